"""The FUSE adapter: presents a :class:`bookfs.formats.book.Book` as a filesystem (pyfuse3 + trio).

``inodes``  inode numbering (stable, derived from event numbers)
``staging`` buffers for files being written into ``new/`` and ``meta/``
``commit``  the ordered group-commit queue behind ``new/``
``ops``     the pyfuse3 ``Operations``
``mount``   mounting, the daemon, unmounting
``mountinfo`` which mount is at a path (umount, append, spark ask it)
"""
