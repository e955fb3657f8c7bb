"""``tail -f`` on the growing last segment of a live log, on real mounts with the real
``tail`` (GNU coreutils polls ``fstat`` on FUSE, then reads from where it was): the
output grows by exactly the new deeds' bytes, as ``book.log`` holds them.

Before the fix, a segment handle served only the bytes the segment had when it was
opened, so ``tail -f`` printed nothing new however long it waited."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

from bookfs.formats.book import Book
from bookfs.formats.layout import HEADER_SIZE
from bookfs.formats.segments import Segments
from mount_fixtures import mnt, mounted, payload, small_src  # noqa: F401

SEG0 = "000000000001"  # the first segment is named after the log's first event
WAIT = 15.0  # seconds a tail may take to show new bytes (it polls every 0.2 s here)
SETTLE = 0.3  # then nothing more may follow: longer than one of tail's polls


def log_bytes(src: Path, start: int = HEADER_SIZE, end: int | None = None) -> bytes:
    data = (src / "book.log").read_bytes()
    return data[start:end]


class Tail:
    """A real ``tail`` child writing to a file; ``wait_for`` polls that file."""

    def __init__(self, out: Path, *args: str):
        self.out = out
        self._f = open(out, "wb")
        self.proc = subprocess.Popen(["tail", "-s", "0.2", *args], stdout=self._f,
                                     stderr=subprocess.PIPE)

    def output(self) -> bytes:
        return self.out.read_bytes()

    def wait_for(self, want: bytes, wait: float = WAIT) -> bytes:
        """The output once it is ``want`` (or as long), or when ``wait`` runs out."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and len(self.output()) < len(want):
            assert self.proc.poll() is None, self.proc.stderr.read()
            time.sleep(0.05)
        time.sleep(SETTLE)  # nothing more may follow
        return self.output()

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        self._f.close()
        return err.decode()


def cp_append(m, n: int, data: bytes, tmp: Path) -> None:
    f = tmp / f"p{n}"
    f.write_bytes(data)
    r = subprocess.run(["cp", str(f), f"{m}/new/{n}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_tail_f_rw_mount(small_src, mnt, tmp_path):
    """tail -f, tail -c +1 -f and tail -F on the last segment of a read-write mount show
    each event appended through new/, byte for byte; stat of the segment and of info is
    current as soon as the appending close() returned."""
    with mounted(small_src, mnt):
        seg = f"{mnt}/segments/{SEG0}"
        before = log_bytes(small_src)
        lines10 = subprocess.run(["tail", seg], capture_output=True, check=True).stdout
        tails = {"f": Tail(tmp_path / "f.out", "-f", seg),
                 "c": Tail(tmp_path / "c.out", "-c", "+1", "-f", seg),
                 "F": Tail(tmp_path / "F.out", "-F", seg)}
        try:
            assert tails["c"].wait_for(before) == before
            assert tails["f"].wait_for(lines10) == lines10
            for n, size in ((11, 700), (12, 5), (13, 70_000)):
                cp_append(mnt, n, payload(n, size), tmp_path)
                now = log_bytes(small_src)
                assert os.stat(seg).st_size == len(now)  # no stale cached size
                info = open(f"{mnt}/info", "rb").read()
                assert os.stat(f"{mnt}/info").st_size == len(info)
                new = now[len(before):]
                assert tails["c"].wait_for(now) == now
                assert tails["f"].wait_for(lines10 + new) == lines10 + new
                assert tails["F"].wait_for(lines10 + new) == lines10 + new
                lines10 += new
                before = now
        finally:
            errs = {k: t.stop() for k, t in tails.items()}
        assert not any(errs.values()), errs


def test_tail_f_ro_mount_follows_writer(small_src, mnt, tmp_path):
    """On a read-only mount, tail -c +1 -f (and -F) on the last segment shows the deeds
    another process appends to the log (watch_loop / Book.refresh)."""
    with mounted(small_src, mnt, "-o", "ro"):
        seg = f"{mnt}/segments/{SEG0}"
        c = Tail(tmp_path / "c.out", "-c", "+1", "-f", seg)
        F = Tail(tmp_path / "F.out", "-c", "+1", "-F", seg)
        try:
            assert c.wait_for(log_bytes(small_src)) == log_bytes(small_src)
            with Book.open(small_src, writable=True) as book:
                book.save(11, [payload(11, 3000), payload(12, 9)])
                now = log_bytes(small_src)
                assert c.wait_for(now) == now
                assert F.wait_for(now) == now
                book.save(13, [payload(13, 200_000)])
                now = log_bytes(small_src)
                assert c.wait_for(now) == now
                assert F.wait_for(now) == now
            assert os.stat(seg).st_size == len(now)
        finally:
            errs = [c.stop(), F.stop()]
        assert not any(errs), errs


def test_segment_fills_and_next_appears(small_src, mnt, tmp_path):
    """With a 4 KiB segment span: the followed segment grows until the log passes its
    range, then stops (complete, exact size); the next segment appears in segments/ and
    tail -F on it follows it in turn."""
    span = int(0.004 * (1 << 20))
    with mounted(small_src, mnt, "-o", "segment_mb=0.004"):
        seg0 = f"{mnt}/segments/{SEG0}"
        c0 = Tail(tmp_path / "c0.out", "-c", "+1", "-f", seg0)
        try:
            assert c0.wait_for(log_bytes(small_src)) == log_bytes(small_src)
            size = os.path.getsize(small_src / "book.log")
            assert size < HEADER_SIZE + span
            n = 11
            while size < HEADER_SIZE + span:  # deeds that start in segment 0
                cp_append(mnt, n, payload(n, 1500), tmp_path)
                size = os.path.getsize(small_src / "book.log")
                assert c0.wait_for(log_bytes(small_src)) == log_bytes(small_src)
                n += 1
            seg0_bytes = log_bytes(small_src)  # segment 0 is complete now
            assert os.listdir(f"{mnt}/segments") == [SEG0]
            cp_append(mnt, n, payload(n, 1500), tmp_path)  # starts segment 1
            name1 = f"{n:012d}"
            assert sorted(os.listdir(f"{mnt}/segments")) == [SEG0, name1]
            seg1 = f"{mnt}/segments/{name1}"
            start1 = HEADER_SIZE + len(seg0_bytes)
            assert open(seg1, "rb").read() == log_bytes(small_src, start1)
            c1 = Tail(tmp_path / "c1.out", "-c", "+1", "-F", seg1)
            try:
                for k in (1, 2):
                    cp_append(mnt, n + k, payload(n + k, 400 * k), tmp_path)
                    want = log_bytes(small_src, start1)
                    assert c1.wait_for(want) == want
                    assert os.stat(seg1).st_size == len(want)
            finally:
                assert c1.stop() == ""
            # it stopped growing: c0 has polled all along since segment 0 was complete,
            # and 2 s more are 10 more of its polls (not WAIT: nothing is expected)
            assert c0.wait_for(seg0_bytes + b"x", wait=2.0) == seg0_bytes
            assert os.stat(seg0).st_size == len(seg0_bytes)
        finally:
            assert c0.stop() == ""


def test_ro_segment_rewritten_under_mount(small_src, mnt):
    """A complete segment is cached for a day; when the writer's log shrinks and is
    re-appended with other bytes (a recovery), a read-only mount serves the new bytes and
    size of that segment, not the kernel's cached ones."""
    span = int(0.004 * (1 << 20))

    def seg0() -> bytes:
        with Book.open(small_src) as book:
            s = Segments(book, span).get(0)
            return log_bytes(small_src, s.start, s.end) if s.complete else b""

    with Book.open(small_src, writable=True) as book:
        cut = book.log_bytes
        book.save(11, [payload(n, 1500) for n in range(11, 15)])
    old = seg0()
    assert old
    with mounted(small_src, mnt, "-o", "ro,segment_mb=0.004"):
        path = f"{mnt}/segments/{SEG0}"
        assert open(path, "rb").read() == old and os.stat(path).st_size == len(old)
        os.truncate(small_src / "book.log", cut)
        with Book.open(small_src, writable=True) as book:
            book.save(11, [payload(n + 100, 1700) for n in range(11, 15)])
        new = seg0()
        assert new and new != old and len(new) != len(old)
        def current() -> bytes | None:
            """The segment's bytes, or None for ESTALE: a name looked up before the daemon
            noticed the replacement still holds the old generation's node ID until the
            follower drops it, and that node answers ESTALE, never old or mixed bytes
            (docs/architecture.md, "Watching a writer"; a loaded machine widens the window)."""
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                if e.errno != errno.ESTALE:
                    raise
                return None

        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and current() != new:
            time.sleep(0.1)
        assert current() == new
        assert os.stat(path).st_size == len(new)
