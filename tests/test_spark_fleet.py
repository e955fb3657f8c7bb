"""``format("bookfs")`` over a fleet mount (issue 24): one ``load(MNT)`` reads every ship
with the ``ship`` column; ``option("ships", ...)`` opens only those ships; a stream across
ships, with one offset per ship, killed mid-batch and restarted, delivers every
``(ship, event)`` exactly once while one ship's log grows under it."""

from __future__ import annotations

import argparse
import os
import threading
import time

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs  # noqa: E402
from bookfs.formats.book import Book  # noqa: E402
from bookfs.formats.info import parse  # noqa: E402
from bookfs.noun import patp  # noqa: E402
from tests.mounting import mounted, run_bookfs  # noqa: E402
from tests.test_spark_stream import (DRIVER, kill_mid_batch, run_driver,  # noqa: E402
                                     source_offsets)

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]
LOGS = [(1, 400), (2, 250), (3, 120)]  # (seed, events): distinct seeds, distinct ships
GROW = 300  # events appended to the first ship while the stream runs
PER_TRIGGER = 120


def _who(src) -> str:
    with Book.open(src) as b:
        return patp(int.from_bytes(b.meta()["who"], "little"))


@pytest.fixture(scope="module")
def env(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("spark_fleet")
    fleet = root / "fleet"
    fleet.mkdir()
    for seed, n in LOGS:
        run_bookfs("sample", str(fleet / f"s{seed}"), "--events", str(n), "--seed", str(seed))
    seed0, n0 = LOGS[0]
    run_bookfs("sample", str(root / "full"), "--events", str(n0 + GROW), "--seed", str(seed0))
    driver = root / "driver.py"
    driver.write_text(DRIVER)
    with mounted(fleet, root / "mnt", "--fleet", "-o", "segment_mb=1") as mnt:
        yield argparse.Namespace(root=root, fleet=fleet, mnt=mnt, spark=spark,
                                 driver=str(driver),
                                 ships={_who(fleet / f"s{s}"): n for s, n in LOGS})


def rows(df) -> list[tuple]:
    return sorted(map(tuple, df.collect()))


def test_a_fleet_is_one_table_with_a_ship_column(env):
    df = env.spark.read.format("bookfs").load(env.mnt)
    assert df.columns[-1] == "ship"
    got = rows(df)
    want = sorted(r + (ship,) for ship in env.ships
                  for r in map(tuple, bs.read_events(env.spark, f"{env.mnt}/{ship}").collect()))
    assert got == want
    counts = {r[0]: r[1] for r in df.groupBy("ship").count().collect()}
    assert counts == env.ships


def test_the_ships_option_opens_only_those_ships(env, tmp_path):
    ship = sorted(env.ships)[1]
    with mounted(env.fleet, tmp_path / "mnt", "--fleet") as mnt:
        df = (env.spark.read.format("bookfs").option("ships", ship)
              .option("columns", "event,ship").load(mnt))
        assert df.count() == env.ships[ship]
        assert {r.ship for r in df.collect()} == {ship}
        with open(os.path.join(mnt, ".bookfs-fleet")) as f:
            assert parse(f.read())["opened"] == "1"
        where = env.spark.read.format("bookfs").load(mnt).where(f"ship = '{ship}'")
        assert where.count() == env.ships[ship]


def _append(src, full, first: int, last: int) -> None:
    with Book.open(full) as f, Book.open(src, writable=True) as b:
        for n in range(first, last + 1):
            b.save(n, [f.read(n)])
            if n % 25 == 0:
                time.sleep(0.05)


def test_a_stream_across_ships_killed_and_restarted_exactly_once(env):
    root = env.root
    out, ck, markers = root / "out", root / "ck", root / "markers"
    markers.mkdir()
    seed0, n0 = LOGS[0]
    grower = _who(env.fleet / f"s{seed0}")
    writer = threading.Thread(target=_append,
                              args=(env.fleet / f"s{seed0}", root / "full", n0 + 1, n0 + GROW))
    driver = run_driver(env, env.mnt, out, ck, "--max-events", PER_TRIGGER, "--slow", 0.5,
                        "--markers", markers)
    seen: dict[int, float] = {}

    def rows_in_flight(batch: int, planned: dict) -> bool:
        since = seen.setdefault(batch, time.time())
        return any(os.stat(markers / m).st_mtime > since for m in os.listdir(markers))

    kill_mid_batch(driver, ck, out, writer, rows_in_flight)
    offsets = source_offsets(ck)
    assert set(offsets[0]) == set(env.ships)  # one offset per ship
    for a, b in zip(sorted(offsets), sorted(offsets)[1:]):
        moved = sum(offsets[b][s] - offsets[a].get(s, 0) for s in offsets[b])
        assert 0 < moved <= PER_TRIGGER

    # the grown ship's events are all visible through the fleet before the restart
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"{env.mnt}/{grower}/info") as f:
            if parse(f.read())["last"] == str(n0 + GROW):
                break
        time.sleep(0.1)
    q = (env.spark.readStream.format("bookfs").load(env.mnt).writeStream.format("parquet")
         .option("path", str(out)).option("checkpointLocation", str(ck))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    got = rows(env.spark.read.parquet(str(out)))
    keys = [(r[-1], r[0]) for r in got]
    want = dict(env.ships, **{grower: n0 + GROW})
    assert sorted(keys) == sorted((s, e) for s, n in want.items() for e in range(1, n + 1))
    assert got == rows(env.spark.read.format("bookfs").load(env.mnt))  # every column
    redone = source_offsets(ck)
    assert all(redone[b] == offsets[b] for b in offsets)
