"""Many ships, one table: ``spark.read.format("bookfs")`` over several read-only mounts (one
per pier) named by a glob or a list, with a ``ship`` column; checked against single-mount
reads, each against ``read_events``.  With the Spark session the Spark test modules share
(conftest.py)."""

from __future__ import annotations

import argparse
import os

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs
from bookfs.formats.info import parse  # noqa: E402
from bookfs.noun import patp  # noqa: E402
from bookfs.spark.source import PUSHDOWN_SAFE, SHIP  # noqa: E402
from tests.lmdb_fixtures import make_pier, meta_values  # noqa: E402
from tests.mounting import mounted, run_bookfs  # noqa: E402
from tests.test_formats_matrix import payloads  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one JVM at a time
#: (seed, events) of each sample log: distinct seeds make distinct ships
LOGS = [(1, 600), (2, 300), (3, 150)]
PIER_WHO = 0x100  # ~marzod


@pytest.fixture(scope="module")
def env(tmp_path_factory, spark):
    import contextlib

    root = tmp_path_factory.mktemp("spark_ships")
    ships = root / "ships"
    mnts = []
    with contextlib.ExitStack() as stack:
        for seed, n in LOGS:
            src = root / f"log{seed}"
            run_bookfs("sample", str(src), "--events", str(n), "--seed", str(seed))
            mnts.append(stack.enter_context(
                mounted(src, ships / f"s{seed}", "-o", "ro,segment_mb=1")))
        pier = make_pier(root / "pier", [("lmdb", payloads(1, 40)), ("vere", payloads(41, 25))],
                         meta=meta_values(who=PIER_WHO))
        pmnt = stack.enter_context(mounted(pier, root / "pier_mnt", "-o", "ro"))
        single = {m: sorted(map(tuple, bs.read_events(spark, m).collect()))
                  for m in [*mnts, pmnt]}
        yield argparse.Namespace(root=root, ships=str(ships), mnts=mnts, pier=pmnt,
                                 spark=spark, single=single)


def rows(df) -> list[tuple]:
    return sorted(map(tuple, df.collect()))


def ship_in_info(mnt: str) -> str:
    with open(os.path.join(mnt, "info")) as f:
        return parse(f.read())["ship"]


def union(env, mnts) -> list[tuple]:
    """The single-mount rows of ``mnts``, each with its ship (from the mount's info)."""
    return sorted(r + (ship_in_info(m),) for m in mnts for r in env.single[m])


def test_a_glob_reads_every_ship_with_a_ship_column(env):
    df = env.spark.read.format("bookfs").load(f"{env.ships}/*")
    ref = bs.read_events(env.spark, env.mnts[0]).schema
    assert df.schema.fieldNames() == [*ref.fieldNames(), SHIP]
    assert df.schema[:len(ref)] == ref[:]
    assert rows(df) == union(env, env.mnts)
    ships = {ship_in_info(m): n for m, (_, n) in zip(env.mnts, LOGS)}
    assert len(ships) == len(LOGS)  # distinct ships
    counts = {r[SHIP]: r["count"] for r in df.groupBy(SHIP).count().collect()}
    assert counts == ships


def test_a_list_of_mounts_and_a_pier(env):
    mnts = [env.mnts[1], env.pier]
    df = env.spark.read.format("bookfs").load(mnts)
    assert rows(df) == union(env, mnts)
    assert ship_in_info(env.pier) == patp(PIER_WHO)
    # the pier has no segments/: events/ files, still with its ship
    assert {r[SHIP] for r in df.where("event > 60").collect()} == {
        patp(PIER_WHO), ship_in_info(env.mnts[1])}


def test_one_mount_keeps_the_schema_of_read_events(env):
    m = env.mnts[0]
    df = env.spark.read.format("bookfs").load(m)
    assert df.schema == bs.read_events(env.spark, m).schema
    assert rows(df) == env.single[m]


def test_ship_and_event_filters_narrow_what_is_read(env):
    all_ = env.spark.read.format("bookfs").load(f"{env.ships}/*")
    ship = ship_in_info(env.mnts[0])
    one = all_.where(f"{SHIP} = '{ship}'")
    alone = env.spark.read.format("bookfs").load(env.mnts[0])
    if PUSHDOWN_SAFE:  # else nothing is pushed (spark_source: issue 19)
        assert one.rdd.getNumPartitions() == alone.rdd.getNumPartitions()  # others unplanned
    assert rows(one) == union(env, [env.mnts[0]])
    two = [ship_in_info(m) for m in env.mnts[1:]]
    got = rows(all_.where(f"{SHIP} in ('{two[0]}', '{two[1]}') and event <= 100"))
    assert got == [r for r in union(env, env.mnts[1:]) if r[0] <= 100]
    assert len(got) == 200


def one_line(excinfo, text: str) -> None:
    """The failure names ``text`` on one line of its own message (Spark wraps the Python
    exception in its own; the line is the Python one, whole)."""
    lines = [ln for ln in str(excinfo.value).splitlines() if text in ln]
    assert lines, str(excinfo.value)[-2000:]


def test_bad_paths_are_one_clear_line(env, tmp_path):
    read = env.spark.read.format("bookfs")
    plain = tmp_path / "not_a_mount"
    plain.mkdir()
    with pytest.raises(Exception) as e:
        read.load([env.mnts[0], str(plain)]).collect()
    one_line(e, f"{plain} is not a bookfs mount (no events/ directory)")
    # an unmounted mount point among the ships: named, not skipped
    (tmp_path / "ships" / "a").mkdir(parents=True)
    with pytest.raises(Exception) as e:
        read.load(f"{tmp_path}/ships/*").collect()
    one_line(e, f"{tmp_path}/ships/a is not a bookfs mount")
    with pytest.raises(Exception) as e:
        read.load(f"{tmp_path}/nothing/*").collect()
    one_line(e, f"{tmp_path}/nothing/* matches no path; expected bookfs mount points")
    with pytest.raises(Exception) as e:
        read.load([env.mnts[0], env.mnts[0]]).collect()
    one_line(e, f"is mounted twice, at {env.mnts[0]} and {env.mnts[0]}")


def test_a_stream_over_a_pier_reads_its_events_files(env):
    """A pier mount has no segments/: the stream reads events/ files, across the LMDB and
    the vere epoch, in batches bounded by maxEventsPerTrigger, every event once."""
    import json

    out, ck = env.root / "pier_stream", env.root / "pier_ck"
    q = (env.spark.readStream.format("bookfs").option("maxEventsPerTrigger", 30)
         .load(env.pier).writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination()
    ends = [json.loads(p["sources"][0]["endOffset"])["event"] for p in q.recentProgress
            if p["numInputRows"]]
    assert ends == [30, 60, 65]
    assert rows(env.spark.read.parquet(str(out))) == env.single[env.pier]
