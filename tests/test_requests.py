"""How many FUSE requests reach the daemon per operation (issue 12), counted from a real
mount's ``--debug`` log, which names every request a handler served.  These counts are
the point of the pyfuse3 patch (``mount_scripts/pyfuse3-3.5.0-bookfs.patch``), so a change
that brings requests back fails here; ``docs/benchmarks.md`` has the table."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import subprocess
import time

import pyfuse3
import pytest

from mounting import mounted, run_bookfs

PATCHED = "read_inode" in getattr(pyfuse3, "FEATURES", ())
needs_patch = pytest.mark.skipif(not PATCHED, reason="needs pyfuse3 with "
                                 "mount_scripts/pyfuse3-3.5.0-bookfs.patch (setup.sh)")
_REQUEST = re.compile(r"DEBUG bookfs\.fs\.ops: (\w+)\(")
_CALL = re.compile(r"DEBUG bookfs\.fs\.ops: (\w+)\((\d+)?")


class Requests:
    """The requests the daemon logged since the last :meth:`take`."""

    def __init__(self, log_path: str):
        self.path, self.mark = log_path, 0

    def _tail(self) -> str:
        time.sleep(0.2)  # the daemon logs a request as it serves it; let the tail land
        with open(self.path) as f:
            f.seek(self.mark)
            text = f.read()
            self.mark = f.tell()
        return text

    def take(self) -> collections.Counter:
        return collections.Counter(_REQUEST.findall(self._tail()))

    def take_warm(self) -> collections.Counter:
        """:meth:`take`, less the GETATTRs of the directories on the path (``/`` and
        ``events/``, inodes 1 and 2): their attributes time out after ``CHANGING`` (1 s),
        and a path walk (``default_permissions``) asks for them again once they have, which
        a loaded machine's slow steps reach.  What is left is what the file itself cost."""
        return collections.Counter(name for name, ino in _CALL.findall(self._tail())
                                   if not (name == "getattr" and ino in ("1", "2")))


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    d = tmp_path_factory.mktemp("req") / "log"
    run_bookfs("sample", str(d), "--events", "300")
    return d


@contextlib.contextmanager
def counted_mount(log, tmp_path, *opts):
    """A mount with ``--debug`` and the :class:`Requests` its log shows."""
    log_file = str(tmp_path / "daemon.log")
    with mounted(log, tmp_path / "mnt", "--debug", *opts, log_file=log_file) as mnt:
        yield mnt, Requests(log_file)


def cat(path) -> bytes:
    return subprocess.run(["cat", path], capture_output=True, check=True).stdout


def ls_l(path) -> str:
    return subprocess.run(["ls", "-l", path], capture_output=True, check=True,
                          text=True).stdout


@needs_patch
def test_read_only_mount_reads_without_opens(log, tmp_path):
    with counted_mount(log, tmp_path, "-o", "ro") as (mnt, req):
        cat(f"{mnt}/events/5")  # the first open: ENOSYS turns opens off for the mount
        req.take()
        data = cat(f"{mnt}/events/6")
        assert req.take() == {"lookup": 1, "read_inode": 1}  # cold: LOOKUP, READ
        time.sleep(1.1)  # as slow as a loaded machine: past CHANGING (1 s)
        assert cat(f"{mnt}/events/6") == data
        assert req.take_warm() == {}  # warm: served by the kernel, no request at all
        ls_l(f"{mnt}/events")
        first = req.take()
        assert first["readdir"] >= 1
        ls_l(f"{mnt}/events")
        again = req.take()
        assert again["readdir"] == 0 and again["lookup"] == 0  # the kernel's listing
        assert set(again) <= {"opendir", "releasedir", "getattr"}, again


@needs_patch
def test_read_write_mount_reads_like_a_read_only_one(log, tmp_path):
    """Issue 22.1: a read-write mount's warm read of an event costs no request at all,
    as on a read-only mount: events/ is its read-only companion's (fs/daemon/companion.py), a
    second connection that answered OPEN and FLUSH with ENOSYS.  Both daemons log to the
    one file, so a request to either is counted.  An append is listed and read at once
    (read after acknowledge)."""
    with counted_mount(log, tmp_path) as (mnt, req):
        assert "read-only companion" in cat(f"{mnt}/info").decode()
        cat(f"{mnt}/events/5")  # the companion's first open: ENOSYS turns opens off
        req.take()
        data = cat(f"{mnt}/events/6")
        assert req.take() == {"lookup": 1, "read_inode": 1}  # cold: LOOKUP, READ
        for _ in range(3):
            assert cat(f"{mnt}/events/6") == data
            time.sleep(0.6)  # as slow as a loaded machine: past CHANGING (1 s) once
        assert req.take_warm() == {}  # warm: no OPEN, RELEASE, FLUSH or GETATTR
        ls_l(f"{mnt}/events")
        req.take()
        ls_l(f"{mnt}/events")
        assert req.take()["readdir"] == 0  # unchanged log: the kernel's listing
        nxt = int(re.search(r"^next: *(\d+)", cat(f"{mnt}/info").decode(), re.M)[1])
        with open(f"{mnt}/new/{nxt}", "wb") as f:
            f.write(b"\0\0\0\0\x02")
        assert cat(f"{mnt}/events/{nxt}") == b"\0\0\0\0\x02"  # at once after the close
        req.take()
        names = ls_l(f"{mnt}/events")
        assert f"{nxt:012d}" in names  # the append made the kernel list again
        assert req.take()["readdir"] >= 1


@needs_patch
def test_single_connection_read_write_mount_sends_no_flush_for_reads(log, tmp_path):
    """-o single_connection: events are read through the read-write connection, each
    warm read an OPEN and a RELEASE (noflush: no FLUSH)."""
    with counted_mount(log, tmp_path, "-o", "single_connection") as (mnt, req):
        assert "single_connection" in cat(f"{mnt}/info").decode()
        cat(f"{mnt}/events/6")
        req.take()
        cat(f"{mnt}/events/6")
        counts = req.take_warm()
        # The kernel also marks atime stale after every read of a file on a writable
        # superblock, which costs one GETATTR later
        assert counts == {"open": 1, "release": 1, "getattr": counts["getattr"]}
        assert counts["getattr"] <= 1


@needs_patch
def test_an_append_costs_the_kernels_requests_and_no_more(log, tmp_path):
    """The requests of an append through ``new/``: one LOOKUP, CREATE, WRITE, FLUSH and
    RELEASE each, and at most one GETATTR of ``new/`` (the kernel drops a directory's
    attributes after a CREATE in it: ``fs/fuse/dir.c``, ``fuse_create_open()`` ->
    ``fuse_dir_changed()``).  Nothing else: a commit makes the kernel forget the
    attributes an append changed (``events/``'s size is fresh at once), but not the
    root's (``ops.py``, ``_committed``), whose GETATTR every writer's next path walk
    would pay (``default_permissions``).  The root's attributes may still expire
    (``CHANGING``, 1 s) on a slow machine, so each second taken allows one more."""
    from bookfs.fs import inodes as I
    from bookfs.fs.nodes.base import CHANGING

    appends = 20
    with counted_mount(log, tmp_path) as (mnt, req):
        nxt = int(re.search(r"^next: *(\d+)", cat(f"{mnt}/info").decode(), re.M)[1])
        data = cat(f"{mnt}/events/6")  # a payload the check accepts
        count = os.stat(f"{mnt}/events").st_size
        req.take()
        began = time.monotonic()
        for k in range(appends):
            fd = os.open(f"{mnt}/new/{nxt + k}", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            assert os.stat(f"{mnt}/events").st_size == count + k + 1  # fresh at once
        took = time.monotonic() - began
        asked = collections.Counter(_CALL.findall(req._tail()))
    kinds = collections.Counter()
    for (kind, _), n in asked.items():
        kinds[kind] += n
    assert asked["lookup", str(I.NEW)] == appends, asked
    for kind in ("create", "write", "flush", "release"):
        assert kinds[kind] == appends, (kind, asked)
    assert asked["getattr", str(I.NEW)] <= appends, asked
    assert asked["getattr", str(I.EVENTS)] == appends, asked  # the loop's own stat
    root = asked["getattr", str(I.ROOT)]
    assert root <= 1 + int(took / CHANGING), (root, took)  # 20 when a commit dropped it
    expected = 6 * appends + asked["getattr", str(I.NEW)] + root
    assert sum(kinds.values()) - expected <= 1, asked  # a GETXATTR a kernel may ask once


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_stock_pyfuse3_path_still_works(log, tmp_path, mode, monkeypatch):
    """BOOKFS_STOCK_PYFUSE3=1: bookfs uses none of the patch, as on stock pyfuse3, and
    says so in info; a read-only mount still answers FLUSH with ENOSYS once."""
    monkeypatch.setenv("BOOKFS_STOCK_PYFUSE3", "1")  # the daemon inherits it
    opts = ["-o", "ro"] if mode == "ro" else []
    with counted_mount(log, tmp_path, *opts) as (mnt, req):
        assert "stock pyfuse3" in cat(f"{mnt}/info").decode()
        cat(f"{mnt}/events/6")
        req.take()
        data = cat(f"{mnt}/events/6")
        counts = req.take()
        want = {"open": 1, "read": 0, "release": 1}
        if mode == "rw":
            want["flush"] = 1
        assert {k: counts[k] for k in want} == want, counts
        assert data == cat(f"{mnt}/events/6")
