"""Adversarial tests through real mounts (issue 9): what a hostile user, a sloppy shell
script or a busy multi-process writer does to ``new/``, ``meta/`` and the read path.

Each test names the finding it guards.  Every one failed on the code before the fix.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from mounting import noun, octal, proc_status_kib
from mount_fixtures import (  # noqa: F401  (fixtures)
    err_of,
    daemon_pid,
    engine_events,
    log_state,
    mnt,
    mounted,
    payload,
    run_bookfs,
    sh,
    small_src,
    threaded_appends,
    wait_for,
)

W = os.O_WRONLY | os.O_CREAT
NEXT = 11  # small_src holds events 1..10


def read_event(m, n: int) -> bytes:
    with open(f"{m}/events/{n}", "rb") as f:
        return f.read()


def committed(src) -> dict[int, bytes]:
    return engine_events(src)


# --- 1. commits only on the last close --------------------------------------------------


def test_subprocess_between_writes_does_not_commit(small_src, mnt):
    """Python: write part 1, subprocess.run(['true']), write part 2, close."""
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        event = noun(b"part-one;part-two")
        os.write(fd, event[:-8])
        subprocess.run(["true"], check=True)  # its exec closes a copy: a FLUSH
        assert os.write(fd, event[-8:]) == 8
        assert not os.path.exists(f"{mnt}/events/{NEXT}")
        os.close(fd)
        assert read_event(mnt, NEXT) == event


def test_dup_close_and_fork_exit_do_not_commit(small_src, mnt):
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        event = noun(b"ABCDE")  # written as its head, then its last four bytes one by one
        os.write(fd, event[:-4])
        os.close(os.dup(fd))  # the close of a dup
        os.write(fd, event[-4:-3])
        pid = os.fork()
        if pid == 0:  # a forked child that exits (its descriptors close)
            os._exit(0)
        os.waitpid(pid, 0)
        os.write(fd, event[-3:-2])
        pid = os.fork()
        if pid == 0:  # a child that writes its part and exits normally
            os.write(fd, event[-2:-1])
            os._exit(0)
        os.waitpid(pid, 0)
        os.write(fd, event[-1:])
        assert not os.path.exists(f"{mnt}/events/{NEXT}")
        os.close(fd)
        assert read_event(mnt, NEXT) == event


#: what the shell commands write (a mug and a noun), in pieces: printf escapes
SHELL_EVENT = noun(b"AAAABBBB")
_A, _AA, _B = (octal(SHELL_EVENT[:8]), octal(SHELL_EVENT[:6]), octal(SHELL_EVENT[8:]))
_AA2 = octal(SHELL_EVENT[6:8])


@pytest.mark.parametrize("script", [
    f"{{{{ /usr/bin/printf '{_A}'; /usr/bin/printf '{_B}'; }}}} > {{f}}",
    f"( /usr/bin/printf '{_A}'; /usr/bin/printf '{_B}' ) > {{f}}",
    f"exec 3> {{f}}; /usr/bin/printf '{_A}' >&3; /usr/bin/printf '{_B}' >&3; exec 3>&-",
    f"{{{{ printf '{_A}'; sh -c \"printf '{_B}'\"; }}}} > {{f}}",  # builtin first
    f"{{{{ printf '{_AA}'; (sleep 0.3; printf '{_AA2}') & printf ''; wait; "
    f"printf '{_B}'; }}}} > {{f}}",
])
def test_shell_compound_commands(small_src, mnt, tmp_path, script):
    """Shell compound commands fork, exec and dup2 around one open file."""
    with mounted(small_src, mnt):
        f = f"{mnt}/new/{NEXT}"
        cmd = script.format(f=f)
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        want = SHELL_EVENT
        assert read_event(mnt, NEXT) == want


def test_a_child_that_outlives_the_writer_fails_loudly(small_src, mnt):
    """The shell (the writer) closes while a background child still holds its stdout: the
    shell's close commits what was written by then, and the child's later write fails
    loudly (EBADF) instead of growing a committed event (issue 18's rule: the kernel does
    not say that a forked child still holds a copy)."""
    with mounted(small_src, mnt):
        f = f"{mnt}/new/{NEXT}"
        r = subprocess.run(["bash", "-c", f"{{ printf '{octal(noun(b'A'))}'; "
                                          f"(sleep 0.5; printf B) & }} > {f}"],
                           capture_output=True, timeout=30)  # waits for the child's stderr
        assert r.returncode == 0
        assert b"Bad file descriptor" in r.stderr
        assert read_event(mnt, NEXT) == noun(b"A")


def test_a_copy_killed_after_the_writer_closed_changes_nothing(small_src, mnt):
    """A child that inherited the descriptor outlives the writer's close and is killed by
    a signal: the writer's close committed the event, and the copy's death changes
    nothing."""
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        os.set_inheritable(fd, True)  # meant for the child, as a shell's redirection is
        os.write(fd, noun(b"\0\0\0\0written"))
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        os.close(fd)  # the writer's last close: committed
        assert read_event(mnt, NEXT) == noun(b"\0\0\0\0written")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        time.sleep(0.3)
        assert read_event(mnt, NEXT) == noun(b"\0\0\0\0written")
        assert not os.path.exists(f"{mnt}/events/{NEXT + 1}")


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_a_stray_fork_copy_does_not_hold_up_the_writer(small_src, mnt):
    """A process forked while the file was open (an O_CLOEXEC copy it never execs away)
    outlives the writer's close: the writer's close commits and returns 0 at once; a write
    through the copy afterwards fails with EBADF and changes nothing."""
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        os.write(fd, noun(b"\0\0\0\0data"))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # until the writer has closed
            os._exit(err_of(os.write, fd, b"more") or 0)
        os.close(r)
        t0 = time.monotonic()
        os.close(fd)
        assert time.monotonic() - t0 < 2
        assert read_event(mnt, NEXT) == noun(b"\0\0\0\0data")
        os.close(w)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == errno.EBADF
        assert read_event(mnt, NEXT) == noun(b"\0\0\0\0data")


def test_threads_forking_while_others_close(small_src, mnt):
    """Many threads append while others fork and exec: every close that returns 0 has
    committed its event whole (the copies forks make never turn a writer's close into
    an early acknowledgement)."""
    stop = threading.Event()

    def spawner():
        while not stop.is_set():
            subprocess.run(["true"])

    with mounted(small_src, mnt, log_file=str(mnt.parent / "daemon.log")):
        spawners = [threading.Thread(target=spawner) for _ in range(2)]
        for t in spawners:
            t.start()
        # 5 bytes at least: a mug and a noun
        acked, failed = threaded_appends(mnt, NEXT, 3, 15, lambda n: 5 + (n % 7) * 3000, 100)
        stop.set()
        for t in spawners:
            t.join()
    got = committed(small_src)
    assert not failed, (failed, (mnt.parent / "daemon.log").read_text()[-3000:])
    assert len(acked) == 45 and all(got.get(n) == data for n, data in acked.items())


def test_big_writes_while_another_thread_spawns(small_src, mnt):
    """The data-loss finding: one thread writes 8-24 MB events (spilled to disk) in
    pieces while another spawns processes.  Every acknowledged event must be stored whole,
    with a length field that matches its bytes."""
    stop = threading.Event()

    def spawner():
        while not stop.is_set():
            subprocess.run(["true"])

    sizes = [8 << 20, 24 << 20, 9 << 20 | 12345]
    with mounted(small_src, mnt):
        t = threading.Thread(target=spawner)
        t.start()
        try:
            for k, size in enumerate(sizes):
                data = payload(NEXT + k, size)
                fd = os.open(f"{mnt}/new/{NEXT + k}", W)
                view = memoryview(data)
                for off in range(0, size, 1 << 20):
                    os.write(fd, view[off : off + (1 << 20)])
                os.close(fd)
        finally:
            stop.set()
            t.join()
        for k, size in enumerate(sizes):
            assert os.stat(f"{mnt}/events/{NEXT + k}").st_size == size
    with Book.open(small_src) as book:  # the engine's own check (CRC and framing)
        book.verify()
        for k, size in enumerate(sizes):
            assert book.read(NEXT + k) == payload(NEXT + k, size)


# --- 2. a failed write poisons the reservation -------------------------------------------


@pytest.mark.parametrize("offset", [2**32, 2**40, 2**62])
def test_efbig_write_poisons(small_src, mnt, offset):
    before = log_state(small_src)
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        os.write(fd, b"\0\0\0\0good bytes")
        assert err_of(os.pwrite, fd, b"x", offset) == errno.EFBIG
        assert err_of(os.close, fd) == errno.EFBIG
        assert not os.path.exists(f"{mnt}/events/{NEXT}")
    assert log_state(small_src) == before


def test_ftruncate_past_the_limit_poisons(small_src, mnt):
    before = log_state(small_src)
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        os.write(fd, b"\0\0\0\0good bytes")
        assert err_of(os.ftruncate, fd, 2**33) == errno.EFBIG
        assert err_of(os.close, fd) == errno.EFBIG
    assert log_state(small_src) == before


@pytest.fixture
def tiny_tmp(tmp_path):
    """A 2 MiB tmpfs, for the daemon's staging files (ENOSPC while staging)."""
    d = tmp_path / "tiny"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield d
    subprocess.run(["umount", "-l", str(d)])


def test_enospc_while_staging_poisons(small_src, mnt, tiny_tmp, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tiny_tmp))
    before = log_state(small_src)
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        data = payload(NEXT, 4 << 20)
        got = None
        for off in range(0, len(data), 1 << 20):
            got = err_of(os.pwrite, fd, data[off : off + (1 << 20)], off)
            if got:
                break
        assert got == errno.ENOSPC
        assert err_of(os.close, fd) == errno.ENOSPC
        assert not os.path.exists(f"{mnt}/events/{NEXT}")
    assert log_state(small_src) == before


# --- 5 and 12. inodes and extreme event numbers ------------------------------------------


@pytest.mark.parametrize("first", [2**40 - 2**32, 2**48, 2**63 - 2, 2**63 + 1, 2**64 - 4])
def test_extreme_first_events_serve_their_payloads(make_book, mnt, first):
    """A log whose first event sits where event inodes once met segment (2^40) or staging
    (2^48) inodes, or past 2^63 (readdir cookies), serves each event's own bytes."""
    src = make_book([payload(first, 40), payload(first + 1, 41), payload(first + 2, 42)],
                    epoch=first - 1)
    with mounted(src, mnt, "-o", "ro"):
        names = sorted(os.listdir(f"{mnt}/events"))
        assert names == [str(first + k) for k in range(3)]
        inodes = set()
        for k in range(3):
            assert read_event(mnt, first + k) == payload(first + k, 40 + k)
            inodes.add(os.stat(f"{mnt}/events/{first + k}").st_ino)
        seg = os.listdir(f"{mnt}/segments")
        inodes |= {os.stat(f"{mnt}/segments/{s}").st_ino for s in seg}
        assert len(inodes) == 3 + len(seg)
        r = sh(f"ls -l {mnt}/events")
        assert r.returncode == 0 and not r.stderr


# --- 6. stale bytes after a recovery -----------------------------------------------------


def test_follower_never_serves_bytes_of_a_rolled_back_log(make_book, mnt):
    """The writer's log shrinks (a recovery cut) and events are re-appended under the same
    numbers with other bytes: a read-only mount serves the new bytes, not cached ones."""
    src = make_book([payload(n, 100 + n) for n in range(1, 41)])
    with mounted(src, mnt, "-o", "ro"):
        old = {n: read_event(mnt, n) for n in (25, 30, 40)}
        assert old[25] == payload(25, 125)
        with Book.open(src) as book:
            cut = book.index.offsets[24 - book.first + 1]  # end of event 24's deed
        os.truncate(src / "book.log", cut)
        with Book.open(src, writable=True) as book:
            book.save(25, [b"\0\0\0\0new-" + str(n).encode() for n in range(25, 41)])
        want = {n: b"\0\0\0\0new-" + str(n).encode() for n in (25, 30, 40)}
        assert wait_for(lambda: all(read_event(mnt, n) == want[n] for n in want), timeout=10)
        assert os.stat(f"{mnt}/events/30").st_size == len(want[30])


# --- 8. meta partial writes, truncate, utime ---------------------------------------------


def test_meta_partial_write_keeps_untouched_bytes(small_src, mnt):
    with mounted(small_src, mnt):
        who = read_meta = open(f"{mnt}/meta/who", "rb").read()
        assert len(who) == 16
        fd = os.open(f"{mnt}/meta/who", os.O_WRONLY)
        os.pwrite(fd, b"\xaa" * 8, 8)
        os.close(fd)
        assert open(f"{mnt}/meta/who", "rb").read() == read_meta[:8] + b"\xaa" * 8
    with Book.open(small_src) as book:
        assert book.read_meta("who") == who[:8] + b"\xaa" * 8


def test_meta_truncate_and_utime_are_refused(small_src, mnt):
    before = log_state(small_src)
    with mounted(small_src, mnt):
        life = f"{mnt}/meta/life"
        fd = os.open(life, os.O_WRONLY | os.O_TRUNC)  # O_TRUNC and nothing written
        assert err_of(os.close, fd) == errno.EINVAL
        assert err_of(os.truncate, life, 0) == errno.EINVAL
        assert err_of(os.truncate, life, 9) == errno.EINVAL
        assert err_of(os.utime, life, (1, 1)) == errno.EPERM
        r = sh(f": > {life}")  # bash ignores close() errors; the field must not change
        assert r.returncode == 0
        fd = os.open(life, os.O_WRONLY)
        assert err_of(os.ftruncate, fd, 2) is None  # judged at close
        assert err_of(os.close, fd) == errno.EINVAL
    assert log_state(small_src) == before


# --- 9. permissions ----------------------------------------------------------------------


def _as_nobody(cmd: str) -> subprocess.CompletedProcess:
    """Run a shell command line as the unprivileged user nobody."""
    def drop():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    return subprocess.run(["/bin/bash", "-c", cmd], preexec_fn=drop, capture_output=True,
                          text=True, timeout=30, cwd="/")


@pytest.fixture
def open_place():
    """A directory every user can reach (pytest's tmp dirs are root-only)."""
    d = Path(f"/tmp/bookfs-perm-{os.getpid()}")
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(d, 0o755)
    yield d
    subprocess.run(["fusermount3", "-u", "-z", str(d / "mnt")], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("dir_mode,log_mode,can_read", [(0o700, 0o644, False),
                                                        (0o755, 0o600, False),
                                                        (0o755, 0o644, True)])
def test_only_writers_of_the_log_may_append(small_src, open_place, dir_mode, log_mode,
                                            can_read):
    src = open_place / "src"
    shutil.copytree(small_src, src)
    os.chmod(src, dir_mode)
    os.chmod(src / "book.log", log_mode)
    m = open_place / "mnt"
    m.mkdir()
    with mounted(src, m, "-o", "allow_other"):
        assert stat.S_IMODE(os.stat(m / "new").st_mode) & 0o022 == 0
        r = _as_nobody(f"printf '\\0\\0\\0\\0evil' > {m}/new/{NEXT}")
        assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
        r = _as_nobody(f"printf '\\1\\1\\1\\1' 1<> {m}/meta/life")
        assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
        r = _as_nobody(f"cat {m}/events/1 > /dev/null")
        assert (r.returncode == 0) == can_read, r.stderr
    assert not (src / "book.log").read_bytes().endswith(b"evil") and NEXT not in committed(src)


# --- 10. a mount point inside the source -------------------------------------------------


def test_mountpoint_inside_the_source_is_refused(small_src, tmp_path):
    (small_src / "sub").mkdir()
    for where in (small_src, small_src / "sub"):
        t = time.monotonic()
        r = run_bookfs("mount", str(small_src), str(where), check=False, timeout=30)
        assert r.returncode != 0 and "inside the source" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert time.monotonic() - t < 10
        assert not os.path.ismount(where)


# --- 11. memory ---------------------------------------------------------------------------


def _rss(pid: int) -> int:
    return proc_status_kib(pid, "VmRSS") * 1024


def _peak_rss(pid: int) -> int:
    """The daemon's peak resident memory so far (VmHWM), in bytes."""
    return proc_status_kib(pid, "VmHWM") * 1024


def test_truncating_a_new_file_to_1gib_costs_no_memory(small_src, mnt):
    with mounted(small_src, mnt):
        pid = daemon_pid(mnt)
        base = _peak_rss(pid)
        fd = os.open(f"{mnt}/new/{NEXT}", W)
        head = noun(b"head")  # an event: a mug and a noun
        os.write(fd, head)
        os.ftruncate(fd, 1 << 30)
        os.pwrite(fd, b"\0\0\0\0end", (1 << 30) - 7)
        assert _peak_rss(pid) - base < 64 << 20
        os.ftruncate(fd, len(head))
        os.close(fd)
        assert read_event(mnt, NEXT) == head


def test_many_handles_on_one_event_share_one_copy(make_book, mnt):
    src = make_book([payload(n, 125_000) for n in range(1, 4)])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 20000), max(hard, 20000)))
    fds = []
    try:
        with mounted(src, mnt, "-o", "ro"):
            pid = daemon_pid(mnt)
            base = _rss(pid)
            for _ in range(8000):
                fds.append(os.open(f"{mnt}/events/2", os.O_RDONLY))
            assert os.pread(fds[-1], 10, 0) == payload(2, 125_000)[:10]
            grown = _rss(pid) - base
            for fd in fds:
                os.close(fd)
            fds = []
            assert grown < 200 << 20, f"daemon grew {grown >> 20} MiB for 8000 handles"
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- 12. smaller defects ------------------------------------------------------------------


def test_sigterm_unmounts_promptly_with_a_stalled_writer(small_src, mnt):
    """A writer waits on a predecessor that is still open; SIGTERM must still unmount
    within seconds (the stall timeout is 30 s), and the waiting close fails."""
    with mounted(small_src, mnt):
        pid = daemon_pid(mnt)
        stalled = os.open(f"{mnt}/new/{NEXT}", W)
        result = {}

        def waiter():
            fd = os.open(f"{mnt}/new/{NEXT + 1}", W)
            os.write(fd, noun(b"\0\0\0\0next"))
            result["err"] = err_of(os.close, fd)

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.5)
        start = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        t.join(timeout=15)
        assert not t.is_alive() and result["err"] is not None
        assert wait_for(lambda: str(mnt) not in open("/proc/self/mountinfo").read(), 10)
        assert time.monotonic() - start < 10
        err_of(os.close, stalled)
    assert NEXT + 1 not in committed(small_src)


def test_daemon_log_is_private_and_never_follows_a_symlink(small_src, mnt, tmp_path,
                                                           monkeypatch):
    logs = tmp_path / "logs"
    monkeypatch.setenv("BOOKFS_LOG_DIR", str(logs))
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = tmp_path / "planted.log"
    planted.symlink_to(victim)
    r = run_bookfs("mount", str(small_src), str(mnt), "--log-file", str(planted), check=False)
    assert r.returncode != 0 and "symlink" in r.stderr
    assert victim.read_text() == "precious\n"
    with mounted(small_src, mnt):
        files = list(logs.iterdir())
        assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
        assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    os.chmod(logs, 0o777)  # a log directory others may write to is refused
    r = run_bookfs("mount", str(small_src), str(mnt), check=False)
    assert r.returncode != 0 and "not writable by others" in r.stderr
