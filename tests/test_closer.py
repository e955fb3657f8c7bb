"""bookfs.fs.append.rule on real processes and real descriptors, without a mount: the probe
reads only ``/proc`` of the closing task, so a plain file, its inode and its filesystem's
device stand in for a new/ file.  The mount-level behaviour is in test_commit_rule.py."""

from __future__ import annotations

import fcntl
import os
import threading
from types import SimpleNamespace

import pytest

from bookfs.fs.append import rule as C
from mount_fixtures import wait_for


def ctx(pid: int, lock_owner: int = 0):
    return SimpleNamespace(pid=pid, lock_owner=lock_owner)


def test_the_writer_table_is_learned_from_the_creating_thread_only():
    w = C.Writer(thread=100)
    w.saw(ctx(200, lock_owner=7))  # another thread (or a child) writing: not learned
    assert w.table == 0 and w.closing(ctx(200, 7)) is None
    w.saw(ctx(100, lock_owner=0))  # a write without lock_owner (not direct I/O)
    assert w.table == 0
    assert w.closing(ctx(100, 9)) is True  # the creating thread's close teaches it
    assert w.table == 9
    assert w.closing(ctx(300, 9)) is True  # any thread of that table
    assert w.closing(ctx(300, 8)) is False  # another table, another task: a copy's close
    assert not w.changed
    assert w.closing(ctx(100, 8)) is None  # the creating thread with another table: its
    assert w.changed  # table changed (unshare, close_range, exec): the probe fails it
    assert w.closing(ctx(300, 9)) is None  # and every close after, either table


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "new-5"
    path.write_bytes(b"")
    st = os.stat(path)
    device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    return str(path), st.st_ino, C.Mounts(device)


def probe(writer, ino, mounts, tid=None, known=True):
    return C.probe(threading.get_native_id() if tid is None else tid, writer, ino, mounts,
                   known)[0]


def test_last_unless_the_table_holds_another_writable_descriptor(target):
    path, ino, mounts = target
    me = C.Writer(threading.get_native_id())
    assert probe(me, ino, mounts) == C.LAST  # nothing of it is open
    fd = os.open(path, os.O_WRONLY)
    try:
        assert probe(me, ino, mounts) == C.HELD  # a dup's close: the writer still holds it
        ro = os.open(path, os.O_RDONLY)
        os.close(fd)
        fd = ro
        assert probe(me, ino, mounts) == C.LAST  # a read-only descriptor does not count
    finally:
        os.close(fd)


def test_another_filesystem_is_not_ours_and_an_unknown_mount_cannot_be_told(
        target, monkeypatch):
    path, ino, mounts = target
    me = C.Writer(threading.get_native_id())
    fd = os.open(path, os.O_WRONLY)
    try:
        # the same inode number on another filesystem: not this mount's file
        assert probe(me, ino, C.Mounts("0:0")) == C.LAST
        # a mount ID that no table shows (a mount detached before it was seen)
        monkeypatch.setattr(C, "mount_devices", lambda: {})
        assert probe(me, ino, C.Mounts(mounts.device)) == C.UNKNOWN
    finally:
        os.close(fd)


def test_another_process_is_a_copy_and_an_ended_creator_is_unknown(target):
    _, ino, mounts = target
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    try:
        os.close(r)
        me = C.Writer(threading.get_native_id())
        assert probe(me, ino, mounts, tid=pid, known=None) == C.COPY
        # the closer's own thread group holds the creator: the writer
        assert probe(C.Writer(pid), ino, mounts, tid=pid, known=None) == C.LAST
    finally:
        os.close(w)
        os.waitpid(pid, 0)
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    assert wait_for(lambda: not os.path.exists(f"/proc/self/task/{t.native_id}"))
    gone = C.Writer(t.native_id)  # its creating thread has ended: cannot be told
    assert probe(gone, ino, mounts, known=None) == C.UNKNOWN


def test_an_unnamed_or_unreadable_closer_is_unknown(target):
    _, ino, mounts = target
    me = C.Writer(threading.get_native_id())
    assert probe(me, ino, mounts, tid=0) == C.UNKNOWN  # pid 0: not in our namespace
    assert probe(me, ino, mounts, tid=2**22 + 12345) == C.UNKNOWN  # no such task


def test_descriptors_closing_during_the_probe_are_skipped(target, tmp_path):
    """Other threads of the closer open and close descriptors while the probe reads its
    fdinfo (8 appending threads do): a descriptor gone between listing and reading is
    skipped, never an UNKNOWN that would fail the append (seen in bench_append.py)."""
    _, ino, mounts = target
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            os.close(os.open(tmp_path / "churn", os.O_WRONLY | os.O_CREAT))

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        me = C.Writer(threading.get_native_id())
        verdicts = {probe(me, ino, mounts) for _ in range(3000)}
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert verdicts == {C.LAST}


@pytest.mark.skipif(C.SCAN != "C", reason="bookfs/fs/append/_fdscan.c did not build")
def test_the_c_scan_answers_as_the_python_scan(target, tmp_path):
    """Seeded: tables of assorted descriptors (the file or others, read-only, write-only,
    read-write, O_CLOEXEC or not, up to 300 of them): the C scan lists exactly the
    writable ones the Python scan lists, and the verdict is HELD exactly when one of them
    is the file."""
    import random

    path, ino, mounts = target
    others = [tmp_path / f"other-{i}" for i in range(3)]
    for o in others:
        o.write_bytes(b"")
    rng = random.Random(18)
    tid = threading.get_native_id()
    for _ in range(200):
        fds = []
        try:
            for _ in range(rng.choice([0, 1, 2, 5, 300])):
                f = rng.choice([path, *others])
                mode = rng.choice([os.O_RDONLY, os.O_WRONLY, os.O_RDWR])
                fds.append(os.open(f, mode | rng.choice([0, os.O_CLOEXEC])))
            assert sorted(C._writable(tid)) == sorted(C._writable_py(tid))
            writable = any(os.fstat(fd).st_ino == ino and
                           fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
                           for fd in fds)
            assert C._holds(tid, ino, mounts) == (C.HELD if writable else C.LAST)
        finally:
            for fd in fds:
                os.close(fd)
