"""Every moment a signal can reach ``bookfs append`` (issue 33, item 7): what it prints and
its exit status are what the log holds, whenever the Ctrl-C (SIGINT), SIGTERM or SIGHUP
comes.  On the code before the fix, a Ctrl-C just after the close of ``new/<N>`` returned
0 said "FILE ... not appended" (exit 130) for an event saved byte for byte, and one while
the command started printed a traceback.

Each run is checked the same way (:func:`check_run`): the ``event N <- FILE`` lines are
exactly the events the engine finds past the log's last event before the run, byte for
byte, in the order of the FILEs; and the status and the one line on stderr say the rest
(0: every FILE in; 128 + the signal: stopped, naming the first FILE not appended).

* :func:`test_every_point_of_an_append`: a signal at each point a run reaches, sent by the
  command itself through its test hook (``BOOKFS_TEST_APPEND_SIGNAL``, ``append.POINTS``),
  so each moment is reached without timing (in CI one per outcome; ``BOOKFS_LONG_TESTS=1``:
  every point).
* :func:`test_a_signal_during_the_close_gets_the_close_outcome`: a real signal delivered
  while the close is in the kernel (``/proc/<pid>/stack`` shows ``fuse_flush``), held
  there by a predecessor this test keeps open; the close then commits or is cancelled.
* :func:`test_a_signal_while_it_starts_is_one_line`: real SIGINTs at a sweep of moments
  from the start of ``bookfs.cli.main`` through the start of the append.
* :func:`test_real_signals_at_random_moments_of_a_large_append`: real SIGINTs at random
  moments of the append of a large file (32 MiB, 2 runs; ``BOOKFS_LONG_TESTS=1``: 256 MiB,
  40 runs).
"""

from __future__ import annotations

import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bookfs.cli import append as append_cli
from bookfs.formats.pier import open_source
from mounting import BOOKFS, noun_payload
from mount_fixtures import mnt, mounted, payload, small_src  # noqa: F401  (fixtures)

LONG = bool(os.environ.get("BOOKFS_LONG_TESTS"))
SIGNAL_AT_ENV = "BOOKFS_TEST_APPEND_SIGNAL"  # append.SIGNAL_AT_ENV
POINTS = getattr(append_cli, "POINTS", ())  # (none before the fix)
EVENT = re.compile(r"^event (\d+) <- (.+) \(([\d,]+) bytes\)$")
STOPPED = re.compile(r"^bookfs append: interrupted; (.+) and the files after it were not "
                     r"appended$")
NOTHING = "bookfs append: interrupted; nothing was appended"
#: The command run as the console script runs it (``from bookfs.cli import main``), saying
#: on a pipe when that import is done: before it, a signal is Python's own (its start-up,
#: ``import bookfs``; see ``bookfs.cli.main``), which no code of bookfs can answer.
CONSOLE = ("import os, sys\nfrom bookfs.cli import main\n"
           "os.write(int(os.environ['READY_FD']), b'R')\nsys.exit(main(sys.argv[1:]))\n")


def last_event(src: Path) -> int:
    with open_source(src) as log:
        return log.last


def check_run(src: Path, before: int, files: list[str], rc: int, out: str, err: str,
              signum: int = signal.SIGINT) -> int:
    """Assert the report of one run is what the engine finds in the log; return how many
    FILEs it appended.  ``before``: the log's last event before the run."""
    why = f"status {rc}, stdout {out!r}, stderr {err!r}"
    assert "Traceback" not in err and "Exception ignored" not in err, why
    reported = []
    for line in out.splitlines():
        m = EVENT.match(line)
        assert m, f"not an event line: {line!r}; {why}"
        reported.append((int(m.group(1)), m.group(2), int(m.group(3).replace(",", ""))))
    k = len(reported)
    assert [name for _, name, _ in reported] == files[:k], why
    with open_source(src) as log:
        now = log.last
        assert [n for n, _, _ in reported] == list(range(before + 1, now + 1)), why
        for n, name, size in reported:
            data = Path(name).read_bytes()
            assert log.read(n) == data and size == len(data), f"event {n}; {why}"
    lines = err.splitlines()
    if rc == 0:
        assert k == len(files) and lines == [], why
    else:
        assert rc == 128 + signum, why
        assert len(lines) == 1, why
        m = STOPPED.match(lines[0])
        if m:
            assert k < len(files) and m.group(1) == files[k], why
        else:  # stopped while it started: nothing of it ran
            assert k == 0 and lines[0] in (NOTHING, "bookfs append: interrupted",
                                           "bookfs: interrupted"), why
    return k


def run_append(mnt: Path, files: list[str], at: str | None = None,
               **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(SIGNAL_AT_ENV, None)
    if at:
        env[SIGNAL_AT_ENV] = at
    return subprocess.run([*BOOKFS, "append", str(mnt), *files], check=False,
                          capture_output=True, text=True, env=env, timeout=120, **kw)


def payload_files(tmp_path: Path, sizes: dict[str, int]) -> list[str]:
    out = []
    for i, (name, size) in enumerate(sizes.items()):
        p = tmp_path / name
        p.write_bytes(payload(1000 + i, size))
        out.append(str(p))
    return out


#: (hook, FILEs appended, stopped) for two FILEs, A of 3 MiB and a bit (four writes) and B:
#: a signal before A's close has started leaves it out; one after, its outcome stands.
#: In CI, one case per outcome and branch; ``BOOKFS_LONG_TESTS=1``: every point.
CASES = [
    ("start", 0, True), ("create", 0, True), ("write:2", 0, True), ("eof", 0, True),
    ("close", 1, True), ("closed", 1, True), ("close:2", 2, False),
    ("closed:1:SIGHUP", 1, True),
]
MORE_CASES = [
    ("checked", 0, True), ("open", 0, True), ("read", 0, True), ("read:3", 0, True),
    ("write", 0, True), ("write:4", 0, True), ("reported", 1, True), ("open:2", 1, True),
    ("eof:2", 1, True), ("closed:2", 2, False), ("reported:2", 2, False),
    ("write:2:SIGTERM", 0, True), ("closed:1:SIGTERM", 1, True),
]


def test_every_point_of_an_append(small_src, mnt, tmp_path):
    cases = CASES + MORE_CASES if LONG else CASES
    assert {c[0].split(":")[0] for c in CASES + MORE_CASES} == set(POINTS or
                                                                 ["(the hook)"])
    files = payload_files(tmp_path, {"a.bin": 3 * (1 << 20) + 77, "b.bin": 300})
    with mounted(small_src, mnt):
        for at, appended, stopped in cases:
            signum = getattr(signal, at.split(":")[2]) if at.count(":") == 2 else \
                signal.SIGINT
            before = last_event(small_src)
            res = run_append(mnt, files, at)
            k = check_run(small_src, before, files, res.returncode, res.stdout, res.stderr,
                          signum)
            assert (k, res.returncode != 0) == (appended, stopped), (at, res)
            if at == "create":  # created, then emptied: the mount refused it
                info = Path(f"{mnt}/info").read_text()
                assert f"new/{before + 1} EINVAL" in info and "0 bytes written" in info
        # standard input, stopped while it is read: the same
        before = last_event(small_src)
        res = run_append(mnt, ["-", files[1]], "read:2", input="x" * (3 << 20))
        check_run(small_src, before, ["-", files[1]], res.returncode, res.stdout,
                  res.stderr.replace("stdin and", "- and"))
        assert res.returncode == 130 and res.stdout == ""


def _wait_in_close(pid: int, mnt: Path, n: int, timeout: float = 60.0) -> None:
    """Until process ``pid`` holds ``new/<n>`` (``next:`` in ``info`` is past it) and
    waits in a FUSE close (``fs/fuse/file.c``, ``fuse_flush()``): its close of ``new/<n>``,
    since it closes nothing else of the mount after that create."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = Path(f"{mnt}/info").read_text()
        if re.search(rf"^next:\s+{n + 1}$", info, re.MULTILINE):
            break
        time.sleep(0.01)
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stack") as f:
            if "fuse_flush" in f.read():
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never waited in its close of new/{n}")


@pytest.mark.parametrize("predecessor, signum", [("commits", signal.SIGINT),
                                                 ("fails", signal.SIGTERM)])
def test_a_signal_during_the_close_gets_the_close_outcome(small_src, mnt, tmp_path,
                                                          predecessor, signum):
    """The close of ``new/12`` waits for ``new/11`` (commits are in order), which this test
    holds; the signal comes while the close is in the kernel, which waits a FLUSH out
    (``fs/fuse/dev.c``, ``request_wait_answer()``).  Then 11 commits, and so does 12: A is
    appended and said so; or 11 fails, and 12 is cancelled (ECANCELED, nothing saved): A
    is not appended, and said so (the command does not send it again after the signal)."""
    files = payload_files(tmp_path, {"a.bin": 1 << 20, "b.bin": 300})
    with mounted(small_src, mnt):
        held = os.open(f"{mnt}/new/11", os.O_WRONLY | os.O_CREAT)
        before = last_event(small_src)
        p = subprocess.Popen([*BOOKFS, "append", str(mnt), *files], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            _wait_in_close(p.pid, mnt, 12)
            p.send_signal(signum)
            time.sleep(0.1)
            assert p.poll() is None  # still in its close
            os.write(held, payload(11, 500) if predecessor == "commits" else b"xy")
        finally:
            closed = None
            try:
                os.close(held)
            except OSError as e:
                closed = e.errno
            out, err = p.communicate(timeout=60)
        assert (closed is None) == (predecessor == "commits")
        k = check_run(small_src, before + 1 if predecessor == "commits" else before, files,
                      p.returncode, out, err, signum)
        assert k == (1 if predecessor == "commits" else 0), (out, err)
        assert p.returncode == 128 + signum


def _harness_only(err: str) -> bool:
    """Whether ``err`` is a traceback of :data:`CONSOLE`'s own lines only: the signal came
    between its ready byte and the call of ``main`` (this test's window, not bookfs's)."""
    frames = re.findall(r'^  File "([^"]+)"', err, re.MULTILINE)
    return "Traceback" in err and bool(frames) and set(frames) == {"<string>"}


def signalled(mnt: Path, files: list[str], delay: float | None,
              signum: int = signal.SIGINT) -> tuple[int, str, str, float]:
    """Run :data:`CONSOLE` ``append MNT FILES``; ``delay`` seconds after it is ready (None:
    never), send it ``signum``.  Returns ``(status, stdout, stderr, seconds it ran from
    ready)``."""
    for _ in range(5):
        r, w = os.pipe()
        p = subprocess.Popen([sys.executable, "-c", CONSOLE, "append", str(mnt), *files],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             pass_fds=(w,), env={**os.environ, "READY_FD": str(w)})
        os.close(w)
        try:
            assert select.select([r], [], [], 60)[0] and os.read(r, 1) == b"R", \
                p.communicate()
        finally:
            os.close(r)
        t = time.monotonic()
        if delay is not None:
            time.sleep(delay)
            p.send_signal(signum)
        out, err = p.communicate(timeout=300)
        if not _harness_only(err):
            return p.returncode, out, err, time.monotonic() - t
    raise AssertionError(f"the signal came before main five times: {err}")


def test_a_signal_while_it_starts_is_one_line(small_src, mnt, tmp_path):
    """From ``bookfs.cli.main`` on: loading the subcommands, reading the arguments, the
    checks, finding the mount, reading ``info`` and the FILEs: one line, exit 130.  Before
    the fix: a traceback (the imports of ``bookfs.cli.commands``) at most moments."""
    files = payload_files(tmp_path, {"a.bin": 2000, "b.bin": 300})
    with mounted(small_src, mnt):
        rc, out, err, whole = signalled(mnt, files, None)
        assert rc == 0, err
        stopped = 0
        moments = 12 if LONG else 4
        for i in range(moments):  # through the first half of a run: mostly start-up
            before = last_event(small_src)
            rc, out, err, _ = signalled(mnt, files, whole * i / (2 * moments))
            stopped += check_run(small_src, before, files, rc, out, err) == 0
        assert stopped >= moments // 2  # those moments stop it before anything


def test_real_signals_at_random_moments_of_a_large_append(small_src, mnt, tmp_path):
    """Ctrl-C at random moments of ``bookfs append MNT big small``: before the fix, a signal
    0.4-0.5 s into a 0.58 s run of 256 MiB was said to leave out an event that was saved."""
    size, runs = ((256, 40) if LONG else (32, 2))
    seed = int(os.environ.get("BOOKFS_APPEND_SIGNAL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    big = tmp_path / "big.bin"
    big.write_bytes(noun_payload(b"".join(rng.randbytes(1 << 20) for _ in range(size))))
    files = [str(big), payload_files(tmp_path, {"small.bin": 300})[0]]
    with mounted(small_src, mnt):
        before = last_event(small_src)
        rc, out, err, whole = signalled(mnt, files, None)
        check_run(small_src, before, files, rc, out, err)
        seen = set()
        for _ in range(runs):
            delay = rng.uniform(0, whole * 1.1)
            before = last_event(small_src)
            rc, out, err, _ = signalled(mnt, files, delay)
            seen.add((check_run(small_src, before, files, rc, out, err), rc))
        print(f"seed {seed}: (appended, status) seen: {sorted(seen)}")


#: Run in a fresh interpreter: ``bookfs ARGS`` through ``bookfs.cli.main``, the subcommand's
#: function replaced by one that notes the modules loaded; prints those that
#: ``bookfs.cli.commands.main`` loaded between its start (where ``bookfs.cli.main`` has
#: stopped holding a Ctrl-C) and the subcommand's start.
LOADED_AFTER_HOLD = """
import argparse, json, sys
import bookfs.cli as C
import bookfs.cli.commands as K
seen = {}
real_main, real_parse = K.main, argparse.ArgumentParser.parse_args

def parse(self, *a, **k):
    ns = real_parse(self, *a, **k)
    def func(args):
        seen["func"] = set(sys.modules)
        return 0
    ns.func = func
    return ns

def main(argv=None):
    seen["main"] = set(sys.modules)
    argparse.ArgumentParser.parse_args = parse
    return real_main(argv)

K.main = main
C.main(sys.argv[1:])
print(json.dumps(sorted(seen["func"] - seen["main"])))
"""


@pytest.mark.parametrize("argv", [
    ["append", "{d}", "{d}/a.bin"], ["info", "{d}"], ["verify", "{d}"], ["fsck", "{d}"],
    ["show", "{d}"], ["report", "{d}"], ["top", "{d}"], ["umount", "{d}"],
    ["sample", "{d}/new"], ["mount", "{d}", "{d}/mnt"]])
def test_no_module_loads_between_the_held_start_and_the_subcommand(tmp_path, argv):
    """``bookfs.cli.main`` holds a Ctrl-C while the command's modules load: one raised in
    an import can be swallowed (Python prints ``Exception ignored in: <function
    _get_module_lock...>`` and the import goes on).  Every module that the command
    loads before its subcommand answers signals itself must then be loaded inside that
    hold.  Before the fix, ``commands.main`` still loaded 48 modules after it (the mount
    daemon's, for its exception classes, and those of the index cache), 42 ms in which a
    Ctrl-C to ``bookfs append`` printed that traceback and the append went on (seen in
    :func:`test_real_signals_at_random_moments_of_a_large_append`)."""
    r = subprocess.run([sys.executable, "-c", LOADED_AFTER_HOLD,
                        *(a.format(d=tmp_path) for a in argv)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]", r.stdout
