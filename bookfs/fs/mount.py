"""Mounting and unmounting: the daemon's life cycle.

``mount()`` opens the log (a read-write mount takes the writer lock first), mounts, and
serves until unmounted or until SIGINT/SIGTERM, which unmount cleanly and release the
lock.  Unless ``foreground``, it forks: the parent returns only when the mount is ready
(or failed, with the daemon's one-line reason) and the daemon logs to a file.  The mount
uses ``auto_unmount``, so a daemon that dies never leaves a dead mount behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

log = logging.getLogger(__name__)

LOG_KEEP = 50  # daemon logs kept in the log directory; older ones are pruned
KNOWN_OPTIONS = {"ro", "rw", "allow_other", "default_permissions", "auto_unmount",
                 "stall_timeout", "segment_mb"}


class MountError(Exception):
    """A mount that could not be made; the message is one line for the user."""


def parse_options(text: str | None) -> dict[str, str | bool]:
    """``-o`` text (``ro,allow_other,stall_timeout=5``) as a dict; unknown ones refused."""
    opts: dict[str, str | bool] = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        if key not in KNOWN_OPTIONS:
            raise MountError(f"unknown mount option {key!r}; expected one of "
                             f"{', '.join(sorted(KNOWN_OPTIONS))}")
        opts[key] = value or True
    if opts.get("ro") and opts.get("rw"):
        raise MountError("options ro and rw contradict each other")
    return opts


def _fuse_options(source: str, opts: dict, readonly: bool) -> set[str]:
    fuse_opts = {"fsname=bookfs:" + source, "subtype=bookfs", "default_permissions"}
    if readonly:
        fuse_opts.add("ro")
    if opts.get("allow_other"):
        fuse_opts.add("allow_other")
    if opts.get("auto_unmount", True) is not False:
        fuse_opts.add("auto_unmount")
    return fuse_opts


def log_dir() -> str:
    """The daemon logs' directory: ``$BOOKFS_LOG_DIR``, else the platform's user log
    directory (``~/.local/state/bookfs/log`` on Linux)."""
    env = os.environ.get("BOOKFS_LOG_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_log_dir("bookfs")


def _private_dir(path: str) -> str:
    """``path``, created 0700 if missing; refused unless it is a real directory (not a
    symlink) owned by this user and closed to others."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise MountError(f"{path}: the log directory must be a directory owned by uid "
                         f"{os.getuid()} and not writable by others")
    return path


def open_log_file(path: str | None) -> tuple[str, int]:
    """``(path, fd)`` of the daemon's log, opened so that a planted symlink or file can
    never redirect it: a given path is opened with ``O_NOFOLLOW`` (appending); the default
    is a new file, ``O_EXCL | O_NOFOLLOW``, in the private :func:`log_dir`, whose oldest
    logs beyond ``LOG_KEEP`` are pruned."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    if path is None:
        directory = _private_dir(log_dir())
        _prune_logs(directory)
        path = os.path.join(directory, time.strftime("bookfs-%Y%m%d-%H%M%S-")
                            + f"{os.getpid()}.log")
        flags |= os.O_EXCL
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        raise MountError(f"{path}: cannot open the daemon log ({e.strerror}); expected a "
                         "regular file that is not a symlink") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise MountError(f"{path}: the daemon log must be a regular file")
    return path, fd


def _prune_logs(directory: str) -> None:
    with contextlib.suppress(OSError):
        logs = sorted((e for e in os.scandir(directory)
                       if e.name.startswith("bookfs-") and e.name.endswith(".log")
                       and e.is_file(follow_symlinks=False)),
                      key=lambda e: e.stat(follow_symlinks=False).st_mtime)
        for e in logs[: max(0, len(logs) - LOG_KEEP + 1)]:
            with contextlib.suppress(OSError):
                os.unlink(e.path)


def check_places(source: str, mountpoint: str) -> None:
    """Refuse a mount point that is the source, lies inside it, or contains it: the
    daemon would then reach its own files through its own mount and deadlock."""
    src, mnt = os.path.realpath(source), os.path.realpath(mountpoint)
    if mnt == src or mnt.startswith(src.rstrip("/") + "/"):
        raise MountError(f"{mountpoint}: the mount point lies inside the source {source}; "
                         "expected a mount point outside it")
    if src.startswith(mnt.rstrip("/") + "/"):
        raise MountError(f"{mountpoint}: the mount point contains the source {source}; "
                         "expected a mount point outside it")


def mount(source: str, mountpoint: str, *, options: str | None = None,
          foreground: bool = False, debug: bool = False, log_file: str | None = None) -> int:
    """Mount ``source`` (a directory holding book.log and meta.bin) at ``mountpoint``.
    Returns a process exit status; prints where it mounted or why it could not."""
    opts = parse_options(options)
    readonly = bool(opts.get("ro"))
    source = os.path.abspath(source)
    mountpoint = os.path.abspath(mountpoint)
    if not os.path.isdir(mountpoint):
        raise MountError(f"{mountpoint}: not a directory (create the mount point first)")
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint}: something is already mounted there")
    check_places(source, mountpoint)
    # descriptors' links name files by their real path: resolve it before mounting
    mountpoint = os.path.realpath(mountpoint)
    if foreground:
        return _serve(source, mountpoint, opts, readonly, debug, ready_fd=None,
                      log_file=log_file)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(r)
        os.setsid()
        code = 1
        try:
            code = _serve(source, mountpoint, opts, readonly, debug, ready_fd=w,
                          log_file=log_file, daemon=True)
        except BaseException as e:  # report to the parent, never unwind into its code
            with contextlib.suppress(OSError):  # the parent may be gone already
                os.write(w, f"ERR {e}".encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode("utf-8", "replace")
    if msg.startswith("OK"):
        print(f"bookfs: mounted {source} at {mountpoint} "
              f"({'read-only' if readonly else 'read-write'}; daemon pid {pid}; "
              f"log {msg[3:].strip()})")
        return 0
    os.waitpid(pid, 0)
    print(f"bookfs: cannot mount {source}: {msg[4:] if msg.startswith('ERR') else 'the daemon died'}",
          file=sys.stderr)
    return 1


def _setup_logging(log_file: str | None, debug: bool, daemon: bool) -> str | None:
    """Log to ``log_file`` (or, for a daemon, a new file in :func:`log_dir`), else to
    stderr.  Returns the log's path."""
    level = logging.DEBUG if debug or os.environ.get("BOOKFS_DEBUG_FLUSH") else logging.INFO
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    if log_file or daemon:
        log_file, fd = open_log_file(log_file)
        handler = logging.StreamHandler(os.fdopen(fd, "a", buffering=1))
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
    return log_file


def _serve(source, mountpoint, opts, readonly, debug, ready_fd, log_file,
           daemon: bool = False) -> int:
    import pyfuse3
    import trio

    from ..errors import LockHeld, ReadOnly
    from ..pier import open_source
    from ..segments import DEFAULT_SPAN
    from .ops import BookOperations

    log_file = _setup_logging(log_file, debug, daemon)
    if ready_fd is not None:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
    try:
        book = open_source(source, writable=not readonly)
    except LockHeld as e:
        raise MountError(f"{e}; mount it read-only with -o ro") from None
    except ReadOnly as e:
        if opts.get("rw"):
            raise MountError(f"{e}; it cannot be mounted read-write") from None
        log.warning("%s; mounting read-only", e)
        readonly = True
        book = open_source(source, writable=False)
    try:
        ops = BookOperations(book, debug=debug, mountpoint=mountpoint,
                             segment_span=int(float(opts.get("segment_mb", DEFAULT_SPAN >> 20))
                                              * (1 << 20)),
                             stall_timeout=float(opts.get("stall_timeout", 30)))
        pyfuse3.init(ops, mountpoint, _fuse_options(source, opts, readonly))
    except BaseException:
        book.close()
        raise
    _start_watchdog(mountpoint)
    log.info("mounted %s at %s (%s); events %s", source, mountpoint,
             "ro" if readonly else "rw", book.gulf())
    if ready_fd is not None:
        os.write(ready_fd, f"OK {log_file}".encode())
        os.close(ready_fd)
    else:
        print(f"bookfs: mounted {source} at {mountpoint}; Ctrl-C unmounts", file=sys.stderr)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            async def stop_on_signal():
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for sig in signals:
                        log.info("signal %d: unmounting", sig)
                        ops.queue.shutdown(f"signal {sig}: the mount is going away")
                        pyfuse3.terminate()
                        return

            nursery.start_soon(stop_on_signal)
            if ops.readonly:
                nursery.start_soon(ops.follow_loop)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        try:
            pyfuse3.close(unmount=True)
        finally:
            book.close()
            log.info("unmounted %s; lock released", mountpoint)
    return 0


def _mount_id(mountpoint: str) -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == mountpoint:
                found = fields[0]  # the last (topmost) mount there wins
    return locals().get("found")


def _start_watchdog(mountpoint: str) -> None:
    """Fork a tiny process that lazily unmounts ``mountpoint`` if this daemon dies without
    unmounting (SIGKILL, a crash), so no dead mount is left behind.  libfuse's
    ``auto_unmount`` aims at the same, but its helper was seen to leave dead mounts; this
    one waits on a pipe that only the daemon holds open and unmounts only the very mount
    it was started for (by mount ID), never a later one at the same place."""
    mount_id = _mount_id(mountpoint)
    if mount_id is None:
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(r)
        os.set_inheritable(w, False)
        _WATCHDOG_FDS.append(w)  # held until this process dies
        return
    try:  # the watchdog: no FUSE descriptor, no signals from the daemon's terminal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setsid()
        os.closerange(3, r)
        os.closerange(r + 1, 65536)
        while os.read(r, 1):  # EOF once the daemon has exited, however it died
            continue
        if _mount_id(mountpoint) == mount_id:
            tool = shutil.which("fusermount3") or shutil.which("fusermount") or "umount"
            subprocess.run([tool, "-u", "-z", mountpoint] if "fuse" in tool
                           else [tool, "-l", mountpoint], capture_output=True)
    finally:
        os._exit(0)


_WATCHDOG_FDS: list[int] = []


def umount(mountpoint: str, *, timeout: float = 30.0) -> int:
    """Unmount ``mountpoint`` and wait for its daemon to finish (index saved, lock freed)."""
    mountpoint = os.path.abspath(mountpoint)
    found = _mounted_source(mountpoint)
    if found is None:
        raise MountError(f"{mountpoint}: no bookfs mount there")
    source, readonly = found
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", mountpoint] if tool else ["umount", mountpoint]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise MountError(f"{mountpoint}: {res.stderr.strip() or 'unmount failed'}")
    if not readonly:  # a read-only daemon holds no lock: nothing to wait for
        _wait_for_daemon(source, timeout)
    print(f"bookfs: unmounted {mountpoint}")
    return 0


def _mounted_source(mountpoint: str) -> tuple[str, bool] | None:
    """``(source, readonly)`` of the FUSE mount at ``mountpoint``, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            parts, rparts = left.split(), right.split()
            if parts[4] == mountpoint and rparts and rparts[0].startswith("fuse"):
                src = rparts[1] if len(rparts) > 1 else ""
                src = src[len("bookfs:"):] if src.startswith("bookfs:") else src
                return src, "ro" in parts[5].split(",")
    return None


def _wait_for_daemon(source: str, timeout: float) -> None:
    """Wait until the daemon that served ``source`` has exited (its lock is free): the
    lock :func:`bookfs.lock.lock_path_for` names, whatever path was mounted."""
    from ..lock import WriterLock, lock_path_for

    lock = lock_path_for(source)
    deadline = time.monotonic() + timeout
    while WriterLock.is_held(lock) and time.monotonic() < deadline:
        time.sleep(0.05)
