"""What ``bookfs spark`` writes, read back as a data engineer would: the layout
(``data/run=N/day=YYYY-MM-DD/``), one file per day sorted by ``event``, row groups that a
filter skips, and the four write modes.  Over a real read-only mount of a log whose events
span several days, with the Spark session the Spark test modules share (conftest.py)."""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import hashlib
import json
import os

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs
from bookfs.spark import cli as spark_cli
from bookfs.formats.book import Book  # noqa: E402
from bookfs.errors import UsageError  # noqa: E402
from bookfs.noun import cord, datetime_to_da, jam, path  # noqa: E402
from tests.mounting import mounted, run_bookfs  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one JVM at a time

SAMPLE = 600  # `bookfs sample` events: 5 lifecycle events (no date), then early 2024
DAYS = 3  # then events dated 2025-06-01 .. 2025-06-03 ...
PER_DAY = 300  # ... this many a day ...
PAYLOAD = 1000  # ... each carrying this many random bytes (so row groups fill)
LAST = SAMPLE + DAYS * PER_DAY
FIRST_DAY = dt.date(2025, 6, 1)


def dated_event(i: int) -> bytes:
    """The ``i``-th appended event: a ``%hear`` dated ``i`` steps into the three days."""
    when = (dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc)
            + dt.timedelta(seconds=i * (DAYS * 86400 // (DAYS * PER_DAY))))
    data = int.from_bytes(os.urandom(PAYLOAD), "little") | (1 << (8 * PAYLOAD))
    noun = (datetime_to_da(when), (path(f"/d/test/{i}"), (cord("hear"), data)))
    return (1000 + i).to_bytes(4, "little") + jam(noun)


@pytest.fixture(scope="module")
def env(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("spark_output")
    src, mnt = root / "log", root / "mnt"
    run_bookfs("sample", str(src), "--events", str(SAMPLE))
    with Book.open(str(src), writable=True) as book:
        book.save(SAMPLE + 1, [dated_event(i) for i in range(DAYS * PER_DAY)])
    with mounted(src, mnt, "-o", "ro"):
        ref = {r["event"]: r.asDict() for r in bs.read_events(spark, str(mnt)).collect()}
        assert sorted(ref) == list(range(1, LAST + 1))
        yield argparse.Namespace(root=root, mnt=str(mnt), spark=spark, ref=ref)


def cli(env, out, **given) -> argparse.Namespace:
    """The arguments of ``bookfs spark MNT --out OUT`` plus ``given`` options."""
    args = argparse.Namespace(mountpoint=env.mnt, out=str(out), incremental=False,
                              bulk=False, since=None, until=None, master="local[2]",
                              mode=None)
    for k, v in given.items():
        setattr(args, k, v)
    return args


def day_of(row: dict) -> dt.date | None:
    return None if row["date"] is None else row["date"].date()  # naive UTC timestamps


def tree(out) -> dict[str, str]:
    """Every file under ``out`` (but the lock) with its bytes' hash."""
    return {os.path.relpath(p, out): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in glob.glob(f"{out}/**", recursive=True)
            if os.path.isfile(p) and not p.endswith(".lock")}


def events_in(spark, out) -> list[int]:
    return sorted(r[0] for r in spark.read.parquet(f"{out}/data").select("event").collect())


def high_water(out) -> int:
    return json.load(open(f"{out}/state.json"))["high_water"]


def test_layout_day_partitions_and_rows(env):
    """One run: data/run=000001/day=.../ with the lifecycle events under the null
    partition; read back it is read_events plus ``run`` and ``day`` columns."""
    out = env.root / "layout"
    assert spark_cli.run(cli(env, out)) == 0
    run = out / "data" / "run=000001"
    days = {day_of(r) for r in env.ref.values()}
    assert {FIRST_DAY + dt.timedelta(d) for d in range(DAYS)} <= days and None in days
    names = {f"day={d.isoformat()}" if d else f"day={bs.NULL_PARTITION}" for d in days}
    assert {p.name for p in run.iterdir() if p.is_dir()} == names
    for name in names:  # repartition(day): each day of a run is one file
        assert len(glob.glob(f"{run}/{name}/*.parquet")) == 1, name
    assert json.load(open(run / spark_cli.MANIFEST))["last"] == LAST == high_water(out)

    df = env.spark.read.parquet(str(out / "data"))
    assert df.columns == bs.COLUMNS + ["run", bs.DAY]
    assert dict(df.dtypes)[bs.DAY] == "date" and dict(df.dtypes)["run"] == "int"
    got = {r["event"]: r.asDict() for r in df.collect()}
    assert sorted(got) == list(range(1, LAST + 1))
    for event, want in env.ref.items():
        row = got[event]
        assert row.pop("run") == 1
        assert row.pop(bs.DAY) == day_of(want), event
        assert row == want, event
    assert sum(r[bs.DAY] is None for r in df.select(bs.DAY).collect()) == 5


def test_files_sorted_and_row_groups_skipped(env):
    """Small row groups: every file is sorted by event, its row groups' event ranges are
    increasing and disjoint, and a filter on day and event reads only the directory of
    that day (PartitionFilters) and only the row groups whose range meets the filter."""
    import pyarrow.parquet as pq

    out = str(env.root / "rowgroups")
    bs.write_parquet(bs.read_events(env.spark, env.mnt), out, row_group_bytes=64 << 10)
    ranges: dict[str, list[tuple[int, int, int]]] = {}
    for f in glob.glob(f"{out}/day=*/*.parquet"):
        events = pq.read_table(f, columns=["event"])["event"].to_pylist()
        assert events == sorted(events), f
        meta = pq.ParquetFile(f).metadata
        col = meta.schema.names.index("event")
        rgs = []
        for i in range(meta.num_row_groups):
            st = meta.row_group(i).column(col).statistics
            assert st is not None and st.has_min_max
            rgs.append((st.min, st.max, meta.row_group(i).num_rows))
        assert all(a[1] < b[0] for a, b in zip(rgs, rgs[1:])), (f, rgs)
        ranges[os.path.basename(os.path.dirname(f))] = rgs
    day = f"day={FIRST_DAY + dt.timedelta(1)}"
    rgs = ranges[day]
    assert len(rgs) >= 3, rgs  # ~300 KB of events in 64 KiB row groups

    lo, hi = rgs[1][0] + 1, rgs[1][1] - 1  # inside the second row group only
    df = env.spark.read.parquet(out).where(
        f"{bs.DAY} = DATE'{FIRST_DAY + dt.timedelta(1)}' AND event BETWEEN {lo} AND {hi}")
    plan = df._jdf.queryExecution().executedPlan().toString()
    part = plan.split("PartitionFilters: [")[1].split("]")[0]
    assert bs.DAY in part and str(FIRST_DAY + dt.timedelta(1)) in part, plan
    pushed = plan.split("PushedFilters: [")[1].split("]")[0]
    assert "GreaterThanOrEqual(event," in pushed and "LessThanOrEqual(event," in pushed, plan

    env.spark.conf.set("spark.sql.adaptive.enabled", "false")  # the scan node, not AQE's
    try:
        qe = df._jdf.queryExecution()
        assert sorted(r["event"] for r in df.collect()) == list(range(lo, hi + 1))
        scan = [n for n in _nodes(qe.executedPlan()) if "Scan" in n.nodeName()]
        assert len(scan) == 1, [n.nodeName() for n in _nodes(qe.executedPlan())]
        read = scan[0].metrics().apply("numOutputRows").value()
        files = scan[0].metrics().apply("numFiles").value()
    finally:
        env.spark.conf.unset("spark.sql.adaptive.enabled")
    assert files == 1  # the other days' directories were never listed into the scan
    assert read == rgs[1][2] < sum(n for _, _, n in rgs)  # one row group of that file


def _nodes(plan):
    """Every node of a JVM physical plan, depth first."""
    stack, found = [plan], []
    while stack:
        node = stack.pop()
        found.append(node)
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return found


def test_modes(env):
    """error refuses with the files untouched, ignore does nothing, append adds a run,
    overwrite replaces data/; an overwrite killed after publishing is rolled forward by
    the next run, and --incremental then adds exactly the rest."""
    out = env.root / "modes"
    first_day = SAMPLE + PER_DAY
    assert spark_cli.run(cli(env, out, until=SAMPLE)) == 0
    assert events_in(env.spark, out) == list(range(1, SAMPLE + 1))

    before = tree(out)
    for mode in (None, "error", "errorifexists"):
        with pytest.raises(UsageError) as e:
            spark_cli.run(cli(env, out, since=SAMPLE + 1, mode=mode))
        msg = str(e.value)
        assert "\n" not in msg and "already holds Parquet" in msg and "--mode overwrite" in msg
        assert tree(out) == before, mode
    assert spark_cli.run(cli(env, out, since=SAMPLE + 1, mode="ignore")) == 0
    assert tree(out) == before

    assert spark_cli.run(cli(env, out, since=SAMPLE + 1, until=first_day,
                             mode="append")) == 0
    assert events_in(env.spark, out) == list(range(1, first_day + 1))
    runs = {r[0]: r[1] for r in env.spark.read.parquet(f"{out}/data")
            .groupBy("run").count().collect()}
    assert runs == {1: SAMPLE, 2: PER_DAY} and high_water(out) == first_day
    run1 = {k: v for k, v in before.items() if k.startswith("data/")}
    assert run1 and {k: v for k, v in tree(out).items() if k in run1} == run1  # kept

    assert spark_cli.run(cli(env, out, since=first_day + 1, mode="overwrite")) == 0
    assert os.listdir(out / "data") == ["run=000001"]
    assert events_in(env.spark, out) == list(range(first_day + 1, LAST + 1))
    assert high_water(out) == LAST

    # overwrite with events 1..100, stopped after publishing, before the mark: the mark
    # still says LAST; the next run records 100 from data/ and --incremental adds 101..
    os.environ[spark_cli.FAIL_ENV] = "published"
    try:
        with pytest.raises(spark_cli.InjectedFailure):
            spark_cli.run(cli(env, out, until=100, mode="overwrite"))
    finally:
        del os.environ[spark_cli.FAIL_ENV]
    assert high_water(out) == LAST and events_in(env.spark, out) == list(range(1, 101))
    assert spark_cli.run(cli(env, out, incremental=True)) == 0
    assert events_in(env.spark, out) == list(range(1, LAST + 1))  # each exactly once
    assert high_water(out) == LAST and sorted(os.listdir(out / "data")) == [
        "run=000001", "run=000002"]


def test_incremental_refuses_other_modes(env):
    for mode in ("overwrite", "error", "ignore"):
        with pytest.raises(UsageError, match="--mode append"):
            spark_cli.run(cli(env, env.root / "never", incremental=True, mode=mode))
    assert not (env.root / "never").exists()
