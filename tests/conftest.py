"""Shared fixtures.  Kept generic so any test module can use them.

* ``cache_dir`` (autouse): every test gets its own ``$BOOKFS_CACHE_DIR`` so persisted
  indexes never leak between tests or into the user's cache.
* ``make_book``: a factory that writes a real Book log under the test's ``tmp_path``.
* ``payload``: deterministic payload bytes (mug ++ jam) for an event number and size.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from bookfs.formats.book import Book


def _payload(event: int, size: int) -> bytes:
    """Deterministic pseudo-random payload of ``size`` bytes for ``event``."""
    return random.Random(event * 1_000_003 + size).randbytes(size)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch) -> Path:
    """A private index cache directory for this test (``$BOOKFS_CACHE_DIR``)."""
    d = tmp_path_factory.mktemp("bookfs-cache")
    monkeypatch.setenv("BOOKFS_CACHE_DIR", str(d))
    return d


@pytest.fixture
def payload():
    """``payload(event, size) -> bytes``: deterministic payload bytes."""
    return _payload


@pytest.fixture
def make_book(tmp_path):
    """``make_book(*batches, name=None, epoch=0, meta=None) -> Path``.

    Creates a Book directory under ``tmp_path`` and saves each batch (a sequence of payload
    bytes, or of ints meaning "a deterministic payload of this size") in order, numbering
    from ``epoch + 1``.  ``meta`` maps meta keys to raw values.  The book is closed again,
    so its index is persisted; the directory path is returned.
    """
    counter = itertools.count()

    def make(*batches: Iterable[bytes | int], name: str | None = None, epoch: int = 0,
             meta: dict[str, bytes] | None = None) -> Path:
        path = tmp_path / (name or f"book{next(counter)}")
        with Book.open(path, writable=True, create=True) as book:
            nxt = epoch + 1
            for batch in batches:
                items: Sequence = list(batch)
                payloads = [
                    _payload(nxt + k, p) if isinstance(p, int) else bytes(p)
                    for k, p in enumerate(items)
                ]
                book.save(nxt, payloads, epoch=epoch)
                nxt += len(payloads)
            for key, value in (meta or {}).items():
                book.save_meta(key, value)
        return path

    return make
