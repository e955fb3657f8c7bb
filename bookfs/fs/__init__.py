"""The FUSE adapter: presents a :class:`bookfs.formats.book.Book` as a filesystem (pyfuse3 + trio).

The request path is at the root; the append engine, the daemon's life and the fleet are
wings (subpackages), each with its own map.

``ops``       the pyfuse3 ``Operations``: one dispatcher that routes each request, by
              inode range, to the kind of node that owns it; no handler's exception
              escapes it
``nodes``     the kinds of node, one module each, with its caching, errno and
              durability contract
``state``     what a mount holds, declared in one place: what the node kinds, the
              watch and the tail are handed (``MountState``), and how they tell the
              kernel (``Kernel``)
``watch``     a read-only mount watches the writer's log: looks again, drops the
              kernel's caches when the log grew, or was replaced or recovered (not to
              be confused with ``follow/``, the live tail: ``tail``)
``generations`` the log's generation as the mount knows it, and the generation slots
              of its inodes (a file of an old generation answers ESTALE)
``tail``      the lookups under ``follow/`` that wait for an event to be committed
``dates``     an event file's mtime: the event's own date, from the log's date column
``inodes``    inode numbering (stable, derived from event numbers)
``cache``     the shared cache of small, checked event payloads
``prefetch``  whether a lookup of a small event starts its disk read at once (learnt
              from whether lookups are followed by reads)
``append``    the append engine, without FUSE: reservations, the ordered group commit,
              the commit rule, the payload check, staging buffers
``daemon``    the daemon's life: mounting, ``-o`` options, the read-only companion,
              unmounting
``fleet``     ``mount --fleet``: every log under a directory, one daemon
"""
