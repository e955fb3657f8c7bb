"""Real mounts for tests: ``mounted(source, mountpoint, "-o", "ro")`` runs the ``bookfs``
command (the daemon forks and returns when the mount is ready) and unmounts on exit,
waiting for the daemon to finish."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

BOOKFS = [sys.executable, "-m", "bookfs.cli"]


def run_bookfs(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*BOOKFS, *args], capture_output=True, text=True, check=check, **kw)


def daemon_pid(mountpoint: str) -> int | None:
    """The PID of the daemon serving ``mountpoint`` (from its mount message)."""
    return _PIDS.get(os.path.abspath(mountpoint))


_PIDS: dict[str, int] = {}


def force_unmount(mountpoint: str) -> None:
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)
    for _ in range(100):
        if not os.path.ismount(mountpoint):
            return
        time.sleep(0.05)


@contextlib.contextmanager
def mounted(source, mountpoint, *args: str, log_file: str | None = None):
    """Mount ``source`` at ``mountpoint`` (created if missing) for the ``with`` block."""
    source, mountpoint = os.fspath(source), os.fspath(mountpoint)
    os.makedirs(mountpoint, exist_ok=True)
    extra = ["--log-file", log_file] if log_file else []
    res = run_bookfs("mount", source, mountpoint, *args, *extra, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"bookfs mount failed: {res.stderr.strip()}")
    pid = int(res.stdout.split("daemon pid ")[1].split(";")[0])
    _PIDS[os.path.abspath(mountpoint)] = pid
    try:
        yield mountpoint
    finally:
        if os.path.ismount(mountpoint):
            run_bookfs("umount", mountpoint, check=False)
        force_unmount(mountpoint)
        _PIDS.pop(os.path.abspath(mountpoint), None)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
