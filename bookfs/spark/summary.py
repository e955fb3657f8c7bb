"""What a ``bookfs spark`` run prints when it is done: the summary of the data it wrote
(:func:`summarize`, one Spark aggregation over the run's Parquet, and
:func:`render_summary`) and its pace (:func:`pace`).

The summary breaks the data down as ``bookfs report --by`` does (issue 35): events and
bytes by vane (:func:`vane_column`), by wire (its first two segments,
:func:`wire_column`) and by card, largest first.  These are Spark column expressions over
the table's ``wire`` and ``card`` columns, usable in any DataFrame of the table (the
recipe in ``docs/cluster.md``, "What fills the logs").  One difference from ``report
--by vane``: a ``%crud`` always counts to ``arvo`` here, since the wire of the ovum it
carries is not a column."""

from __future__ import annotations

__all__ = ["pace", "render_summary", "summarize", "vane_column", "wire_column"]


def vane_column(F, wire="wire", card="card"):
    """The vane Arvo routes each row's event to (:func:`bookfs.noun.route.vane_of`'s
    rules on the ``wire`` and ``card`` columns: the wire's first segment through
    ``+grow``, ``arvo`` for ``%$`` and the wasps ``%crud``/``%wack``/``%wyrd``,
    ``(boot)`` for a row without a head)."""
    from bookfs.noun.route import ARVO, GROW, NO_WIRE, UNDATED, WASPS

    way = F.element_at(F.split(F.col(wire), "/"), 2)
    grown = F.coalesce(F.element_at(F.create_map(*[F.lit(x) for kv in GROW.items()
                                                   for x in kv]), way), way)
    return (F.when(F.col(wire).isNull(), F.lit(UNDATED))
            .when(F.col(wire) == "/", F.lit(NO_WIRE))
            .when(F.col(card).isin(*sorted(WASPS)) | (way == ""), F.lit(ARVO))
            .otherwise(grown))


def wire_column(F, depth: int = 2, wire="wire"):
    """The wire's first ``depth`` segments (``/a/newt``), ``(boot)`` without a head."""
    from bookfs.noun.route import UNDATED

    parts = F.slice(F.split(F.col(wire), "/"), 2, depth)
    return F.when(F.col(wire).isNull(), F.lit(UNDATED)).otherwise(
        F.concat(F.lit("/"), F.concat_ws("/", parts)))


def _groups(df, column) -> dict:
    from pyspark.sql import functions as F

    rows = (df.groupBy(column.alias("key")).agg(F.count("*").alias("events"),
                                                 F.sum("size").alias("bytes"))
            .orderBy(F.desc("bytes"), F.desc("events"), "key").collect())
    return {r["key"]: {"events": r["events"], "bytes": r["bytes"] or 0} for r in rows}


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
            "undecoded": row["undecoded"] or 0,
            "by": {"vane": _groups(df, vane_column(F)), "wire": _groups(df, wire_column(F)),
                   "card": _groups(df, F.coalesce(F.col("card"), F.lit("(boot)")))}}


def render_summary(s: dict) -> str:
    lines = [f"events:  {s['events']:,}", f"bytes:   {s['bytes']:,}",
             f"first:   {s['first']}", f"last:    {s['last']}",
             "size:    " + "  ".join(f"{k} {int(v):,}" if v is not None else f"{k} -"
                                     for k, v in s["size"].items()),
             "cards:"]
    lines += [f"  {tag:<12} {n:,}" for tag, n in s["cards"].items()]
    for key, groups in s.get("by", {}).items():
        lines.append(f"by {key}:")
        total = s["bytes"] or 1
        lines += [f"  {g:<16} {v['events']:>12,} events  {v['bytes']:>16,} bytes  "
                  f"{100 * v['bytes'] / total:5.1f}%" for g, v in groups.items()]
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
