"""The on-disk formats: every log kind behind one interface, knowing nothing of FUSE.

``layout``          every constant and byte layout of the formats (one place)
``eventlog``        the interface every format offers (:class:`~bookfs.formats.eventlog.EventLog`)
``logbase``         what the formats share: walk, published view; the Book engines' base
                    (open, meta, bad-region handling, vectored writes, closing)
``book``            the UIP layout's engine (``book.log`` + ``meta.bin``)
``vere``            vere's two-slot layout's engine
``vere_header``     vere's two header slots: parse, pack, choose
``vere_deeds``      vere's damaged deeds: batch CRC, framed deeds at any offset, torn tail
``detect``          telling the two Book layouts apart, without guessing
``lmdb_log``        LMDB epochs (read-only)
``lmdb_snapshots``  reading a live LMDB store without its lock file
``pier``            a pier = ordered epochs, one numbering; ``identify``/``open_source``
                    pick the format
``epochs``          an epoch directory: its ``epoc.txt``, the store it holds, a pier's epochs
``recovery``        the Recovery ladder (check → repair → salvage) and what every ladder
                    shares (``meta.bin``), nothing else
``reports``         what an open and a check report (``RecoveryReport``, ``CheckReport``)
``quarantine``      bytes that may hold events kept aside before a log is cut back
``nouncheck``       the noun check (``verify --nouns``): every event decode-checked
``deedcheck``       a damaged UIP log's deeds: the first bad CRC (forked past 256 MiB),
                    valid deeds in a damaged region, the torn tail
``book_recovery``   the ladder for the UIP layout
``vere_recovery``   the ladder for vere's layout
``lmdb_recovery``   the ladder for LMDB epochs (check and salvage)
``pier_recovery``   the ladder for a pier (each epoch by its format, then the chain), and
                    ``recovery_for(path)``: the ladder for any source, by ``identify``
``salvage``         what a salvage writes: batched events, the bytes left out, publishing
``deeds``           one deed walk per layout (``UIP``, ``VERE``): sizes, checks, walks, writer;
                    every reader and writer of deeds goes through it
``index``           the persisted offset index (8 B/event), validated and rebuilt when stale
``seals``           a large deed's CRC per block, kept beside the index: reads checked
                    block by block as they are served
``framing``         the framing scan of both Book layouts, and walks from the log's end
                    (its walk of a chunk compiled: ``_framing.pyx``)
``datecolumn``      each event's date, kept beside the offset index
``shipcard``        a ship's card: what a fleet mount shows of a log it has not opened
``mark``            the commit mark: a writer's word to readers in other processes
``committed``       what a reader is given: only what is committed
``fleet``           a directory of piers, one per ship, named as ``mount --fleet`` shows
``segments``        the bulk view: the log cut into byte ranges of whole deeds
``info``            the summary of any opened log (``bookfs info``, a mount's ``info`` file)
``lock``            the single-writer lock
``fileio``          safe opens, preads into reusable buffers, vectored writes, directory
                    fsync, publish by rename
"""
