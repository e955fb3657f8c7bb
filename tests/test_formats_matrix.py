"""Issue 10: every tool on every source kind (UIP layout, vere layout, LMDB epoch, pier),
vere recovery against the reference's rule, and one regression test per item.

Healthy inputs must come out clean and byte-for-byte unchanged (every file hashed before
and after).  ``spark`` runs over a read-only mount of every kind (one SparkSession for the
four), and tests/test_spark.py covers the pipeline in depth.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookfs.formats.book import Book
from bookfs.errors import FormatError, MetaAbsent, TooShort
from bookfs.noun import cord, jam, mug, murmur3_32, murmur3_32_fast
from bookfs.formats.pier import open_source
from bookfs.formats.vere import VereBook
from lmdb_fixtures import make_lmdb_epoch, make_pier, make_vere_epoch, meta_values
from mounting import mounted
from test_vere import GOLDEN_META, golden_log

KINDS = ["uip", "vere", "lmdb", "pier"]


def event_payload(i: int) -> bytes:
    """A real event payload: the true mug of the noun, then its jam."""
    noun = (i, (cord("event"), i * 7919))
    return mug(noun).to_bytes(4, "little") + jam(noun)


def payloads(first: int, count: int) -> list[bytes]:
    return [event_payload(i) for i in range(first, first + count)]


def make_source(root: Path, kind: str) -> Path:
    meta = meta_values(who=0x100, fake=1, life=3)
    if kind == "uip":
        d = root / "uip"
        with Book.open(d, writable=True, create=True) as b:
            b.save(1, payloads(1, 30))
            b.save(31, payloads(31, 20))
            for k, v in meta.items():
                b.save_meta(k, v)
        return d
    if kind == "vere":
        d = make_vere_epoch(root / "0i0", 0, payloads(1, 30), meta=meta)
        with VereBook.open(d, writable=True) as b:
            b.save(31, payloads(31, 20))
        return d
    if kind == "lmdb":
        return make_lmdb_epoch(root / "0i0", 0, payloads(1, 50), meta=meta)
    return make_pier(root / "pier", [("lmdb", payloads(1, 30)), ("vere", payloads(31, 20))],
                     meta=meta)


def tree_hash(path: Path) -> dict[str, str]:
    """sha256 of every regular file under ``path`` (the lock files aside: bookfs's own
    ``book.lock`` is created by writers, LMDB's ``lock.mdb`` is never opened)."""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.name not in ("book.lock", "lock.mdb", ".vere.lock"):
            out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def bookfs(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bookfs.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOKFS_CACHE_DIR", str(tmp_path / "cache"))


# --- the matrix: healthy inputs ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_tool_on_a_healthy_source_leaves_it_unchanged(tmp_path, kind):
    src = make_source(tmp_path / "src", kind)
    before = tree_hash(src)
    runs = {
        "info": bookfs("info", src),
        "verify": bookfs("verify", src),
        "verify --mugs": bookfs("verify", src, "--mugs"),
        "fsck": bookfs("fsck", src),
        "fsck --mugs": bookfs("fsck", src, "--mugs"),
        "fsck --repair": bookfs("fsck", src, "--repair"),
        "fsck --salvage": bookfs("fsck", src, "--salvage", tmp_path / "salvaged"),
        "migrate": bookfs("migrate", src, tmp_path / "migrated"),
    }
    for name, r in runs.items():
        assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"
        assert "Traceback" not in r.stderr and "Errno" not in r.stderr, name
    assert tree_hash(src) == before
    assert "events:   50" in runs["info"].stdout and "fake:     %.n" in runs["info"].stdout
    assert "50 events decode-checked" in runs["verify --mugs"].stdout
    assert "0 problem(s); nouns: 50 checked" in runs["fsck --mugs"].stdout
    assert "LMDB epochs are not written by bookfs" in runs["fsck --repair"].stdout or (
        "nothing to repair" in runs["fsck --repair"].stdout)
    assert "in the vere layout (vere and bookfs read it)" in runs["migrate"].stdout
    # what salvage and migrate wrote holds the same events
    want = payloads(1, 50)
    for out in (tmp_path / "salvaged", tmp_path / "migrated"):
        if kind == "pier":
            for name, first, last in (("0i0", 1, 30), ("0i30", 31, 50)):
                if (out / name).exists():
                    with open_source(out / name) as lg:
                        assert [p for _, p in lg.walk()] == want[first - 1 : last]
            continue
        with open_source(out) as lg:
            assert [p for _, p in lg.walk()] == want
    report = json.loads((tmp_path / "salvaged" / "salvage-report.json").read_text())
    assert report["recovered"] == 50 and report["gaps"] == []


@pytest.mark.parametrize("kind", KINDS)
def test_read_only_mount_serves_every_kind(tmp_path, kind):
    src = make_source(tmp_path / "src", kind)
    before = tree_hash(src)
    with mounted(src, tmp_path / "mnt", "-o", "ro") as mnt:
        names = sorted(os.listdir(f"{mnt}/events"))
        assert names == [f"{e:012d}" for e in range(1, 51)]
        with open(f"{mnt}/events/{names[41]}", "rb") as f:
            assert f.read() == event_payload(42)
        with open(f"{mnt}/info") as f:
            assert "fake:     %.n" in f.read()  # item 3 in the mount's info file
    assert tree_hash(src) == before


@pytest.mark.spark
@pytest.mark.xdist_group("spark-b")  # one JVM per worker under xdist
def test_spark_reads_every_kind_through_the_mount(tmp_path, spark):
    """``read_events`` over a read-only mount of each kind gives every event, with the
    mug and jam split as stored, and the sources stay unchanged.  (``spark``: the run's
    shared local[2] session, conftest.py.)"""
    from bookfs import spark as bs

    for kind in KINDS:
        src = make_source(tmp_path / kind, kind)
        before = tree_hash(src)
        with mounted(src, tmp_path / f"mnt-{kind}", "-o", "ro") as mnt:
            rows = {r["event"]: r for r in bs.read_events(spark, mnt).collect()}
        assert sorted(rows) == list(range(1, 51)), kind
        for e in (1, 31, 50):
            p = event_payload(e)
            assert rows[e]["mug"] == int.from_bytes(p[:4], "little"), (kind, e)
            assert bytes(rows[e]["jam"]) == p[4:], (kind, e)
        assert tree_hash(src) == before, kind


# --- the matrix: damaged inputs, handled per format -----------------------------------------


@pytest.mark.parametrize("kind", ["uip", "vere", "pier"])
def test_torn_tail_is_found_and_repaired_per_format(tmp_path, kind):
    src = make_source(tmp_path / "src", kind)
    log = src / "book.log" if kind != "pier" else src / ".urb/log/0i30/book.log"
    size = log.stat().st_size
    with open(log, "ab") as f:
        f.write(struct.pack("<Q", 500) + b"half a deed")
    r = bookfs("fsck", src)
    assert r.returncode == 4 and "torn-tail" in r.stdout, r.stdout + r.stderr
    r = bookfs("fsck", src, "--repair")
    assert r.returncode == 1 and "repaired: " in r.stdout and "the log is clean" in r.stdout
    assert log.stat().st_size == size
    assert bookfs("fsck", src).returncode == 0


def test_lmdb_repair_is_refused_with_a_clear_message(tmp_path):
    src = make_source(tmp_path / "src", "lmdb")
    # damage LMDB's view of the epoch: a key missing in the middle (not contiguous)
    broken = make_lmdb_epoch(tmp_path / "broken" / "0i0", 0, payloads(1, 3), keys=[1, 2, 4])
    r = bookfs("fsck", broken, "--repair")
    assert r.returncode == 8 and "not contiguous" in r.stderr and "Traceback" not in r.stderr
    r = bookfs("fsck", src, "--repair")
    assert r.returncode == 0 and "not repaired: " in r.stdout
    assert "LMDB epochs are not written by bookfs" in r.stdout


def test_unknown_or_mismatched_layout_is_refused_and_untouched(tmp_path):
    """Item 1's root cause: a vere log whose two slots are both damaged is not parsed as the
    UIP layout (that cut it to 16 bytes); it is refused, and nothing changes."""
    d = tmp_path / "0i0"
    d.mkdir()
    raw = bytearray(golden_log())
    raw[40] ^= 1
    raw[4096 + 40] ^= 1
    (d / "book.log").write_bytes(raw)
    (d / "meta.bin").write_bytes(GOLDEN_META)
    before = tree_hash(d)
    for args in (("fsck", d, "--repair"), ("fsck", d, "--salvage", tmp_path / "o"),
                 ("verify", d), ("info", d)):
        r = bookfs(*args)
        assert r.returncode in (1, 8), args
        assert "both header slots damaged" in r.stderr, r.stderr
    assert tree_hash(d) == before


# --- item 1: fsck --repair on healthy vere logs ---------------------------------------------


@pytest.mark.parametrize("events", [0, 3])
def test_item1_fsck_repair_keeps_a_healthy_late_vere_epoch(tmp_path, events):
    """Base code: called the whole file a torn tail and cut book.log to 16 bytes."""
    d = make_vere_epoch(tmp_path / "0i1000000", 1000000, payloads(1000001, events))
    before = tree_hash(d)
    r = bookfs("fsck", d, "--repair")
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree_hash(d) == before and (d / "book.log").stat().st_size >= 8192


def test_item1_fsck_on_pier_and_lmdb_gives_no_raw_errno(tmp_path):
    for kind in ("lmdb", "pier"):
        r = bookfs("fsck", make_source(tmp_path / kind, kind))
        assert r.returncode == 0 and "Errno" not in r.stdout + r.stderr, r.stderr


def test_item1_salvage_recovers_every_event_of_a_vere_log(tmp_path):
    """Base code: --salvage recovered 0 events of a vere log."""
    src = make_source(tmp_path / "src", "vere")
    r = bookfs("fsck", src, "--salvage", tmp_path / "out")
    assert r.returncode == 0 and "salvaged 50 events" in r.stdout, r.stdout + r.stderr


# --- item 2: verify ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vere", "lmdb", "pier"])
def test_item2_verify_accepts_every_kind_and_finds_damage(tmp_path, kind):
    src = make_source(tmp_path / "src", kind)
    r = bookfs("verify", src)
    assert r.returncode == 0 and "50 events" in r.stdout, r.stderr
    if kind == "vere":  # a let_d broken in an old batch is a framing failure
        with open(src / "book.log", "r+b") as f:
            f.seek(8192 + 8 + len(event_payload(1)))
            f.write(b"\x09")
        r = bookfs("verify", src)
        assert r.returncode == 1 and "1630 bytes at offset 8192 are not valid" in r.stdout


# --- item 3: fake is a loobean ---------------------------------------------------------------


@pytest.mark.parametrize("fake,shown", [(0, "%.y"), (1, "%.n"), (7, "invalid loobean 7")])
def test_item3_info_renders_fake_as_a_loobean(tmp_path, fake, shown):
    d = tmp_path / "b"
    with Book.open(d, writable=True, create=True) as b:
        b.save_meta("fake", bytes([fake]))
    r = bookfs("info", d, "--json")
    assert json.loads(r.stdout)["fake"] == shown


# --- item 4: migrate writes what a runtime reads --------------------------------------------


def test_item4_migrate_pier_default_is_vere_layout_and_uip_is_refused(tmp_path):
    pier = make_pier(tmp_path / "p", [("lmdb", payloads(1, 10))])
    r = bookfs("migrate", pier, tmp_path / "out")
    assert r.returncode == 0 and "vere layout" in r.stdout, r.stderr
    d = tmp_path / "out" / "0i0"
    assert (d / "epoc.txt").read_text() == "3"
    raw = (d / "book.log").read_bytes()
    assert zlib.crc32(raw[:44]) == struct.unpack_from("<I", raw, 44)[0]  # vere's slot A
    r = bookfs("migrate", pier, tmp_path / "out2", "--layout", "uip")
    assert r.returncode == 1 and "no runtime reads" in r.stderr
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out2.partial").exists()


# --- item 5: vere recovery against the reference's rule (golden vectors) ---------------------


def reference_keeps(raw: bytes) -> int:
    """How many events the C reference (ml/book @ 48131d38) keeps, modelled from the
    corrected reference-formats.md §2: take the best slot; if the file ends exactly at the
    end of its last batch and only the batch CRC fails, roll that batch back; otherwise a
    forward scan from 8192 keeps every whole deed whose framing checks out."""
    slots = []
    for off in (0, 4096):
        s = raw[off : off + 48]
        if len(s) == 48 and zlib.crc32(s[:44]) == struct.unpack_from("<I", s, 44)[0]:
            slots.append(struct.unpack_from("<IIQQQQI", s))
    best = max(slots, key=lambda s: s[4])
    fir, las, bat, sm = best[2], best[3], best[5], best[6]
    offs, pos = [], 8192
    while pos + 16 <= len(raw):
        (n,) = struct.unpack_from("<Q", raw, pos)
        if n == 0 or pos + n + 16 > len(raw) or struct.unpack_from("<Q", raw, pos + 8 + n)[0] != n:
            break
        offs.append(pos)
        pos += n + 16
    k = las - fir
    if len(offs) >= k and pos == len(raw) and len(offs) == k:
        start = offs[k - bat] if bat else pos
        if zlib.crc32(raw[start:pos]) != sm:
            return k - bat  # the file ends at the batch end, only the CRC fails
        return k
    return len(offs)


GOLDEN_DEED_ENDS = [8192 + 21, 8192 + 42, 8192 + 64]  # events 1, 2 (batch 1), 3 (batch 2)


def _with_slot_a_broken(raw):
    raw[30] ^= 0xFF


CASES = {
    # name: (damage, events bookfs keeps, events the reference keeps, quarantined)
    "torn last batch": (lambda r: r.__delitem__(slice(GOLDEN_DEED_ENDS[2] - 3, None)), 2, 2, True),
    "cut inside the batch before the last": (
        lambda r: r.__delitem__(slice(GOLDEN_DEED_ENDS[1] - 5, None)), 1, 1, True),
    "torn newest slot": (_with_slot_a_broken, 2, 3, True),
    "appended deed, no header update": (
        lambda r: r.extend(struct.pack("<Q", 5) + b"\x01\x02\x03\x04\x05" + struct.pack("<Q", 5)),
        3, 4, True),
    "flipped payload byte, last batch": (
        lambda r: r.__setitem__(GOLDEN_DEED_ENDS[1] + 9, r[GOLDEN_DEED_ENDS[1] + 9] ^ 1), 2, 2, True),
    "flipped payload byte, older batch": (
        lambda r: r.__setitem__(8192 + 9, r[8192 + 9] ^ 1), 3, 3, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_item5_golden_vere_recovery_against_the_reference(tmp_path, case):
    damage, ours, theirs, quarantined = CASES[case]
    d = tmp_path / "0i0"
    d.mkdir()
    raw = bytearray(golden_log())
    damage(raw)
    (d / "book.log").write_bytes(raw)
    (d / "meta.bin").write_bytes(GOLDEN_META)
    assert reference_keeps(bytes(raw)) == theirs
    with VereBook.open(d) as b:  # read-only: same answer, nothing touched
        assert b.count == ours
    with VereBook.open(d, writable=True) as b:
        assert b.count == ours
        kept = [p for _, p in b.walk()]
        assert bool(b.recovery.quarantined) == quarantined
    # the rule: bookfs never keeps an event the reference drops, and never drops an
    # acknowledged event (1..2: the state before the newest save) the reference keeps
    assert ours <= theirs and ours >= min(theirs, 2)
    starts, sizes = (8192, 8192 + 21, 8192 + 42), (5, 5, 6)
    assert kept == [bytes(raw[o + 8 : o + 8 + n]) for o, n in zip(starts, sizes)][:ours]


def test_item5_cut_before_the_last_batch_keeps_every_acknowledged_deed(tmp_path):
    """The issue's case (there: the reference kept 1..1510, the base code 1..411)."""
    d = tmp_path / "0i0"
    with VereBook.open(d, writable=True, create=True) as b:
        for first in range(1, 1601, 100):
            b.save(first, payloads(first, 100))
        ends = list(b.index.offsets) + [b.log_bytes]
    raw = (d / "book.log").read_bytes()
    cut = ends[1410] + 7  # inside event 1411: the batch 1401..1500, before the last
    (d / "book.log").write_bytes(raw[:cut])
    want = reference_keeps(raw[:cut])
    assert want == 1410
    with VereBook.open(d, writable=True) as b:
        assert b.gulf() == (1, 1410)
        assert [q[1:] for q in b.recovery.quarantined] == [(ends[1410], 7)]
    with VereBook.open(d) as b:
        assert b.recovery.clean and b.gulf() == (1, 1410)


# --- item 6: short vere files ----------------------------------------------------------------


def test_item6_writable_open_of_a_short_vere_file_is_refused_and_fsck_repairs_it(tmp_path):
    d = tmp_path / "0i0"
    d.mkdir()
    (d / "book.log").write_bytes(golden_log()[:48])
    (d / "meta.bin").write_bytes(GOLDEN_META)
    with pytest.raises(TooShort, match="never grows"):
        VereBook.open(d, writable=True)
    assert (d / "book.log").stat().st_size == 48
    with VereBook.open(d) as b:  # a reader still opens it
        assert b.count == 0
    r = bookfs("fsck", d, "--repair")
    assert r.returncode == 1 and "grew" in r.stdout and "8192" in r.stdout, r.stdout
    assert (d / "book.log").stat().st_size == 8192
    with VereBook.open(d, writable=True) as b:
        b.save(1, [b"abcd"])


# --- item 7: a Book directory without meta.bin -----------------------------------------------


@pytest.mark.parametrize("kind", ["uip", "vere"])
def test_item7_missing_meta_bin(tmp_path, kind):
    src = make_source(tmp_path / "src", kind)
    (src / "meta.bin").unlink()
    with open_source(src) as lg:
        assert lg.count == 50 and lg.read(7) == event_payload(7)
        with pytest.raises(MetaAbsent):
            lg.read_meta("who")
    r = bookfs("info", src)
    assert r.returncode == 0 and "absent (no meta.bin)" in r.stdout
    assert not (src / "meta.bin").exists()
    with open_source(src, writable=True) as lg:
        assert lg.read_meta("life") == bytes(4)
    assert (src / "meta.bin").read_bytes() == bytes(256)


# --- item 8: mugs ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_item8_mmh3_equals_the_pure_murmur3(data, seed):
    assert murmur3_32_fast(data, seed) == murmur3_32(data, seed)


def test_item8_noun_check_is_the_only_check_catching_an_old_vere_payload_flip(tmp_path):
    """vere's layout has no CRC per deed: a flipped byte in an old batch is seen only by
    the decode check (``--nouns``, and ``--mugs``, its alias: a stored mug is the mug of
    Arvo's state after the event, which cannot be checked without a replay), and only
    when the event no longer decodes."""
    src = make_source(tmp_path / "src", "vere")
    last = 8192 + 8 + len(event_payload(1)) - 1  # event 1's last jam byte (an old batch)
    with open(src / "book.log", "r+b") as f:
        f.seek(last)
        b = f.read(1)
        f.seek(last)
        f.write(bytes([b[0] ^ 0x80]))  # a bit past the noun's end: no longer exact
    assert bookfs("verify", src).returncode == 0  # framing holds: invisible without --nouns
    for flag in ("--nouns", "--mugs"):
        r = bookfs("verify", src, flag)
        assert r.returncode == 1 and "event 1 is not a noun: parsing failed at byte 14" \
            in r.stdout, r.stdout
        r = bookfs("fsck", src, flag)
        assert r.returncode == 4 and "noun" in r.stdout and "event 1 is not a noun" in r.stdout
