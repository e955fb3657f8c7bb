"""bookfs.fs.holders on real processes and real descriptors (no mount needed: a scan only
reads ``/proc``, so a plain file, a FIFO and forked children show every case).

The mount-level behaviour (dup, fork, exec, kill around ``new/N``) is tested through real
mounts in test_mount_append.py and test_adversarial_mount.py; these tests pin the cheap
paths the scan takes on every append (issue 12) to the answers of the full scan."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from bookfs.fs import holders as H


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "new-5"
    path.write_bytes(b"")
    return str(path), os.stat(path).st_ino


def test_creator_holds_until_its_close(target):
    path, ino = target
    fd = os.open(path, os.O_WRONLY)
    scan = H.HolderScan(path, ino, threading.get_native_id())
    try:
        assert scan.creator == os.getpid()
        found, killed = scan.holders()
        assert found == {os.getpid(): H.HELD} and not killed
        assert scan.fds == {fd}
    finally:
        os.close(fd)
    assert scan.holders() == ({}, False)


def test_a_read_only_descriptor_or_another_file_is_not_a_holder(target, tmp_path):
    path, ino = target
    other = tmp_path / "new-6"
    other.write_bytes(b"")
    fds = [os.open(path, os.O_RDONLY), os.open(other, os.O_WRONLY)]
    try:
        assert H.HolderScan(path, ino, os.getpid()).holders() == ({}, False)
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("cloexec, expected", [(False, H.HELD), (True, H.TRANSIENT)])
def test_a_forked_child_holds_a_copy(target, cloexec, expected):
    """A child started after the create is a candidate (its PID is above the create's
    last PID); an O_CLOEXEC copy is transient, a plain one held."""
    path, ino = target
    scan = H.HolderScan(path, ino, os.getpid())
    fd = os.open(path, os.O_WRONLY)  # Python opens with O_CLOEXEC (PEP 446)
    os.set_inheritable(fd, not cloexec)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: keep the copy until told to go
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    try:
        os.close(r)
        os.close(fd)  # the creator's own close: the child's copy remains
        found, killed = scan.holders()
        assert found == {pid: expected} and not killed
    finally:
        os.close(w)
        os.waitpid(pid, 0)
    assert scan.holders() == ({}, False)


def test_a_writer_killed_by_a_signal_is_told_from_one_that_closed(target):
    """The last holder exiting because SIGKILL hit it: ``killed``.  Its table is gone, so
    the cheap check (a live table means no kill) does not hide it."""
    path, ino = target
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        fd = os.open(path, os.O_WRONLY)
        os.write(w, b"%d" % fd)
        time.sleep(60)
        os._exit(0)
    os.close(w)
    os.read(r, 16)
    os.close(r)
    scan = H.HolderScan(path, ino, pid)
    assert scan.holders() == ({pid: H.HELD}, False)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a zombie until reaped: its stat says killed
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    try:
        assert scan.holders() == ({}, True)
    finally:
        os.waitpid(pid, 0)


def test_note_creator_fds_reads_the_writing_descriptor_from_the_syscall(tmp_path,
                                                                      monkeypatch):
    """The creating thread blocked in ``write`` (a full FIFO stands in for a FUSE WRITE
    being answered): its descriptor is found without scanning the whole table."""
    if H._WRITERS is None:
        pytest.skip("no syscall table for this machine")
    fifo = str(tmp_path / "new-7")
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        while True:  # fill the pipe, so the next blocking write waits
            try:
                os.write(wfd, b"x" * 65536)
            except BlockingIOError:
                break
        os.set_blocking(wfd, True)
        ready = threading.Event()
        tid = []

        def writer():
            tid.append(threading.get_native_id())
            ready.set()
            try:
                os.write(wfd, b"y" * 65536)
            except OSError:
                pass

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        ready.wait()
        scan = H.HolderScan(fifo, os.stat(fifo).st_ino, tid[0])
        deadline = time.monotonic() + 10
        while scan._writing_fd() is None and time.monotonic() < deadline:
            time.sleep(0.01)

        def no_full_scan(self, pid):
            raise AssertionError("the full table scan ran")

        monkeypatch.setattr(H.HolderScan, "_holds", no_full_scan)
        scan.note_creator_fds()
        assert scan.fds == {wfd}
        monkeypatch.undo()
        # a thread that is not writing: the full scan finds the same descriptor
        other = H.HolderScan(fifo, os.stat(fifo).st_ino, threading.get_native_id())
        other.note_creator_fds()
        assert other.fds == {wfd}
    finally:
        while True:  # drain, so the writer thread finishes
            try:
                if not os.read(rfd, 1 << 20):
                    break
            except BlockingIOError:
                if not t.is_alive():
                    break
                time.sleep(0.01)
        t.join(10)
        os.close(wfd)
        os.close(rfd)


def test_tgid_of_a_thread_and_a_stale_remembered_answer():
    """A remembered thread -> process answer is re-checked: a wrong one (a recycled
    thread ID) is dropped and read again."""
    box = []
    done = threading.Event()
    t = threading.Thread(target=lambda: (box.append(threading.get_native_id()),
                                         done.wait(10)))
    t.start()
    try:
        while not box:
            time.sleep(0.001)
        tid = box[0]
        assert H.tgid(tid) == os.getpid()
        assert H.tgid(tid) == os.getpid()  # remembered
        H._tgids[tid] = 1  # as if the thread ID had belonged to another process
        assert H.tgid(tid) == os.getpid()
        assert H._tgids[tid] == os.getpid()
    finally:
        done.set()
        t.join()
    assert H.tgid(2 ** 22 + 12345) == 2 ** 22 + 12345  # no such thread: itself


def test_last_pid_moves_with_a_new_process():
    before = H.last_pid()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    now = H.last_pid()
    assert now >= pid or now < before  # (or the PID counter wrapped meanwhile)
