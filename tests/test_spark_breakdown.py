"""The breakdown of ``bookfs report --by`` in Spark (issue 35): ``bookfs spark``'s summary
(:func:`bookfs.spark.summary.summarize`) and the column expressions of the documented
recipe (``vane_column``, ``wire_column``) over a sample log read through a real
read-only mount, against what the generator says it wrote, and against ``report --by``."""

from __future__ import annotations

import json
from collections import Counter

import pytest

pyspark = pytest.importorskip("pyspark")

from mount_fixtures import build_sample
from mounting import mounted, run_bookfs

from bookfs import spark as bs
from bookfs.cli.sample import iter_sample_events
from bookfs.spark.summary import render_summary, summarize, vane_column

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

EVENTS = 1500


def _expected(key: str) -> dict[str, dict]:
    events, size = Counter(), Counter()
    for payload, made in iter_sample_events(EVENTS):
        g = ("(boot)" if made is None else made.vane if key == "vane" else made.tag
             if key == "card" else "/" + "/".join(made.wire[1:].split("/")[:2]))
        events[g] += 1
        size[g] += len(payload)
    return {g: {"events": events[g], "bytes": size[g]} for g in events}


def test_spark_summary_breaks_down_like_report(spark, tmp_path):
    from pyspark.sql import functions as F

    src = build_sample(tmp_path / "log", EVENTS)
    bs.register(spark)
    with mounted(src, tmp_path / "mnt", "-o", "ro") as mnt:
        df = spark.read.format("bookfs").load(mnt)
        out = str(tmp_path / "parquet")
        bs.write_parquet(df, out)
        report = json.loads(run_bookfs("report", mnt, "--by", "vane", "--json").stdout)
    summary = summarize(spark, out)
    for key in ("vane", "wire", "card"):
        assert summary["by"][key] == _expected(key), key
    assert {g["key"]: {"events": g["events"], "bytes": g["bytes"]}
            for g in report["groups"]} == summary["by"]["vane"]
    text = render_summary(summary)
    assert "by vane:" in text and "ames" in text
    # the recipe's expression on the table read back
    back = spark.read.parquet(out).groupBy(vane_column(F).alias("vane")).agg(
        F.sum("size").alias("bytes")).collect()
    assert {r["vane"]: r["bytes"] for r in back} == {
        k: v["bytes"] for k, v in _expected("vane").items()}
