"""One read stream, one generation of the log (issue 19, item 1), and waiting closes that
never freeze the mount (issue 19, item 7).

Item 1.  A reader streams a large ``events/3`` (or the segment holding it) in 1 MiB reads
while ``book.log`` is replaced by rename with a log whose event 3 has the same size and
other bytes, or while the writer recovers (cuts event 3 off) and appends another event 3.
The paced reader reads the first MiBs, the log changes, the follower notices
(``watch_loop`` looks every second), and the reader reads on.  Every byte it got must be
the old event's, and the stream either ends with all of them or with ESTALE/EIO, never
with the new event's bytes after the old one's.  A fresh open afterwards reads the new
bytes.  Both request paths: the patched pyfuse3's reads by inode (no OPEN, fh 0) and the
stock path's handles.

Item 7.  While the writer of ``new/3`` pauses, 1,000 threads create, write and close
``new/4..new/1003``; each close waits in its FLUSH for ``new/3``.  ``stat info`` must
answer at once, the paused writer's next write and close must be served, and then all
1,001 closes succeed.  SIGTERM with the 1,000 closes waiting unmounts cleanly.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookfs.formats.book import Book
from bookfs.fs import inodes as I
from bookfs.noun import jam
from mount_fixtures import mnt, mounted  # noqa: F401
from mounting import noun_payload, proc_gone, proc_status_kib

MIB = 1 << 20
BIG = 32 * MIB  # event 3
FIRST_PART = 8 * MIB  # read before the log changes
FOLLOW_WAIT = 2.5  # seconds: the follower looks every second
NOTICED = "the log changed under the mount"  # what the daemon logs when its follower sees it
SETTLE = 0.5  # seconds for the worker thread that then drops the kernel's caches


def _noticed(log_file, times: int = 1, timeout: float = 6 * FOLLOW_WAIT) -> None:
    """Wait until the daemon (``mounted(..., log_file=log_file)``) has logged that its
    follower noticed ``times`` changes of the log.  (These tests once slept FOLLOW_WAIT
    instead: longer, and no proof that the change was noticed.)"""
    deadline = time.monotonic() + timeout
    while True:
        with open(log_file) as f:
            seen = f.read().count(NOTICED)
        if seen >= times:
            return
        assert time.monotonic() < deadline, f"the follower noticed {seen} of {times} changes"
        time.sleep(0.05)


def _dropped(path: str, ino: int, timeout: float = 10.0) -> None:
    """Wait until the kernel no longer resolves ``path`` to ``ino`` (the old generation's
    name was dropped: a lookup now answers another inode, or an error)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.stat(path).st_ino != ino:
                return
        except OSError:
            return
        time.sleep(0.05)


def _log(path, third: bytes) -> None:
    with Book.open(path, writable=True, create=True) as book:
        book.save(1, [b"\x01\x02\x03\x04one", b"\x05\x06\x07\x08two"])
        book.save(3, [third])


def _replace_by_rename(src, tmp_path, new: bytes) -> None:
    other = tmp_path / "other"
    _log(other, new)
    os.rename(other / "book.log", src / "book.log")


def _recover_and_append(src, tmp_path, new: bytes) -> None:
    """The writer cuts event 3 off (a recovery) and appends another event 3."""
    with Book.open(src) as book:
        end = book.index.offsets[2]  # where event 3's deed starts
    os.truncate(src / "book.log", end)
    with Book.open(src, writable=True) as book:
        book.save(3, [new])


CHANGES = {"rename": _replace_by_rename, "recover": _recover_and_append}


def _stream(path: str, change, log_file=None) -> tuple[bytes, int | None]:
    """Read ``path`` in 1 MiB reads: ``FIRST_PART``, then ``change()``, a wait for the
    follower (when the daemon logs to ``log_file``: until it noticed the change, and
    ``SETTLE``), then the rest.  ``(bytes read, errno that ended it or None)``."""
    got = bytearray()
    fd = os.open(path, os.O_RDONLY)
    try:
        while len(got) < FIRST_PART:
            got += os.read(fd, MIB)
        change()
        if log_file is not None:
            _noticed(log_file)
            time.sleep(SETTLE)
        while True:
            try:
                chunk = os.read(fd, MIB)
            except OSError as e:
                return bytes(got), e.errno
            if not chunk:
                return bytes(got), None
            got += chunk
    finally:
        os.close(fd)


def _fresh_read(path: str, timeout: float = 10.0) -> bytes:
    """A new open's bytes (retried while the kernel still holds the old name: the
    mount drops it in a worker thread right after noticing the change)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            if e.errno not in (errno.ESTALE, errno.EIO) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _two_logs(tmp_path, what: str, seed: str) -> tuple[Path, str, int, bytes, bytes]:
    """A log at ``tmp_path/src`` whose event 3 is ``old`` (random, BIG bytes), and the
    ``new`` payload of the same size that replaces it: ``(src, name, start, old_view,
    new)``, where ``name`` is the file read (``events/3`` or the first segment), ``start``
    the segment's offset in book.log and ``old_view`` the bytes that file shows now."""
    rng = random.Random(seed)
    old, new = rng.randbytes(BIG), rng.randbytes(BIG)
    src = tmp_path / "src"
    _log(src, old)
    name = {"events": "events/3", "segments": "segments/000000000001"}[what]
    with Book.open(src) as book:
        start = book.index.offsets[0] if what == "segments" else 0
    with open(src / "book.log", "rb") as f:
        f.seek(start)
        old_view = f.read() if what == "segments" else old
    return src, name, start, old_view, new


@pytest.mark.parametrize("path_kind", ["no-open", "stock"])
@pytest.mark.parametrize("what", ["events", "segments"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_stream_never_mixes_two_logs(tmp_path, mnt, monkeypatch, path_kind, what,
                                       change):
    if path_kind == "stock":
        monkeypatch.setenv("BOOKFS_STOCK_PYFUSE3", "1")  # the daemon opens with handles
    src, name, start, old_view, new = _two_logs(tmp_path, what, f"{path_kind}{what}{change}")
    daemon_log = tmp_path / "daemon.log"
    with mounted(src, mnt, "-o", "ro", log_file=str(daemon_log)):
        path = f"{mnt}/{name}"
        assert os.path.getsize(path) == len(old_view)
        got, err = _stream(path, lambda: CHANGES[change](src, tmp_path, new), daemon_log)
        assert got == old_view[:len(got)], (
            f"{len(got)} bytes read, and they are not all the old log's: the first "
            f"{next(i for i in range(len(got)) if got[i] != old_view[i])} are")
        assert err in (None, errno.ESTALE, errno.EIO)
        assert err is not None or len(got) == len(old_view)
        fresh = _fresh_read(path)
        with Book.open(src) as book:
            expected = book.read(3) if what == "events" else None
        if what == "events":
            assert expected == new and fresh == new
        else:
            with open(src / "book.log", "rb") as f:
                f.seek(start)
                assert fresh == f.read()


@pytest.mark.parametrize("what", ["events", "segments"])
def test_a_stream_read_while_the_writer_recovers(tmp_path, mnt, what):
    """The reads go on at once, before the follower's next look: the writer's recovery
    has rewritten the file in place under the mount, and a read straight from the file
    must notice that before it serves what it read."""
    src, name, start, old_view, new = _two_logs(tmp_path, what, what)
    with mounted(src, mnt, "-o", "ro"):
        path = f"{mnt}/{name}"
        os.stat(path)
        got, err = _stream(path, lambda: _recover_and_append(src, tmp_path, new))
        assert got == old_view[:len(got)], "the stream mixed the old and the new log"
        assert err in (errno.ESTALE, errno.EIO) or len(got) == len(old_view)
        if what == "events":
            assert _fresh_read(path) == new


def test_pretty_after_a_replacement(tmp_path, mnt):
    """``pretty/N`` is bound to its generation as well: after a replacement a new open
    renders the new event, and the old name's inode is not the new one's."""
    src = tmp_path / "src"
    jam_a, jam_b = b"\0\0\0\0" + jam(1), b"\0\0\0\0" + jam(2)  # two nouns, two renderings
    with Book.open(src, writable=True, create=True) as book:
        book.save(1, [jam_a])
    daemon_log = tmp_path / "daemon.log"
    with mounted(src, mnt, "-o", "ro", log_file=str(daemon_log)):
        before = open(f"{mnt}/pretty/1", "rb").read()
        ino = os.stat(f"{mnt}/pretty/1").st_ino
        other = tmp_path / "other"
        with Book.open(other, writable=True, create=True) as book:
            book.save(1, [jam_b])
        os.rename(other / "book.log", src / "book.log")
        _noticed(daemon_log)
        _dropped(f"{mnt}/pretty/1", ino)
        after = _fresh_read(f"{mnt}/pretty/1")
        assert after != before
        assert os.stat(f"{mnt}/pretty/1").st_ino != ino
        assert os.stat(f"{mnt}/events/1").st_ino == I.event_inode(1, 1)
        assert open(f"{mnt}/events/1", "rb").read() == jam_b


def test_sizes_after_a_replacement(tmp_path, mnt):
    """``segments/<K>.sizes`` is bound to its generation like its segment (issue 34.5):
    after the log is replaced by one whose events have other sizes, a new open reads the
    new sizes, under another inode."""
    src = tmp_path / "src"
    with Book.open(src, writable=True, create=True) as book:
        book.save(1, [noun_payload(b"a" * 40), noun_payload(b"b" * 50)])
    daemon_log = tmp_path / "daemon.log"
    with mounted(src, mnt, "-o", "ro", log_file=str(daemon_log)):
        path = f"{mnt}/segments/000000000001.sizes"
        before = open(path, "rb").read()
        ino = os.stat(path).st_ino
        other = tmp_path / "other"
        with Book.open(other, writable=True, create=True) as book:
            book.save(1, [noun_payload(b"c" * 7), noun_payload(b"d" * 9),
                          noun_payload(b"e" * 11)])
        os.rename(other / "book.log", src / "book.log")
        _noticed(daemon_log)
        _dropped(path, ino)
        after = _fresh_read(path)
        assert after != before and len(after) == 24
        assert after == b"".join(os.stat(f"{mnt}/events/{e}").st_size.to_bytes(8, "little")
                                 for e in (1, 2, 3))
        assert os.stat(path).st_ino != ino


def test_slots_are_freed_and_reused(tmp_path, mnt):
    """Four replacements in a row: once the old names are dropped and nothing holds
    their files, each generation's slot is free again, so reads never stop."""
    src = tmp_path / "src"
    _log(src, b"\x00\x00\x00\x00gen0")
    daemon_log = tmp_path / "daemon.log"
    with mounted(src, mnt, "-o", "ro", log_file=str(daemon_log)):
        seen = []
        for k in range(1, 5):
            assert open(f"{mnt}/events/3", "rb").read().endswith(b"gen%d" % (k - 1))
            seen.append(os.stat(f"{mnt}/events/3").st_ino)
            _replace_by_rename(src, tmp_path / f"r{k}", b"\x00\x00\x00\x00gen%d" % k)
            _noticed(daemon_log, k)
            _dropped(f"{mnt}/events/3", seen[-1])
        assert _fresh_read(f"{mnt}/events/3").endswith(b"gen4")
        assert len(set(seen[:3])) == 3  # three slots in turn


def test_no_slot_is_reused_while_its_files_are_open(tmp_path, mnt):
    """Files of two older generations held open while the log changes a third time:
    no slot is free, so the new log's events answer EIO (never the old files' node IDs
    with the new bytes), the old files answer ESTALE, and once one of them is closed
    (the kernel forgets its inode) the new log is served."""
    src = tmp_path / "src"
    _log(src, b"\x00\x00\x00\x00gen0")
    path = f"{mnt}/events/3"
    daemon_log = tmp_path / "daemon.log"
    with mounted(src, mnt, "-o", "ro", log_file=str(daemon_log)):
        held = []
        for k in range(1, 4):
            fd = os.open(path, os.O_RDONLY)
            assert os.pread(fd, 100, 0).endswith(b"gen%d" % (k - 1))
            held.append(fd)
            ino = os.fstat(fd).st_ino
            _replace_by_rename(src, tmp_path / f"r{k}", b"\x00\x00\x00\x00gen%d" % k)
            _noticed(daemon_log, k)
            _dropped(path, ino)
            if k < 3:
                assert _fresh_read(path).endswith(b"gen%d" % k)
        try:
            with pytest.raises(OSError) as e:
                open(path, "rb").read()
            assert e.value.errno == errno.EIO  # gen 0 and gen 1 hold the other slots
            for fd in held:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                with pytest.raises(OSError) as e:
                    os.pread(fd, 100, 0)
                assert e.value.errno == errno.ESTALE
        finally:
            os.close(held.pop(0))  # gen 0's file: its slot is forgotten, then free
        try:
            assert _fresh_read(path).endswith(b"gen3")
        finally:
            for fd in held:
                os.close(fd)


@settings(max_examples=500, deadline=None)  # pure arithmetic; a loaded machine is no failure
@given(st.integers(1, (1 << 64) - 1), st.integers(0, 1 << 61), st.data())
def test_slots_never_meet(first, span, data):
    """Every slot's inodes round-trip and lie in their kind's range, and two slots (or
    two kinds) never share an inode, for logs anywhere in the u64 range."""
    last = min(first + span, (1 << 64) - 1)
    e = data.draw(st.integers(first, last))
    seen: dict[int, tuple] = {}
    for slot in range(I.SLOTS):
        for kind, ino, back in (
                ("event", I.event_inode(e, slot), lambda i: I.inode_event(i, first)),
                ("pretty", I.pretty_inode(e, slot), lambda i: I.inode_pretty(i, first)),
                ("segment", I.segment_inode(e % I.SIZES_BIT, slot),
                 lambda i: I.inode_segment(i) + e - e % I.SIZES_BIT),
                ("sizes", I.segment_inode(e % I.SIZES_BIT, slot, sizes=True),
                 lambda i: I.inode_segment(i) + e - e % I.SIZES_BIT)):
            assert I.slot_of(ino) == slot, (kind, slot)
            assert back(ino) == e
            assert seen.setdefault(ino, (kind, slot)) == (kind, slot)
        assert I.is_event(I.event_inode(e, slot)) and I.is_pretty(I.pretty_inode(e, slot))
        assert I.is_segment(I.segment_inode(e % I.SIZES_BIT, slot))
    for other in (I.ROOT, I.EVENTS, I.PRETTY, I.SEGMENTS, I.epoch_inode(5, 1),
                  I.staging_inode(1 << 39), *I.META_INODES.values()):
        assert I.slot_of(other) is None


# --- item 7: many waiting closes -------------------------------------------------------------

WAITERS = 1000


class _Appends:
    """A writer of ``new/N`` that pauses between two writes, and ``WAITERS`` threads that
    each create, write and close ``new/N+1..N+WAITERS`` meanwhile (each close waits for
    ``new/N``).  Every thread is its own creator, writer and closer."""

    def __init__(self, root: str, first: int):
        import threading

        self.root, self.first = root, first
        self.resume, self.go = threading.Event(), threading.Event()
        self.lock = threading.Lock()
        self.numbers = iter(range(first + 1, first + 1 + WAITERS))
        self.results: dict[int, object] = {}  # number -> None (closed) or an errno
        self.closing = 0
        self.slow: object = "not finished"
        threading.stack_size(256 << 10)
        self.slow_thread = threading.Thread(target=self._slow, daemon=True)
        self.threads = [threading.Thread(target=self._waiter, daemon=True)
                        for _ in range(WAITERS)]

    def data(self, n: int) -> bytes:
        return noun_payload(random.Random(n).randbytes(4096))

    def _slow(self) -> None:
        n, data = self.first, self.data(self.first)
        try:
            fd = os.open(f"{self.root}/new/{n}", os.O_WRONLY | os.O_CREAT)
            os.write(fd, data[:100])
            self.go.set()
            self.resume.wait()
            os.write(fd, data[100:])
            os.close(fd)
            self.slow = None
        except OSError as e:
            self.slow = e.errno

    def _waiter(self) -> None:
        self.go.wait()
        with self.lock:  # numbers are taken in order
            n = next(self.numbers)
            try:
                fd = os.open(f"{self.root}/new/{n}", os.O_WRONLY | os.O_CREAT)
            except OSError as e:
                self.results[n] = e.errno
                return
        try:
            os.write(fd, self.data(n))
        except OSError as e:
            self.results[n] = e.errno
        with self.lock:
            self.closing += 1
        try:
            os.close(fd)
            self.results.setdefault(n, None)
        except OSError as e:
            self.results[n] = e.errno

    def start(self) -> None:
        self.slow_thread.start()
        for t in self.threads:
            t.start()

    def all_closing(self) -> bool:
        return self.closing == WAITERS

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in [self.slow_thread, *self.threads]:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in [self.slow_thread, *self.threads])


def _timed_stat(path: str, timeout: float) -> float | None:
    """Seconds ``os.stat(path)`` took, or None if it had not returned after ``timeout``."""
    import threading

    took: list[float] = []

    def run():
        t0 = time.monotonic()
        os.stat(path)
        took.append(time.monotonic() - t0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return took[0] if took else None


def _rss_kib(pid: int) -> int:
    return proc_status_kib(pid, "VmRSS")


def _small_log(path) -> None:
    with Book.open(path, writable=True, create=True) as book:
        book.save(1, [b"\x00\x00\x00\x00one", b"\x00\x00\x00\x00two"])


def _waiting_closes(mnt) -> tuple[int, "_Appends"]:
    """Start :class:`_Appends` on the mount and return ``(daemon pid, run)`` once all
    of its closes have reached the daemon and wait there for the paused writer."""
    from mounting import daemon_pid

    daemon = daemon_pid(mnt)
    run = _Appends(str(mnt), 3)
    run.start()
    try:
        assert run.go.wait(10)
        assert wait_for_(run.all_closing, 120), f"{run.closing} closing"
    except BaseException:
        run.resume.set()  # let the paused writer finish, so every close returns
        run.join(60)
        raise
    time.sleep(1.0)  # the closes reach the daemon and wait there
    return daemon, run


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_a_thousand_waiting_closes_never_freeze_the_mount(tmp_path, mnt):
    """While the writer of new/3 pauses, 1,000 writers close new/4..new/1003, and each of
    those closes waits for new/3.  The mount must go on serving: ``stat info`` answers at
    once, the paused writer's next write and its close are served, and then all 1,001
    closes return 0 with every event in the log."""
    import signal

    src = tmp_path / "src"
    _small_log(src)
    with mounted(src, mnt, "-o", "stall_timeout=60"):
        daemon, run = _waiting_closes(mnt)
        try:
            assert run.slow == "not finished"
            took = _timed_stat(f"{mnt}/info", 5.0)
            rss = _rss_kib(daemon)
            run.resume.set()
            finished = run.join(60)
        finally:
            run.resume.set()
            if not run.join(0) and daemon:  # free the closes stuck in the daemon
                os.kill(daemon, signal.SIGTERM)
                run.join(30)
        assert took is not None and took < 2.0, f"stat info took {took} s"
        assert finished, "closes still waiting after the slow writer finished"
        assert run.slow is None, f"the paused writer failed: {run.slow}"
        failed = {n: e for n, e in run.results.items() if e is not None}
        assert not failed and len(run.results) == WAITERS, sorted(failed.items())[:5]
        print(f"daemon RSS with {WAITERS} waiting closes: {rss // 1024} MiB")
        assert rss < 512 << 10, f"daemon RSS {rss} KiB with {WAITERS} waiting closes"
    with Book.open(src) as book:
        assert book.last == 3 + WAITERS
        for n in (3, 4, 500, 3 + WAITERS):
            assert book.read(n) == run.data(n)


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_sigterm_with_a_thousand_waiting_closes_unmounts(tmp_path, mnt):
    """SIGTERM while 1,000 closes wait for a paused writer: every close returns (with
    an error: nothing of them was committed), the daemon exits and the mount is gone."""
    import signal

    from mounting import in_mountinfo

    src = tmp_path / "src"
    _small_log(src)
    with mounted(src, mnt, "-o", "stall_timeout=60"):
        daemon, run = _waiting_closes(mnt)
        try:
            os.kill(daemon, signal.SIGTERM)
            closed = all(t.join(30) is None and not t.is_alive() for t in run.threads)
            gone = wait_for_(lambda: not in_mountinfo(mnt), 30)
            exited = wait_for_(lambda: proc_gone(daemon), 30)
        finally:
            run.resume.set()
            run.join(30)
        assert closed, "closes still waiting after SIGTERM"
        assert len(run.results) == WAITERS
        assert all(e is not None for e in run.results.values())  # none was committed
        assert gone and exited
    with Book.open(src) as book:
        assert book.last == 2


def wait_for_(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()
