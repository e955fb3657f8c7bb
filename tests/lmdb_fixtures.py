"""Real LMDB epochs and piers, written with the ``lmdb`` binding the way vere writes them.

* ``make_lmdb_epoch(dir, base, payloads, meta=None)``: an LMDB environment in ``dir`` with
  database ``EVENTS`` (``MDB_INTEGERKEY``; key = event number as 8 bytes LE, value = the
  payload) holding events ``base + 1 ..``, and, if ``meta`` is given, a ``META`` database.
* ``make_pier(root, [("lmdb", payloads), ("book", payloads), ...])``: a pier whose
  ``.urb/log/`` holds one epoch directory ``0i<N>`` per entry (``epoc.txt``, ``vere.txt``)
  and the top-level environment ``.urb/log/data.mdb`` holding only ``META``.
* ``meta_values(...)``: META values in the ``meta.bin`` encodings.
"""

from __future__ import annotations

import contextlib
import os
import random
import struct
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import lmdb

from bookfs.formats.book import Book

MAP_SIZE = 1 << 32  # sparse file: only the pages used take disk space


def payloads(first: int, count: int, size: int | None = None, seed: int = 0) -> list[bytes]:
    """Deterministic payloads (4-byte mug ++ random jam bytes) for events ``first..``."""
    out = []
    for e in range(first, first + count):
        r = random.Random(e * 7919 + seed)
        n = size if size is not None else r.randrange(4, 300)
        out.append(r.randbytes(n))
    return out


def meta_values(who: int = 0x100, version: int = 3, fake: int = 1, life: int = 17
                ) -> dict[str, bytes]:
    """The four META values in ``meta.bin``'s encodings."""
    return {
        "who": who.to_bytes(16, "little"),
        "version": struct.pack("<I", version),
        "fake": bytes([fake]),
        "life": struct.pack("<I", life),
    }


def write_meta_db(env: lmdb.Environment, meta: dict[str, bytes]) -> None:
    db = env.open_db(b"META", create=True)
    with env.begin(write=True, db=db) as txn:
        for key, value in meta.items():
            txn.put(key.encode(), value)


def make_lmdb_epoch(directory: str | os.PathLike, base: int, events: Iterable[bytes], *,
                    meta: dict[str, bytes] | None = None, integerkey: bool = True,
                    keys: Sequence[int] | None = None, batch: int = 5000) -> Path:
    """Write an LMDB epoch into ``directory``: events ``base + 1, ...`` (or exactly
    ``keys``, to build broken stores).  Returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(d), map_size=MAP_SIZE, max_dbs=2, subdir=True)
    try:
        db = env.open_db(b"EVENTS", integerkey=integerkey, create=True)
        it = iter(events)
        numbers = iter(keys) if keys is not None else iter(range(base + 1, 1 << 62))
        done = False
        while not done:
            with env.begin(write=True, db=db) as txn:
                for _ in range(batch):
                    try:
                        value = next(it)
                    except StopIteration:
                        done = True
                        break
                    txn.put(struct.pack("<Q", next(numbers)), value, append=False)
        if meta is not None:
            write_meta_db(env, meta)
        env.sync(True)
    finally:
        env.close()
    return d


def make_top_meta(log_dir: str | os.PathLike, meta: dict[str, bytes]) -> None:
    """The pier's top-level environment (``.urb/log/data.mdb``) holding only ``META``."""
    env = lmdb.open(str(log_dir), map_size=1 << 20, max_dbs=2, subdir=True)
    try:
        write_meta_db(env, meta)
    finally:
        env.close()


def make_book_epoch(directory: str | os.PathLike, base: int, events: Iterable[bytes], *,
                    meta: dict[str, bytes] | None = None) -> Path:
    """A UIP Book epoch: events ``base + 1, ...`` and ``meta.bin``."""
    d = Path(directory)
    with Book.open(d, writable=True, create=True) as book:
        events = list(events)
        if events:
            book.save(base + 1, events, epoch=base)
        for key, value in (meta or {}).items():
            book.save_meta(key, value)
    return d


def make_vere_epoch(directory: str | os.PathLike, base: int, events: Iterable[bytes], *,
                    meta: dict[str, bytes] | None = None) -> Path:
    """A Book epoch in vere's two-slot layout (needs ``bookfs.formats.vere``)."""
    from bookfs.formats.vere import VereBook

    d = Path(directory)
    with VereBook.open(d, writable=True, create=True) as book:
        events = list(events)
        if events:
            book.save(base + 1, events, epoch=base)
        for key, value in (meta or {}).items():
            book.save_meta(key, value)
    return d


def make_pier(root: str | os.PathLike, epochs: Sequence[tuple[str, Sequence[bytes]]], *,
              start: int = 0, meta: dict[str, bytes] | None = None,
              top_meta: bool = True) -> Path:
    """A pier at ``root`` with one epoch per ``(kind, payloads)``; kind is ``lmdb``,
    ``book`` or ``vere``.  The first epoch is ``0i<start>`` (``start > 0``: as after a
    chop); each next epoch starts where the previous ends.  ``meta`` (default
    :func:`meta_values`) goes into the top-level META database and each Book's meta.bin."""
    root = Path(root)
    log_dir = root / ".urb" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    meta = meta_values() if meta is None else meta
    if top_meta:
        make_top_meta(log_dir, meta)
    base = start
    for kind, events in epochs:
        d = log_dir / f"0i{base}"
        if kind == "lmdb":
            make_lmdb_epoch(d, base, events)
            epoc = "2"
        elif kind == "book":
            make_book_epoch(d, base, events, meta=meta)
            epoc = "3"
        elif kind == "vere":
            make_vere_epoch(d, base, events, meta=meta)
            epoc = "3"
        else:
            raise ValueError(kind)
        (d / "epoc.txt").write_text(epoc)
        (d / "vere.txt").write_text("3.2")
        base += len(events)
    return root


@contextlib.contextmanager
def runtime_lock(pier: str | os.PathLike):
    """The pier's ``.vere.lock`` held by another process, as a running vere holds it, for
    the ``with`` block."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from bookfs.formats.lock import WriterLock; "
         f"l = WriterLock({str(Path(pier) / '.vere.lock')!r}); print('held', flush=True); "
         "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.stdin.close()
        holder.wait(10)
