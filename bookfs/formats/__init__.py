"""The on-disk formats: every log kind behind one interface, knowing nothing of FUSE.

``layout``    every constant and byte layout of the formats (one place)
``eventlog``  the interface every format offers (:class:`~bookfs.formats.eventlog.EventLog`)
``logbase``   what the file-backed formats share: published view, meta, walk, writes
``book``      the UIP layout's engine (``book.log`` + ``meta.bin``)
``vere``      vere's two-slot layout's engine
``lmdb_log``  LMDB epochs (read-only)
``pier``      a pier = ordered epochs, one numbering; ``identify``/``open_source`` pick the format
``recovery``  the Recovery ladder (check → repair → salvage) each format fills in
``index``     the persisted offset index (8 B/event), validated and rebuilt when stale
``segments``  the bulk view: the log cut into byte ranges of whole deeds
``info``      the summary of any opened log (``bookfs info``, a mount's ``info`` file)
``lock``      the single-writer lock
``fileio``    safe opens, preads into reusable buffers, directory fsync, publish by rename
"""
