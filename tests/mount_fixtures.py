"""Shared fixtures and helpers for the real-mount tests (test_mount_*.py, test_ops_direct.py).

Import what you need by name (``from mount_fixtures import sample_src, ...``).
Every log built here gets a private ``$BOOKFS_CACHE_DIR`` (module-scoped fixtures set it
themselves, since conftest's autouse fixture is function-scoped).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.cli.sample import iter_sample_payloads, sample_meta
from mounting import daemon_pid, force_unmount, in_mountinfo, mounted, run_bookfs  # noqa: F401
from mounting import noun, noun_payload, octal  # noqa: F401

BROWSE_EVENTS = 3000


def build_sample(path: Path, events: int, seed: int = 0, extra: list[bytes] = ()) -> Path:
    """A realistic sample log of ``events`` events (then ``extra`` payloads) at ``path``."""
    with Book.open(path, writable=True, create=True) as book:
        for key, value in sample_meta(seed).items():
            book.save_meta(key, value)
        batch, first = [], 1
        for p in iter_sample_payloads(events, seed):
            batch.append(p)
            if len(batch) >= 1000:
                book.save(first, batch)
                first += len(batch)
                batch = []
        if batch:
            book.save(first, batch)
            first += len(batch)
        if extra:
            book.save(first, list(extra))
    return path


def payload(event: int, size: int) -> bytes:
    """Deterministic payload for ``event``: ``mug ++ jam`` of an atom, exactly ``size``
    bytes, which a checked ``new/`` accepts (issue 21) when it is 5 bytes or more."""
    data = random.Random(event * 7919 + size).randbytes(size)
    return noun_payload(data) if size >= 5 else data  # (4 bytes or fewer: never a noun)


def sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log_state(src: Path) -> tuple[str, str]:
    """sha256 of book.log and meta.bin: compare before/after to prove nothing changed."""
    return sha(src / "book.log"), sha(src / "meta.bin")


def engine_events(src: Path) -> dict[int, bytes]:
    """Every committed event of the log at ``src``, read by the engine (read-only)."""
    with Book.open(src) as book:
        return dict(book.walk())


def threaded_appends(root, first: int, threads: int, each: int, size, cut: int):
    """``threads`` threads each append ``each`` events to ``root``/new/ (numbers taken in
    order, and the file created, under one lock), writing ``cut`` bytes and then the rest
    of :func:`payload` (``size(n)`` bytes); a thread stops at its first failed close.
    Returns ``(acked, failed)``: ``{n: data}`` of the closes that returned 0, and
    ``[(n, OSError)]``."""
    lock = threading.Lock()
    numbers = iter(range(first, first + threads * each))
    acked: dict[int, bytes] = {}
    failed: list = []

    def writer():
        for _ in range(each):
            with lock:
                n = next(numbers)
                fd = os.open(f"{root}/new/{n}", os.O_WRONLY | os.O_CREAT)
            data = payload(n, size(n))
            os.write(fd, data[:cut])
            os.write(fd, data[cut:])
            try:
                os.close(fd)
            except OSError as e:
                failed.append((n, e))
                return
            acked[n] = data

    workers = [threading.Thread(target=writer) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return acked, failed


def sh(cmd: str, **kw) -> subprocess.CompletedProcess:
    """Run a shell command line; stdout as bytes."""
    return subprocess.run(cmd, shell=True, capture_output=True, timeout=60, **kw)


def err_of(fn, *args) -> int | None:
    """The errno ``fn(*args)`` fails with, or None if it succeeds."""
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return None


def info_text(mp) -> str:
    """``mp/info`` as text."""
    with open(f"{mp}/info") as f:
        return f.read()


def next_number(mp) -> int:
    """The number the mount at ``mp`` appends next (``info``'s ``next:``)."""
    return int(re.search(r"^next:\s+(\d+)$", info_text(mp), re.MULTILINE).group(1))


def wait_for(pred, timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    """A private index cache for module-scoped logs and mounts."""
    d = tmp_path_factory.mktemp("bookfs-module-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BOOKFS_CACHE_DIR", str(d))
        yield d


@pytest.fixture(scope="module")
def sample_src(tmp_path_factory, module_cache) -> Path:
    """A ~3,000-event sample log (module-scoped: built once)."""
    return build_sample(tmp_path_factory.mktemp("browse") / "src", BROWSE_EVENTS)


@pytest.fixture
def small_src(tmp_path) -> Path:
    """A small log of 10 events of assorted sizes, with sample meta."""
    path = tmp_path / "small"
    with Book.open(path, writable=True, create=True) as book:
        for key, value in sample_meta(0).items():
            book.save_meta(key, value)
        book.save(1, [payload(n, 4 + 37 * n) for n in range(1, 11)])
    return path


@pytest.fixture
def mnt(tmp_path) -> Path:
    p = tmp_path / "mnt"
    p.mkdir()
    yield p
    force_unmount(str(p))
