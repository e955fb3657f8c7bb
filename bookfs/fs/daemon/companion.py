"""A read-write mount's read-only companion: one mount that reads at read-only speed.

**Why a second connection.**  A warm read of an event on a read-only mount costs no FUSE
request: the mount answers OPEN with ENOSYS and FLUSH with ENOSYS, after which the kernel
sends neither again for any file of that connection (``fs/fuse/file.c``:
``fuse_file_open()`` sets ``fc->no_open`` when OPEN answers ``-ENOSYS`` and opens with the
default ``ff->open_flags = FOPEN_KEEP_CACHE``, so no RELEASE either; ``fuse_flush()``
returns early once ``fc->no_flush`` is set, and otherwise only for an open that said
``FOPEN_NOFLUSH``, which needs an OPEN to say it).  Both switches are per connection.  A
read-write mount cannot set them: a ``new/`` or ``meta/`` close is a FLUSH that commits,
and a ``meta/`` open is an OPEN.  So every read of an event through the read-write
connection costs an OPEN and a RELEASE (0.036x the read-only mount's warm reads).

**What it does.**  Once the read-write mount is served, its daemon starts a read-only
bookfs daemon of the same log (``bookfs mount SOURCE PRIVATE -o ro,...``: a follower,
which takes no lock), bind-mounts that mount's ``events/``, ``pretty/``, ``segments/``
and ``epochs/`` (those it has) over the same directories of the read-write mount, then
detaches the private mount point (``umount2(MNT_DETACH)``) and removes it, so the binds
alone hold the companion's mount.  Reads of events then never reach the read-write
daemon, and cost what they cost on a read-only mount; ``new/``, ``meta/`` and ``info``
stay on the read-write connection with every durability rule.

* **Read after acknowledge.**  The writer's close returns only once the event is in
  ``book.log`` and ``fdatasync``'d; a lookup of a number the companion has not seen
  makes it refresh from the file (``fs/watch.py``) before it answers, and it caches no
  negative entry.  So ``events/N`` is there as soon as the close of ``new/N`` returned.
* **Unmounting.**  A mount with mounts inside it is busy for a plain ``umount``
  (``fs/pnode.c``, ``propagate_mount_busy()``: ``if (!list_empty(&mnt->mnt_mounts) ...)
  return 1``, which ``do_umount()`` in ``fs/namespace.c`` turns into ``-EBUSY``).
  ``bookfs umount`` unmounts the binds first (:func:`unbind_all`), then the mount; the
  daemon's own unmount at exit is lazy and takes them along (libfuse
  ``fuse_kern_unmount()``: ``umount2(mnt, MNT_DETACH)`` as root, ``fusermount3 -u -z``
  otherwise).  The companion daemon exits by itself once its last bind is gone.
* **Fresh directories when the close returns.**  The kernel caches ``events/``'s
  attributes (its size is the event count) for ``CHANGING`` on the companion's
  connection, which the read-write daemon's commits do not touch.  So once the
  companion is up, the read-write daemon takes a copy of the companion's ``/dev/fuse``
  descriptor (``pidfd_getfd(2)``, Linux 5.6: ``kernel/pid.c``, ``pidfd_getfd()``; it
  needs ptrace access to the companion, which its own user has when Yama allows, and
  root always), and after every commit, before the writer's close is answered, writes
  the companion's connection an attribute invalidation of each directory an append
  changes (``FUSE_NOTIFY_INVAL_INODE`` with ``off = -1``: ``fs/fuse/dev.c``,
  ``fuse_notify_inval_inode()``; ``fs/fuse/inode.c``, ``fuse_reverse_inval_inode()``
  drops the attributes and, with a negative offset, no page): the next ``stat`` asks the
  companion, which reads the commit mark.  No wait on the companion: the kernel does it
  on the write.  Where the descriptor cannot be had, the companion's own follower drops
  them when inotify tells it of the commit: a millisecond or so later, or up to
  ``COMPANION_LOOK_BURST`` (0.25 s) in a burst of commits, which it takes together
  (``fs/watch.py``; the companion is mounted ``-o companion``, so that its follower,
  whose looks serve no request while the read-write daemon tells the kernel of each
  commit, does not wake 50 times a second on the CPUs the writers share).
* **When the companion dies**, the read-write daemon (which watches it through a pidfd)
  detaches the binds, so the read-write connection's own ``events/`` shows through
  again: slower, never wrong.
* **Needs** ``CAP_SYS_ADMIN`` for the bind mounts (``mount(2)``: ``EPERM`` otherwise).
  Without it, or with ``-o single_connection``, reads go through the read-write
  connection as before.  The ``reads:`` line of ``info`` says which.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import struct
import subprocess
import sys
import tempfile

from bookfs.fs.daemon.mountinfo import mounts_under

__all__ = ["BOUND", "Companion", "start", "unbind_all"]

log = logging.getLogger(__name__)

#: the read-only directories the companion serves in the read-write mount's place
BOUND = ("events", "pretty", "segments", "epochs")
MS_BIND = 4096  # <linux/mount.h>
MNT_DETACH = 2  # <linux/fs.h>: umount2's lazy flag
START_TIMEOUT = 60.0  # seconds the companion daemon may take to mount

_libc = ctypes.CDLL(None, use_errno=True)


def _bind(source: str, target: str) -> None:
    if _libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bind mount of {source} on {target}: {os.strerror(e)}")


def _detach(path: str) -> None:
    if _libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"detach {path}: {os.strerror(e)}")


_SYS_PIDFD_GETFD = 438  # the same number on every architecture (asm-generic unistd)
#: ``include/uapi/linux/fuse.h``: ``enum fuse_notify_code``
FUSE_NOTIFY_INVAL_INODE = 2
#: ``struct fuse_out_header`` (len, error = the notify code, unique = 0), then
#: ``struct fuse_notify_inval_inode_out`` (ino, off, len)
_INVAL_INODE = struct.Struct("<IiQQqq")


class Companion:
    """A running companion: its daemon's pid and the directories bound from it."""

    def __init__(self, pid: int, bound: list[str]):
        self.pid = pid
        self.bound = bound
        self._fuse_fd: int | None = None  # a copy of its /dev/fuse descriptor

    def take_connection(self, target: int) -> bool:
        """Take a copy of the companion's ``/dev/fuse`` descriptor, number ``target`` in
        its table (its ready line says it: ``mount._own_fuse_fd``), to tell its kernel
        connection of commits (module docstring); False when it cannot be had."""
        try:
            if target < 0:
                raise OSError(errno.ENOENT, "the companion did not say its descriptor")
            pidfd = os.pidfd_open(self.pid)
        except OSError as e:
            log.info("companion: no copy of its connection (%s); its follower drops its "
                     "directories' attributes when it sees a commit", e)
            return False
        try:
            fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, target, 0)
            if fd < 0:
                e = ctypes.get_errno()
                log.info("companion: no copy of its connection (pidfd_getfd: %s); its "
                         "follower drops its directories' attributes when it sees a "
                         "commit", os.strerror(e))
                return False
        finally:
            os.close(pidfd)
        os.set_inheritable(fd, False)
        self._fuse_fd = fd
        return True

    def drop_attrs(self, inodes) -> None:
        """Make the companion's kernel connection forget the attributes of ``inodes``
        (attributes only: no page is touched, so no request in flight is waited for).
        ENOENT: the kernel holds nothing of that inode."""
        fd = self._fuse_fd
        if fd is None:
            return
        for ino in inodes:
            try:
                os.write(fd, _INVAL_INODE.pack(_INVAL_INODE.size, FUSE_NOTIFY_INVAL_INODE,
                                               0, ino, -1, 0))
            except OSError as e:
                if e.errno == errno.ENODEV:  # the companion's connection is gone
                    self.close_connection()
                    return

    def close_connection(self) -> None:
        fd, self._fuse_fd = self._fuse_fd, None
        if fd is not None:
            os.close(fd)

    def describe(self) -> str:
        names = ", ".join(os.path.basename(p) + "/" for p in self.bound)
        return (f"{names} through a read-only companion connection (daemon pid {self.pid}); "
                "new/, meta/ and info through this one")

    def pidfd(self) -> int | None:
        """A pidfd of the companion daemon (readable once it has exited), or None."""
        try:
            return os.pidfd_open(self.pid)
        except (OSError, AttributeError):
            return None

    def unbind(self) -> None:
        """Detach the binds (the read-write connection's own directories show again)."""
        for path in reversed(self.bound):
            try:
                _detach(path)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOENT):
                    log.warning("companion: %s", e)


def start(source: str, mountpoint: str, options: str, *, log_file: str | None,
          debug: bool) -> Companion | str:
    """Start the companion of the read-write mount at ``mountpoint`` (already served: the
    bind targets are looked up through it, so never call this on its event loop).
    ``options``: the companion's ``-o`` text (``MountOptions.companion_options()``).
    Returns the :class:`Companion`, or one line saying why reads stay on the read-write
    connection."""
    private = tempfile.mkdtemp(prefix="bookfs-companion-")
    cmd = [sys.executable, "-m", "bookfs.cli", "mount", source, private, "-o", options]
    if log_file:
        cmd += ["--log-file", log_file]
    if debug:
        cmd.append("--debug")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        _remove(private)
        return f"the read-only companion did not start ({e})"
    m = re.search(r"daemon pid (\d+)", res.stdout)
    if res.returncode != 0 or m is None:
        _remove(private)
        said = (res.stderr or res.stdout).strip().splitlines()
        return f"the read-only companion did not start ({said[-1] if said else 'no output'})"
    companion = Companion(int(m.group(1)), [])
    try:
        for name in BOUND:
            inside, target = os.path.join(private, name), os.path.join(mountpoint, name)
            if os.path.isdir(inside) and os.path.isdir(target):
                _bind(inside, target)
                companion.bound.append(target)
    except OSError as e:
        companion.unbind()
        _detach_quietly(private)
        _remove(private)
        why = ("bind mounts need CAP_SYS_ADMIN" if e.errno == errno.EPERM else str(e))
        return f"reads through this connection: {why}"
    _detach_quietly(private)  # the binds hold the companion's mount now
    _remove(private)
    fuse_fd = re.search(r"fuse fd (\d+)", res.stdout)
    companion.take_connection(int(fuse_fd.group(1)) if fuse_fd else -1)
    log.info("companion: %s", companion.describe())
    return companion


def _detach_quietly(path: str) -> None:
    try:
        _detach(path)
    except OSError as e:
        log.warning("companion: %s", e)


def _remove(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError as e:
        log.warning("companion: cannot remove %s: %s", path, e)


def unbind_all(mountpoint: str) -> None:
    """Unmount a read-write mount's companion binds, before the mount itself (a plain
    unmount of a mount with mounts inside is EBUSY: module docstring).  Only bookfs
    mounts directly at ``BOUND`` names are touched; a busy one raises ``OSError``
    (EBUSY), leaving the rest mounted."""
    names = {os.path.join(mountpoint, name) for name in BOUND}
    for m in mounts_under(mountpoint):
        if m.point in names and m.is_bookfs:
            if _libc.umount2(os.fsencode(m.point), 0) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"{m.point}: {os.strerror(e)}")

