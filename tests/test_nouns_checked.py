"""Existing logs are checked on demand (issue 21, items 3 and 4): ``bookfs verify --nouns``
and ``bookfs fsck --nouns`` list every event whose payload does not decode (jam: cues
completely and exactly; ram: vere's ``ml/bob`` encoding), with the byte of its payload
where parsing failed, and change nothing; ``show`` and the mount's ``pretty/N`` say "not a
noun" in one line and render ram events as their jam twins; ``report`` counts both.

A stored mug is the mug of Arvo's state after the event (vere's ``mars.c``), never the
event noun's: a log whose stored mugs are arbitrary non-zero values, as a real ship
writes them, is clean under ``--nouns`` and its alias ``--mugs``.

Through the real ``bookfs`` command and a real read-only mount."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.noun import cord, datetime_to_da, jam, path, scan
from bookfs.noun.ram import BobRef, bob_file_mug, ram_encode
from lmdb_fixtures import make_pier, meta_values
from mounting import BOOKFS, mounted

LIFE = 2
NOW = datetime_to_da(dt.datetime(2026, 11, 25, 12, 0, 0, tzinfo=dt.timezone.utc))
NOT_A_NOUN = re.compile(r"\bevent (\d+) is not a noun: parsing failed at byte (\d+) of its "
                        r"payload: (.+)$", re.M)


def mug_of(i: int) -> bytes:
    """An arbitrary non-zero stored mug, as a ship writes (the kernel's, not the noun's)."""
    return (0x9E3779B1 * i & 0x7FFFFFFF | 1).to_bytes(4, "little")


def ship_event(i: int, tag: str = "belt"):
    return (NOW + (i << 64), (path(f"/d/term/{i}"), (cord(tag), (cord("txt"), i))))


JAM_TWIN = 3  # event 9 is event 3's noun in the ram encoding
BAD_RAM = b"RAM\x00\x01\xff"  # a back-reference to bit 0 before anything is there


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> tuple[Path, dict[int, bytes]]:
    """A UIP log: boot events 1..LIFE, ship events, some that do not decode (4, 6, 8,
    12), a ram twin (9), a noun appended after the boot that is no ship event (10) and a
    ram event with a missing bob (11); every stored mug arbitrary and non-zero."""
    d = tmp_path_factory.mktemp("nouns") / "log"
    p = {
        1: mug_of(1) + jam((cord("boot"), 0)),
        2: mug_of(2) + jam((1, 2)),
        3: mug_of(3) + jam(ship_event(3)),
        4: mug_of(4) + b"zzzz",  # the atom 0, then bytes that are no part of it
        5: mug_of(5) + jam(ship_event(5, "hear")),
        6: mug_of(6) + jam(ship_event(6)) + b"\x00",  # a byte after the noun
        7: mug_of(7) + jam(ship_event(7, "wake")),
        8: mug_of(8),  # a mug and nothing else
        9: mug_of(9) + ram_encode(ship_event(JAM_TWIN)),
        10: mug_of(10) + jam(cord("appended later")),
        11: mug_of(11) + ram_encode((cord("blob"), BobRef(12345, 1))),
        12: mug_of(12) + BAD_RAM,
    }
    with Book.open(d, writable=True, create=True) as book:
        book.save(1, [p[i] for i in sorted(p)])
        for k, v in meta_values(who=0x100, life=LIFE).items():
            book.save_meta(k, v)
    return d, p


def expected_bad(p: dict[int, bytes]) -> dict[int, int]:
    """event -> payload byte where parsing fails, found independently of the tools."""
    out = {}
    for n, payload in p.items():
        if payload[4:9] == b"RAM\x00\x01":
            continue
        res = scan(payload[4:], exact=True)
        if not res.ok:
            out[n] = 4 + res.byte
    out[12] = 4 + 5  # the first tag after the 5-byte ram header
    return out


def bookfs(*args, progress: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if progress:
        env["BOOKFS_PROGRESS"] = "1"
    return subprocess.run([*BOOKFS, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def tree(d: Path) -> dict[str, str]:
    return {str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(d.rglob("*")) if f.is_file() and f.name != "book.lock"}


def listed(text: str) -> dict[int, int]:
    return {int(e): int(b) for e, b, _ in NOT_A_NOUN.findall(text)}


# --- verify and fsck ---------------------------------------------------------------------


def test_verify_nouns_lists_exactly_the_events_that_do_not_decode(log):
    d, p = log
    before = tree(d)
    # event 6: its noun ends inside the last byte of its jam, and a byte follows
    assert expected_bad(p) == {4: 4, 6: 3 + len(jam(ship_event(6))), 8: 4, 12: 9}
    r = bookfs("verify", d, "--nouns", progress=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert listed(r.stdout) == expected_bad(p)
    assert "Traceback" not in r.stderr
    assert "nouns:" in r.stderr  # the progress bar of the decode check
    assert re.search(r"^nouns: 12 events decode-checked \(3 in the ram encoding\); 4 do not "
                     r"decode \(reported only: nothing was repaired or cut\)$", r.stdout, re.M)
    assert bookfs("verify", d).returncode == 0  # the CRCs hold: only --nouns sees them
    assert tree(d) == before


def test_fsck_nouns_reports_them_and_repairs_nothing(log):
    d, p = log
    before = tree(d)
    assert bookfs("fsck", d).returncode == 0
    r = bookfs("fsck", d, "--nouns", progress=True)
    assert r.returncode == 4, r.stdout + r.stderr
    assert listed(r.stdout) == expected_bad(p)
    assert all(line.startswith("noun ") for line in r.stdout.splitlines()
               if "is not a noun" in line)
    assert "fsck" in r.stderr and "Traceback" not in r.stderr  # the progress bar
    assert "4 problem(s); nouns: 12 checked (3 ram), 4 do not decode" in r.stdout
    r = bookfs("fsck", d, "--nouns", "--repair")
    assert r.returncode == 4 and listed(r.stdout) == expected_bad(p)
    assert tree(d) == before  # nothing cut or quarantined because an event does not decode


def test_the_noun_check_of_a_pier_reads_its_bobs(tmp_path):
    """A pier's ram events: a bob whose file is in ``.urb/bob`` is read (and checked
    against its name), through each epoch's own format."""
    content = b"a bob atom's bytes"
    bob = BobRef(bob_file_mug(content), 1)
    date = ship_event(1)[0]
    good = mug_of(1) + ram_encode((date, (path("/g"), (cord("blob"), bob))))
    pier = make_pier(tmp_path / "pier", [("vere", [good, mug_of(2) + jam(ship_event(2))])],
                     meta=meta_values(life=0))
    bobs = pier / ".urb" / "bob" / str(bob.mug)
    bobs.mkdir(parents=True)
    (bobs / "1").write_bytes(content)
    for cmd in (("verify", pier, "--nouns"), ("fsck", pier, "--nouns")):
        r = bookfs(*cmd)
        assert r.returncode == 0, r.stdout + r.stderr
    out = bookfs("show", pier, "1").stdout
    assert "noun:  [%blob 'a bob atom\\'s bytes']" in out and "bobs:" not in out
    (bobs / "1").write_bytes(b"not the same bytes")  # a file that is not this atom
    r = bookfs("fsck", pier, "--nouns")
    assert r.returncode == 4 and "event 1 is not a noun: parsing failed in a bob file" in \
        r.stdout, r.stdout


# --- stored mugs are not the noun's -----------------------------------------------------


def test_arbitrary_stored_mugs_are_clean_under_nouns_and_mugs(tmp_path):
    """Stored mugs as a real ship writes them (the kernel's mug after the event): no tool
    compares them with the event noun's mug; ``--mugs`` is ``--nouns`` and says why."""
    d = tmp_path / "ship"
    with Book.open(d, writable=True, create=True) as book:
        book.save(1, [mug_of(i) + jam(ship_event(i)) for i in range(1, 21)])
    for args in (("verify", d, "--mugs"), ("fsck", d, "--mugs"), ("verify", d, "--nouns"),
                 ("fsck", d, "--nouns")):
        r = bookfs(*args)
        assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
        if "--mugs" in args:
            note = [ln for ln in r.stderr.splitlines() if "note:" in ln]
            assert len(note) == 1 and "cannot be checked without replaying the ship" in note[0]
    assert "20 events decode-checked" in bookfs("verify", d, "--mugs").stdout
    assert "0 problem(s); nouns: 20 checked" in bookfs("fsck", d, "--mugs").stdout


# --- show, pretty/N and report -------------------------------------------------------------


def blocks(text: str) -> dict[int, list[str]]:
    out = {}
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        out[int(lines[0].split(":")[1])] = lines
    return out


def test_show_says_not_a_noun_in_one_line(log):
    d, p = log
    r = bookfs("show", d, "1..12")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    shown = blocks(r.stdout)
    for n, byte in expected_bad(p).items():
        errors = [ln for ln in shown[n] if ln.startswith("error:")]
        assert len(errors) == 1 and not any(ln.startswith(("noun:", "kind:"))
                                            for ln in shown[n]), shown[n]
        assert errors[0].startswith(f"error: event {n} is not a noun: parsing failed at "
                                    f"byte {byte} of its payload: ")
    rows = [json.loads(x) for x in bookfs("show", d, "4", "--json")
            .stdout.splitlines()]
    assert rows[0]["error_byte"] == 4 and "is not a noun" in rows[0]["error"]


def test_show_kinds_ram_twin_and_missing_bob(log):
    d, _ = log
    shown = blocks(bookfs("show", d, "1..12").stdout)
    assert shown[1][1] == "kind:  not [date [wire card]] (a lifecycle event of the boot)"
    assert shown[2][1] == "kind:  not [date [wire card]] (a lifecycle event of the boot)"
    assert shown[10][1] == "kind:  not a ship event (no date and wire)"  # after the boot
    assert shown[10][-1] == "noun:  'appended later'"
    jam_lines = [ln for ln in shown[JAM_TWIN][1:] if not ln.startswith("size:")]
    ram_lines = [ln for ln in shown[9][1:] if not ln.startswith("size:")]
    assert ram_lines == jam_lines and any(ln.startswith("date:") for ln in ram_lines)
    assert "ram encoding" in next(ln for ln in shown[9] if ln.startswith("size:"))
    bob = next(ln for ln in shown[11] if ln.startswith("bobs:"))
    assert ".urb/bob/12345/1" in bob and "not present" in bob
    assert shown[11][-1] == ("noun:  [%blob <bob atom stored outside the log in "
                             ".urb/bob/12345/1; that file is not present>]")


def test_pretty_through_a_read_only_mount_says_the_same(log, tmp_path):
    d, _ = log
    expected = blocks(bookfs("show", d, "1..12").stdout)
    with mounted(d, tmp_path / "mnt", "-o", "ro") as mnt:
        for n in range(1, 13):
            with open(f"{mnt}/pretty/{n}") as f:
                assert f.read().strip().splitlines() == expected[n], n
        with open(f"{mnt}/pretty/8") as f:
            assert "error: event 8 is not a noun: parsing failed at byte 4" in f.read()
        # show through the mount reads events/N and the mount's info (life)
        assert blocks(bookfs("show", mnt, "1..12").stdout) == expected


def test_report_counts_ram_events_and_events_that_are_not_nouns(log, tmp_path):
    d, _ = log
    r = bookfs("report", d, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    assert "12 events" in r.stdout and "4 of them not nouns" in r.stdout
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "<th>events that are not nouns</th><td>4 " in page
    assert "<th>events in the ram encoding</th><td>3 " in page
    tags = re.search(r"<th>card tags</th><td>([^<]*)<", page).group(1)
    # 3, 5, 7 and the ram twin 9 are dated; 1, 2, 10, 11 have no date; 4 6 8 12 no noun
    assert "(not a noun) 4" in tags and "(boot) 4" in tags and "belt 2" in tags, tags
