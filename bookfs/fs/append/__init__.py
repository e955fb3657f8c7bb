"""The append engine: how bytes written into ``new/<N>`` become event N, with no FUSE in it
(it imports no pyfuse3; ``tests/test_layers.py`` holds it to that).  The FUSE adapter
(``fs/nodes/new.py``, ``fs/nodes/meta.py``) feeds it each request and answers the errno
of the :class:`~bookfs.errors.Refused` it raises.

``commit_queue``  reservations (the next free number), the ordered group commit on its own
                  thread, the refusal record: the durability contract of DESIGN.md
``rule``          the commit rule: which close of a written file is its writer's last
                  (the probe of ``/proc``, the verdicts), ``_fdscan.c`` its scan in C
``check``         the payload check as the bytes stream in, and the hole check
``staging``       the buffers files being written are kept in (memory, then a spill file)
"""
