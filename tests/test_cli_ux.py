"""Every ``bookfs`` subcommand through a real shell, with good and bad input.

The table :data:`CASES` holds one row per command line: the arguments (with ``{name}``
placeholders for the paths of the :func:`tree` fixture) and the exit statuses allowed.
Every row asserts: that exit status; no ``Traceback`` anywhere; for an error, exactly one
line on stderr, starting ``bookfs``; and that the tree (every file's bytes, every
directory's entries) is exactly as before.  A new subcommand is one more row (or a few).

Then the behaviours around it, each with a real child process: ``bookfs spark`` refusing
bad input without starting Spark (pyspark is never imported), Ctrl-C (SIGINT to the
process group, as a terminal sends it) in ``sample``, ``migrate`` and a real Spark job,
``sample`` resuming and ``--force``, and a salvage that renumbers saying so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.cli.sample import SAMPLE_MARK, iter_sample_payloads, sample_meta
from lmdb_fixtures import make_pier, payloads
from mounting import mounted, run_bookfs

BOOKFS = f"{shlex.quote(sys.executable)} -m bookfs.cli"
LOG_EVENTS = 60
FAIL, USAGE, FSCK_ERROR = {1}, {2}, {8}


def sh(command: str, cwd, *, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run ``command`` with bash, in ``cwd``."""
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, **kw)


def snapshot(root: Path, skip: tuple[str, ...] = ("mnt", "piermnt")) -> dict:
    """Every path under ``root`` with its bytes' hash (files) or None (directories), but
    not the inside of the mounts named in ``skip`` (served by a daemon) nor the content of
    lock files (a lock holder leaves its note truncated)."""
    state = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel in skip:
            dirs[:] = []
            continue
        state[rel] = None
        for name in files:
            p = os.path.join(dirpath, name)
            key = os.path.join(rel, name)
            if name.endswith(".lock"):
                state[key] = "lock"
                continue
            with open(p, "rb") as f:
                state[key] = hashlib.sha256(f.read()).hexdigest()
    return state


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A directory of things to point commands at: ``log`` (a 60-event sample), ``file``
    (a regular file), ``empty/``, ``other/`` (a directory with a file in it), ``garbage/``
    (a ``book.log`` that is not a log), ``pier/`` (LMDB + Book epochs), ``mnt`` (``log``
    mounted read-only) and ``piermnt`` (``pier`` mounted read-only).  ``missing`` and
    ``new`` are names that do not exist."""
    root = tmp_path_factory.mktemp("ux")
    env = pytest.MonkeyPatch()
    env.setenv("BOOKFS_CACHE_DIR", str(tmp_path_factory.mktemp("ux-cache")))
    r = sh(f"{BOOKFS} sample log --events {LOG_EVENTS}", root)
    assert r.returncode == 0, r.stderr
    (root / "file").write_text("just some text\n")
    (root / "empty").mkdir()
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("mine\n")
    (root / "garbage").mkdir()
    (root / "garbage" / "book.log").write_bytes(os.urandom(5000))
    make_pier(root / "pier", [("lmdb", payloads(1, 5)), ("book", payloads(6, 5))])
    try:
        with mounted(root / "log", root / "mnt", "-o", "ro"), \
                mounted(root / "pier", root / "piermnt", "-o", "ro"):
            yield root
    finally:
        env.undo()


# (arguments, allowed exit statuses).  {new} is a path that must not exist before or after
# an error row, {missing} a path that never exists.
CASES: list[tuple[str, set[int]]] = [
    # top level
    ("", USAGE),
    ("no-such-command", USAGE),
    ("--version", {0}),
    # info
    ("info {log}", {0}),
    ("info {log} --json", {0}),
    ("info {pier}", {0}),
    ("info", USAGE),
    ("info {missing}", USAGE),
    ("info {file}", USAGE),
    ("info {log}/book.log", USAGE),
    ("info {empty}", FAIL),
    ("info {garbage}", FAIL),
    ("info {log} --bogus", USAGE),
    # verify
    ("verify {log}", {0}),
    ("verify {log} --mugs", {0}),
    ("verify {missing}", USAGE),
    ("verify {file}", USAGE),
    ("verify {empty}", FAIL),
    ("verify {garbage}", FAIL),
    # sample
    ("sample {new} --events -5", USAGE),
    ("sample {new} --events 0", USAGE),
    ("sample {new} --events abc", USAGE),
    ("sample {new} --events 2.5", USAGE),
    ("sample {new} --seed -1", USAGE),
    ("sample {file}", USAGE),
    ("sample {missing}/sub/dir --events 3", USAGE),
    ("sample {other} --events 3", USAGE),
    ("sample {log} --events 10", USAGE),
    ("sample {other} --events 3 --force", USAGE),
    ("sample {garbage} --events 3 --force", FAIL),
    (f"sample {{log}} --events {LOG_EVENTS} --seed 4", USAGE),
    ("sample {garbage} --events 3", FAIL),
    (f"sample {{log}} --events {LOG_EVENTS}", {0}),  # already complete: nothing written
    ("sample", USAGE),
    # fsck
    ("fsck {log}", {0}),
    ("fsck {missing}", USAGE),
    ("fsck {file}", USAGE),
    ("fsck {empty}", FSCK_ERROR),
    ("fsck {garbage}", FSCK_ERROR),
    ("fsck {log} --salvage {file}", USAGE),
    ("fsck {log} --salvage {other}", USAGE),
    ("fsck {log} --salvage {log}", USAGE),
    ("fsck {log} --salvage {missing}/a/b", USAGE),
    ("fsck {log} --json {missing}/x.json", USAGE),
    ("fsck {log} --json {empty}", USAGE),
    # migrate
    ("migrate {log} {missing}/parent/dest", USAGE),
    ("migrate {missing} {new}", USAGE),
    ("migrate {file} {new}", USAGE),
    ("migrate {log} {file}", USAGE),
    ("migrate {log} {new} --layout nope", USAGE),
    ("migrate {empty} {new}", FAIL),
    ("migrate {garbage} {new}", FAIL),
    ("migrate {log} {other}", FAIL),
    ("migrate {log} {log}/inside", FAIL),
    ("migrate", USAGE),
    # mount / umount (the -o option classes are tested in test_mount_habits.py)
    ("mount {missing} {new}", USAGE),
    ("mount {log} {file}", USAGE),
    ("mount {log}", USAGE),
    ("mount {log} {empty} -o stall_timeout=abc", USAGE),
    ("mount {log} {empty} -o segment_mb=-1", USAGE),
    ("mount {log} {empty} -o uid=nosuchuser", USAGE),
    ("mount {log} {empty} -o ro,rw", USAGE),
    ("mount {log} {empty} -o frobnicate", USAGE),
    ("mount {log} {mnt}", FAIL),  # something is mounted there already
    ("{log} {empty} -o ro,stall_timeout=abc", USAGE),  # mount.fuse3's calling form
    ("umount {missing}", USAGE),
    ("umount {empty}", USAGE),
    ("umount -l {empty}", USAGE),
    ("umount", USAGE),
    # append (appends themselves are tested in test_append_cli.py)
    ("append {mnt} {file}", USAGE),  # a read-only mount
    ("append {log} {file}", USAGE),  # not a mount
    ("append {missing} {file}", USAGE),
    ("append {mnt} {missing}", USAGE),
    ("append {mnt} {empty}", USAGE),
    ("append {mnt} {file} --at x", USAGE),
    ("append {mnt}", USAGE),
    # show / report
    ("show {log} 1", {0}),
    ("show {log} 1..3 --json", {0}),
    ("show {mnt} 2", {0}),
    (f"show {{log}} {LOG_EVENTS + 1}", FAIL),
    ("show {log} 5..2", USAGE),
    ("show {log} abc", USAGE),
    ("show {log} 0", USAGE),
    ("show {missing} 1", USAGE),
    ("show {empty} 1", FAIL),
    ("show {garbage} 1", FAIL),
    ("show {log}", USAGE),
    ("report {log} --out {file}", USAGE),
    ("report {missing} --out {new}", USAGE),
    ("report {garbage} --out {new}", FAIL),
    ("report {log}", USAGE),
    # spark: only what is refused before Spark starts (see test_spark_refuses_before_spark)
    ("spark {empty} --out {new}", USAGE),
    ("spark {mnt} --out {file}", USAGE),
    ("spark {mnt} --since x --out {new}", USAGE),
    ("spark {mnt}", USAGE),
]


def _fill(args: str, root: Path, **more: Path) -> str:
    names = {k: root / k for k in ("log", "file", "empty", "other", "garbage", "pier", "mnt",
                                   "piermnt", "missing", "new")}
    return args.format(**{k: shlex.quote(str(v)) for k, v in {**names, **more}.items()})


def _assert_clean(r: subprocess.CompletedProcess, allowed: set[int], what: str) -> None:
    assert r.returncode in allowed, f"{what}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr, f"{what}:\n{r.stderr}"
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, f"{what}: {len(lines)} stderr lines:\n{r.stderr}"
        assert lines[0].startswith("bookfs"), f"{what}: {lines[0]}"


@pytest.mark.parametrize("args,allowed", CASES, ids=[c[0] or "(none)" for c in CASES])
def test_command_line(tree, args, allowed):
    """One row of :data:`CASES` through bash: exit status, one-line error, no traceback,
    nothing changed on disk."""
    before = snapshot(tree)
    r = sh(f"{BOOKFS} {_fill(args, tree)}", tree)
    _assert_clean(r, allowed, args)
    assert snapshot(tree) == before, f"{args}: changed the tree"
    assert not (tree / "new").exists() and not (tree / "missing").exists()


def _subcommands() -> list[str]:
    import argparse

    from bookfs.cli import commands as cli

    cli._register_optional()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_has_help(tmp_path, command):
    r = sh(f"{BOOKFS} {command} --help", tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage: bookfs " + command), r.stderr
    assert not r.stderr


def test_good_commands_write_what_they_say(tree, tmp_path):
    """The writing commands with good input (their targets outside the shared tree)."""
    r = sh(f"{BOOKFS} sample s --events 30 && {BOOKFS} verify s && "
           f"{BOOKFS} migrate s m && {BOOKFS} verify m && {BOOKFS} fsck m --salvage x "
           f"--json f.json", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote events 1..30" in r.stdout and "30 events" in r.stdout
    assert json.loads((tmp_path / "f.json").read_text())["events"] == 30
    from bookfs.formats.pier import open_source

    with open_source(str(tmp_path / "x")) as b:  # salvaged in m's layout, vere's
        assert b.count == 30


# --- spark: refused before Spark starts -------------------------------------------------------

_PROBE = """\
import atexit, os, runpy, sys
atexit.register(lambda: open(os.environ["PROBE_OUT"], "w").write(
    "pyspark" if "pyspark" in sys.modules else "no pyspark"))
sys.argv[0] = "bookfs"
runpy.run_module("bookfs.cli", run_name="__main__", alter_sys=True)
"""


def _probed(tmp_path: Path) -> tuple[str, dict]:
    """A command prefix running bookfs that records, at exit, whether pyspark was imported
    (no pyspark, no JVM), and the environment it needs."""
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    env = dict(os.environ, PROBE_OUT=str(tmp_path / "probe.out"))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(probe))}", env


@pytest.mark.parametrize("args,allowed,says", [
    ("spark {empty} --out {new}", USAGE, "not a bookfs mount"),
    ("spark {missing} --out {new}", USAGE, "expected a directory"),
    ("spark {mnt} --out {file}", USAGE, "found a regular file"),
    ("spark {mnt} --out {mnt}/x", USAGE, "inside the mount"),
    ("spark {mnt} --out {new} --since 9 --until 3", USAGE, "--since <= --until"),
    ("spark {mnt} --out {new} --until 0", USAGE, ">= 1"),
    ("spark {piermnt} --out {new} --bulk", USAGE, "this mount is a pier"),
    (f"spark {{mnt}} --out {{new}} --since {LOG_EVENTS + 1}", {0}, "nothing to do"),
    ("spark {mnt} --out {state} --incremental", {0}, "nothing to do"),
    ("spark {mnt} --out {state} --incremental --since 3", {0}, "nothing to do"),
    ("spark {mnt} --out {state}", USAGE, "--mode overwrite"),  # data/ holds a run
    ("spark {mnt} --out {state} --mode errorifexists", USAGE, "already holds Parquet"),
    ("spark {mnt} --out {state} --mode ignore", {0}, "nothing to do"),
    ("spark {mnt} --out {new} --incremental --mode overwrite", USAGE, "--mode append"),
    ("spark {mnt} --out {new} --mode replace", USAGE, "invalid choice"),
    # issue 23.3: nothing listening there: refused at once (it waited 68 s, printed a Java
    # stack trace and left OUT/.lock)
    ("spark {mnt} --out {new} --master spark://127.0.0.1:9", USAGE,
     "no Spark master answers (127.0.0.1:9: Connection refused)"),
    ("spark {mnt} --out {new} --master spark://nohost", USAGE, "expected spark://HOST:PORT"),
])
def test_spark_refuses_before_spark(tree, tmp_path, args, allowed, says):
    """Each refusal, and 'nothing new', comes back without pyspark ever being imported
    (so no JVM was started), in one line, with the tree untouched."""
    state = tmp_path / "out"
    run = state / "data" / "run=000001"  # an earlier run's output (its bytes: not read)
    run.mkdir(parents=True)
    (run / "part-0.parquet").write_bytes(b"earlier run")
    (state / "state.json").write_text(json.dumps({"high_water": LOG_EVENTS}))
    cmd, env = _probed(tmp_path)
    before, out_before = snapshot(tree), snapshot(state)
    r = sh(f"{cmd} {_fill(args, tree, state=state)}", tree, env=env)
    _assert_clean(r, allowed, args)
    assert says in r.stderr, r.stderr
    assert (tmp_path / "probe.out").read_text() == "no pyspark"
    assert snapshot(tree) == before and not (tree / "new").exists()
    assert json.loads((state / "state.json").read_text()) == {"high_water": LOG_EVENTS}
    assert snapshot(state) == out_before


@pytest.mark.parametrize("args", ["--incremental", "--mode append"])
def test_spark_refuses_to_append_to_an_earlier_layout(tree, tmp_path, args):
    """An --out written by a bookfs before day partitions (data/run=.../event_bucket=N/):
    appending would mix two layouts in one table, so it is refused before Spark starts,
    in one line, with the output untouched."""
    out = tmp_path / "out"
    old = out / "data" / "run=000000000001" / "event_bucket=0"
    old.mkdir(parents=True)
    (old / "part-0.parquet").write_bytes(b"an old run")
    (out / "state.json").write_text(json.dumps({"high_water": 3}))
    cmd, env = _probed(tmp_path)
    before = snapshot(out)
    r = sh(f"{cmd} spark {tree / 'mnt'} --out {out} {args}", tree, env=env)
    _assert_clean(r, USAGE, args)
    assert "layout of an earlier bookfs" in r.stderr and "--mode overwrite" in r.stderr
    assert (tmp_path / "probe.out").read_text() == "no pyspark"
    assert snapshot(out) == before


# --- sample: resume, --force, Ctrl-C ---------------------------------------------------------


def _fresh_sample_bytes(tmp_path: Path, events: int, seed: int = 0) -> bytes:
    d = tmp_path / f"ref-{events}-{seed}"
    r = sh(f"{BOOKFS} sample {d} --events {events} --seed {seed}", tmp_path)
    assert r.returncode == 0, r.stderr
    return (d / "book.log").read_bytes()


def _sigint_when(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    """Send SIGINT to ``proc``'s process group (as a terminal's Ctrl-C) once ``ready()``."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"finished before Ctrl-C: {proc.communicate()}"
        assert time.monotonic() < deadline, "never got ready"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)


def _foreground() -> None:
    """In the child: SIGINT and SIGQUIT at their defaults, as a terminal's foreground job
    has them.  A suite started in the background by a non-interactive shell (``.ci/run
    &``) inherits them ignored (POSIX: an asynchronous list ignores both), and a Python
    that starts with SIGINT ignored keeps ignoring it: Ctrl-C never reached ``bookfs
    spark``, whose run then finished (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _popen(args: str, cwd, **kw) -> subprocess.Popen:
    # bash -c 'exec ...': the command is the group leader, with SIGINT at its default
    return subprocess.Popen(["bash", "-c", f"exec {args}"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_foreground, **kw)


def test_sample_ctrl_c_then_resume(tmp_path):
    events = 8000
    d = tmp_path / "s"
    proc = _popen(f"{BOOKFS} sample {d} --events {events}", tmp_path)
    # after the first batch is saved, well before the last
    _sigint_when(proc, lambda: (d / "book.log").exists()
                 and (d / "book.log").stat().st_size > 3 << 20)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted after event" in err and "run the same command again" in err
    said = int(err.split("interrupted after event ")[1].split()[0])
    assert 0 < said < events
    with Book.open(d) as b:  # a clean prefix of the sample, exactly as said
        assert b.gulf() == (1, said)
        want = iter_sample_payloads(events)
        assert all(b.read(n) == next(want) for n in range(1, said + 1))
    r = sh(f"{BOOKFS} sample {d} --events {events}", tmp_path)
    assert r.returncode == 0 and f"resumed after event {said}" in r.stdout, r.stderr
    assert (d / "book.log").read_bytes() == _fresh_sample_bytes(tmp_path, events)
    assert json.loads((d / SAMPLE_MARK).read_text()) == {"seed": 0, "events": events}


def test_sample_force_replaces_only_a_sample(tmp_path):
    d = tmp_path / "s"
    assert sh(f"{BOOKFS} sample {d} --events 40 --seed 1", tmp_path).returncode == 0
    before = (d / "book.log").read_bytes()
    r = sh(f"{BOOKFS} sample {d} --events 30 --seed 2", tmp_path)
    assert r.returncode == 2 and "--force replaces it" in r.stderr, r.stderr
    assert (d / "book.log").read_bytes() == before
    r = sh(f"{BOOKFS} sample {d} --events 30 --seed 2 --force", tmp_path)
    assert r.returncode == 0 and "replaced" in r.stdout, r.stderr
    assert (d / "book.log").read_bytes() == _fresh_sample_bytes(tmp_path, 30, seed=2)
    with Book.open(d) as b:
        assert b.meta() == sample_meta(2)
    # a log that bookfs sample did not write is never replaced
    own = tmp_path / "own"
    with Book.open(own, writable=True, create=True) as b:
        b.save(1, [b"\x00\x00\x00\x00hello"])
    before = (own / "book.log").read_bytes()
    r = sh(f"{BOOKFS} sample {own} --events 5 --force", tmp_path)
    assert r.returncode == 2 and "left alone even with --force" in r.stderr, r.stderr
    assert (own / "book.log").read_bytes() == before and not (own / SAMPLE_MARK).exists()


def test_sample_extends_a_shorter_sample(tmp_path):
    d = tmp_path / "s"
    assert sh(f"{BOOKFS} sample {d} --events 25", tmp_path).returncode == 0
    r = sh(f"{BOOKFS} sample {d} --events 70", tmp_path)
    assert r.returncode == 0 and "resumed after event 25" in r.stdout, r.stderr
    assert (d / "book.log").read_bytes() == _fresh_sample_bytes(tmp_path, 70)


# --- migrate: Ctrl-C ------------------------------------------------------------------------


def test_migrate_ctrl_c_then_resume(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    events = 8000  # two batches of migrate's 16 MB
    assert sh(f"{BOOKFS} sample {src} --events {events}", tmp_path).returncode == 0
    env = dict(os.environ, BOOKFS_MIGRATE_SLOW="0.5")  # time to press Ctrl-C mid-way
    proc = _popen(f"{BOOKFS} migrate {src} {dest}", tmp_path, env=env)
    partial = Path(f"{dest}.partial")
    _sigint_when(proc, lambda: any(p.name.startswith(".verified-") for p in partial.glob(".*")))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err and "run the same command again to resume" in err
    held = int(err.split("holds the first ")[1].split()[0].replace(",", ""))
    assert 0 < held < events and not dest.exists()
    r = sh(f"{BOOKFS} migrate {src} {dest}", tmp_path)
    assert r.returncode == 0 and f"({held} already done by an earlier run)" in r.stdout, r.stderr
    with Book.open(src) as a:
        from bookfs.formats.pier import open_source

        with open_source(str(dest)) as b:
            assert b.gulf() == a.gulf() == (1, events)
            assert all(a.read(n) == b.read(n) for n in range(1, events + 1))


# --- fsck: a salvage that renumbers says so ----------------------------------------------------


def test_salvage_that_renumbers_says_so(tmp_path):
    src = tmp_path / "log"
    with Book.open(src, writable=True, create=True) as b:
        b.save(1, [n.to_bytes(4, "little") + bytes([n]) * 300 for n in range(1, 41)])
        offsets = list(b.index.offsets)
    with open(src / "book.log", "r+b") as f:  # break the framing of events 10..11
        f.seek(offsets[9] + 3)
        f.write(b"\xa5" * (offsets[10] + 20 - offsets[9] - 3))
    r = sh(f"{BOOKFS} fsck {src} --salvage {tmp_path / 'out'}", tmp_path)
    assert r.returncode == 4 and "Traceback" not in r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "RENUMBERED" in ln]
    assert len(warn) == 1 and "events after 9 are RENUMBERED" in warn[0], r.stderr
    with Book.open(tmp_path / "out") as b:
        assert b.read(10)[:4] == (12).to_bytes(4, "little")  # original event 12, now 10
    # a clean salvage renumbers nothing and says nothing of it
    r = sh(f"{BOOKFS} fsck {tmp_path / 'out'} --salvage {tmp_path / 'again'}", tmp_path)
    assert r.returncode == 0 and "RENUMBERED" not in r.stderr + r.stdout, r.stderr


# --- spark: Ctrl-C during a real job ----------------------------------------------------------


def _tree_bytes(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.mark.spark
@pytest.mark.xdist_group("spark-b")  # one JVM per worker under xdist
def test_spark_ctrl_c_leaves_the_output_as_it_was(tree, tmp_path):
    pytest.importorskip("pyspark")
    out = tmp_path / "out"
    cmd, env = _probed(tmp_path)
    first = sh(f"{cmd} spark {tree / 'mnt'} --out {out} --incremental --until 20", tmp_path,
               env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (tmp_path / "probe.out").read_text() == "pyspark"  # the probe sees Spark runs
    before = _tree_bytes(out)
    assert json.loads((out / "state.json").read_text())["high_water"] == 20
    snapshot = tmp_path / "out-before"
    shutil.copytree(out, snapshot, symlinks=True)
    for attempt in range(3):
        proc = _popen(f"{BOOKFS} spark {tree / 'mnt'} --out {out} --incremental", tmp_path)
        err_lines: list[str] = []

        def reading() -> bool:  # the job is under way
            err_lines.append(proc.stderr.readline())
            return "bookfs spark: reading events" in err_lines[-1]

        _sigint_when(proc, reading, timeout=300)
        said: list[str] = []  # what the Ctrl-C brings, up to the command's last line
        reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")),
                                  daemon=True)
        reader.start()
        try:  # the command itself; Spark's JVM (its child, in its group) may take longer
            proc.wait(timeout=120)
            deadline = time.monotonic() + 60
            while proc.returncode == 130 and not any(
                    x.startswith("bookfs spark: interrupted") for x in said):
                assert time.monotonic() < deadline, "".join(said)
                time.sleep(0.05)
        except subprocess.TimeoutExpired:
            ps = subprocess.run(["ps", "-o", "pid,stat,etime,args", "-g", str(proc.pid)],
                                capture_output=True, text=True).stdout
            raise AssertionError(f"no exit 120 s after Ctrl-C:\n{ps}{''.join(said)}") \
                from None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode != 0:
            break
        # the run ended before the Ctrl-C came (a test starved of CPU read the line
        # late): the output as it was, and again
        shutil.rmtree(out)
        shutil.copytree(snapshot, out, symlinks=True)
    stdout, rest = proc.stdout.read(), "".join(said)
    assert proc.returncode == 130, "".join(err_lines) + rest
    assert "Traceback" not in "".join(err_lines) + rest + stdout
    after = rest.strip().splitlines()
    assert len(after) == 1, rest  # one line after Ctrl-C, nothing from Java or py4j
    assert after[0].startswith("bookfs spark: interrupted;") and "as it was" in after[0]
    assert "high-water mark 20" in after[0]
    assert _tree_bytes(out) == before and not (out / "_staging").exists()


def test_spark_restart_puts_back_data_a_killed_publish_moved_aside(tmp_path):
    """A run killed between publishing's two renames (data/ -> _staging/old, then the new
    run -> data/) left no data/: the next run puts the old one back before discarding the
    staging, so the previous Parquet and its high-water mark still agree."""
    from bookfs.spark import cli as spark_cli

    out = tmp_path / "out"
    old = out / "_staging" / "old" / "run=000001" / "day=2024-01-01"
    old.mkdir(parents=True)
    (old / "part-0.parquet").write_bytes(b"previous run")
    (out / "_staging" / "data" / "run=000001").mkdir(parents=True)  # never renamed in
    (out / "state.json").write_text(json.dumps({"high_water": 7}))
    state = spark_cli._recover(str(out), spark_cli._read_state(str(out)))
    assert state["high_water"] == 7 and not (out / "_staging").exists()
    assert (out / "data" / "run=000001" / "day=2024-01-01" / "part-0.parquet"
            ).read_bytes() == b"previous run"


def test_the_readme_names_import():
    """The names the README imports work in a fresh interpreter, and only by their place
    in the tree: the flat names of before issue 20 (``bookfs.book``) are gone, with the
    import hook that served them (issue 36, item 5)."""
    code = ("from bookfs import Book as B; "
            "from bookfs.formats.book import Book as C; assert B is C; "
            "from bookfs import spark as bs; assert callable(bs.read_events) and bs.DAY; "
            "import bookfs.noun; assert bookfs.noun.cue(bookfs.noun.jam(5)) == 5\n"
            "try:\n    import bookfs.book\nexcept ImportError:\n    pass\n"
            "else:\n    raise SystemExit('bookfs.book still imports')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr


def test_spark_that_cannot_start_leaves_nothing(tree, tmp_path):
    """Issue 23.3: when Spark does not start (here ``session()`` fails, as it does after a
    minute against something that is no Spark master), the run says why in one line and
    removes the ``--out`` it created, lock file and all (it left ``OUT/.lock``); an
    ``--out`` that existed before is not removed."""
    code = f"""
import sys
from bookfs.spark import pipeline as bs
def session(*a, **k):
    raise RuntimeError("All masters are unresponsive! Giving up.")
bs.session = session
from bookfs.cli.commands import main
sys.exit(main(["spark", {str(tree / 'mnt')!r}, "--out", sys.argv[1]]))
"""
    fresh = tmp_path / "fresh"
    r = subprocess.run([sys.executable, "-c", code, str(fresh)], capture_output=True,
                       text=True)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "bookfs spark: RuntimeError: All masters are unresponsive! Giving up.")
    assert not fresh.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    r = subprocess.run([sys.executable, "-c", code, str(kept)], capture_output=True,
                       text=True)
    assert r.returncode == 1 and kept.is_dir()


def _no_master(kind: str, stop: threading.Event, held: list) -> int:
    """A port on 127.0.0.1 that is no Spark master, of one ``kind`` (see
    :func:`test_spark_master_that_is_no_master_is_refused_in_one_line`), served by a
    daemon thread until ``stop`` is set; returns the port."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held.append(server)
    if kind == "closed":  # bound, never listening: connection refused
        return port
    if kind == "http":  # a real HTTP server, as the master's web UI or REST port
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        server.close()
        httpd = ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        held.append(type("Stop", (), {"close": lambda self: (httpd.shutdown(),
                                                              httpd.server_close())})())
        return port
    server.listen(16)
    server.settimeout(0.2)

    def serve():
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except OSError:
                continue
            held.append(conn)
            if kind == "garbage":  # answers, but not Spark's framing
                conn.sendall(os.urandom(64))
            elif kind == "echo":  # sends back our own RpcRequest: Spark's framing, type 3
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.sendall(conn.recv(4096))
            elif kind == "other-id":  # an RpcFailure frame, but for another request id
                conn.sendall(struct.pack(">qbqi", 8 + 1 + 8 + 4 + 2, 5, 12345, 2) + b"no")
            elif kind == "hangup":  # accepts and closes at once
                conn.close()
            # "silent": holds the connection and says nothing

    threading.Thread(target=serve, daemon=True).start()
    return port


NO_MASTER = {
    "closed": "Connection refused",
    "silent": "accepted a connection but sent no answer in 5 s (a master too busy to "
              "answer gets longer with --master-timeout)",
    "garbage": "which is not Spark's RPC protocol",
    "echo": "which is not Spark's RPC protocol",
    "other-id": "which is not Spark's RPC protocol",
    "http": "an HTTP server answered (a web UI or REST port?), not Spark's RPC",
    "hangup": "accepted a connection and closed it without an answer",
}


@pytest.mark.parametrize("kind", sorted(NO_MASTER))
def test_spark_master_that_is_no_master_is_refused_in_one_line(tree, tmp_path, kind):
    """Issue 33.5: whether ``--master spark://HOST:PORT`` is a Spark master is told by
    what the port answers to one request in Spark's RPC protocol
    (:mod:`bookfs.spark.master`), never by how long a real master takes to register the
    run.  Every kind of port that is no master is refused before Spark starts (pyspark
    never imported), in one line naming what it did, exit 2, within the default
    ``--master-timeout`` (5 s) at most, leaving no ``--out``: closed; silent (takes the
    connection, says nothing); garbage; an echo (Spark's framing, but a request); a
    failure frame for another request id; a real HTTP server (the master's web UI or REST
    port); one that hangs up at once.  (Before, a port that accepted passed, and the run
    refused it after a 20 s timer, as it did a real master slower than that.)"""
    stop, held = threading.Event(), []
    out = tmp_path / "out"
    cmd, env = _probed(tmp_path)
    try:
        port = _no_master(kind, stop, held)
        url = f"spark://127.0.0.1:{port}"
        t0 = time.monotonic()
        r = sh(f"{cmd} spark {shlex.quote(str(tree / 'mnt'))} --out {shlex.quote(str(out))} "
               f"--master {url}", tree, env=env)
        took = time.monotonic() - t0
    finally:
        stop.set()
        for thing in held:
            thing.close()
    _assert_clean(r, USAGE, kind)
    assert r.stderr.startswith(f"bookfs spark: --master {url}: no Spark master answers "
                               f"(127.0.0.1:{port}: "), r.stderr
    assert NO_MASTER[kind] in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("expected a running master's RPC port (7077 by "
                                      "default; not its web UI's 8080 nor its REST port "
                                      "6066): docs/cluster.md"), r.stderr
    assert took < 5 + 10, took  # the default --master-timeout, interpreter start-up
    assert (tmp_path / "probe.out").read_text() == "no pyspark"
    assert not out.exists()


def test_spark_master_timeout_must_be_positive(tree, tmp_path):
    """``--master-timeout 0`` is refused by the argument parser."""
    bad = run_bookfs("spark", str(tree / "mnt"), "--out", str(tmp_path / "out"),
                     "--master-timeout", "0", check=False)
    assert bad.returncode == 2 and "expected a positive number of seconds" in bad.stderr


def test_spark_master_probe_reads_spark_framing():
    """The probe against stand-ins that answer as Spark's transport does
    (``MessageEncoder.encode``): an ``RpcFailure`` (type 5) with our request id, as a
    master answers, passes; an ``RpcResponse`` (type 4), as a worker answers (it has the
    endpoint ``Worker``), is a worker; either one sent a byte at a time too; and the
    frame the probe sends decodes as Spark's ``RpcRequest`` and ``RequestMessage`` do."""
    import socket

    from bookfs.spark.master import PROBE_CONTENT, PROBE_ENDPOINT, probe, probe_frame

    frame = probe_frame("h", 7077, 99)
    length, kind, rid, size = struct.unpack(">qbqi", frame[:21])
    assert (length, kind, rid, size) == (len(frame), 3, 99, len(frame) - 21)
    name = struct.pack(">H", len(PROBE_ENDPOINT)) + PROBE_ENDPOINT.encode()
    # no sender address; the receiver's (host "h", port 7077) and name; a Java String
    assert frame[21:] == (b"\x00" + b"\x01\x00\x01h" + struct.pack(">i", 7077) + name + b"\xac\xed\x00\x05t"
                        + struct.pack(">H", len(PROBE_CONTENT)) + PROBE_CONTENT.encode())

    for answer_type, drip, want in ((5, False, None), (5, True, None),
                                    (4, False, "a Spark worker's RPC port, not a master's"),
                                    (4, True, "a Spark worker's RPC port, not a master's")):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def answer():
            conn = server.accept()[0]
            with conn:
                got = conn.recv(21)
                request_id = struct.unpack(">q", got[9:17])[0]
                error = b"Could not find Worker."
                reply = struct.pack(">qbqi", 21 + len(error), answer_type, request_id,
                                    len(error)) + error
                for i in range(len(reply)) if drip else [None]:
                    conn.sendall(reply[i:i + 1] if drip else reply)
                with contextlib.suppress(OSError):
                    conn.recv(4096)

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        try:
            assert probe("127.0.0.1", server.getsockname()[1], 10) == want, (answer_type,
                                                                              drip)
        finally:
            t.join(10)
            server.close()


def test_spark_summary_pace_says_no_rate_for_a_small_run():
    """Issue 23.4: a run of 2 events in 17 s said "(0 events/s)"."""
    from bookfs.spark.cli import pace

    assert pace(2, 17.04) == "the pipeline 17.0 s for 2 events"
    assert pace(1, 3.0) == "the pipeline 3.0 s for 1 event"
    assert pace(100_000, 10.0) == "the pipeline 10.0 s for 100,000 events (10,000 events/s)"


@pytest.mark.parametrize("tool", [["info"], ["verify"], ["verify", "--nouns"], ["fsck"]])
def test_every_log_tool_accepts_a_mount_point(tree, tool):
    """Issue 23.2: ``info``, ``verify`` and ``fsck`` take a bookfs mount point as ``show``
    and ``report`` do, read the log it serves, and say so in one stderr line (they refused
    it: "not a pier, a Book directory or an LMDB epoch", fsck with exit 8).  The result is
    the one for the log itself."""
    on_mount = sh(f"{BOOKFS} {' '.join(tool)} {tree / 'mnt'}", tree)
    on_log = sh(f"{BOOKFS} {' '.join(tool)} {tree / 'log'}", tree)
    assert on_mount.returncode == on_log.returncode == 0, on_mount.stderr
    said = f"is a bookfs mount (read-only) of {tree / 'log'}: reading {tree / 'log'}"
    assert said in on_mount.stderr, on_mount.stderr
    assert on_mount.stdout == on_log.stdout


def test_migrate_accepts_a_mount_point(tree, tmp_path):
    r = sh(f"{BOOKFS} migrate {tree / 'piermnt'} {tmp_path / 'epochs'}", tree)
    assert r.returncode == 0, r.stderr
    assert f"of {tree / 'pier'}: reading {tree / 'pier'}" in r.stderr
    assert (tmp_path / "epochs" / "0i0").is_dir()
