"""LogOperations driven directly (no kernel), s3ql-style: handlers run under trio.run.
readdir needs a real kernel token, so it is covered by the mount tests."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pyfuse3
import pytest
import trio

from bookfs.formats.book import Book
from bookfs.fs import inodes as I
from bookfs.fs import ops as ops_module
from bookfs.fs.ops import LogOperations
from mount_fixtures import noun, payload, small_src  # noqa: F401

CTX = SimpleNamespace(pid=os.getpid(), uid=0, gid=0, umask=0o022)
W = os.O_WRONLY | os.O_CREAT


@pytest.fixture
def ops(small_src):
    book = Book.open(small_src, writable=True)
    o = LogOperations(book, stall_timeout=2)
    yield o
    book.close()


def run(fn, *args):
    return trio.run(fn, *args)


def fuse_errno(fn, *args) -> int | None:
    try:
        trio.run(fn, *args)
    except pyfuse3.FUSEError as e:
        return e.errno
    return None


def _fh(opened) -> int:
    """opendir's handle: a FileInfo where pyfuse3 offers cache_readdir, else the number."""
    return opened.fh if isinstance(opened, pyfuse3.FileInfo) else opened


def test_lookup_getattr_read(ops):
    a = run(ops.lookup, I.EVENTS, b"000000000003", CTX)
    assert a.st_ino == I.event_inode(3) and a.st_size == 4 + 37 * 3
    assert run(ops.lookup, I.EVENTS, b"3", CTX).st_ino == a.st_ino
    assert run(ops.getattr, a.st_ino, CTX).st_size == a.st_size
    assert fuse_errno(ops.lookup, I.EVENTS, b"11", CTX) == errno.ENOENT
    negative = run(ops.lookup, I.EVENTS, b"x", CTX)  # can never exist: a cacheable miss
    assert negative.st_ino == 0 and negative.entry_timeout > 0
    assert fuse_errno(ops.lookup, I.ROOT, b"nope", CTX) == errno.ENOENT
    assert fuse_errno(ops.getattr, I.event_inode(99), CTX) == errno.ENOENT
    fi = run(ops.open, a.st_ino, os.O_RDONLY, CTX)
    assert run(ops.read, fi.fh, 0, 1000) == payload(3, 4 + 37 * 3)
    assert run(ops.read, fi.fh, 5, 3) == payload(3, 4 + 37 * 3)[5:8]
    run(ops.release, fi.fh)
    assert fuse_errno(ops.read, fi.fh, 0, 10) == errno.EBADF
    assert fuse_errno(ops.open, a.st_ino, os.O_WRONLY, CTX) == errno.EROFS
    assert _fh(run(ops.opendir, I.NEW, CTX)) == I.NEW  # lists as empty
    meta = run(ops.lookup, I.META, b"who", CTX)
    fi = run(ops.open, meta.st_ino, os.O_RDONLY, CTX)
    assert run(ops.read, fi.fh, 0, 100) == ops.log.read_meta("who")


def _append(ops, name: bytes, data: bytes):
    fi, attrs = run(ops.create, I.NEW, name, 0o644, W, CTX)
    assert I.is_staging(attrs.st_ino)
    assert run(ops.write, fi.fh, 0, data) == len(data)
    run(ops.flush, fi.fh)
    run(ops.release, fi.fh)


def test_create_write_flush_release(ops):
    _append(ops, b"11", noun(b"abcdefgh"))
    assert ops.log.read(11) == noun(b"abcdefgh")
    assert run(ops.lookup, I.EVENTS, b"11", CTX).st_size == len(noun(b"abcdefgh"))
    assert ops.queue.batches == 1
    # errors of the table
    assert fuse_errno(ops.create, I.NEW, b"abc", 0o644, W, CTX) == errno.EINVAL
    assert fuse_errno(ops.create, I.NEW, b"5", 0o644, W, CTX) == errno.EEXIST
    assert fuse_errno(ops.create, I.NEW, b"13", 0o644, W, CTX) == errno.EINVAL
    assert fuse_errno(ops.create, I.EVENTS, b"12", 0o644, W, CTX) == errno.EROFS
    assert fuse_errno(ops.create, I.META, b"nope", 0o644, W, CTX) == errno.ENOENT
    assert fuse_errno(ops.unlink, I.EVENTS, b"1", CTX) == errno.EPERM
    # too short
    fi, _ = run(ops.create, I.NEW, b"12", 0o644, W, CTX)
    run(ops.write, fi.fh, 0, b"ab")
    assert fuse_errno(ops.flush, fi.fh) == errno.EINVAL
    run(ops.release, fi.fh)
    assert 12 not in ops.log


def test_group_commit_batches(ops):
    """Eight reservations, flushed concurrently: committed in fewer saves than events."""
    want = {n: payload(n, 50 + n) for n in range(11, 19)}

    async def main():
        fhs = {}
        for n in want:
            fi, _ = await ops.create(I.NEW, str(n).encode(), 0o644, W, CTX)
            await ops.write(fi.fh, 0, want[n])
            fhs[n] = fi.fh
        async with trio.open_nursery() as nursery:
            for n in sorted(want)[1:]:
                nursery.start_soon(ops.flush, fhs[n])
            await trio.sleep(0.2)  # 12..18 are ready and waiting for 11
            assert all(ops._handles[fhs[n]].state == "ready" for n in sorted(want)[1:])
            nursery.start_soon(ops.flush, fhs[11])  # the head flushes last
        for fh in fhs.values():
            await ops.release(fh)

    before = ops.queue.batches
    trio.run(main)
    assert {n: ops.log.read(n) for n in want} == want
    assert ops.queue.batches - before == 1 < len(want)


def test_stall_gives_etimedout(ops):
    async def main():
        stalled, _ = await ops.create(I.NEW, b"11", 0o644, W, CTX)
        await ops.write(stalled.fh, 0, noun(b"slow"))
        fi, _ = await ops.create(I.NEW, b"12", 0o644, W, CTX)
        await ops.write(fi.fh, 0, noun(b"next"))
        with pytest.raises(pyfuse3.FUSEError) as ei:
            await ops.flush(fi.fh)
        assert ei.value.errno == errno.ETIMEDOUT
        await ops.release(fi.fh)
        fi, _ = await ops.create(I.NEW, b"12", 0o644, W, CTX)  # free again
        await ops.release(fi.fh)
        await ops.release(stalled.fh)  # released without a flush: abandoned

    trio.run(main)
    assert ops.log.last == 10
    _append(ops, b"11", noun(b"later"))  # 11 is free again too
    assert ops.log.read(11) == noun(b"later")


def test_unexpected_exception_becomes_eio(ops, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(ops.log, "read", boom)
    ino = I.event_inode(3)
    assert fuse_errno(ops.open, ino, os.O_RDONLY, CTX) == errno.EIO
    # a closed engine fd: an OSError (EBADF) is answered with its errno, nothing escapes
    monkeypatch.undo()
    fd = ops.log._fd
    ops.log._fd = 2**20 - 1  # no such descriptor
    try:
        assert fuse_errno(ops.open, ino, os.O_RDONLY, CTX) == errno.EBADF
        assert fuse_errno(ops.statfs, CTX) is None
    finally:
        ops.log._fd = fd
    # a save that fails with an unexpected error fails the commit; the log is unchanged
    size = os.path.getsize(ops.log.log_path)
    monkeypatch.setattr(ops.log, "save", boom)
    fi, _ = run(ops.create, I.NEW, b"11", 0o644, W, CTX)
    run(ops.write, fi.fh, 0, noun(b"data"))
    assert fuse_errno(ops.flush, fi.fh) == errno.EIO
    run(ops.release, fi.fh)
    assert os.path.getsize(ops.log.log_path) == size
    monkeypatch.undo()
    _append(ops, b"11", noun(b"after"))
    assert ops.log.read(11) == noun(b"after")


def test_readonly_ops(small_src, monkeypatch):
    monkeypatch.setattr(ops_module, "FEATURES", frozenset())  # stock pyfuse3: opens
    with Book.open(small_src) as book:
        o = LogOperations(book)
        assert fuse_errno(o.flush, 1) == errno.ENOSYS  # nothing commits: no FLUSH wanted
        assert fuse_errno(o.create, I.NEW, b"11", 0o644, W, CTX) == errno.EROFS
        meta = run(o.lookup, I.META, b"life", CTX)
        assert fuse_errno(o.open, meta.st_ino, os.O_WRONLY, CTX) == errno.EROFS
        assert fuse_errno(o.unlink, I.EVENTS, b"1", CTX) == errno.EROFS


@pytest.mark.skipif("read_inode" not in getattr(pyfuse3, "FEATURES", ()),
                    reason="needs pyfuse3 with mount_scripts/pyfuse3-3.5.0-bookfs.patch")
def test_no_open_path(small_src, monkeypatch):
    """A read-only mount on patched pyfuse3: OPEN and FLUSH answer ENOSYS (the kernel then
    stops sending them), reads arrive by inode with fh 0 and are checked there: a corrupt
    event answers EIO; info, meta and pretty/ are served by inode."""
    monkeypatch.setattr(ops_module, "FEATURES", pyfuse3.FEATURES)
    with Book.open(small_src) as book:
        o = LogOperations(book)
        ino = I.event_inode(3)
        assert fuse_errno(o.open, ino, os.O_RDONLY, CTX) == errno.ENOSYS
        assert fuse_errno(o.flush, 0) == errno.ENOSYS
        assert run(o.read_inode, ino, 0, 0, 1000) == payload(3, 4 + 37 * 3)
        assert run(o.read_inode, ino, 0, 5, 3) == payload(3, 4 + 37 * 3)[5:8]
        info = run(o.read_inode, I.INFO, 0, 0, 1 << 16)
        assert b"last:" in info and b"fuse:     patched pyfuse3: no-open" in info
        assert run(o.getattr, I.INFO, CTX).st_size == len(info)
        who = run(o.lookup, I.META, b"who", CTX).st_ino
        assert run(o.read_inode, who, 0, 0, 100) == book.read_meta("who")
        pretty = run(o.lookup, I.PRETTY, b"3", CTX)
        text = run(o.read_inode, pretty.st_ino, 0, 0, 1 << 20)
        assert text.startswith(b"event: 3\n") and pretty.st_size == len(text)  # real size
        assert fuse_errno(o.read_inode, I.event_inode(99), 0, 0, 10) == errno.ESTALE
    # a corrupt event: EIO on its first read, never its bytes
    path = os.path.join(small_src, "book.log")
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        needle = payload(4, 4 + 37 * 4)
        at = data.find(needle)
        assert at > 0
        data[at + 10] ^= 0xFF
        f.seek(0)
        f.write(data)
    with Book.open(small_src) as book:
        o = LogOperations(book)
        assert fuse_errno(o.read_inode, I.event_inode(4), 0, 0, 1000) == errno.EIO
        assert run(o.read_inode, I.event_inode(5), 0, 0, 1000) == payload(5, 4 + 37 * 5)
