"""What a ``bookfs spark`` run prints when it is done: the summary of the data it wrote
(:func:`summarize`, one Spark aggregation over the run's Parquet, and
:func:`render_summary`) and its pace (:func:`pace`)."""

from __future__ import annotations

__all__ = ["pace", "render_summary", "summarize"]


def summarize(spark, path: str) -> dict:
    """Events, bytes, first/last event, events per card tag, size percentiles and events
    that do not decode (a non-null ``error``) of the Parquet data at ``path``."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(path)
    bad = F.count("error") if "error" in df.columns else F.lit(0)  # data of older runs
    row = df.agg(F.count("*").alias("events"), F.sum("size").alias("bytes"),
                 F.min("event").alias("first"), F.max("event").alias("last"),
                 F.expr("percentile(size, array(0.5, 0.9, 0.99))").alias("p"),
                 F.max("size").alias("max"), bad.alias("undecoded")).collect()[0]
    tags = {(r["card"] if r["card"] is not None else "(none)"): r["count"]
            for r in df.groupBy("card").count().collect()}
    p = row["p"] or [None, None, None]
    return {"events": row["events"], "bytes": row["bytes"] or 0, "first": row["first"],
            "last": row["last"], "cards": dict(sorted(tags.items(), key=lambda kv: -kv[1])),
            "size": {"p50": p[0], "p90": p[1], "p99": p[2], "max": row["max"]},
            "undecoded": row["undecoded"] or 0}


def render_summary(s: dict) -> str:
    lines = [f"events:  {s['events']:,}", f"bytes:   {s['bytes']:,}",
             f"first:   {s['first']}", f"last:    {s['last']}",
             "size:    " + "  ".join(f"{k} {int(v):,}" if v is not None else f"{k} -"
                                     for k, v in s["size"].items()),
             "cards:"]
    lines += [f"  {tag:<12} {n:,}" for tag, n in s["cards"].items()]
    if s.get("undecoded"):
        lines.append(f"not nouns: {s['undecoded']:,} (null date, wire and card; the error "
                     "column says why)")
    return "\n".join(lines) + "\n"



def pace(events: int, secs: float) -> str:
    """``the pipeline 12.3 s for 100,000 events (8,130 events/s)``; no rate for a run of
    under 1,000 events, where it says nothing (2 events in 17 s were "0 events/s")."""
    noun = "event" if events == 1 else "events"
    rate = f" ({events / secs:,.0f} events/s)" if events >= 1000 and secs > 0 else ""
    return f"the pipeline {secs:.1f} s for {events:,} {noun}{rate}"
