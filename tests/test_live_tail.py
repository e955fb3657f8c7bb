"""A live tail (issue 23.5): ``follow/N`` and ``follow/next`` wait for the event to be
committed, ``bookfs show --follow`` prints events as they commit, and a read-only mount
of a pier goes on across a roll.  Every test has a concurrent writer (a thread appending
through a read-write mount's ``new/``, or writing the log directly as a ship would) and
reads through real shell tools or the CLI."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time

from bookfs.formats.book import Book
from bookfs.formats.pier import Pier
from lmdb_fixtures import make_pier, make_vere_epoch, meta_values, payloads
from mount_fixtures import daemon_pid, mounted, payload, small_src, wait_for  # noqa: F401
from mounting import BOOKFS, in_mountinfo, proc_gone, run_bookfs, where_stuck


def later(delay: float, fn, *args) -> threading.Thread:
    """Run ``fn(*args)`` in a thread after ``delay`` seconds (the concurrent writer)."""
    def run():
        time.sleep(delay)
        fn(*args)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def append_new(m, event: int, data: bytes) -> None:
    """Append through a read-write mount's new/ (the close commits)."""
    with open(f"{m}/new/{event}", "wb") as f:
        f.write(data)


def timed(fn, *args, **kw):
    """``(fn(*args, **kw) or the OSError it raised, seconds it took)``."""
    t = time.monotonic()
    try:
        return fn(*args, **kw), time.monotonic() - t
    except OSError as e:
        return e, time.monotonic() - t


def test_follow_n_waits_for_a_concurrent_writer(small_src, tmp_path):
    """cat follow/11 blocks until a writer commits event 11 through new/, then prints its
    bytes; follow/11 is events/11's inode; a committed number answers at once."""
    data = payload(11, 700)
    with mounted(small_src, tmp_path / "rw") as m:
        later(0.8, append_new, m, 11, data)
        res, took = timed(subprocess.run, ["cat", f"{m}/follow/11"], capture_output=True)
        assert res.returncode == 0 and res.stdout == data
        assert 0.6 < took < 5, took
        assert os.stat(f"{m}/follow/11").st_ino == os.stat(f"{m}/events/11").st_ino
        assert os.stat(f"{m}/follow/000000000011").st_size == 700
        res, took = timed(subprocess.run, ["cat", f"{m}/follow/3"], capture_output=True)
        assert res.stdout == payload(3, 4 + 37 * 3) and took < 0.5


def test_many_waiters_do_not_starve_the_writer(small_src, tmp_path):
    """Forty processes wait on follow/11 at once: reads still answer at once, the append
    of event 11 through new/ (CREATE, WRITE, FLUSH) still commits, and every waiter then
    gets its bytes."""
    data = payload(11, 300)
    with mounted(small_src, tmp_path / "rw") as m:
        cats = [subprocess.Popen(["cat", f"{m}/follow/11"], stdout=subprocess.PIPE)
                for _ in range(40)]
        time.sleep(0.5)
        got, took = timed(lambda: open(f"{m}/events/10", "rb").read())
        assert got == payload(10, 4 + 370) and took < 0.5
        append_new(m, 11, data)
        assert [c.communicate(timeout=10)[0] for c in cats] == [data] * 40


def test_shell_loop_consumes_a_live_log_on_a_read_only_follower(small_src, tmp_path):
    """A read-write mount appends events one by one while a shell loop over a read-only
    mount of the same log reads follow/11, follow/12, ... as each commits."""
    datas = {n: payload(n, 50 + n) for n in range(11, 17)}
    out = tmp_path / "out"
    with mounted(small_src, tmp_path / "rw") as rw, \
            mounted(small_src, tmp_path / "ro", "-o", "ro") as ro:
        def writer():
            for n, d in datas.items():
                time.sleep(0.2)
                append_new(rw, n, d)
        loop = subprocess.Popen(
            ["sh", "-c", f'n=11; while [ $n -le 16 ]; do cat "{ro}/follow/$n" >> "{out}" '
                         '|| exit 1; n=$((n+1)); done'])
        later(0.3, writer)
        assert loop.wait(timeout=20) == 0
        assert out.read_bytes() == b"".join(datas.values())


def test_follow_next_waits_for_the_event_after_the_newest(small_src, tmp_path):
    """follow/next is a symlink whose target is the next event to be committed: read
    twice in a row, it gives two successive events (not the same one, not one skipped)."""
    with mounted(small_src, tmp_path / "ro", "-o", "ro") as m:
        assert os.lstat(f"{m}/follow/next").st_mode & 0o170000 == 0o120000

        def commit(n):
            with Book.open(small_src, writable=True) as book:
                book.save(n, [payload(n, 99)])
        later(0.5, commit, 11)
        target, took = timed(os.readlink, f"{m}/follow/next")
        assert target == "000000000011" and took > 0.3
        later(0.5, commit, 12)
        res, took = timed(subprocess.run, ["cat", f"{m}/follow/next"], capture_output=True)
        assert res.stdout == payload(12, 99) and took > 0.3


def test_timeout_errno_and_existence_checks_never_wait(small_src, tmp_path):
    """follow/N answers ETIMEDOUT after follow_timeout; events/N for a missing N, and a
    follow/ name that can never come, answer ENOENT at once; follow/ lists as empty and a
    walk of the whole mount never waits."""
    with mounted(small_src, tmp_path / "ro", "-o", "ro,follow_timeout=1.5") as m:
        err, took = timed(os.stat, f"{m}/follow/99")
        assert err.errno == errno.ETIMEDOUT and 1.3 < took < 4, (err, took)
        res = subprocess.run(["cat", f"{m}/follow/99"], capture_output=True, text=True)
        assert res.returncode == 1 and "timed out" in res.stderr
        for path in ("events/99", "events/000000000099", "follow/0", "follow/nope"):
            err, took = timed(os.stat, f"{m}/{path}")
            assert err.errno == errno.ENOENT and took < 0.3, (path, err, took)
        res, took = timed(subprocess.run, ["sh", "-c", f"test -e {m}/events/99"])
        assert res.returncode == 1 and took < 0.5
        assert os.listdir(f"{m}/follow") == []
        assert "follow" in os.listdir(m)
        res, took = timed(subprocess.run, ["find", m], capture_output=True, text=True)
        assert res.returncode == 0 and took < 1.5
        assert [p for p in res.stdout.split() if "/follow/" in p] == []
    bad = run_bookfs("mount", str(small_src), str(tmp_path / "x"), "-o",
                     "ro,follow_timeout=0", check=False)
    assert bad.returncode == 2 and "follow_timeout" in bad.stderr


def test_killed_waiter_then_unmount(small_src, tmp_path):
    """A cat killed while it waits ends at the latest when its lookup times out (the
    kernel waits out a request the daemon holds); the mount serves on, and unmounts.  A
    lazy unmount, or SIGTERM to the daemon, while a lookup waits answers it ESHUTDOWN and
    the daemon ends."""
    with mounted(small_src, tmp_path / "ro", "-o", "ro,follow_timeout=2") as m:
        cat = subprocess.Popen(["cat", f"{m}/follow/50"], stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        cat.send_signal(signal.SIGKILL)
        assert cat.wait(timeout=5) == -signal.SIGKILL
        assert open(f"{m}/events/10", "rb").read() == payload(10, 4 + 370)
        assert run_bookfs("umount", m, check=False).returncode == 0
        assert not in_mountinfo(m)
    with mounted(small_src, tmp_path / "ro2", "-o", "ro,follow_timeout=30") as m:
        pid = daemon_pid(m)
        cat = subprocess.Popen(["cat", f"{m}/follow/50"], stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        busy = run_bookfs("umount", m, check=False)
        assert busy.returncode != 0 and "busy" in busy.stderr  # a waiter is inside
        t = time.monotonic()
        assert run_bookfs("umount", "-l", m, check=False).returncode == 0
        assert cat.wait(timeout=10) == 1
        assert "shutdown" in cat.stderr.read()
        assert wait_for(lambda: proc_gone(pid), 10), "the daemon did not end"
        assert time.monotonic() - t < 5
    with mounted(small_src, tmp_path / "ro3", "-o", "ro,follow_timeout=30") as m:
        pid = daemon_pid(m)
        cat = subprocess.Popen(["cat", f"{m}/follow/50"], stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        t = time.monotonic()
        os.kill(pid, signal.SIGTERM)  # the daemon stops: the waiter is answered at once
        assert cat.wait(timeout=10) == 1 and time.monotonic() - t < 5
        assert wait_for(lambda: proc_gone(pid), 10), "the daemon did not end"


def test_ctrl_c_ends_a_waiting_lookup_at_once(small_src, tmp_path):
    """With the patched pyfuse3's ``interrupts``, SIGINT to a process waiting in a
    follow/ lookup (cat follow/N) or readlink (readlink follow/next) ends it at once: the
    kernel's FUSE_INTERRUPT reaches the wait, which answers EINTR, long before the 60 s
    follow_timeout.  The mount serves on."""
    import pyfuse3

    if "interrupts" not in getattr(pyfuse3, "FEATURES", ()):
        import pytest

        pytest.skip("needs pyfuse3 with the interrupts patch (setup.sh)")
    with mounted(small_src, tmp_path / "ro", "-o", "ro,follow_timeout=60") as m:
        for cmd in (["cat", f"{m}/follow/50"], ["readlink", f"{m}/follow/next"]):
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            assert proc.poll() is None, cmd  # waiting
            t = time.monotonic()
            proc.send_signal(signal.SIGINT)
            try:
                assert proc.wait(timeout=30) != 0, cmd
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{cmd} still runs 30 s after its SIGINT:\n"
                                     f"{where_stuck([proc.pid], m)}") from None
            assert time.monotonic() - t < 10, cmd  # not the follow_timeout
        assert open(f"{m}/events/10", "rb").read() == payload(10, 4 + 370)


def test_show_follow_prints_events_as_they_commit(tmp_path):
    """bookfs show --follow MNT prints the events appended while it runs, one by one,
    and Ctrl-C ends it at once with status 130 and no traceback; --follow N..M stops
    after M."""
    src = tmp_path / "src"
    with Book.open(src, writable=True, create=True) as book:
        book.save(1, [payload(n, 40) for n in range(1, 6)])
    with mounted(src, tmp_path / "rw") as rw, \
            mounted(src, tmp_path / "ro", "-o", "ro,follow_timeout=1") as ro:
        show = subprocess.Popen([*BOOKFS, "show", "--follow", ro], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        bounded = subprocess.Popen([*BOOKFS, "show", "--follow", "--json", ro, "4..7"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)  # show has started and waits for event 6
        for n in (6, 7, 8):
            append_new(rw, n, payload(n, 40))
            time.sleep(0.3)
        out, err = bounded.communicate(timeout=15)
        assert bounded.returncode == 0, err
        assert [line.count('"event": ') for line in out.splitlines()] == [1] * 4
        assert [int(line.split('"event": ')[1].split(",")[0]) for line in out.splitlines()
                ] == [4, 5, 6, 7]
        assert wait_for(lambda: os.path.exists(f"{ro}/events/8"))
        time.sleep(0.5)
        t = time.monotonic()
        show.send_signal(signal.SIGINT)
        out, err = show.communicate(timeout=10)
        assert time.monotonic() - t < 3
        assert show.returncode == 130 and "Traceback" not in err, err
        events = [line.split()[1] for line in out.splitlines() if line.startswith("event:")]
        assert events == ["6", "7", "8"]
    assert "--follow" in run_bookfs("show", "--help").stdout
    res = run_bookfs("show", "--follow", str(src), check=False)
    assert res.returncode == 2 and "mount" in res.stderr


def roll(root, last: int, events: list[bytes]) -> None:
    """What a ship does at an upgrade: a new vere-layout epoch ``0i<last>`` (its directory
    first, its files a moment later), then appends there."""
    new = root / ".urb" / "log" / f"0i{last}"
    new.mkdir()  # caught half made, the epoch is taken once it opens
    time.sleep(0.3)
    make_vere_epoch(new, last, [], meta=meta_values())
    (new / "epoc.txt").write_text("3")
    time.sleep(0.3)
    with Pier.open(root, writable=True) as pier:
        pier.save(last + 1, events)


def test_ro_pier_mount_follows_a_roll(tmp_path):
    """A ship rolls to a new epoch while a read-only mount follows it: the events after
    the roll appear under events/ and follow/, epochs/ shows the new epoch, info too."""
    before = payloads(1, 10)
    more = payloads(11, 8)
    root = make_pier(tmp_path / "pier", [("lmdb", before[:5]), ("vere", before[5:])])

    def ship():
        with Pier.open(root, writable=True) as pier:
            pier.save(11, more[:2])
        roll(root, 12, more[2:6])

    with mounted(root, tmp_path / "mnt", "-o", "ro") as m:
        assert sorted(os.listdir(f"{m}/epochs")) == ["0i0", "0i5"]
        later(0.3, ship).join()
        assert wait_for(lambda: os.path.exists(f"{m}/events/16"), 5), "the roll is not followed"
        got = [open(f"{m}/events/{n}", "rb").read() for n in range(1, 17)]
        assert got == before + more[:6]
        assert sorted(os.listdir(f"{m}/epochs")) == ["0i0", "0i12", "0i5"]
        assert len(os.listdir(f"{m}/epochs/0i12/events")) == 4
        assert open(f"{m}/epochs/0i12/events/13", "rb").read() == more[2]
        assert "0i12 vere-book 13..16" in open(f"{m}/info").read()

        def append_more():
            with Pier.open(root, writable=True) as pier:
                pier.save(17, more[6:])
        later(0.5, append_more)  # follow/ waits in the new epoch
        res = subprocess.run(["cat", f"{m}/follow/18"], capture_output=True, timeout=15)
        assert res.returncode == 0 and res.stdout == more[7]


def _waiting_in_the_kernel(proc: subprocess.Popen) -> bool:
    """True once ``proc``'s lookup is in the kernel, waiting for the daemon's answer."""
    try:
        with open(f"/proc/{proc.pid}/stack") as f:
            stack = f.read()
    except OSError:
        return False
    return "fuse_" in stack and "request_wait_answer" in stack


def test_a_waiting_lookup_holds_up_no_other_in_its_directory(small_src, tmp_path):
    """While ``cat follow/11`` waits for event 11, in the kernel, a lookup of another name
    in ``follow/`` (and in ``events/``) is answered at once: the mount runs the lookups
    of one directory in parallel (patched pyfuse3's ``parallel_dirops``: libfuse before
    3.17 never told the kernel it may, and the kernel then serializes them,
    ``fs/fuse/dir.c``, ``fuse_lookup()`` -> ``fuse_lock_inode()``)."""
    data = payload(11, 300)
    with mounted(small_src, tmp_path / "rw") as m:
        waiter = subprocess.Popen(["cat", f"{m}/follow/11"], stdout=subprocess.PIPE)
        try:
            assert wait_for(lambda: _waiting_in_the_kernel(waiter), timeout=20)
            other = subprocess.run(["cat", f"{m}/follow/3"], capture_output=True,
                                   timeout=20)
            assert other.stdout == payload(3, 4 + 37 * 3)
            assert waiter.poll() is None, "the waiting lookup ended before the other"
            assert os.stat(f"{m}/follow/000000000004").st_size == 4 + 37 * 4
            assert waiter.poll() is None
        finally:
            append_new(m, 11, data)
            assert waiter.communicate(timeout=20)[0] == data
