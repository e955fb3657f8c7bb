"""Mounting and unmounting: the daemon's life cycle.

``mount()`` opens the log (a read-write mount takes the writer lock first), mounts, and
serves until unmounted or until SIGINT/SIGTERM, which unmount cleanly and release the
lock.  Unless ``foreground``, it forks: the parent returns only when the mount is ready
(or failed, with the daemon's one-line reason) and the daemon logs to a file.  The mount
uses ``auto_unmount``, so a daemon that dies never leaves a dead mount behind.

The ``-o`` options are sorted in :mod:`bookfs.fs.daemon.options` (re-exported here:
``parse_options``, ``options_help``, ``MountError``, ``OptionError``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

from bookfs.errors import BookError, UsageError
from bookfs.formats.fileio import private_dir
from bookfs.fs.daemon.mountinfo import bookfs_mount_at, mount_at
from bookfs.fs.daemon.mainloop import log_busy_poll, main_options, max_tasks
from bookfs.fs.daemon.options import (DEFAULT_STALL_TIMEOUT, MountError, MountOptions, OptionError,
                               options_help, parse_options)

__all__ = ["DEFAULT_STALL_TIMEOUT", "LOG_KEEP", "MountError", "MountOptions", "OptionError",
           "check_places", "log_dir", "max_tasks", "mount", "open_log_file", "options_help",
           "parse_options", "umount"]

log = logging.getLogger(__name__)

LOG_KEEP = 50  # daemon logs kept in the log directory; older ones are pruned


def log_dir() -> str:
    """The daemon logs' directory: ``$BOOKFS_LOG_DIR``, else the platform's user log
    directory (``~/.local/state/bookfs/log`` on Linux)."""
    env = os.environ.get("BOOKFS_LOG_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_log_dir("bookfs")


def open_log_file(path: str | None) -> tuple[str, int]:
    """``(path, fd)`` of the daemon's log, opened so that a planted symlink or file can
    never redirect it: a given path is opened with ``O_NOFOLLOW`` (appending); the default
    is a new file, ``O_EXCL | O_NOFOLLOW``, in the private :func:`log_dir`, whose oldest
    logs beyond ``LOG_KEEP`` are pruned.  The process that opens it (the daemon: it runs
    in the forked child) holds a shared ``flock`` on it for its lifetime, which tells
    pruning that its daemon is alive (:func:`_prune_logs`); the descriptor is close-on-exec
    and the watchdog closes its copy, so no other process keeps the lock."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    if path is None:
        directory = private_dir(log_dir(), "log directory")
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
    fcntl.flock(fd, fcntl.LOCK_SH)  # "my daemon is alive": released when it exits
    return path, fd


def _prune_logs(directory: str) -> None:
    """Delete the oldest daemon logs in ``directory`` so that ``LOG_KEEP`` remain with
    the new one, never the log of a live daemon: a log is deleted only while this process
    holds an exclusive ``flock`` on it, taken without waiting, which fails while its daemon
    holds its shared one (:func:`open_log_file`).  Live daemons' logs do not count as
    prunable, however old; logs of daemons that are gone are pruned in their place."""
    with contextlib.suppress(OSError):
        logs = sorted((e for e in os.scandir(directory)
                       if e.name.startswith("bookfs-") and e.name.endswith(".log")
                       and e.is_file(follow_symlinks=False)),
                      key=lambda e: e.stat(follow_symlinks=False).st_mtime)
        excess = len(logs) - LOG_KEEP + 1
        for e in logs:
            if excess <= 0:
                break
            if _unlink_if_dead(e.path):
                excess -= 1


def _unlink_if_dead(path: str) -> bool:
    """Unlink the log at ``path`` unless a live daemon holds its lock (True if done)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EWOULDBLOCK: its daemon is alive
            return False
        st, now = os.fstat(fd), os.lstat(path)
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            return False  # the name was given to another file meanwhile
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


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
          foreground: bool = False, debug: bool = False, log_file: str | None = None,
          serve=None) -> int:
    """Mount ``source`` (a directory holding book.log and meta.bin) at ``mountpoint``.
    Returns a process exit status; prints where it mounted or why it could not.
    ``serve``: what the daemon runs instead of serving one log (``fs/fleet/daemon.py``)."""
    serve = serve or _serve
    opts = parse_options(options)
    readonly = opts.readonly
    _configure_index(opts)
    source = os.path.abspath(source)
    mountpoint = os.path.abspath(mountpoint)
    if not os.path.exists(source):
        raise UsageError(f"{source}: no such file or directory; expected a pier, a Book "
                         "directory or an LMDB epoch")
    if not os.path.isdir(mountpoint):
        raise UsageError(f"{mountpoint}: not a directory (create the mount point first)")
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint}: something is already mounted there")
    check_places(source, mountpoint)
    # descriptors' links name files by their real path: resolve it before mounting
    mountpoint = os.path.realpath(mountpoint)
    if foreground:
        return serve(source, mountpoint, opts, readonly, debug, ready_fd=None,
                      log_file=log_file)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(r)
        os.setsid()
        code = 1
        try:
            code = serve(source, mountpoint, opts, readonly, debug, ready_fd=w,
                          log_file=log_file, daemon=True)
        except BaseException as e:  # report to the parent, never unwind into its code
            kind = "USE" if isinstance(e, (OptionError, UsageError)) else "ERR"
            with contextlib.suppress(OSError):  # the parent may be gone already
                os.write(w, f"{kind} {e}".encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode("utf-8", "replace")
    if msg.startswith("OK"):
        log_path, _, fuse_fd = msg[3:].partition("\n")
        fuse = f"; fuse fd {fuse_fd.strip()}" if fuse_fd.strip() not in ("", "-1") else ""
        print(f"bookfs: mounted {source} at {mountpoint} "
              f"({'read-only' if readonly else 'read-write'}; daemon pid {pid}; "
              f"log {log_path.strip()}{fuse})")
        return 0
    os.waitpid(pid, 0)
    said = msg[4:] if msg[:4] in ("ERR ", "USE ") else "the daemon died"
    print(f"bookfs: cannot mount {source}: {said}", file=sys.stderr)
    return 2 if msg.startswith("USE ") else 1  # 2: bad usage (an option FUSE refused)


def _configure_index(opts: MountOptions) -> None:
    """Apply ``index_dir=`` / ``noindex_cache`` (they override ``--index-dir`` and
    ``--no-index-cache``); an index directory that cannot be made private is refused."""
    from bookfs.formats import index

    if not opts.index_cache:
        index.configure_cache(None, enabled=False)
    elif opts.index_dir:
        try:
            private_dir(opts.index_dir, "index directory")
        except OSError as e:
            raise OptionError(f"index_dir={opts.index_dir}: {e.strerror}; expected a "
                              "directory bookfs can create or write") from None
        except BookError as e:
            raise OptionError(f"index_dir={e}") from None
        index.configure_cache(opts.index_dir)


_FUSE_UNKNOWN = re.compile(r"unknown option\(s\): `(.*?)'")


def _init_fuse(ops, mountpoint: str, fuse_opts: set[str]) -> None:
    """``pyfuse3.init``, with what libfuse prints on stderr caught: a refusal becomes one
    :class:`MountError` line naming the options FUSE did not accept (or FUSE's own last
    line), instead of pyfuse3's bare ``fuse_session_new failed``; anything else libfuse
    says is logged."""
    import pyfuse3

    failure, said = _libfuse_call(pyfuse3.init, ops, mountpoint, fuse_opts)
    if failure is None:
        if said:
            log.warning("libfuse: %s", said.replace("\n", "; "))
        return
    _refuse_unknown_options(said)
    last = said.splitlines()[-1].removeprefix("fuse: ") if said else str(failure)
    raise MountError(f"FUSE refused the mount: {last}") from None


#: A mount point that cannot exist: :func:`check_fuse_options` lets libfuse parse the
#: options and then fail to mount there.
_NOWHERE = "/nonexistent/bookfs-option-check"


def check_fuse_options(fuse_opts: set[str]) -> None:
    """Let libfuse parse ``fuse_opts`` (``fuse_session_new``) before the log is opened, so
    that an option it does not know is refused as bad usage (:class:`OptionError`), not
    reported after the writer lock was found held.  The mount it then tries at a path
    that does not exist fails, as it must; the real ``pyfuse3.init`` comes later."""
    import pyfuse3

    failure, said = _libfuse_call(pyfuse3.init, pyfuse3.Operations(), _NOWHERE, fuse_opts)
    if failure is None:  # pragma: no cover - _NOWHERE cannot be mounted on
        pyfuse3.close(unmount=True)
        return
    _refuse_unknown_options(said)


def _refuse_unknown_options(said: str) -> None:
    unknown = _FUSE_UNKNOWN.search(said)
    if unknown:
        names = sorted({name for word in unknown.group(1).split()
                        for name in word.removeprefix("-o").split(",") if name})
        raise OptionError(f"FUSE does not accept the mount option(s) {', '.join(names)}; "
                         "see bookfs mount --help for the options bookfs knows") from None


def _libfuse_call(fn, *args) -> tuple[BaseException | None, str]:
    """``fn(*args)`` with file descriptor 2 caught: ``(the RuntimeError it raised or None,
    what libfuse printed)``."""
    import tempfile

    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(err.fileno(), 2)
        try:
            fn(*args)
            failure = None
        except RuntimeError as e:
            failure = e
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        said = err.read().decode("utf-8", "replace").strip()
    return failure, said


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

    from bookfs.errors import LockHeld, ReadOnly
    from bookfs.formats.pier import open_source
    from bookfs.fs.daemon import readahead
    from bookfs.fs.dates import date_pass
    from bookfs.fs.ops import FEATURES, LogOperations
    from bookfs.fs.watch import COMPANION_LOOK_BURST

    log_file = _setup_logging(log_file, debug, daemon)
    if ready_fd is not None:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
    check_fuse_options(opts.fuse_options(source, readonly))  # before any lock is taken
    try:
        book = open_source(source, writable=not readonly)
    except LockHeld as e:
        raise MountError(f"{e}; mount it read-only with -o ro") from None
    except ReadOnly as e:
        if opts.rw:
            raise MountError(f"{e}; it cannot be mounted read-write") from None
        log.warning("%s; mounting read-only", e)
        readonly = True
        book = open_source(source, writable=False)
    try:
        ops = LogOperations(book, debug=debug, mountpoint=mountpoint,
                             segment_span=opts.segment_span,
                             stall_timeout=opts.stall_timeout,
                             follow_timeout=opts.follow_timeout,
                             owner=(opts.uid, opts.gid), umask=opts.umask)
        ops.new_files.checked = not opts.unchecked_payloads  # -o unchecked_payloads
        ops.readdirplus_auto = opts.readdirplus == "auto" and "readdirplus_auto" in FEATURES
        if opts.companion:  # told of commits by its read-write daemon: looks less often
            ops.watch.look_burst = COMPANION_LOOK_BURST
        if opts.ignored:
            log.info("mount options accepted without effect: %s", ",".join(opts.ignored))
        _init_fuse(ops, mountpoint, opts.fuse_options(source, readonly))
        here = mount_at(mountpoint, resolve=False)  # no stat: the mount is not served yet
        ops.set_device(here.device if here is not None else None)
    except BaseException:
        book.close()
        raise
    _start_watchdog(mountpoint)
    log.info("mounted %s at %s (%s); events %s", source, mountpoint,
             "ro" if readonly else "rw", book.gulf())

    ready = ready_reporter(ready_fd, log_file, f"{source} at {mountpoint}")

    async def start() -> None:
        """Raise the readahead (``readahead.py``), then report ready, or start the
        companion, which does once bound: a read right after the mount has 1 MiB READs."""
        if here is not None:
            await readahead.after_init(mountpoint, here.device)
        if readonly or opts.single_connection or "read_inode" not in FEATURES:
            if opts.single_connection and not readonly:
                ops.reads_note = "through this connection (-o single_connection)"
            elif not readonly:
                ops.reads_note = ("through this connection (stock pyfuse3: a read-only "
                                  "connection would not save a request)")
            ready()
        else:  # reads through a read-only companion (fs/daemon/companion.py)
            await _companion(ops, source, mountpoint, opts, log_file, debug, ready)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(start)
            async def stop_on_signal():
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for sig in signals:
                        log.info("signal %d: unmounting", sig)
                        ops.queue.shutdown(f"signal {sig}: the mount is going away")
                        ops.tail.close(f"signal {sig}: the mount is going away")
                        pyfuse3.terminate()
                        return

            nursery.start_soon(stop_on_signal)
            nursery.start_soon(ops.tail.watch)  # follow/ waiters after a lazy unmount
            # dates for listings (fs/dates.py); a companion's only while the log rests
            nursery.start_soon(functools.partial(date_pass, book, rest=opts.companion))
            if ops.readonly:
                nursery.start_soon(ops.watch_loop)
            # a read-write daemon whose reads go through its companion answers appends,
            # which wait on commits: it does not poll (mainloop.main_options says why)
            serves_reads = readonly or opts.single_connection or "read_inode" not in FEATURES
            loop_options = main_options(opts.busy_poll if serves_reads else 0)
            await pyfuse3.main(**loop_options)
            log_busy_poll(loop_options)
            nursery.cancel_scope.cancel()

    try:
        _run_profiled(trio.run, run, suffix=".ro" if readonly else "")
    finally:
        try:
            pyfuse3.close(unmount=True)
        finally:
            ops.queue.saver.close()  # no save runs now: the loop that awaited them is gone
            ops.prober.close(wait=False)  # a probe past its deadline is not waited for
            book.close()
            log.info("unmounted %s; lock released", mountpoint)
    return 0


#: Environment variable: a file to write a :mod:`cProfile` of the daemon's event loop to at
#: unmount (``pstats`` format; the event-loop thread's CPU time, so waiting in ``epoll``
#: counts as nothing; a read-only mount writes it with ``.ro`` appended, so that a
#: read-write mount's companion does not overwrite its daemon's), for benchmarks that say
#: where a request's CPU goes (bench/bench_append.py --profile).
PROFILE_ENV = "BOOKFS_PROFILE"


def _own_fuse_fd() -> int:
    """This daemon's ``/dev/fuse`` descriptor, or -1: said in the ready line, so that a
    read-write mount can copy its companion's connection without reading its ``/proc``."""
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                    return int(name)
    return -1


def ready_reporter(ready_fd: int | None, log_file: str | None, said: str):
    """The call that reports the mount ready: to the parent through ``ready_fd`` (the
    forked daemon), or on stderr in the foreground (``said``: what is mounted where)."""
    def ready() -> None:
        if ready_fd is not None:
            os.write(ready_fd, f"OK {log_file}\n{_own_fuse_fd()}".encode())
            os.close(ready_fd)
        else:
            print(f"bookfs: mounted {said}; Ctrl-C unmounts", file=sys.stderr)
    return ready


async def _companion(ops, source, mountpoint, opts, log_file, debug, ready) -> None:
    """Start the read-write mount's read-only companion (in a thread: binding over this
    mount's directories looks them up through it), report the mount ready, then watch
    the companion: if its daemon exits while this mount is served, detach its binds."""
    import trio

    from bookfs.fs.daemon import companion as comp

    try:
        got = await trio.to_thread.run_sync(functools.partial(
            comp.start, source, mountpoint, opts.companion_options(), log_file=log_file,
            debug=debug))
    finally:
        ready()
    if isinstance(got, str):
        ops.reads_note = got
        log.warning("%s", got)
        return
    ops.reads_note = got.describe()
    ops.companion = got  # told of every commit (ops._committed)
    pidfd = got.pidfd()
    if pidfd is None:
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
        ops.companion = None
        got.close_connection()
    log.warning("the read-only companion (pid %d) exited: reads go through this "
                "connection now", got.pid)
    ops.reads_note = f"through this connection (the companion, pid {got.pid}, exited)"
    await trio.to_thread.run_sync(got.unbind)


def _run_profiled(run, *args, suffix: str = "") -> None:
    """``run(*args)``, under :mod:`cProfile` when :data:`PROFILE_ENV` names a file (the
    profile goes to that name plus ``suffix``)."""
    path = os.environ.get(PROFILE_ENV)
    if not path:
        run(*args)
        return
    path += suffix
    import cProfile

    prof = cProfile.Profile(time.thread_time)  # CPU of the loop's thread, not waits
    try:
        prof.runcall(run, *args)
    finally:
        prof.dump_stats(path)
        log.info("profile of the event loop written to %s", path)


def _mount_id(mountpoint: str) -> str | None:
    m = mount_at(mountpoint, resolve=False)
    return m.mount_id if m else None


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


def umount(mountpoint: str, *, lazy: bool = False, timeout: float = 30.0) -> int:
    """Unmount the bookfs mount at ``mountpoint``.  Normally refused while it is busy (a
    process has a file open or its cwd inside); then waits for a read-write mount's
    daemon to finish (index saved, writer lock freed).  ``lazy`` (like ``umount -l`` and
    ``fusermount3 -u -z``) detaches the mount at once, even while busy, and returns: the
    daemon finishes, saving and releasing the lock, once the last open file or cwd inside
    is let go.  Raises :class:`MountError` (one line) when nothing, or no bookfs mount, is
    mounted there, or the unmount fails."""
    mountpoint = os.path.realpath(mountpoint)
    source, readonly = _mounted_source(mountpoint)
    if not lazy:  # a lazy detach takes the companion's binds along
        from bookfs.fs.daemon.companion import unbind_all

        try:
            unbind_all(mountpoint)  # a mount with mounts inside is busy for umount
        except OSError as e:
            hint = "; bookfs umount -l detaches it lazily" if e.errno == errno.EBUSY else ""
            raise MountError(f"{e.strerror}{hint}") from None
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool:
        cmd = [tool, "-u", *(["-z"] if lazy else []), mountpoint]
    else:
        cmd = ["umount", *(["-l"] if lazy else []), mountpoint]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        said = res.stderr.strip().splitlines()
        hint = "; bookfs umount -l detaches it lazily" if "busy" in res.stderr else ""
        raise MountError(f"{mountpoint}: {said[-1] if said else 'unmount failed'}{hint}")
    if lazy:
        print(f"bookfs: detached {mountpoint}; its daemon finishes once the last open "
              "file inside is closed")
        return 0
    if not readonly and source:  # a read-only daemon holds no lock: nothing to wait for
        _wait_for_daemon(source, timeout)
    print(f"bookfs: unmounted {mountpoint}")
    return 0


def _mounted_source(mountpoint: str) -> tuple[str | None, bool]:
    """``(source, readonly)`` of the bookfs mount at ``mountpoint`` (the topmost one there);
    ``source`` is None when the mount was given another ``fsname=``.  Raises
    :class:`UsageError` when nothing, or something other than bookfs, is mounted there."""
    m = bookfs_mount_at(mountpoint)
    return m.bookfs_source, m.readonly


def _wait_for_daemon(source: str, timeout: float) -> None:
    """Wait until the daemon that served ``source`` has exited (its lock is free): the
    lock :func:`bookfs.formats.lock.lock_path_for` names, whatever path was mounted."""
    from bookfs.formats.lock import WriterLock, lock_path_for

    lock = lock_path_for(source)
    deadline = time.monotonic() + timeout
    while WriterLock.is_held(lock) and time.monotonic() < deadline:
        time.sleep(0.05)
