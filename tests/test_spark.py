"""The Spark pipeline over a real mount of a 2,000-event sample log, with the Spark session
the Spark test modules share (conftest.py ``spark``; spark-notes.md: start-up costs
10-20 s).

``BOOKFS_SPARK_LONG=1`` adds :func:`test_local_cluster`, the command with master
``local-cluster[2,1,1024]``: three JVMs of its own beside the tests.  CI leaves it to the
standalone cluster of ``test_spark_standalone.py``, which covers the same path (executors
in JVMs of their own, Python workers importing this ``bookfs`` through
``spark.executorEnv.PYTHONPATH``) on a real master and two workers."""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import signal
import subprocess
import time

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs
from bookfs.spark import cli as spark_cli
from bookfs.cli.commands import main  # noqa: E402
from bookfs.formats.book import Book  # noqa: E402
from bookfs.noun import cord, cue, da_to_datetime, datetime_to_da, jam, path, uncord, unpath  # noqa: E402
from tests.mounting import BOOKFS, mounted, run_bookfs  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one JVM at a time
EVENTS = 2000
LONG = bool(os.environ.get("BOOKFS_SPARK_LONG"))


@pytest.fixture(scope="module")
def env(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("spark")
    src, mnt = root / "log", root / "mnt"
    run_bookfs("sample", str(src), "--events", str(EVENTS))
    with mounted(src, mnt):
        # test_local_cluster's command (three JVMs of its own) runs while the other tests do
        out = root / "cluster"
        cluster = None
        if LONG:
            with open(root / "cluster.stdout", "w") as so, \
                    open(root / "cluster.stderr", "w") as se:
                cluster = subprocess.Popen(
                    [*BOOKFS, "spark", str(mnt), "--out", str(out), "--since", "1",
                     "--until", "300", "--master", "local-cluster[2,1,1024]"],
                    stdout=so, stderr=se, text=True, start_new_session=True)
        try:
            yield argparse.Namespace(root=root, src=str(src), mnt=str(mnt), spark=spark,
                                     cache={}, cluster=cluster, cluster_out=out)
        finally:
            if cluster is not None:
                if cluster.poll() is None:
                    os.killpg(cluster.pid, signal.SIGKILL)
                cluster.wait()


def expected(payload: bytes, event: int) -> dict:
    noun = cue(payload[4:])
    date = wire = card = None
    try:
        d, (w, (tag, _)) = noun
        if isinstance(d, int):
            date = da_to_datetime(d).replace(tzinfo=None)
            wire, card = unpath(w), uncord(tag)
    except (TypeError, ValueError):
        pass
    return {"event": event, "epoch": None,
            "mug": int.from_bytes(payload[:4], "little", signed=True), "size": len(payload),
            "jam": payload[4:], "date": date, "wire": wire, "card": card, "error": None}


def rows_of(df) -> dict[int, dict]:
    return {r["event"]: r.asDict() for r in df.collect()}


def per_event(env):
    if "rows" not in env.cache:
        env.cache["rows"] = rows_of(bs.read_events(env.spark, env.mnt))
    return env.cache["rows"]


def test_every_column_matches_the_engine(env):
    rows = per_event(env)
    assert sorted(rows) == list(range(1, EVENTS + 1))
    with Book.open(env.src) as book:
        for event in range(1, EVENTS + 1):
            got = dict(rows[event])
            committed = got.pop("committed_at")
            assert got == expected(book.read(event), event), event
            st = os.stat(os.path.join(env.mnt, "events", f"{event:012d}"))
            mtime_ms = st.st_mtime_ns // 1_000_000  # what the mount says, to the ms
            assert committed == dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=mtime_ms)
    assert sum(r["date"] is None for r in rows.values()) == 5  # the lifecycle events
    assert {r["card"] for r in rows.values()} - {None} <= {
        "belt", "wake", "hear", "request", "plea", "boon", "send", "born", "crud", "trim"}


def test_since_until(env):
    for bulk in (False, True):
        df = bs.read_events(env.spark, env.mnt, since=100, until=150, bulk=bulk)
        assert sorted(r["event"] for r in df.select("event").collect()) == list(range(100, 151))
        assert sorted(r["event"] for r in bs.read_events(env.spark, env.mnt, since=EVENTS - 2,
                                                         bulk=bulk).select("event").collect()
                      ) == [EVENTS - 2, EVENTS - 1, EVENTS]  # rows come in no set order


def test_range_prunes_files_at_planning(env):
    df = bs.read_events(env.spark, env.mnt, since=10, until=12, check_limit=False)
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "file_name" in plan
    assert df.count() == 3


def test_bulk_equals_per_event(env):
    rows = per_event(env)
    bulk = rows_of(bs.read_events(env.spark, env.mnt, bulk=True))
    assert bulk == rows  # committed_at included: both are the event's own mtime


def test_too_large_is_one_clear_line(env):
    env.spark.conf.set(bs.MAX_LENGTH_KEY, str(1 << 20))
    try:
        with pytest.raises(bs.EventTooLarge) as e:
            bs.read_events(env.spark, env.mnt)
    finally:
        env.spark.conf.unset(bs.MAX_LENGTH_KEY)
    msg = str(e.value)
    assert "\n" not in msg
    assert "event 2 " in msg and "1,048,576" in msg and bs.MAX_LENGTH_KEY in msg


def _append(mnt: str, payloads: list[bytes]) -> list[int]:
    with open(os.path.join(mnt, "info")) as f:
        last = int(next(ln for ln in f if ln.startswith("last:")).split()[1])
    numbers = []
    for i, payload in enumerate(payloads):
        n = last + 1 + i
        fd = os.open(os.path.join(mnt, "new", str(n)), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, payload)
        finally:
            os.close(fd)
        numbers.append(n)
    return numbers


def _event(i: int, size: int = 0) -> bytes:
    when = dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i)
    data = int.from_bytes(os.urandom(size), "little") | (1 << (8 * size)) if size else i
    noun = (datetime_to_da(when), (path(f"/d/test/{i}"), (cord("hear"), data)))
    return (1000 + i).to_bytes(4, "little") + jam(noun)


def _cli(out, *extra, since=None):
    args = argparse.Namespace(mountpoint=None, out=str(out), incremental=True, bulk=False,
                              since=since, until=None, master="local[2]", mode=None)
    for k, v in extra:
        setattr(args, k, v)
    return args


def _published(out) -> list[int]:
    import pyarrow.parquet as pq

    files = glob.glob(f"{out}/data/run=*/{bs.DAY}=*/*.parquet")
    return sorted(e for f in files for e in pq.read_table(f, columns=["event"])["event"].to_pylist())


def test_incremental_runs_and_a_five_mb_event(env, monkeypatch):
    out = env.root / "inc"
    args = _cli(out, ("mountpoint", env.mnt), since=EVENTS - 20)
    assert spark_cli.run(args) == 0
    assert _published(out) == list(range(EVENTS - 20, EVENTS + 1))
    big = _event(0, 5 << 20)
    new = _append(env.mnt, [_event(1), big, _event(2)])
    assert spark_cli.run(args) == 0
    assert _published(out) == list(range(EVENTS - 20, new[-1] + 1))
    assert json.load(open(out / "state.json"))["high_water"] == new[-1]
    # the 5 MB event round-trips, through the per-event and the bulk views
    for bulk in (False, True):
        (row,) = bs.read_events(env.spark, env.mnt, since=new[1], until=new[1], bulk=bulk).collect()
        assert row["jam"] == big[4:] and row["size"] == len(big) and row["card"] == "hear"
    # nothing new: nothing written
    assert spark_cli.run(args) == 0
    assert _published(out) == list(range(EVENTS - 20, new[-1] + 1))
    env.cache.pop("rows", None)

    # injected failures at both dangerous points, then a rerun: exactly once
    for point in ("staged", "published"):
        more = _append(env.mnt, [_event(10), _event(11)])
        monkeypatch.setenv(spark_cli.FAIL_ENV, point)
        with pytest.raises(spark_cli.InjectedFailure):
            spark_cli.run(args)
        monkeypatch.delenv(spark_cli.FAIL_ENV)
        assert spark_cli.run(args) == 0
        assert _published(out) == list(range(EVENTS - 20, more[-1] + 1)), point
        assert not os.path.exists(out / "_staging")


def test_committed_at_is_the_event_date_on_every_path(env):
    """Issue 23.4: an event file's mtime is the event's date (bookfs/fs/dates.py), so the
    per-event rows' committed_at (binaryFile's modificationTime) is the date to the
    millisecond; the bulk rows (segments/) and format("bookfs") say the same, and an event
    without a date keeps the time the log grew."""
    ranges = dict(since=1, until=60)
    per_event = {r["event"]: r for r in bs.read_events(env.spark, env.mnt, **ranges).collect()}
    bulk = {r["event"]: r for r in bs.read_events(env.spark, env.mnt, bulk=True,
                                                  **ranges).collect()}
    source = {r["event"]: r for r in env.spark.read.format("bookfs").option("since", 1)
              .option("until", 60).load(env.mnt).collect()}
    dated = 0
    for event, row in per_event.items():
        assert bulk[event]["committed_at"] == row["committed_at"] == source[event]["committed_at"]
        if row["date"] is not None:
            dated += 1
            ms = row["date"].replace(microsecond=row["date"].microsecond // 1000 * 1000)
            assert row["committed_at"] == ms, event
        else:
            assert row["committed_at"].year >= 2025  # when the log was written
    assert 0 < dated < len(per_event)


def test_a_short_incremental_run_names_its_files_and_lists_nothing(spark, tmp_path,
                                                                  monkeypatch):
    """Issue 23.3: an --incremental run after a few appends reads those events by name
    (pipeline.NAMED_RANGE), so it neither lists events/ (a million files on a big log)
    nor runs a Spark job to check their lengths: the mount sees no READDIR during the
    run, and the run publishes exactly the new events.  A file over the binaryFile
    limit is still refused in one line, naming it."""
    src, mnt, log_file = tmp_path / "log", tmp_path / "mnt", tmp_path / "daemon.log"
    run_bookfs("sample", str(src), "--events", "200")
    with mounted(src, mnt, "--debug", log_file=str(log_file)):
        out = tmp_path / "out"
        args = _cli(out, ("mountpoint", str(mnt)))
        assert spark_cli.run(args) == 0
        new = _append(str(mnt), [_event(1), _event(2)])
        mark = log_file.stat().st_size
        assert spark_cli.run(args) == 0
        with open(log_file) as f:
            f.seek(mark)
            during = f.read()
        assert "readdir(" not in during and "opendir(" not in during
        assert _published(out) == list(range(1, new[-1] + 1))
        monkeypatch.setattr(bs.pipeline, "_max_length", lambda spark: 10)
        with pytest.raises(bs.pipeline.EventTooLarge, match=f"event {new[0]} is "):
            bs.read_events(spark, str(mnt), since=new[0], until=new[-1])


def test_killed_run_then_rerun_is_exactly_once(env):
    out = env.root / "kill"
    base = [*BOOKFS, "spark", env.mnt, "--out", str(out), "--incremental",
            "--since", str(EVENTS - 50)]
    proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if glob.glob(f"{out}/_staging/run=*/**", recursive=True)[1:]:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert os.path.exists(out / "_staging") and not os.path.exists(out / "state.json")
    args = _cli(out, ("mountpoint", env.mnt), since=EVENTS - 50)
    assert spark_cli.run(args) == 0
    with open(os.path.join(env.mnt, "info")) as f:
        last = int(next(ln for ln in f if ln.startswith("last:")).split()[1])
    assert _published(out) == list(range(EVENTS - 50, last + 1))


@pytest.mark.skipif(not LONG, reason="BOOKFS_SPARK_LONG=1 only: CI covers executor JVMs "
                    "on the standalone cluster (test_spark_standalone.py)")
def test_local_cluster(env):
    """The same pipeline with master local-cluster[2,1,1024] (two executor JVMs): the
    command started by ``env`` (events 1..300, which the other tests' appends leave as
    they are)."""
    out = env.cluster_out
    env.cluster.wait(timeout=300)
    stdout, stderr = (open(f"{out}.{name}").read() for name in ("stdout", "stderr"))
    assert env.cluster.returncode == 0, stderr[-2000:]
    assert "events:  300" in stdout
    import pyarrow.parquet as pq

    table = pq.read_table(str(out / "data")).to_pylist()
    got = {r["event"]: r for r in table}
    rows = rows_of(bs.read_events(env.spark, env.mnt, until=300))
    assert sorted(got) == list(range(1, 301))
    for e, want in rows.items():
        assert {k: got[e][k] for k in ("mug", "size", "jam", "wire", "card")} == {
            k: want[k] for k in ("mug", "size", "jam", "wire", "card")}


def test_cli_help():
    res = subprocess.run([*BOOKFS, "spark", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--incremental" in res.stdout


def test_cli_too_large_message(env, capsys):
    """``bookfs spark`` on a log with an event over the session's limit exits 1 with one
    line that names the event, its size and the setting.  The command runs in this
    process (its ``main``), on the shared session: it reuses an active session and leaves
    it running."""
    out = env.root / "big"
    env.spark.conf.set(bs.MAX_LENGTH_KEY, str(1 << 20))
    try:
        capsys.readouterr()
        code = main(["spark", env.mnt, "--out", str(out), "--until", "10"])
        stderr = capsys.readouterr().err
    finally:
        env.spark.conf.unset(bs.MAX_LENGTH_KEY)
    assert code == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("bookfs spark: event 2 is") and "1,048,576" in last
