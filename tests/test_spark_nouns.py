"""Spark's decoded columns over payloads that are not nouns, and over vere's ram encoding
(issue 21.3 and 21.4), through a real read-only mount: ``read_events`` (``events/`` and
``segments/``), ``format("bookfs")`` and ``readStream``.  The log is written with the
engine (``Book.save``), which stores any payload of 4 bytes or more: a mount's ``new/``
would refuse these.  The Spark session is the one the Spark test modules share
(conftest.py)."""

from __future__ import annotations

import argparse
import datetime as dt
import random

import pytest

pyspark = pytest.importorskip("pyspark")

from bookfs import spark as bs
from bookfs.formats.book import Book  # noqa: E402
from bookfs.noun import cord, da_to_datetime, datetime_to_da, jam, mug, path, scan  # noqa: E402
from bookfs.noun.ram import BobRef, ram_encode, ram_mug  # noqa: E402
from tests.mounting import mounted  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one JVM at a time

BIG = 400 << 10  # over rows._CUE_BYTES: a jam this size only has its head read


def _noun(i: int, data=None):
    when = dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i)
    return (datetime_to_da(when), (path(f"/d/test/{i}"), (cord("hear"), i if data is None
                                                          else data)))


def _mug(noun) -> bytes:
    return (ram_mug(noun) if _has_bob(noun) else mug(noun)).to_bytes(4, "little")


def _has_bob(noun) -> bool:
    return isinstance(noun, BobRef) or (isinstance(noun, tuple)
                                       and any(map(_has_bob, noun)))


class Log:
    """The events of the test log: their payloads and what each row must say."""

    def __init__(self):
        self.payloads: list[bytes] = []
        self.want: dict[int, dict] = {}  # event -> {"date", "wire", "card"} (error None)
        self.bad: dict[int, tuple[int, str]] = {}  # event -> (byte, a word of the reason)
        self.twins: list[tuple[int, int]] = []  # (jam event, ram event)

    def good(self, noun, encoding: str = "jam") -> int:
        body = jam(noun) if encoding == "jam" else ram_encode(noun)
        self.payloads.append(_mug(noun) + body)
        n = len(self.payloads)
        date, (wire, _) = noun
        self.want[n] = {"date": da_to_datetime(date).replace(tzinfo=None),
                        "wire": "/" + "/".join(_knots(wire)), "card": "hear"}
        return n

    def twin(self, noun, ram_noun=None) -> None:
        """A jam event and its ram twin (``ram_noun``: the ram one's noun, when it differs
        from the jam's only by a bob reference)."""
        a = self.good(noun)
        b = self.good(ram_noun if ram_noun is not None else noun, "ram")
        self.want[b] = self.want[a]
        self.twins.append((a, b))

    def broken(self, payload: bytes, byte: int, word: str) -> int:
        self.payloads.append(payload)
        n = len(self.payloads)
        self.bad[n] = (byte, word)
        return n


def _knots(wire) -> list[str]:
    out = []
    while isinstance(wire, tuple):
        knot, wire = wire
        out.append(knot.to_bytes((knot.bit_length() + 7) // 8, "little").decode())
    return out


def build() -> Log:
    log = Log()
    for i in range(1, 40):
        log.good(_noun(i))
    ok = jam(_noun(100))
    m = _mug(_noun(100))
    # a jam with a byte after it: the noun ends where the jam's bytes did
    log.broken(m + ok + b"\x01", 4 + len(ok), "trailing")
    # a jam cut short
    cut = ok[:-3]
    log.broken(m + cut, 4 + scan(cut).byte, "truncated")
    assert scan(cut).reason == "truncated"
    # a back-reference to the cell still being read (bits 1 1 1: back-reference to 0)
    assert scan(b"\x07").reason == "bad-reference"
    log.broken(m + b"\x07", 4, "back-reference")
    # a length prefix of 64 or more zero bits: an atom larger than any input
    log.broken(m + bytes(10), 4, "too large")
    # a mug and no jam at all
    log.broken(b"\0\0\0\0", 4, "empty")
    # what `printf zzzz` and /dev/urandom gave (issue 21): bytes that are no jam
    words = {"truncated": "truncated", "trailing": "trailing", "too-large": "too large",
             "bad-reference": "back-reference"}
    for seed in range(3):
        junk = random.Random(seed).randbytes(200)
        log.broken(b"zzzz" + junk, 4 + scan(junk).byte, words[scan(junk).reason])
    # vere's ram magic with a version that does not exist: not ram, so a jam, which it
    # is not (vere's cue would read the atom 0 and ignore the rest); a ram encoding cut
    # short
    log.broken(m + b"RAM\x00\x02" + b"\xff" * 8, 4, "trailing")
    ram = ram_encode(_noun(100))
    log.broken(m + ram[:-3], -1, "ram")
    # large events (over the size that is cued whole): good, its ram twin, and broken
    big = _noun(200, 1 << (8 * BIG))
    log.twin(big)
    bigjam = jam(_noun(201, 1 << (8 * BIG)))
    log.broken(_mug(_noun(201)) + bigjam + b"\0\0", 4 + len(bigjam), "trailing")
    # ram twins: plain, and one whose data is a bob atom (its file is not in the mount)
    for i in range(300, 305):
        log.twin(_noun(i))
    log.twin(_noun(310, 1 << 300), _noun(310, BobRef(12345, 1)))
    for i in range(400, 420):
        log.good(_noun(i))
    return log


@pytest.fixture(scope="module")
def env(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("spark_nouns")
    src, mnt = root / "log", root / "mnt"
    log = build()
    with Book.open(src, writable=True, create=True) as book:
        book.save(1, log.payloads)
    # small segments: the big events spread the log over several segments/ files
    with mounted(src, mnt, "-o", "ro,segment_mb=1"):
        yield argparse.Namespace(root=root, mnt=str(mnt), spark=spark, log=log)


def _rows(df) -> dict[int, dict]:
    return {r["event"]: r.asDict() for r in df.collect()}


def check_rows(log: Log, rows: dict[int, dict]) -> None:
    assert sorted(rows) == list(range(1, len(log.payloads) + 1))
    for n, payload in enumerate(log.payloads, 1):
        r = rows[n]
        assert (r["size"], r["jam"]) == (len(payload), payload[4:]), n
        assert r["mug"] == int.from_bytes(payload[:4], "little", signed=True), n
        if n in log.bad:
            byte, word = log.bad[n]
            assert (r["date"], r["wire"], r["card"]) == (None, None, None), n
            error = r["error"]
            assert error and "\n" not in error, (n, error)
            if byte >= 0:
                assert error.startswith(f"byte {byte}: "), (n, error)
            assert word in error, (n, error)
        else:
            assert r["error"] is None, (n, r["error"])
            assert {k: r[k] for k in ("date", "wire", "card")} == log.want[n], n


def test_read_events_completes_and_says_why(env):
    """events/ (binaryFile) and segments/ (bulk): the job completes; events that are not
    nouns have null decoded columns and an error naming the byte; the others decode."""
    rows = _rows(bs.read_events(env.spark, env.mnt))
    check_rows(env.log, rows)
    assert list(rows[1]) == bs.COLUMNS and bs.COLUMNS[-1] == "error"
    bulk = _rows(bs.read_events(env.spark, env.mnt, bulk=True))
    assert bulk == rows


def test_format_bookfs_completes_and_says_why(env):
    # one segment a task (maxPartitionBytes=1): the error rows come from several tasks
    df = env.spark.read.format("bookfs").option("maxPartitionBytes", 1).load(env.mnt)
    assert df.schema == bs.read_events(env.spark, env.mnt).schema
    assert df.rdd.getNumPartitions() > 1  # several segments
    rows = _rows(df)
    check_rows(env.log, rows)
    assert rows == _rows(bs.read_events(env.spark, env.mnt))
    # filtering on the new column works like any other
    bad = sorted(r["event"] for r in df.where("error is not null").select("event").collect())
    assert bad == sorted(env.log.bad)


def test_ram_event_reads_like_its_jam_twin(env):
    rows = _rows(env.spark.read.format("bookfs").load(env.mnt))
    assert len(env.log.twins) == 7
    for a, b in env.log.twins:
        assert rows[b]["jam"].startswith(b"RAM\x00\x01") and not rows[a]["jam"].startswith(b"RAM")
        assert {k: rows[a][k] for k in ("date", "wire", "card")} == {
            k: rows[b][k] for k in ("date", "wire", "card")}, (a, b)
        assert rows[b]["card"] == "hear"
        assert rows[a]["error"] is None and rows[b]["error"] is None


def test_stream_over_such_a_log_completes(env):
    q = (env.spark.readStream.format("bookfs").option("maxEventsPerTrigger", 20)
         .load(env.mnt).writeStream.format("memory").queryName("bookfs_nouns")
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(300)
        assert q.exception() is None
        rows = _rows(env.spark.table("bookfs_nouns"))
    finally:
        q.stop()
    check_rows(env.log, rows)


def test_parquet_and_the_command_summary_count_them(env):
    """``write_parquet`` keeps the error column, and ``bookfs spark``'s summary counts the
    events that are not nouns."""
    from bookfs.spark import cli as spark_cli

    out = str(env.root / "parquet")
    bs.write_parquet(bs.read_events(env.spark, env.mnt), out)
    back = {r["event"]: r["error"] for r in env.spark.read.parquet(out).collect()}
    assert {n for n, e in back.items() if e is not None} == set(env.log.bad)
    summary = spark_cli.summarize(env.spark, out)
    assert summary["events"] == len(env.log.payloads)
    assert summary["undecoded"] == len(env.log.bad)
    assert f"not nouns: {len(env.log.bad)} " in spark_cli.render_summary(summary)
