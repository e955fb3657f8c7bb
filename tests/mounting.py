"""Real mounts for tests: ``mounted(source, mountpoint, "-o", "ro")`` runs the ``bookfs``
command (the daemon forks and returns when the mount is ready) and unmounts on exit,
waiting for the daemon to finish."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
import time

BOOKFS = [sys.executable, "-m", "bookfs.cli"]


def proc_text(pid: int, name: str, deadline: float = 5.0) -> str | None:
    """The text of ``/proc/<pid>/<name>`` of another process, or None once it is gone.

    Read in a thread and waited for with a ``deadline``: a read of another process's
    ``/proc`` entries can wait behind that process's locks (how issue 20's hung fixture
    waited for 33 minutes), so a read that does not return in time fails the test with
    one line instead of hanging it."""
    out: list = []

    def read() -> None:
        try:
            with open(f"/proc/{pid}/{name}") as f:
                out.append(f.read())
        except (FileNotFoundError, ProcessLookupError):
            out.append(None)
        except OSError as e:
            out.append(e)

    t = threading.Thread(target=read, daemon=True, name=f"read /proc/{pid}/{name}")
    t.start()
    t.join(deadline)
    if not out:
        raise AssertionError(f"reading /proc/{pid}/{name} took over {deadline} s")
    if isinstance(out[0], OSError):
        raise out[0]
    return out[0]


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[0]`` is the state,
    ``[11]``/``[12]`` utime/stime), or None once the process is gone."""
    text = proc_text(pid, "stat")
    return None if text is None else text.rsplit(")", 1)[1].split()


def proc_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie nobody reaped yet)."""
    fields = proc_stat(pid)
    return fields is None or fields[0] == "Z"


def proc_status_kib(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB, e.g. ``VmHWM`` or ``VmRSS``."""
    text = proc_text(pid, "status")
    assert text is not None, f"process {pid} is gone"
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def noun_payload(data: bytes) -> bytes:
    """``mug ++ jam`` of one atom made of ``data``'s bits, exactly ``len(data)`` bytes long
    (at least 5: a 4-byte mug, then a jam of at least one byte), with the atom's true mug:
    a payload a checked ``new/`` accepts (issue 21)."""
    from bookfs.noun import jam, mug

    size = len(data)
    if size < 5:
        raise ValueError(f"a payload of {size} bytes cannot hold a noun (5 at least)")
    room = 8 * (size - 4)  # the jam's bits: 1 (atom tag) + 2 * bitlen(b) + b for b bits
    b = room
    while b and 1 + 2 * b.bit_length() + b > room:
        b -= 1
    atom = (int.from_bytes(data, "little") & ((1 << b) - 1)) | (1 << (b - 1)) if b else 0
    out = mug(atom).to_bytes(4, "little") + jam(atom)
    assert len(out) == size, (size, len(out))
    return out


def noun(data: bytes) -> bytes:
    """``mug ++ jam`` of the atom whose bytes are ``data`` (a cord of them), with its true
    mug: the event a test appends where it once appended ``data`` itself."""
    from bookfs.noun import jam, mug

    atom = int.from_bytes(data, "little")
    return mug(atom).to_bytes(4, "little") + jam(atom)


def octal(data: bytes) -> str:
    """``data`` as ``printf`` escapes (``\\001``...), for a shell command line."""
    return "".join(f"\\{b:03o}" for b in data)


def run_bookfs(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*BOOKFS, *args], capture_output=True, text=True, check=check, **kw)


def sample_log(directory: str, events: int) -> str:
    """``directory/log<events>``, a ``bookfs sample`` log of ``events`` events, made there
    unless it already is (the benchmarks' shared input)."""
    src = os.path.join(directory, f"log{events}")
    if not os.path.exists(os.path.join(src, "book.log")):
        os.makedirs(directory, exist_ok=True)
        subprocess.run([*BOOKFS, "sample", src, "--events", str(events)], check=True)
    return src


def daemon_pid(mountpoint: str) -> int | None:
    """The PID of the daemon serving ``mountpoint`` (from its mount message)."""
    return _PIDS.get(os.path.abspath(mountpoint))


_PIDS: dict[str, int] = {}


def where_stuck(pids, mountpoint: str | None = None) -> str:
    """For a failure's message: where each process of ``pids``, each of its descendants
    and each bookfs daemon whose command line names ``mountpoint`` waits, thread by thread
    (``/proc``: state, ``wchan``, the kernel stack, the signal masks).  Reads no file of
    a mount, which may be what is stuck."""
    def children(pid: int) -> list[int]:
        out = []
        for task in _listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except OSError:
                pass
        return out

    todo, seen = list(pids), []
    if mountpoint:
        needle = os.path.abspath(mountpoint).encode()
        for entry in _listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                if b"mount" in argv and any(needle in a for a in argv):
                    todo.append(int(entry))
    while todo:
        pid = todo.pop(0)
        if pid not in seen:
            seen.append(pid)
            todo += children(pid)
    lines = []
    for pid in seen:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            cmd = "(gone)"
        lines.append(f"pid {pid}: {cmd}")
        for task in _listdir(f"/proc/{pid}/task"):
            info = []
            for name in ("wchan", "stack"):
                try:
                    with open(f"/proc/{pid}/task/{task}/{name}") as f:
                        info.append(" <- ".join(x.split("]")[-1].strip().split("+")[0]
                                                for x in f.read().strip().splitlines()))
                except OSError as e:
                    info.append(str(e))
            try:
                with open(f"/proc/{pid}/task/{task}/status") as f:
                    info += [" ".join(line.split()) for line in f
                             if line.split(":")[0] in ("State", "SigPnd", "SigBlk", "SigIgn")]
            except OSError:
                pass
            lines.append(f"  task {task}: " + "; ".join(info))
    return "\n".join(lines)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def daemons_left(mark: str, wait: float) -> list[tuple[int, str]]:
    """The bookfs daemons (``bookfs ... mount``) whose environment carries ``mark`` (this
    test run's: ``conftest.RUN_MARK``) still running after up to ``wait`` seconds."""
    needle = f"BOOKFS_TEST_RUN={mark}".encode()
    deadline = time.monotonic() + wait
    while True:
        left = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
                if b"bookfs" not in cmd or b"mount" not in cmd:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            left.append((int(entry), cmd.replace(b"\0", b" ").decode(errors="replace")[:200]))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def in_mountinfo(path) -> bool:
    """True if ``path`` is a mount point, even a dead one (``os.path.ismount`` says False
    for a FUSE mount whose daemon died: its lstat fails with ENOTCONN)."""
    path = os.path.abspath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def force_unmount(path) -> None:
    """Lazily unmount ``path`` if anything (alive or dead) is mounted there."""
    for _ in range(100):
        if not in_mountinfo(path):
            return
        subprocess.run(["fusermount3", "-u", "-z", os.fspath(path)], capture_output=True)
        time.sleep(0.05)


def umount_quietly(mountpoint: str) -> None:
    """What ``bookfs umount MOUNTPOINT`` does (its very function: fusermount3 -u, then
    wait for a read-write daemon to finish), called here rather than in a new ``bookfs``
    process (a second of interpreter start-up on a busy machine, for every mount of the
    suite); its failures are ignored, as a cleanup's.  The ``bookfs umount`` command
    itself is tested where it is the subject."""
    from bookfs.errors import BookError
    from bookfs.fs.daemon.mount import MountError, umount

    with contextlib.redirect_stdout(io.StringIO()), \
            contextlib.suppress(MountError, BookError, OSError):
        umount(mountpoint)


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
        if in_mountinfo(mountpoint):
            umount_quietly(mountpoint)
        force_unmount(mountpoint)
        _PIDS.pop(os.path.abspath(mountpoint), None)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
