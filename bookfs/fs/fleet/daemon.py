"""``bookfs mount --fleet DIR MNT``: the daemon of a fleet mount (``fs/fleet/ops.py``).

The life cycle is a single mount's (``fs/daemon/mount.py``: fork, ready pipe, watchdog, SIGINT and
SIGTERM unmount, daemon log), with :class:`~bookfs.fs.fleet.FleetOperations` served
instead of one log's operations.  A fleet is always read-only (``-o rw`` is refused as
bad usage); its ``fsname`` is ``bookfs-fleet:DIR``.  The mount is ready once ``DIR`` has
been listed and each ship's meta read: no log is opened.
"""

from __future__ import annotations

import functools
import logging
import os
import signal

from bookfs.errors import UsageError
from bookfs.formats.fleet import FLEET_FSNAME_PREFIX
from bookfs.fs.daemon import mount as M
from bookfs.fs.fleet.ahead import MAX_SHIPS
from bookfs.fs.fleet.ops import IDLE_CLOSE, MAX_OPEN
from bookfs.fs.daemon import mainloop
from bookfs.fs.daemon.options import parse_options

log = logging.getLogger(__name__)


def mount_fleet(directory: str, mountpoint: str, *, options: str | None = None,
                foreground: bool = False, debug: bool = False,
                log_file: str | None = None, max_open: int = MAX_OPEN,
                idle_close: float = IDLE_CLOSE, ships_ahead: int = MAX_SHIPS) -> int:
    """Mount every log under ``directory`` at ``mountpoint`` (read-only): at most
    ``max_open`` logs open at once, each closed after ``idle_close`` seconds unused; the
    cards of up to ``ships_ahead`` ships built ahead of a walk (``fs/fleet/ahead.py``).
    Returns a process exit status; prints where it mounted or why it could not."""
    if max_open < 1 or idle_close < 0:
        raise UsageError(f"--max-open {max_open} --idle-close {idle_close}: expected at "
                         "least 1 open log and a non-negative idle time")
    opts = parse_options(options)
    if opts.rw:
        raise UsageError("--fleet: a fleet mount is read-only; drop -o rw")
    if not os.path.isdir(directory):
        raise UsageError(f"--fleet {directory}: not a directory; expected a directory "
                         "holding one pier (or Book directory, or LMDB epoch) per ship")
    return M.mount(directory, mountpoint, options=",".join(filter(None, ["ro", options])),
                   foreground=foreground, debug=debug, log_file=log_file,
                   serve=functools.partial(_serve_fleet, max_open=max_open,
                                           idle_close=idle_close, ships_ahead=ships_ahead))


def _serve_fleet(source, mountpoint, opts, readonly, debug, ready_fd, log_file,
                 daemon: bool = False, *, max_open: int = MAX_OPEN,
                 idle_close: float = IDLE_CLOSE, ships_ahead: int = MAX_SHIPS) -> int:
    import pyfuse3
    import trio

    from bookfs.fs.fleet.ops import FleetOperations

    log_file = M._setup_logging(log_file, debug, daemon)
    if ready_fd is not None:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
    if not any(o.startswith("fsname=") for o in opts.fuse):
        escaped = source.replace("\\", "\\\\").replace(",", "\\,")
        opts.fuse.append("fsname=" + FLEET_FSNAME_PREFIX + escaped)
    fuse_opts = opts.fuse_options(source, True)
    M.check_fuse_options(fuse_opts)
    ops = FleetOperations(source, mountpoint, segment_span=opts.segment_span,
                          owner=(opts.uid, opts.gid), umask=opts.umask,
                          follow_timeout=opts.follow_timeout, debug=debug,
                          max_open=max_open, idle_close=idle_close,
                          ships_ahead=ships_ahead)
    if opts.ignored:
        log.info("mount options accepted without effect: %s", ",".join(opts.ignored))
    M._init_fuse(ops, mountpoint, fuse_opts)
    M._start_watchdog(mountpoint)
    log.info("mounted the fleet %s at %s: %d ships", source, mountpoint,
             len(ops.fleet.ships))

    ready = M.ready_reporter(ready_fd, log_file, f"the fleet {source} at {mountpoint}")

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            async def stop_on_signal():
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for sig in signals:
                        log.info("signal %d: unmounting", sig)
                        for ship in list(ops.open_ships.values()):
                            ship.tail.close(f"signal {sig}: the mount is going away")
                        pyfuse3.terminate()
                        return

            nursery.start_soon(stop_on_signal)
            nursery.start_soon(ops.loop)
            ready()
            loop_options = mainloop.main_options(opts.busy_poll)
            await pyfuse3.main(**loop_options)
            mainloop.log_busy_poll(loop_options)
            nursery.cancel_scope.cancel()

    try:
        M._run_profiled(trio.run, run)
    finally:
        try:
            pyfuse3.close(unmount=True)
        finally:
            ops.close_all()
            log.info("unmounted the fleet at %s", mountpoint)
    return 0
