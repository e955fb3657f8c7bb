"""bookfs: Urbit event logs as a filesystem.

The packages, from the bottom up (imports only point downwards; ``docs/architecture.md``):

``noun``     nouns: jam/cue/mug, @p and @da, the dojo-style rendering (pure functions)
``formats``  the on-disk formats behind one interface (:class:`~bookfs.formats.eventlog.EventLog`):
             the UIP Book, vere's layout, LMDB epochs, a pier of epochs; their recovery,
             the offset index, segments, the writer lock. Knows nothing of FUSE.
``fs``       the FUSE adapter (pyfuse3 + trio) over a ``formats`` log
``spark``    the PySpark pipeline, ``format("bookfs")`` and ``bookfs spark``
``cli``      the ``bookfs`` command and its tools (append, show, report, fsck, migrate, ...)

``errors`` and ``types`` are the shared vocabulary: exceptions with their errno, EventNum.
"""
from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    """``from bookfs import Book``: the UIP engine, imported on first use."""
    if name == "Book":
        from bookfs.formats.book import Book
        return Book
    raise AttributeError(f"module 'bookfs' has no attribute {name!r}")
