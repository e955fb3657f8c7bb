"""The kinds of node a mount shows, one module each, behind the one dispatcher in
:mod:`bookfs.fs.ops` (which routes every request by inode range, :mod:`bookfs.fs.inodes`).

``base``      what every kind shares: cache timeouts, permissions (``source_modes``),
              the :class:`~.base.Kind` every module subclasses, snapshot handles
``events``    ``events/<N>``: immutable payloads, checked before a byte is served
``pretty``    ``pretty/<N>``: readable renderings, made once per event and generation
``segments``  ``segments/<K>``: the log's bytes in fixed spans (a plain UIP-layout log)
``new``       ``new/<N>``: appends, committed on the writer's last close (the commit rule)
``meta``      ``meta/<key>``: the log's metadata fields, read and rewritten whole
``follow_dir`` ``follow/<N>`` and ``follow/next``: lookups that wait for the event
``dirs``      the directories (root, ``events/``, ``epochs/``, ...), their listings, and
              the info files (``info``, ``epochs/*/info``)

Each module's docstring states its kind's contract: what the kernel may cache and for
how long, which errno answers what, and when a write is durable.  A kind reaches the
mount's shared state (the log, the open handles, the generation slots of
:mod:`bookfs.fs.watch`) through ``self.fs``, typed as :class:`~bookfs.fs.state.MountState`
(the dispatcher holds it; no kind imports the dispatcher).
"""
