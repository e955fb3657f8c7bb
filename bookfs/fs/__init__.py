"""The FUSE adapter: presents a :class:`bookfs.formats.book.Book` as a filesystem (pyfuse3 + trio).

``ops``       the pyfuse3 ``Operations``: one dispatcher that routes each request, by
              inode range, to the kind of node that owns it; no handler's exception
              escapes it
``nodes``     the kinds of node, one module each, with its caching, errno and
              durability contract: ``events``, ``pretty``, ``segments``, ``new``,
              ``meta``, ``dirs`` (directories, listings, info files), and ``base``
              (timeouts, permissions)
``follow``    a read-only mount follows the writer; generation slots; the kernel's
              caches dropped when the log is replaced or recovered
``inodes``    inode numbering (stable, derived from event numbers)
``cache``     the shared cache of small, checked event payloads
``staging``   buffers for files being written into ``new/`` and ``meta/``
``commit``    the ordered group-commit queue behind ``new/``
``closer``    the commit rule: which close of a written file is its writer's last
``mount``     mounting, the daemon, unmounting
``options``   the ``-o`` mount options, sorted by what bookfs does with each
``mountinfo`` which mount is at a path (umount, append, spark ask it)
"""
