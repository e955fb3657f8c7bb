#!/usr/bin/env python3
"""constfs: the smallest pyfuse3 filesystem that looks like a bookfs mount, as a floor.

It serves ``events/<N>`` (N = 1..count, names zero-padded to 12 digits like bookfs) as
files of constant bytes held in memory, with the same caching choices as bookfs: entry
and attribute timeouts of a day, ``keep_cache`` on open, readdirplus attributes.  It also
has a writable ``new/`` whose files accept ``create``/``write``/``close`` and discard the
data (no ordering, no durability), which gives pyfuse3's own floor for appends.  With
``--log FILE`` each file's bytes are appended to FILE on its close (FLUSH), followed by one
``fdatasync`` done right in the handler: the floor of a durable append (pyfuse3 plus one
fdatasync per event, no ordering, no group commit).  With ``--log FILE --group-commit``
the closes are saved in groups instead, as bookfs saves them: a close hands its bytes to
one committer task, which writes every close handed over meanwhile with one ``writev``
and one ``fdatasync`` on a worker thread (``trio.to_thread``) and then answers them all;
``--probe`` adds the commit rule's ``/proc`` probe of each closing task on that thread
(``bookfs.fs.append.rule``: its ``statm`` and its writable descriptors), as bookfs does
before it saves.  These are the floors of a durable append on pyfuse3 and trio with
bookfs's shape and none of its checks.

Nothing is read from disk, so what a benchmark measures on it is the kernel, libfuse,
pyfuse3 and trio: the per-request cost bookfs cannot go under.

    python bench/constfs.py MOUNTPOINT --sizes FILE    # FILE: little-endian u64 sizes
    python bench/constfs.py MOUNTPOINT --count 1 --size 268435456

Runs in the foreground; unmount with ``fusermount3 -u MOUNTPOINT`` (or SIGINT/SIGTERM).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import stat
import sys
import time
from array import array

import pyfuse3
import trio

FOREVER = 24 * 3600.0
ROOT = pyfuse3.ROOT_INODE
EVENTS, NEW = 2, 3
FILE_BASE = 1 << 32
STAGING_BASE = 1 << 48
NAME_DIGITS = 12
CHUNK = 1 << 20
CONST = b"\xa5" * CHUNK  # every file byte


class ConstFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, sizes, tuned=True, log_fd=None, group=None):
        super().__init__()
        self.log_fd = log_fd  # --log: closes append the file's bytes here and fdatasync
        self.group = group  # --group-commit: a GroupCommit that saves the closes
        self.request_owner = bool(group and group.probe)  # ctx with flush/write/release
        self.tuned = tuned  # cache directories too, answer getxattr with ENOSYS
        self.sizes = sizes  # sizes[k - 1] is the size of events/<k>
        self.count = len(sizes)
        self.uid, self.gid = os.getuid(), os.getgid()
        self.t = time.time_ns()
        self.next_fh = 1
        self.staging: dict[int, int] = {}  # fh -> bytes written (data discarded)
        self.data: dict[int, bytearray] = {}  # fh -> bytes written (with --log)

    def _attrs(self, ino, mode, size, timeout, nlink=1):
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = mode
        a.st_nlink = nlink
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_size = size
        a.st_blksize = 4096
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = a.st_ctime_ns = a.st_mtime_ns = self.t
        a.entry_timeout = a.attr_timeout = timeout
        return a

    def _file_attrs(self, k):
        return self._attrs(FILE_BASE + k, stat.S_IFREG | 0o444, self.sizes[k - 1], FOREVER)

    def _dir_attrs(self, ino):
        mode = 0o777 if ino == NEW else 0o555
        return self._attrs(ino, stat.S_IFDIR | mode, self.count if ino == EVENTS else 0,
                           FOREVER if self.tuned else 0, 2)

    async def lookup(self, parent, name, ctx=None):
        if parent == EVENTS:
            if not name.isdigit() or len(name) > 20:
                raise pyfuse3.FUSEError(errno.ENOENT)
            k = int(name)
            if not 1 <= k <= self.count:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._file_attrs(k)
        if parent == ROOT and name in (b"events", b"new"):
            return self._dir_attrs(EVENTS if name == b"events" else NEW)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def getattr(self, ino, ctx=None):
        if ino in (ROOT, EVENTS, NEW):
            return self._dir_attrs(ino)
        if FILE_BASE <= ino < STAGING_BASE:
            return self._file_attrs(ino - FILE_BASE)
        if ino >= STAGING_BASE and ino - STAGING_BASE in self.staging:
            return self._attrs(ino, stat.S_IFREG | 0o200,
                               self.staging[ino - STAGING_BASE], 0)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def setattr(self, ino, attr, fields, fh, ctx):
        return await self.getattr(ino)

    async def opendir(self, ino, ctx):
        if ino not in (ROOT, EVENTS, NEW):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return ino

    async def readdir(self, fh, start_id, token):
        if fh == EVENTS:
            k = start_id + 1
            reply, attrs = pyfuse3.readdir_reply, self._file_attrs
            while k <= self.count:
                if not reply(token, b"%0*d" % (NAME_DIGITS, k), attrs(k), k):
                    return
                k += 1
        elif fh == ROOT:
            entries = [(b"events", EVENTS), (b"new", NEW)]
            for i in range(start_id, len(entries)):
                name, ino = entries[i]
                if not pyfuse3.readdir_reply(token, name, self._dir_attrs(ino), i + 1):
                    return

    async def releasedir(self, fh):
        return None

    async def open(self, ino, flags, ctx):
        if not FILE_BASE <= ino < STAGING_BASE:
            raise pyfuse3.FUSEError(errno.EISDIR if ino in (ROOT, EVENTS, NEW) else errno.ENOENT)
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        return pyfuse3.FileInfo(fh=ino, keep_cache=True)

    async def read(self, fh, off, size):
        n = min(size, self.sizes[fh - FILE_BASE - 1] - off)
        if n <= 0:
            return b""
        if n <= CHUNK:
            return CONST[:n]
        return CONST * (n // CHUNK) + CONST[: n % CHUNK]

    async def create(self, parent, name, mode, flags, ctx):
        if parent != NEW:
            raise pyfuse3.FUSEError(errno.EROFS)
        fh = self.next_fh
        self.next_fh += 1
        self.staging[fh] = 0
        if self.log_fd is not None:
            self.data[fh] = bytearray()
        return (pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False),
                await self.getattr(STAGING_BASE + fh))

    async def write(self, fh, off, buf, ctx=None):
        if fh not in self.staging:
            raise pyfuse3.FUSEError(errno.EBADF)
        self.staging[fh] = max(self.staging[fh], off + len(buf))
        if self.log_fd is not None:
            self.data[fh][off:off + len(buf)] = buf
        return len(buf)

    async def flush(self, fh, ctx=None):
        data = self.data.get(fh)
        if data and self.group is not None:
            await self.group.save(len(data).to_bytes(4, "little") + data,
                                  ctx.pid if ctx is not None else 0)
            data.clear()
        elif data:
            os.write(self.log_fd, len(data).to_bytes(4, "little") + data)
            os.fdatasync(self.log_fd)
            data.clear()

    async def release(self, fh, ctx=None):
        self.staging.pop(fh, None)
        self.data.pop(fh, None)

    async def getxattr(self, ino, name, ctx):
        # pyfuse3's default answers ENOATTR, which the kernel does not remember, so
        # `ls -l` costs one request per file; ENOSYS makes the kernel stop asking.
        raise pyfuse3.FUSEError(errno.ENOSYS if self.tuned else errno.ENODATA)

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        return s


class GroupCommit:
    """One committer task saves every close handed over while it was busy: one ``writev``
    and one ``fdatasync`` per group, on a worker thread; with ``probe``, each closing
    task's ``statm`` and writable descriptors are read first, on that thread, as the
    commit rule does (``bookfs.fs.append.rule``)."""

    def __init__(self, fd: int, probe: bool):
        self.fd, self.probe = fd, probe
        self.pending: list[tuple[bytes, int, trio.Event]] = []
        self.wake = trio.Event()

    async def save(self, record: bytes, pid: int) -> None:
        done = trio.Event()
        self.pending.append((record, pid, done))
        self.wake.set()
        await done.wait()

    def _save(self, group) -> None:
        if self.probe:
            from bookfs.fs.append.rule import _read, _writable
            for _, pid, _ in group:
                if pid > 0:
                    _read(f"/proc/{pid}/statm")
                    _writable(pid)
        os.writev(self.fd, [record for record, _, _ in group])
        os.fdatasync(self.fd)

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            group, self.pending = self.pending, []
            await trio.to_thread.run_sync(self._save, group)
            for _, _, done in group:
                done.set()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mountpoint")
    p.add_argument("--sizes", help="file of little-endian u64 sizes, one per events/<N>")
    p.add_argument("--count", type=int, default=0, help="serve this many files of --size")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--untuned", action="store_true",
                   help="do not cache directories and answer getxattr with ENODATA "
                        "(bookfs's earlier choices; shows what caching them buys)")
    p.add_argument("--busy-poll", type=int, default=0, metavar="US",
                   help="poll /dev/fuse for up to US microseconds before sleeping, as bookfs "
                        "does by default (the patched pyfuse3's busy_poll; default 0: never)")
    p.add_argument("--log", metavar="FILE",
                   help="append each new/ file's bytes to FILE on close, with one "
                        "fdatasync (the durable-append floor)")
    p.add_argument("--group-commit", action="store_true",
                   help="with --log: save the closes in groups, one writev and one "
                        "fdatasync per group on a worker thread, as bookfs does")
    p.add_argument("--probe", action="store_true",
                   help="with --group-commit: probe each closing task's /proc first, as "
                        "bookfs's commit rule does")
    a = p.parse_args(argv)
    if (a.group_commit and not a.log) or (a.probe and not a.group_commit):
        p.error("--group-commit needs --log FILE, and --probe needs --group-commit")
    if a.sizes:
        sizes = array("Q")
        with open(a.sizes, "rb") as f:
            sizes.frombytes(f.read())
        if sys.byteorder != "little":
            sizes.byteswap()
    else:
        sizes = array("Q", [a.size]) * a.count
    log_fd = None
    if a.log:
        log_fd = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    group = GroupCommit(log_fd, a.probe) if a.group_commit else None
    fs = ConstFS(sizes, tuned=not a.untuned, log_fd=log_fd, group=group)
    opts = {"fsname=constfs", "subtype=constfs", "default_permissions", "auto_unmount"}
    pyfuse3.init(fs, a.mountpoint, opts)

    async def run():
        async with trio.open_nursery() as nursery:
            async def stop_on_signal():
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return
            nursery.start_soon(stop_on_signal)
            if group is not None:
                nursery.start_soon(group.run)
            await pyfuse3.main(**({"busy_poll_us": a.busy_poll} if a.busy_poll else {}))
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
