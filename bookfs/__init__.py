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

Modules that moved into these packages keep their old import names
(``from bookfs.book import Book`` still works; :data:`MOVED`).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

#: Old module names (before the packages by layer) and where each module lives now.
MOVED = {
    **{f"bookfs.{m}": f"bookfs.formats.{m}" for m in (
        "layout", "eventlog", "logbase", "fileio", "lock", "index", "segments", "book",
        "vere", "lmdb_log", "pier", "recovery", "info")},
    "bookfs.render": "bookfs.noun.render",
    "bookfs.spark_source": "bookfs.spark.source",
    "bookfs.spark_cli": "bookfs.spark.cli",
    "bookfs.cliargs": "bookfs.cli.args",
    **{f"bookfs.{m}": f"bookfs.cli.{m}" for m in (
        "append", "show", "report", "fsck", "migrate", "sample")},
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module object at its new name (one object, so
    ``bookfs.book.Book is bookfs.formats.book.Book``)."""

    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        """Nothing to run: :meth:`create_module` returned the module already imported."""


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str):
    """``from bookfs import Book``: the UIP engine, imported on first use."""
    if name == "Book":
        from bookfs.formats.book import Book
        return Book
    raise AttributeError(f"module 'bookfs' has no attribute {name!r}")
