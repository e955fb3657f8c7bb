"""bookfs fsck: findings with offsets, safe repair, salvage past damage, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bookfs.cli import fsck
from bookfs.formats.book import Book



def _payload(i: int) -> bytes:
    return i.to_bytes(4, "little") + bytes([i % 251]) * (40 + (i * 37) % 900)


@pytest.fixture
def log(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOKFS_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "log"
    with Book.open(d, writable=True, create=True) as b:
        for k in range(0, 300, 50):
            b.save(k + 1, [_payload(i) for i in range(k + 1, k + 51)])
        offsets = list(b.index.offsets)
    return d, offsets


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bookfs.cli", "fsck", *map(str, args)],
                          capture_output=True, text=True)


def test_clean_log(log):
    d, _ = log
    rep = fsck.check(str(d))
    assert rep.clean and (rep.first, rep.last, rep.events) == (1, 300, 300)
    res = _cli(d)
    assert res.returncode == fsck.EXIT_CLEAN, res.stdout + res.stderr


def test_crc_failures_reported_with_offsets_and_events(log):
    d, offsets = log
    with open(d / "book.log", "r+b") as f:
        for event in (10, 200):
            f.seek(offsets[event - 1] + 14)
            b = f.read(1)
            f.seek(offsets[event - 1] + 14)
            f.write(bytes([b[0] ^ 0x40]))
    before = (d / "book.log").read_bytes()
    rep = fsck.check(str(d))
    crc = [(p.offset, p.event) for p in rep.problems if p.kind == "crc"]
    assert crc == [(offsets[9], 10), (offsets[199], 200)]
    res = _cli(d, "--repair")
    assert res.returncode == fsck.EXIT_PROBLEMS
    assert "only a torn tail" in res.stdout
    assert (d / "book.log").read_bytes() == before  # nothing unsafe was touched


def test_torn_tail_is_repaired(log):
    d, offsets = log
    size = os.path.getsize(d / "book.log")
    os.truncate(d / "book.log", size - 5)
    rep = fsck.check(str(d))
    assert rep.state.torn_tail == (offsets[299], size - 5 - offsets[299])
    res = _cli(d, "--repair")
    assert res.returncode == fsck.EXIT_REPAIRED, res.stdout
    assert os.path.getsize(d / "book.log") == offsets[299]
    assert _cli(d).returncode == fsck.EXIT_CLEAN


def test_salvage_past_broken_framing(log, tmp_path):
    d, offsets = log
    # smash the framing of events 100..102 (overwrite from inside 100 to inside 102)
    start, stop = offsets[99] + 3, offsets[101] + 30
    with open(d / "book.log", "r+b") as f:
        f.seek(start)
        f.write(b"\xa5" * (stop - start))
    rep = fsck.check(str(d))
    kinds = [p.kind for p in rep.problems]
    assert "framing" in kinds
    framing = next(p for p in rep.problems if p.kind == "framing")
    assert framing.offset == offsets[99]
    out = tmp_path / "salvaged"
    res = _cli(d, "--salvage", out)
    assert res.returncode == fsck.EXIT_PROBLEMS
    report = json.loads((out / "salvage-report.json").read_text())
    # events 1..99 and 103..300 recovered, in order; 100..102 lost
    expected = [_payload(i) for i in list(range(1, 100)) + list(range(103, 301))]
    with Book.open(out) as b:
        got = [p for _, p in b.walk()]
    assert got == expected
    assert report["recovered"] == len(expected)
    lost = [g for g in report["gaps"] if g["events_lost"] == "unknown"]
    assert lost and lost[0]["offset"] == offsets[99]
    assert lost[0]["offset"] + lost[0]["bytes"] == offsets[102]


def test_salvage_tries_every_offset_in_garbage(tmp_path, monkeypatch):
    """Valid deeds that follow unframed garbage are found at their exact offsets."""
    monkeypatch.setenv("BOOKFS_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "log"
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, [_payload(1), _payload(2)])
        end = b.log_bytes
    from bookfs.formats.layout import encode_deed

    with open(d / "book.log", "ab") as f:
        f.write(os.urandom(777))
        f.write(encode_deed(_payload(3)))
        f.write(b"\x00" * 13)
        f.write(encode_deed(_payload(4)))
    rep = fsck.check(str(d))
    assert rep.state.damaged[0][0] == end
    out = tmp_path / "out"
    fsck.salvage(str(d), rep, str(out))
    with Book.open(out) as b:
        assert [p for _, p in b.walk()] == [_payload(i) for i in (1, 2, 3, 4)]


def test_not_a_log_is_an_operational_error(tmp_path):
    (tmp_path / "book.log").write_bytes(b"NOTABOOKLOG_____" * 2)
    res = _cli(tmp_path)
    assert res.returncode == fsck.EXIT_ERROR
    assert "not a Book log" in res.stderr
