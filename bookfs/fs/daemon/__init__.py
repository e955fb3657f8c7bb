"""The daemon's life: from ``bookfs mount`` to the unmount, around the request path.

``mount``      mounting, the daemon (fork, ready pipe, signals, watchdog), unmounting
``options``    the ``-o`` mount options, sorted by what bookfs does with each
``mainloop``   pyfuse3's main loop's arguments: its workers, its poll before it sleeps
``companion``  a read-write mount's read-only companion: reads at read-only speed
``mountinfo``  which mount is at a path (umount, append, spark and the watchdog ask it)
``readahead``  a mount's readahead raised to 1 MiB
"""
