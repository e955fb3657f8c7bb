"""Mounting real piers: LMDB, UIP and vere epochs in one numbering, per-epoch views,
appends to the newest epoch under the runtime's lock."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys

import pytest

from lmdb_fixtures import make_lmdb_epoch, make_pier, payloads
from mounting import mounted, noun, run_bookfs


@pytest.fixture
def pier(tmp_path):
    a, b, c = payloads(1, 300), payloads(301, 200), payloads(501, 100)
    root = make_pier(tmp_path / "pier", [("lmdb", a), ("lmdb", b), ("book", c)])
    return root, a + b + c


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_pier_one_numbering_and_epoch_views(pier, tmp_path):
    root, events = pier
    with mounted(root, tmp_path / "mnt") as mnt:
        names = sorted(os.listdir(f"{mnt}/events"))
        assert names == [f"{e:012d}" for e in range(1, 601)]
        for e in (1, 300, 301, 500, 501, 600):
            assert _read(f"{mnt}/events/{e}") == events[e - 1]
        assert sorted(os.listdir(f"{mnt}/epochs")) == ["0i0", "0i300", "0i500"]
        assert len(os.listdir(f"{mnt}/epochs/0i300/events")) == 200
        assert _read(f"{mnt}/epochs/0i300/events/000000000301") == events[300]
        with pytest.raises(FileNotFoundError):
            os.stat(f"{mnt}/epochs/0i300/events/000000000501")
        info = _read(f"{mnt}/info").decode()
        assert "pier (3 epochs: lmdb, lmdb, book-v1)" in info
        assert "0i300 lmdb 301..500" in info
        assert "format:" in _read(f"{mnt}/epochs/0i500/info").decode()
        assert "segments" not in os.listdir(mnt)


def test_pier_append_goes_to_newest_epoch_and_takes_vere_lock(pier, tmp_path):
    root, events = pier
    lmdb_before = _read(root / ".urb/log/0i0/data.mdb")
    with mounted(root, tmp_path / "mnt") as mnt:
        # the runtime's lock is held by the daemon: a ship could not start
        fd = os.open(root / ".vere.lock", os.O_RDWR)
        try:
            with pytest.raises(OSError) as e:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert e.value.errno in (errno.EAGAIN, errno.EACCES)
        finally:
            os.close(fd)
        fd = os.open(f"{mnt}/new/601", os.O_CREAT | os.O_WRONLY)
        os.write(fd, noun(b"\x01\x02\x03\x04\x05"))
        os.close(fd)
        assert _read(f"{mnt}/events/601") == noun(b"\x01\x02\x03\x04\x05")
        assert _read(f"{mnt}/epochs/0i500/events/601") == noun(b"\x01\x02\x03\x04\x05")
    assert _read(root / ".urb/log/0i0/data.mdb") == lmdb_before
    from bookfs.formats.book import Book

    with Book.open(root / ".urb/log/0i500") as book:
        assert book.gulf() == (501, 601)


def test_running_ship_refuses_rw_mount(pier, tmp_path):
    root, _ = pier
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(root / '.vere.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "os.write(fd, str(os.getpid()).encode())\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        os.makedirs(tmp_path / "mnt")
        res = run_bookfs("mount", str(root), str(tmp_path / "mnt"), check=False)
        assert res.returncode == 1
        assert str(holder.pid) in res.stderr and "-o ro" in res.stderr
        with mounted(root, tmp_path / "mnt", "-o", "ro") as mnt:
            assert len(os.listdir(f"{mnt}/events")) == 600
    finally:
        holder.kill()
        holder.wait()


def test_lmdb_newest_epoch_mounts_read_only(tmp_path):
    a = payloads(1, 50)
    root = make_pier(tmp_path / "pier", [("lmdb", a)])
    with mounted(root, tmp_path / "mnt") as mnt:
        assert _read(f"{mnt}/events/50") == a[49]
        with pytest.raises(OSError) as e:
            os.open(f"{mnt}/new/51", os.O_CREAT | os.O_WRONLY)
        assert e.value.errno == errno.EROFS


def test_single_lmdb_epoch_and_vere_directory(tmp_path):
    a = payloads(11, 40)
    make_lmdb_epoch(tmp_path / "0i10", 10, a)
    with mounted(tmp_path / "0i10", tmp_path / "m1") as mnt:
        assert sorted(os.listdir(f"{mnt}/events"))[0] == "000000000011"
        assert _read(f"{mnt}/events/50") == a[-1]
    root = make_pier(tmp_path / "vpier", [("vere", payloads(1, 30))])
    vdir = root / ".urb/log/0i0"
    with mounted(vdir, tmp_path / "m2") as mnt:
        assert "vere-book" in _read(f"{mnt}/info").decode()
        fd = os.open(f"{mnt}/new/31", os.O_CREAT | os.O_WRONLY)
        os.write(fd, b"\0\0\0\0\x02")
        os.close(fd)
        assert _read(f"{mnt}/events/31") == b"\0\0\0\0\x02"
    from bookfs.formats.vere import VereBook

    with VereBook.open(vdir) as v:
        assert v.gulf() == (1, 31) and v.read(31) == b"\0\0\0\0\x02"
