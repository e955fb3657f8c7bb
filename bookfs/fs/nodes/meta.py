"""``meta/<key>``: the log's metadata fields (``who``, ``fake``, ``life``, ``version``:
``layout.META_FIELDS``), each a file of exactly its field's size.

Caching: entries are cached for a day (``FOREVER``: the keys never change); attributes
(the mtime: the meta file's) for ``CHANGING`` (1 s).  Reads are ``direct_io`` snapshots
taken at open (on the no-open path, read by inode from the log each time).

Writing: an open for writing starts from the field's current bytes (empty after
``O_TRUNC``), so a partial write keeps the bytes it does not touch; the field is saved
(written and ``fsync``'d: ``save_meta``) on the writer's last close, by the commit rule
as for ``new/`` (``new.py``): a copy's or a dup's close saves nothing, a killed writer's
or an unjudgeable close saves nothing and fails (EIO).  A write that failed poisons the
file: its last close fails with that errno, nothing saved.

Errors (each recorded, and shown in ``info``): EROFS on a read-only mount or on stock
pyfuse3; EINVAL for ``O_APPEND``, a truncate to another size or a close with a field
that is not exactly its size; EPERM for chmod, chown or times; ENOENT for an unknown key
(a create in ``meta/``).
"""

from __future__ import annotations

import errno
import logging
import os
import stat

import pyfuse3
import trio

from bookfs.errors import BookError
from bookfs.formats.layout import META_FIELDS, META_KEYS
from bookfs.fs import inodes as I
from bookfs.fs.append import rule
from bookfs.fs.append.rule import Writer
from bookfs.fs.append.staging import Staging
from bookfs.fs.nodes.base import CHANGING, FOREVER, BytesHandle, Kind
from bookfs.fs.nodes.new import need_rule

log = logging.getLogger(__name__)

assert set(META_KEYS) == set(I.META_INODES)


class MetaWriteHandle:
    """A meta field open for writing.  The buffer starts as the field's current bytes
    (empty after ``O_TRUNC``), so a partial write keeps the bytes it does not touch."""

    __slots__ = ("key", "staging", "dirty", "poisoned", "writer")

    def __init__(self, key: str, current: bytes, writer: Writer | None):
        self.key, self.staging, self.dirty = key, Staging(4096), False
        self.poisoned = 0
        self.writer = writer  # who opened it (its thread: the refusal record's pid)
        if current:
            self.staging.write(0, current)


class MetaFiles(Kind):
    """``meta/<key>``."""

    def _mtime(self) -> int:
        fs = self.fs
        source = fs.epochs[-1].log if fs.epochs else self.log
        path = getattr(source, "meta_path", None)
        return os.stat(path).st_mtime_ns if path else fs.mounted_ns

    async def lookup(self, name: bytes) -> pyfuse3.EntryAttributes:
        """``meta/<name>``."""
        ino = I.META_INODES.get(name.decode("utf-8", "replace"))
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.attrs(ino)

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        key = I.META_BY_INODE[ino]
        fs = self.fs
        mode = fs.modes.meta
        mtime = self._mtime()
        return fs.entry_attrs(ino, stat.S_IFREG | mode, META_FIELDS[key][1], mtime, CHANGING,
                              entry_timeout=FOREVER)

    async def setattr(self, ino: int, attr, fields, fh, ctx) -> pyfuse3.EntryAttributes:
        fs = self.fs
        times = fields.update_atime or fields.update_mtime or fields.update_ctime
        owner = fields.update_mode or fields.update_uid or fields.update_gid
        key = I.META_BY_INODE[ino]
        path, refused = f"meta/{key}", fs.refusals.refuse
        if fs.readonly:
            raise refused(path, errno.EROFS, f"{path}: the mount is read-only", ctx.pid)
        if owner:
            raise refused(path, errno.EPERM, f"{path}: meta files keep their owner and "
                                             "mode", ctx.pid)
        if fields.update_size:
            h = fs.handle(fh) if fh is not None else None
            if isinstance(h, MetaWriteHandle):  # O_TRUNC, ftruncate: judged at close
                h.staging.truncate(attr.st_size)
                h.dirty = True
            elif attr.st_size != META_FIELDS[key][1]:
                raise refused(path, errno.EINVAL, f"{path}: truncate to {attr.st_size} "
                                                  f"bytes; the field is exactly "
                                                  f"{META_FIELDS[key][1]} bytes", ctx.pid)
        elif times:
            raise refused(path, errno.EPERM, f"{path}: times follow the log; write the "
                                             "field to change it", ctx.pid)
        return await self.attrs(ino)

    async def create(self, name: bytes, ctx):
        """CREATE in ``meta/``: an existing key never reaches create, so an unknown key
        (recorded, as every refused meta write)."""
        fs = self.fs
        path = f"meta/{name.decode('utf-8', 'replace')}"
        if fs.readonly:
            raise fs.refusals.refuse(path, errno.EROFS, f"{path}: the mount is read-only",
                                     ctx.pid)
        raise fs.refusals.refuse(path, errno.ENOENT, f"{path}: unknown meta key; "
                                 f"expected one of {', '.join(I.META_INODES)}", ctx.pid)

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        fs = self.fs
        key = I.META_BY_INODE[ino]
        if writing:
            path, refused = f"meta/{key}", fs.refusals.refuse
            if fs.readonly:
                raise refused(path, errno.EROFS, f"{path}: the mount is read-only",
                              ctx.pid)
            if flags & os.O_APPEND:
                raise refused(path, errno.EINVAL, f"{path}: write the whole field, "
                                                  "not an append", ctx.pid)
            need_rule(fs, path, ctx)
            truncated = bool(flags & os.O_TRUNC)
            current = b"" if truncated else self.log.read_meta(key)
            h = MetaWriteHandle(key, current, Writer(ctx.pid))
            h.dirty = truncated  # emptied: judged (and refused, unless rewritten) at close
            return pyfuse3.FileInfo(fh=fs.new_fh(h), direct_io=True, keep_cache=False)
        return fs.file_info(fs.new_fh(BytesHandle(self.log.read_meta(key))),
                            direct_io=True, keep_cache=False)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        return self.log.read_meta(I.META_BY_INODE[ino])[off : off + size]

    async def write(self, h: MetaWriteHandle, off: int, buf: bytes, ctx) -> int:
        if ctx is not None:
            h.writer.saw(ctx)
        try:
            n = h.staging.write(off, buf)
        except (OSError, BookError) as e:
            h.poisoned = h.poisoned or getattr(e, "errno", None) or errno.EIO
            raise
        h.dirty = True
        return n

    async def flush(self, h: MetaWriteHandle, fh: int, ctx) -> None:
        """The commit rule for ``meta/<key>`` (as for ``new/``): the writer's last close
        saves a changed field; a copy's or a dup's close saves nothing."""
        fs = self.fs
        if not h.dirty and not h.poisoned:
            return
        path = f"meta/{h.key}"
        pid = h.writer.thread
        verdict, why = await rule.closing(fs.prober, fs.mounts, h.writer, I.META_INODES[h.key],
                                          ctx, mounted=bool(fs.mountpoint))
        size = META_FIELDS[h.key][1]
        if verdict == rule.COPY or (verdict == rule.HELD and not h.poisoned
                                      and len(h.staging) != size):
            return  # a copy's close, or a dup's before the field is whole
        # a dup's close of a whole field saves it: every open of a key shares its inode,
        # so a second open in the writer's table looks like a dup, and its close must
        # not be left unsaved
        h.dirty = False
        if verdict in (rule.KILLED, rule.UNKNOWN):
            h.poisoned = 0
            raise fs.refusals.refuse(path, errno.EIO, f"{path}: not saved: {why}", pid)
        if h.poisoned:
            err, h.poisoned = h.poisoned, 0
            raise fs.refusals.refuse(path, err, f"{path}: not saved, because a write to it "
                                     "failed", pid)
        value = h.staging.getvalue()
        if len(value) != size:
            raise fs.refusals.refuse(path, errno.EINVAL, f"{path}: {len(value)} bytes "
                                     f"written, expected exactly {size}; the field is "
                                     "unchanged", pid)
        hole = h.staging.first_hole()
        if hole is not None:  # every byte of a field must be written (as for new/)
            raise fs.refusals.refuse(path, errno.EINVAL, f"{path}: bytes {hole[0]} to "
                                     f"{hole[1] - 1} were never written; the field is "
                                     "unchanged", pid)
        await trio.to_thread.run_sync(self.log.save_meta, h.key, value)

    def release(self, h: MetaWriteHandle) -> None:
        if h.dirty:
            log.warning("meta/%s: not saved: its last descriptor was closed by a "
                        "process other than its writer", h.key)
        h.staging.close()
