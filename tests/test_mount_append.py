"""Appending through new/ on a real mount: the durability contract of DESIGN.md."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bookfs.formats.book import Book
from bookfs.formats.lock import WriterLock
from mounting import noun, octal, proc_gone
from mount_fixtures import (  # noqa: F401  (fixtures)
    daemon_pid,
    engine_events,
    force_unmount,
    in_mountinfo,
    mnt,
    mounted,
    payload,
    sh,
    small_src,
    wait_for,
)

W = os.O_WRONLY | os.O_CREAT


def append(m, n: int, data: bytes) -> None:
    fd = os.open(f"{m}/new/{n}", W)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    return not proc_gone(pid)


def test_sequential_appends_with_tools(small_src, mnt, tmp_path):
    before = engine_events(small_src)
    want = dict(before)
    with mounted(small_src, mnt):
        f = tmp_path / "p"
        # cp
        f.write_bytes(want.setdefault(11, payload(11, 1000)))
        assert sh(f"cp {f} {mnt}/new/11").returncode == 0
        assert open(f"{mnt}/events/11", "rb").read() == want[11]
        # dd with an odd block size
        f.write_bytes(want.setdefault(12, payload(12, 10_007)))
        r = sh(f"dd if={f} of={mnt}/new/12 bs=7 status=none")
        assert r.returncode == 0, r.stderr
        assert open(f"{mnt}/events/000000000012", "rb").read() == want[12]
        # shell redirection (open, dup2, close: an early flush that must not commit)
        want[13] = noun(b"\x01\x02\x03\x04hello\n")
        assert sh(f"printf '{octal(want[13])}' > {mnt}/new/13").returncode == 0
        assert open(f"{mnt}/events/13", "rb").read() == want[13]
        # python, offsets out of order (last chunk first, a hole filled later)
        want[14] = payload(14, 3 * 4096 + 5)
        fd = os.open(f"{mnt}/new/14", W)
        for off in (2 * 4096, 0, 3 * 4096, 4096):
            os.pwrite(fd, want[14][off: off + 4096], off)
        os.close(fd)
        assert open(f"{mnt}/events/14", "rb").read() == want[14]
        # padded name; a large one (spills to disk in the daemon)
        want[15] = payload(15, 3 << 20)
        append(mnt, "000000000015", want[15])
        assert os.path.getsize(f"{mnt}/events/15") == len(want[15])
        assert sh(f"sha256sum < {mnt}/events/15").stdout == sh(
            "sha256sum", input=want[15]).stdout
        assert "last:     15" in open(f"{mnt}/info").read()
        assert sorted(os.listdir(f"{mnt}/events"))[-1] == "000000000015"
        assert os.stat(f"{mnt}/events/15").st_ino == 2**63 + 15
    assert engine_events(small_src) == want


def test_group_commit_reverse_close(small_src, mnt, tmp_path):
    """8 writers reserve 11..18 in order; 12..18 close first (and wait for 11); 11 closes
    last and commits all 8 in one save."""
    logf = tmp_path / "d.log"
    want = {n: payload(n, 100 + n) for n in range(11, 19)}
    with mounted(small_src, mnt, log_file=str(logf)):
        fds = {n: os.open(f"{mnt}/new/{n}", W) for n in want}
        for n, fd in fds.items():
            os.write(fd, want[n])
        results: dict[int, object] = {}

        def close(n):
            try:
                os.close(fds[n])
                results[n] = 0
            except OSError as e:
                results[n] = e.errno

        threads = [threading.Thread(target=close, args=(n,)) for n in range(18, 11, -1)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert not results  # nobody returned: they wait for their predecessor 11
        assert not os.path.exists(f"{mnt}/events/12")  # nothing visible early
        close(11)
        for t in threads:
            t.join(10)
        assert results == {n: 0 for n in want}
        for n, data in want.items():
            assert open(f"{mnt}/events/{n}", "rb").read() == data
    assert "group commit: events 11..18 in one save" in logf.read_text()
    got = engine_events(small_src)
    assert {n: got[n] for n in want} == want and max(got) == 18


def test_concurrent_writers_processes(small_src, mnt, tmp_path):
    """12 writer processes each hold the next number, write concurrently, close at once."""
    logf = tmp_path / "d.log"
    k = 12
    script = (
        "import os, sys\n"
        "path, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
        "import random\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "from mounting import noun_payload\n"
        "data = noun_payload(random.Random(n * 7919 + size).randbytes(size))\n"
        "fd = os.open(path, os.O_WRONLY | os.O_CREAT)\n"
        "print('open', flush=True)\n"
        "sys.stdin.readline()\n"
        "for off in range(0, size, 1000):\n"
        "    os.pwrite(fd, data[off:off + 1000], off)\n"
        "try:\n"
        "    os.close(fd)\n"
        "    print('ok', flush=True)\n"
        "except OSError as e:\n"
        "    print('err', e.errno, flush=True)\n"
    )
    sizes = {n: 5000 + 37 * n for n in range(11, 11 + k)}
    with mounted(small_src, mnt, log_file=str(logf)):
        procs = {}
        for n in sizes:  # reserve in order
            p = subprocess.Popen([sys.executable, "-c", script, f"{mnt}/new/{n}", str(n),
                                  str(sizes[n])], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline() == "open\n"
            procs[n] = p
        for p in procs.values():  # go
            p.stdin.write("\n")
            p.stdin.flush()
        outs = {n: p.communicate(timeout=30)[0].strip() for n, p in procs.items()}
        assert outs == {n: "ok" for n in sizes}
        for n, size in sizes.items():
            assert open(f"{mnt}/events/{n}", "rb").read() == payload(n, size)
    got = engine_events(small_src)
    assert max(got) == 10 + k
    assert all(got[n] == payload(n, s) for n, s in sizes.items())


KILLED_WRITER = (
    "import os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
    "os.write(fd, b'x' * int(sys.argv[2]))\n"
    "print('written', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize("written", [2, 100])
def test_writer_killed_mid_write(small_src, mnt, tmp_path, written):
    logf = tmp_path / "d.log"
    before = (small_src / "book.log").read_bytes()
    with mounted(small_src, mnt, log_file=str(logf)):
        p = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, f"{mnt}/new/11",
                              str(written)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "written\n"
        assert os.path.exists(f"{mnt}/events/11") is False
        p.kill()
        p.wait(10)
        # the number frees up once the kernel has closed the killed writer's file
        assert wait_for(lambda: _try_commit(mnt, 11, noun(b"good event")), timeout=5)
        assert open(f"{mnt}/events/11", "rb").read() == noun(b"good event")
        text = logf.read_text()
    assert "new/11 abandoned" in text or "expected at least 4" in text, text
    after = (small_src / "book.log").read_bytes()
    assert after[: len(before)] == before and len(after) == len(before) + 20 + len(
        noun(b"good event"))
    assert engine_events(small_src)[11] == noun(b"good event")


def _try_commit(m, n, data) -> bool:
    try:
        append(m, n, data)
        return True
    except OSError as e:
        assert e.errno == errno.EEXIST  # still held by the dying writer
        return False


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_stalled_predecessor_etimedout(small_src, mnt, tmp_path):
    logf = tmp_path / "d.log"
    with mounted(small_src, mnt, "-o", "stall_timeout=2", log_file=str(logf)):
        stalled = os.open(f"{mnt}/new/11", W)
        os.write(stalled, noun(b"slow"))
        fd = os.open(f"{mnt}/new/12", W)
        os.write(fd, noun(b"fast one"))
        t0 = time.monotonic()
        with pytest.raises(OSError) as ei:
            os.close(fd)
        waited = time.monotonic() - t0
        assert ei.value.errno == errno.ETIMEDOUT
        assert 1.5 <= waited <= 6, waited
        assert not os.path.exists(f"{mnt}/events/12")
        # 12 is free again (11 still in flight); the stalled writer can still finish
        fd = os.open(f"{mnt}/new/12", W)
        os.write(fd, noun(b"second try"))
        os.close(stalled)
        os.close(fd)
        assert open(f"{mnt}/events/11", "rb").read() == noun(b"slow")
        assert open(f"{mnt}/events/12", "rb").read() == noun(b"second try")
    assert "still being written" in logf.read_text()
    got = engine_events(small_src)
    assert got[11] == noun(b"slow") and got[12] == noun(b"second try") and max(got) == 12


def test_daemon_sigkill_mid_commit(small_src, mnt, tmp_path):
    """Writers append in a loop; the daemon is killed with SIGKILL.  Every acknowledged
    event survives with exact bytes; the only others are in-flight ones, with exact bytes."""
    base = engine_events(small_src)
    acked: dict[int, bytes] = {}
    attempted: dict[int, bytes] = {}
    lock = threading.Lock()
    counter = [11]
    stop = threading.Event()

    def writer(w):
        while not stop.is_set():
            with lock:  # reserve the next number (creates must come in order)
                n = counter[0]
                data = payload(n, 50 + (n * 131) % 20000)
                try:
                    fd = os.open(f"{mnt}/new/{n}", W)
                except OSError:
                    return
                counter[0] += 1
                attempted[n] = data
            try:
                os.write(fd, data)
                os.close(fd)
            except OSError:
                return
            with lock:
                acked[n] = data

    with mounted(small_src, mnt):
        pid = daemon_pid(str(mnt))
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        assert wait_for(lambda: len(acked) >= 150, timeout=20)
        os.kill(pid, signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join(20)
            assert not t.is_alive()
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        force_unmount(str(mnt))
        assert wait_for(lambda: not WriterLock.is_held(str(small_src / "book.lock")), 10)
    assert len(acked) >= 150
    with mounted(small_src, mnt, "-o", "ro"):  # and through a fresh mount
        names = sorted(os.listdir(f"{mnt}/events"))
        for n, data in acked.items():
            assert open(f"{mnt}/events/{n}", "rb").read() == data
    got = engine_events(small_src)  # a writable open would also recover; read-only here
    assert sorted(got) == list(range(1, max(got) + 1))
    assert len(names) == len(got)
    for n, data in got.items():
        if n <= 10:
            assert data == base[n]
        else:
            assert data == attempted[n], n  # acknowledged or in flight, never garbage
    assert set(acked) <= set(got)
    in_flight = set(attempted) - set(acked)
    assert set(got) - set(base) - set(acked) <= in_flight
    size_before = (small_src / "book.log").stat().st_size
    with Book.open(small_src, writable=True) as book:
        # SIGKILL can cut the daemon's own pwrite of an unacknowledged deed short: the
        # kernel copies a buffered write page by page and stops at a pending fatal
        # signal, returning what it wrote (mm/filemap.c, generic_perform_write():
        # "if (fatal_signal_pending(current)) { status = -EINTR; break; }"). Recovery may
        # therefore cut one torn final deed, and nothing else: no quarantine, no bad
        # region, and every event seen read-only (every acknowledged one) stays.
        report = book.recovery
        assert not report.quarantined and report.bad_region is None, report
        if report.torn_tail is not None:
            offset, length = report.torn_tail
            assert offset + length == size_before, report
        assert book.count == len(got)
        for n, data in got.items():
            assert book.read(n) == data


def test_sigterm_unmounts_and_releases_lock(small_src, mnt, tmp_path):
    with mounted(small_src, mnt):
        pid = daemon_pid(str(mnt))
        append(mnt, 11, noun(b"before term"))
        os.kill(pid, signal.SIGTERM)
        assert wait_for(lambda: not os.path.ismount(mnt), timeout=10)
        assert wait_for(lambda: not pid_alive(pid), timeout=10)
        assert not WriterLock.is_held(str(small_src / "book.lock"))
    with mounted(small_src, mnt):  # a new read-write mount succeeds
        append(mnt, 12, noun(b"after term"))
        assert open(f"{mnt}/events/11", "rb").read() == noun(b"before term")
    got = engine_events(small_src)
    assert got[11] == noun(b"before term") and got[12] == noun(b"after term")


def test_sigkill_leaves_no_dead_mount(small_src, mnt):
    """A SIGKILLed daemon leaves no mount behind: its watchdog (and libfuse's auto_unmount
    helper) unmount it, nothing hangs, the lock is released, and a remount works."""
    for _ in range(3):  # libfuse's helper alone failed about one time in three
        with mounted(small_src, mnt):
            pid = daemon_pid(str(mnt))
            assert os.listdir(f"{mnt}/events")
            os.kill(pid, signal.SIGKILL)
            assert wait_for(lambda: not pid_alive(pid), timeout=10)
            assert wait_for(lambda: not in_mountinfo(mnt), timeout=5)
            r = subprocess.run(["ls", str(mnt)], capture_output=True, timeout=10)
            assert r.returncode == 0 and r.stdout == b""  # the empty mount point directory
            assert wait_for(lambda: not WriterLock.is_held(str(small_src / "book.lock")), 10)
    with mounted(small_src, mnt):
        assert len(os.listdir(f"{mnt}/events")) == 10
