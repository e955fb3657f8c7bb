"""Fault-injection helpers for the commit tests of issue 32 (``test_power_cut.py``,
``test_commit_failures.py``): real mounts whose writer's ``fdatasync`` is held or failed by
``strace``, readers that record every event each reader path serves, and ext4 on a loop
device whose image file, copied, is what a power cut would leave.

* :func:`skip_reason`: why these tests cannot run here (not root, no ``/dev/fuse``, a tool
  missing), or None.
* :class:`Strace`: ``strace -f -p PID -e inject=fdatasync:...`` attached to every thread
  of a daemon for a ``with`` block, detached (SIGINT) at its end.  Detaching ends a held
  ``delay_enter``/``delay_exit`` at once: the held call then runs (a plain delay) or
  returns its injected error (``error=...:delay_exit=...``; detached during an
  ``error=...:delay_enter=...``, the replaced call would return ENOSYS instead), so a
  test holds a save only as long as its readers need, however busy the machine is.
  :meth:`Strace.wait_injected` waits for an injected error (``strace`` writes the call's
  line before a ``delay_exit`` holds it).
* :func:`held_task`: the daemon's thread held in an injected ``fdatasync``, if any.
* :class:`Served` and :class:`Readers`: threads that poll the reader paths of a mount
  (``events/``, ``pretty/``, ``segments/``, ``follow/N``, ``info``'s ``last:``) and
  record what each served, with the time it was served.
* :func:`loop_ext4` and :func:`attached_image`: an ext4 file system on a loop device over
  an image file; a copy of that file mounted (its journal replayed) to read what survived.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Self

from mounting import proc_text

#: ``fdatasync``'s system call number, as ``/proc/PID/task/TID/syscall`` shows it for a
#: thread stopped at its entry (``-1`` is shown once ``strace`` replaced the call to inject
#: an error, and for stops outside any system call)
FDATASYNC_NR = {"x86_64": 75, "aarch64": 83, "riscv64": 83}.get(platform.machine())

TOOLS = ("strace", "losetup", "mkfs.ext4", "fusermount3", "mount", "umount", "cp")


def skip_reason(*, loop: bool = False) -> str | None:
    """Why the fault tests cannot run on this machine (None: they can).  ``loop``: the
    test needs loop devices and ext4 as well."""
    if os.geteuid() != 0:
        return "needs root (strace attaches to a mount daemon; losetup, mount)"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse"
    for tool in TOOLS if loop else ("strace", "fusermount3"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if loop and not os.path.exists("/dev/loop-control"):
        return "needs loop devices (/dev/loop-control)"
    if FDATASYNC_NR is None:
        return f"fdatasync's system call number on {platform.machine()} is not known here"
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            if f.read().strip() == "3":
                return "ptrace is disabled (kernel.yama.ptrace_scope = 3)"
    except OSError:
        pass
    return None


def env_number(name: str, default: float) -> float:
    """A tunable from the environment (a longer local run), else ``default``."""
    value = os.environ.get(name)
    return float(value) if value else default


# --- strace -------------------------------------------------------------------------------


def tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _status(pid: int, tid: int) -> dict[str, str]:
    text = proc_text(pid, f"task/{tid}/status") or ""
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


class Strace:
    """``strace`` attached to every thread of process ``pid`` (``-f``: threads it starts
    later too) for the ``with`` block, tampering with ``fdatasync`` as ``inject`` says
    (``fdatasync:delay_enter=30s``, ``fdatasync:error=EIO:delay_exit=30s:when=3``).  The
    block starts once every thread is traced.  :meth:`detach` (also at the block's end)
    stops ``strace`` with SIGINT, which detaches it: a call held in a delay goes on."""

    def __init__(self, pid: int, inject: str, log: str | os.PathLike):
        self.pid, self.inject, self.log = pid, inject, os.fspath(log)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        with open(self.log + ".err", "wb") as err:  # (a pipe nobody reads could fill)
            self.proc = subprocess.Popen(
                ["strace", "-f", "-qq", "-p", str(self.pid), "-e", "trace=fdatasync",
                 "-e", f"inject={self.inject}", "-o", self.log],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            self._wait_attached(30.0)
        except BaseException:
            self.detach()
            raise
        return self

    def _wait_attached(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                said = Path(self.log + ".err").read_text(errors="replace").strip()
                raise RuntimeError(f"strace exited ({self.proc.returncode}): {said}")
            if all(_status(self.pid, t).get("TracerPid") == str(self.proc.pid)
                   for t in tasks(self.pid)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"strace did not attach to every thread of {self.pid} "
                                   f"in {timeout} s")
            time.sleep(0.02)

    def detach(self) -> None:
        """Stop ``strace`` (SIGINT: it detaches from every thread) and wait for it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def __exit__(self, *exc) -> None:
        self.detach()

    def wait_injected(self, timeout: float = 60.0) -> None:
        """Wait until ``strace`` has injected its error: it writes the call's line, ``=
        -1 EIO ... (INJECTED)``, at the call's exit, before a ``delay_exit`` holds it."""
        deadline = time.monotonic() + timeout
        while "(INJECTED)" not in self.output():
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"strace is gone before it injected: {self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"strace injected nothing in {timeout} s: "
                                     f"{self.output()[-2000:]}")
            time.sleep(0.01)

    def output(self) -> str:
        try:
            return Path(self.log).read_text(errors="replace")
        except OSError:
            return ""


def held_task(pid: int, *, injected_error: bool) -> int | None:
    """The thread of ``pid`` that ``strace`` holds in an ``fdatasync``, or None: stopped
    by its tracer (state ``t``) at that call's entry (a plain ``delay_enter``: the call
    shows as itself), or, ``injected_error``, at the exit of the call it replaced to inject
    an error (``error=...:delay_exit=...``: the call shows as ``-1``).  Looked at twice,
    20 ms apart, so a thread passing through another tracing stop is not taken for it."""
    want = "-1" if injected_error else str(FDATASYNC_NR)

    def look() -> set[int]:
        out = set()
        for tid in tasks(pid):
            if _status(pid, tid).get("State", "").startswith("t"):
                call = (proc_text(pid, f"task/{tid}/syscall") or "").split()
                if call and call[0] == want:
                    out.add(tid)
        return out

    first = look()
    if not first:
        return None
    time.sleep(0.02)
    both = first & look()
    return min(both) if both else None


def wait_held(pid: int, *, injected_error: bool, timeout: float = 60.0) -> int:
    """Wait until :func:`held_task` finds the thread held in ``fdatasync``; its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tid = held_task(pid, injected_error=injected_error)
        if tid is not None:
            return tid
        time.sleep(0.01)
    raise AssertionError(f"no thread of {pid} was held in fdatasync within {timeout} s")


# --- what the readers served --------------------------------------------------------------


class Served:
    """What reader paths served, recorded as they serve it: for each ``(kind, event)``,
    every distinct value served (the payload's bytes; None where the path says only that
    the event exists: a listed name, ``pretty/N``) with the ``time.monotonic()`` at which
    the read that served it first returned; for each ``info`` kind, every ``last:`` seen
    with when; and the unexpected errors, ``(kind, event, errno)``."""

    def __init__(self):
        self._lock = threading.Lock()
        self.values: dict[tuple[str, int], dict[bytes | None, float]] = {}
        self.lasts: dict[str, list[tuple[float, int]]] = {}
        self.errors: list[tuple[str, int | None, int | str]] = []

    def record(self, kind: str, event: int, data: bytes | None) -> None:
        now = time.monotonic()
        with self._lock:
            self.values.setdefault((kind, event), {}).setdefault(data, now)

    def record_last(self, kind: str, last: int) -> None:
        now = time.monotonic()
        with self._lock:
            seen = self.lasts.setdefault(kind, [])
            if not seen or seen[-1][1] != last:
                seen.append((now, last))

    def error(self, kind: str, event: int | None, err) -> None:
        with self._lock:
            if len(self.errors) < 100:
                self.errors.append((kind, event, err))

    def snapshot(self) -> dict[int, list[tuple[str, bytes | None]]]:
        """Every event served so far: ``{event: [(kind, bytes or None), ...]}``; an
        ``info`` that said ``last: L`` served every event up to ``L`` (None: no bytes)."""
        with self._lock:
            out: dict[int, list] = {}
            for (kind, event), values in self.values.items():
                out.setdefault(event, []).extend((kind, v) for v in values)
            tops = {kind: max(last for _, last in seen) for kind, seen in self.lasts.items()}
        for kind, top in tops.items():
            for event in range(1, top + 1):
                out.setdefault(event, []).append((kind, None))
        return out

    def of(self, event: int) -> dict[str, dict[bytes | None, float]]:
        """``{kind: {value: first served at}}`` for ``event``."""
        with self._lock:
            return {k: dict(v) for (k, e), v in self.values.items() if e == event}

    def first_last_at_least(self, event: int) -> dict[str, float]:
        """``{info kind: when it first said last: >= event}``."""
        with self._lock:
            out = {}
            for kind, seen in self.lasts.items():
                for when, last in seen:
                    if last >= event:
                        out[kind] = when
                        break
            return out


def deeds(data: bytes, first: int) -> Iterable[tuple[int, bytes]]:
    """``(event, payload)`` of each whole deed in ``data`` (a ``segments/`` file: deeds of
    the UIP layout, ``len_d`` (8 bytes), payload, CRC (4), ``let_d`` (8)), numbered from
    ``first``."""
    off, n = 0, first
    while off + 8 <= len(data):
        (length,) = struct.unpack_from("<Q", data, off)
        end = off + 8 + length + 12
        if end > len(data):
            return
        yield n, data[off + 8: off + 8 + length]
        off, n = end, n + 1


LAST = re.compile(rb"^last:\s+(\d+)", re.MULTILINE)
QUIET = (errno.ENOENT, errno.ETIMEDOUT)  # not yet there; a follow/N that timed out


class Readers:
    """Threads that poll reader paths until :meth:`stop`, recording into ``served``
    (:class:`Served`).  Each kind of path has its ``add_*``; each thread counts its rounds
    (:meth:`wait_rounds`).  ``recheck``: events whose bytes are read again on every round
    of the ``events/``, ``pretty/`` and ``follow/`` readers (a number whose bytes must
    never change, or must change only once)."""

    POLL = 0.01

    def __init__(self, served: Served, recheck: Iterable[int] = ()):
        self.served = served
        self.recheck = set(recheck)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.rounds: dict[str, int] = {}
        self.polling: set[str] = set()  # the kinds that never block (follow/ does)

    def _run(self, kind: str, step, polls: bool = True) -> None:
        self.rounds[kind] = 0
        if polls:
            self.polling.add(kind)

        def loop():
            while not self._stop.is_set():
                try:
                    step()
                except OSError as e:
                    if e.errno not in QUIET:
                        self.served.error(kind, None, e.errno)
                except Exception as e:  # noqa: BLE001 - a reader's bug is the test's failure
                    self.served.error(kind, None, repr(e))
                self.rounds[kind] += 1
                self._stop.wait(self.POLL)

        t = threading.Thread(target=loop, name=f"reader {kind}", daemon=True)
        self._threads.append(t)
        t.start()

    def _read(self, kind: str, path: str, event: int) -> bool:
        """Read ``path`` (event ``event``) and record its bytes; False if it is not there."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            if e.errno not in QUIET:
                self.served.error(kind, event, e.errno)
            return False
        self.served.record(kind, event, data)
        return True

    def add_events(self, kind: str, directory: str, first: int) -> None:
        """``events/``: each next number read until one is not there, and the listing
        (a name listed is an event served)."""
        state = {"next": first}

        def step():
            while self._read(kind, f"{directory}/{state['next']}", state["next"]):
                state["next"] += 1
            for n in self.recheck:
                self._read(kind, f"{directory}/{n}", n)
            for name in os.listdir(directory):
                n = int(name)
                if n >= state["next"] or n in self.recheck:
                    self.served.record(kind, n, None)

        self._run(kind, step)

    def add_pretty(self, kind: str, directory: str, first: int) -> None:
        """``pretty/N``: that it is there (None)."""
        state = {"next": first}

        def step():
            while os.path.exists(f"{directory}/{state['next']}"):
                self.served.record(kind, state["next"], None)
                state["next"] += 1
            for n in self.recheck:
                if os.path.exists(f"{directory}/{n}"):
                    self.served.record(kind, n, None)

        self._run(kind, step)

    def add_segments(self, kind: str, directory: str) -> None:
        """``segments/``: every segment whose size changed read whole, its deeds
        recorded."""
        sizes: dict[str, int] = {}

        def step():
            for name in sorted(os.listdir(directory)):
                path = f"{directory}/{name}"
                size = os.stat(path).st_size
                if sizes.get(name) == size and not self.recheck:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
                sizes[name] = len(data)
                for n, payload in deeds(data, int(name)):
                    self.served.record(kind, n, payload)

        self._run(kind, step)

    def add_follow(self, kind: str, directory: str, first: int) -> None:
        """``follow/N``: waits (the mount's ``follow_timeout``) for each next event."""
        state = {"next": first}

        def step():
            if self._read(kind, f"{directory}/{state['next']}", state["next"]):
                state["next"] += 1
            for n in self.recheck:
                if n < state["next"]:
                    self._read(kind, f"{directory}/{n}", n)

        self._run(kind, step, polls=False)

    def add_info(self, kind: str, path: str) -> None:
        """``info``'s ``last:``."""
        def step():
            with open(path, "rb") as f:
                m = LAST.search(f.read())
            if m:
                self.served.record_last(kind, int(m[1]))

        self._run(kind, step)

    def wait_rounds(self, count: int, timeout: float = 60.0) -> None:
        """Wait until every polling reader finished ``count`` more rounds."""
        start = {k: self.rounds[k] for k in self.polling}
        deadline = time.monotonic() + timeout
        while any(self.rounds[k] < start[k] + count for k in start):
            if time.monotonic() > deadline:
                slow = [k for k in start if self.rounds[k] < start[k] + count]
                raise AssertionError(f"readers {slow} made no {count} rounds in {timeout} s")
            time.sleep(0.005)

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"reader threads still running: {alive}"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def add_mount_readers(readers: Readers, rw: str | None, ro: str | None, *, first: int,
                      follow_from: int, segments: bool) -> None:
    """Every reader path of a read-write mount ``rw`` (its ``events/``, ``pretty/`` and
    ``segments/`` are the companion's) and of a read-only mount ``ro``."""
    for name, mnt in (("rw", rw), ("ro", ro)):
        if mnt is None:
            continue
        readers.add_events(f"{name} events/", f"{mnt}/events", first)
        readers.add_follow(f"{name} follow/", f"{mnt}/follow", follow_from)
        readers.add_info(f"{name} info", f"{mnt}/info")
        if name == "rw":
            readers.add_pretty(f"{name} pretty/", f"{mnt}/pretty", first)
            if segments:
                readers.add_segments(f"{name} segments/", f"{mnt}/segments")


# --- ext4 on a loop device ---------------------------------------------------------------


def run(*cmd: str, timeout: float = 60) -> str:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                         check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip() or res.returncode}")
    return res.stdout


def _unmount(where: str) -> None:
    """Unmount ``where``: retried while busy (a daemon still closing its files), lazily in
    the end."""
    for _ in range(150):
        if not os.path.ismount(where):
            return
        if subprocess.run(["umount", where], capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.2)
    subprocess.run(["umount", "-l", where], capture_output=True, check=False)


@contextlib.contextmanager
def attached_image(image: str | os.PathLike, where: str | os.PathLike,
                   options: str = "noatime"):
    """The ext4 image file ``image`` on a loop device, mounted read-write at ``where``
    (which replays its journal, as the first mount after a power cut does) for the
    ``with`` block; unmounted and the loop device freed after."""
    where = os.fspath(where)
    os.makedirs(where, exist_ok=True)
    dev = run("losetup", "--find", "--show", os.fspath(image)).strip()
    try:
        run("mount", "-t", "ext4", "-o", options, dev, where)
        try:
            yield Path(where)
        finally:
            _unmount(where)
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)


@contextlib.contextmanager
def loop_ext4(image: str | os.PathLike, where: str | os.PathLike, size: str = "96M",
              options: str = "noatime,commit=60"):
    """A new ext4 file system in the image file ``image`` (``size``), on a loop device,
    mounted at ``where`` for the ``with`` block; everything undone after, the image file
    removed.  ``commit=60``: the journal is committed by the ``fdatasync``s, not by a
    timer while a test copies the image (a copy then sees one quiet file system)."""
    image = os.fspath(image)
    run("truncate", "-s", size, image)
    try:
        run("mkfs.ext4", "-q", "-F", image)
        with attached_image(image, where, options) as d:
            yield d
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(image)


def copy_image(image: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Copy the image file as a power cut would leave the disk: what the loop device
    wrote (the host's page cache of the file); nothing still dirty in the page cache of
    the file system on it."""
    run("cp", "--sparse=always", os.fspath(image), os.fspath(dest))


def build_log(where: Path, layout: str, sizes, *, batches: int = 1) -> Path:
    """A log of ``len(sizes)`` events (event ``n`` of ``sizes[n - 1]`` bytes, the
    deterministic ``mount_fixtures.payload``) in ``where``: a UIP Book ``where/log``
    saved in ``batches`` saves, or a vere-layout epoch ``where/0i0``."""
    from lmdb_fixtures import make_vere_epoch, meta_values
    from mount_fixtures import payload

    from bookfs.cli.sample import sample_meta
    from bookfs.formats.book import Book

    events = [payload(n, size) for n, size in enumerate(sizes, 1)]
    if layout != "uip":
        return make_vere_epoch(where / "0i0", 0, events, meta=meta_values())
    src = where / "log"
    with Book.open(src, writable=True, create=True) as book:
        for key, value in sample_meta(0).items():
            book.save_meta(key, value)
        step = -(-len(events) // batches)
        for i in range(0, len(events), step):
            book.save(i + 1, events[i : i + step])
    return src


def append(root: str, n: int, data: bytes, out: dict) -> None:
    """Append event ``n`` through ``root/new/``: ``out[n]`` is None once the close
    returned 0, else the OSError."""
    try:
        with open(f"{root}/new/{n}", "wb") as f:
            f.write(data)
        out[n] = None
    except OSError as e:
        out[n] = e
