"""LmdbLog against real LMDB environments written the way vere writes them
(reference-formats.md §3)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import lmdb
import pytest

from bookfs.errors import (
    BadMetaKey,
    BookError,
    ContiguityError,
    FormatError,
    NoSuchEvent,
    ReadOnly,
)
from bookfs.formats.eventlog import EventLog
from bookfs.formats.lmdb_log import LmdbLog, read_meta_db
from lmdb_fixtures import make_lmdb_epoch, make_pier, meta_values, payloads


def test_reads_every_event(tmp_path):
    events = payloads(1, 50)
    d = make_lmdb_epoch(tmp_path / "0i0", 0, events, meta=meta_values(who=0x100))
    with LmdbLog.open(d) as log:
        assert isinstance(log, EventLog)
        assert log.gulf() == (1, 50) and log.first == 1 and log.last == 50
        assert log.count == 50 and len(events) == 50
        assert log.format == "lmdb (epoc 1)"  # no epoc.txt
        assert log.writable is False
        assert log.log_bytes == os.path.getsize(d / "data.mdb")
        mtime = os.stat(d / "data.mdb").st_mtime_ns
        for e, p in enumerate(events, start=1):
            assert e in log
            assert log.read(e) == p
            assert log.payload_size(e) == len(p)
            assert log.mtime_ns(e) == mtime
            log.verify_event(e)
            assert log.read_slice(e, 2, 5) == p[2:7]
            assert log.read_slice(e, len(p), 5) == b""
        assert list(log.walk()) == list(enumerate(events, start=1))
        assert list(log.walk(10, 12)) == [(10, events[9]), (11, events[10]), (12, events[11])]
        assert 0 not in log and 51 not in log
        assert log.refresh() == 0
        assert log.meta() == meta_values(who=0x100)
        assert log.read_meta("who") == (0x100).to_bytes(16, "little")


def test_epoc_txt_in_format(tmp_path):
    d = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 3))
    (d / "epoc.txt").write_text("2")
    with LmdbLog.open(d) as log:
        assert log.format == "lmdb (epoc 2)"


def test_integer_key_order_beyond_256(tmp_path):
    # keys 256, 512, ... sort first as little-endian bytes; MDB_INTEGERKEY sorts numerically
    events = payloads(1, 700, size=8)
    d = make_lmdb_epoch(tmp_path / "0i0", 0, events)
    with LmdbLog.open(d) as log:
        assert log.gulf() == (1, 700)
        got = list(log.walk())
        assert [e for e, _ in got] == list(range(1, 701))
        assert [p for _, p in got] == events
        assert list(log.walk(250, 260)) == [(e, events[e - 1]) for e in range(250, 261)]


def test_store_without_integerkey_is_refused(tmp_path):
    d = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 300, size=8), integerkey=False)
    with pytest.raises(FormatError, match="MDB_INTEGERKEY"):
        LmdbLog.open(d)
    # and it released the environment (the binding refuses a second open otherwise)
    with pytest.raises(FormatError):
        LmdbLog.open(d)


def test_gap_in_keys_raises(tmp_path):
    d = make_lmdb_epoch(tmp_path / "e", 0, payloads(1, 4), keys=[1, 2, 4, 5])
    with pytest.raises(ContiguityError, match=r"4 entries but its keys run 1\.\.5"):
        LmdbLog.open(d)


def test_first_key_must_follow_epoch_name(tmp_path):
    d = make_lmdb_epoch(tmp_path / "0i10", 12, payloads(13, 4))
    with pytest.raises(ContiguityError, match=r"0i10 must start at event 11.*first event is 13"):
        LmdbLog.open(d)
    ok = make_lmdb_epoch(tmp_path / "0i12", 12, payloads(13, 4))
    with LmdbLog.open(ok) as log:
        assert log.gulf() == (13, 16) and log.base == 12
    # a directory name that says nothing: any start is accepted
    other = make_lmdb_epoch(tmp_path / "epoch", 12, payloads(13, 4))
    with LmdbLog.open(other) as log:
        assert log.gulf() == (13, 16) and log.base is None


def test_empty_epoch(tmp_path):
    d = make_lmdb_epoch(tmp_path / "0i5", 5, [])
    with LmdbLog.open(d) as log:
        assert log.gulf() == (0, 0) and log.count == 0
        assert list(log.walk()) == []
        with pytest.raises(NoSuchEvent):
            log.read(6)


def test_read_only_everything(tmp_path):
    d = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 5))
    with pytest.raises(ReadOnly, match="LMDB epochs are read-only; migrate them with bookfs migrate"):
        LmdbLog.open(d, writable=True)
    os.unlink(d / "lock.mdb")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()}
    with LmdbLog.open(d) as log:
        with pytest.raises(ReadOnly, match="data.mdb: LMDB epochs are read-only"):
            log.save(6, [b"abcd"])
        with pytest.raises(ReadOnly):
            log.save_meta("life", b"\0\0\0\0")
        with pytest.raises(NoSuchEvent, match=r"no event 6 \(the epoch holds 1\.\.5\)"):
            log.read(6)
        with pytest.raises(BadMetaKey):
            log.read_meta("nope")
        assert log.meta() == {"who": bytes(16), "version": bytes(4), "life": bytes(4),
                              "fake": bytes(1)}
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in d.iterdir()}
    assert after == before  # no lock.mdb created, nothing touched


def test_not_lmdb(tmp_path):
    with pytest.raises(BookError, match="no such file"):
        LmdbLog.open(tmp_path)
    (tmp_path / "data.mdb").write_bytes(b"x" * 10000)
    with pytest.raises(FormatError, match="cannot open as LMDB"):
        LmdbLog.open(tmp_path)
    env = lmdb.open(str(tmp_path / "nodb"), map_size=1 << 20, max_dbs=2)
    env.open_db(b"META", create=True)
    env.close()
    with pytest.raises(FormatError, match="no EVENTS database"):
        LmdbLog.open(tmp_path / "nodb")


def test_meta_from_pier_top_level(tmp_path):
    meta = meta_values(who=1, version=2, fake=0, life=3)
    pier = make_pier(tmp_path / "p", [("lmdb", payloads(1, 5)), ("lmdb", payloads(6, 5))],
                     meta=meta)
    log_dir = pier / ".urb" / "log"
    assert read_meta_db(str(log_dir)) == meta
    with LmdbLog.open(log_dir / "0i5") as log:  # found in ../data.mdb
        assert log.meta() == meta
        assert log.format == "lmdb (epoc 2)"
        assert log.meta_source == str(log_dir / "data.mdb")


def test_meta_value_encodings(tmp_path):
    # short values are zero-extended; longer ones must carry only zeros beyond the field
    d = make_lmdb_epoch(tmp_path / "e", 0, payloads(1, 2),
                        meta={"who": b"\x01\x02", "version": struct.pack("<Q", 3),
                              "fake": b"\x01", "life": struct.pack("<I", 9)})
    with LmdbLog.open(d) as log:
        assert log.read_meta("who") == b"\x01\x02" + bytes(14)
        assert log.read_meta("version") == struct.pack("<I", 3)
        assert log.read_meta("life") == struct.pack("<I", 9)


def test_refresh_sees_events_a_writer_added(tmp_path):
    d = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 10))
    with LmdbLog.open(d) as log:
        script = textwrap.dedent(f"""
            import lmdb, struct
            env = lmdb.open({str(d)!r}, map_size=1 << 32, max_dbs=2)
            db = env.open_db(b"EVENTS", integerkey=True)
            with env.begin(write=True, db=db) as t:
                for e in range(11, 16):
                    t.put(struct.pack("<Q", e), b"new!%d" % e)
            env.close()
        """)
        os.utime(d / "data.mdb", ns=(0, 0))  # make sure the mtime changes
        log._mtime_ns = 0
        subprocess.run([sys.executable, "-c", script], check=True)
        assert log.refresh() == 5
        assert log.gulf() == (1, 15)
        assert log.read(15) == b"new!15"


def _rolled_epoch(d, meta=True):
    """An epoch directory as vere's roll leaves it before the first event: data.mdb with
    META (or nothing) and no EVENTS database."""
    d.mkdir(parents=True)
    env = lmdb.open(str(d), map_size=1 << 20, max_dbs=2, subdir=True)
    try:
        if meta:
            from lmdb_fixtures import write_meta_db

            write_meta_db(env, meta_values())
    finally:
        env.close()
    return d


def test_a_just_rolled_epoch_opens_empty_and_picks_up_its_first_event(tmp_path):
    """An epoch ``0i<N>`` without EVENTS (vere has rolled to it, no event yet) opens as an
    empty epoch instead of being refused; once vere writes the first event, ``refresh``
    finds EVENTS and the event."""
    d = _rolled_epoch(tmp_path / "0i30")
    with LmdbLog.open(d) as log:
        assert log.count == 0
        with pytest.raises(NoSuchEvent):
            log.read(31)
        assert list(log.walk()) == []
        # vere's first event, written by another process (as vere is one)
        subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import lmdb, struct
            env = lmdb.open({str(d)!r}, map_size=1 << 20, max_dbs=2, subdir=True)
            db = env.open_db(b"EVENTS", integerkey=True, create=True)
            with env.begin(write=True, db=db) as txn:
                txn.put(struct.pack("<Q", 31), b"\\0\\0\\0\\0\\x02")
            env.close()
            """)], check=True)
        os.utime(d / "data.mdb", ns=(1, 1))  # a different mtime, whatever the clock
        assert log.refresh() == 1
        assert (log.first, log.last) == (31, 31) and log.read(31) == b"\0\0\0\0\x02"


def test_no_events_outside_an_epoch_directory_is_still_refused(tmp_path):
    d = _rolled_epoch(tmp_path / "store", meta=False)
    with pytest.raises(FormatError, match="no EVENTS database"):
        LmdbLog.open(d)


def test_a_pier_just_after_a_roll_opens_and_mounts(tmp_path):
    """``bookfs info`` and a read-only mount of a pier whose newest epoch has no event yet
    (before: refused whole, "no EVENTS database")."""
    from tests.mounting import mounted, noun_payload, run_bookfs

    root = make_pier(tmp_path / "pier", [("lmdb", [noun_payload(bytes([i]) * 20)
                                                   for i in range(1, 31)])])
    _rolled_epoch(root / ".urb" / "log" / "0i30")
    (root / ".urb" / "log" / "0i30" / "epoc.txt").write_text("2")
    (root / ".urb" / "log" / "0i30" / "vere.txt").write_text("3.2")
    out = run_bookfs("info", str(root)).stdout
    assert "0i30 lmdb no events yet" in out and "last:     30" in out
    with mounted(root, tmp_path / "mnt", "-o", "ro") as mnt:
        assert sorted(os.listdir(os.path.join(mnt, "epochs"))) == ["0i0", "0i30"]
        assert len(os.listdir(os.path.join(mnt, "events"))) == 30
