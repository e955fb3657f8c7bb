"""A fleet mount (issue 24): ``bookfs mount --fleet DIR MNT`` serves every log under DIR
as ``MNT/<ship>/`` from one daemon, through a real FUSE mount."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.formats.info import parse
from bookfs.noun import patp
from mount_fixtures import build_sample, mounted, run_bookfs, wait_for

EVENTS = 30


def _who(path: Path) -> str:
    with Book.open(path) as b:
        return patp(int.from_bytes(b.meta()["who"], "little"))


def _marker(mnt) -> dict[str, str]:
    return parse((Path(mnt) / ".bookfs-fleet").read_text())


@pytest.fixture
def fleet(tmp_path) -> Path:
    d = tmp_path / "fleet"
    d.mkdir()
    for i in range(3):
        build_sample(d / f"s{i}", EVENTS, seed=i)
    return d


def test_inode_map_round_trips():
    from bookfs.fs.fleet import inodes as F
    from bookfs.fs import inodes as I

    m = F.InodeMap()
    for sid in (1, 7, (1 << 22) - 2):
        for local in (I.ROOT, I.EVENTS, I.INFO, I.epoch_inode(3, I.EPOCH_INFO),
                      I.event_inode(1), I.event_inode((1 << 40) - 1)):
            ino = m.fleet(sid, local)
            assert ino is not None and ino not in (F.FLEET_ROOT, F.MARKER)
            assert m.local(ino) == (sid, local)
        assert m.local(F.error_inode(sid)) == (sid, 0)
    # the rest go through the table, counted, and are dropped at the last FORGET
    other = I.event_inode(5, slot=1)
    assert m.fleet(2, other) is None
    ino = m.fleet(2, other, lookup=True)
    assert m.fleet(2, other, lookup=True) == ino and m.local(ino) == (2, other)
    m.forget(ino, 1)
    assert m.local(ino) == (2, other)
    m.forget(ino, 1)
    assert m.local(ino) is None and len(m) == 0


def test_fleet_lists_ships_and_reads_them_like_single_mounts(fleet, tmp_path):
    ships = {_who(fleet / f"s{i}"): fleet / f"s{i}" for i in range(3)}
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        assert sorted(os.listdir(mnt)) == sorted(ships)
        assert _marker(mnt)["open"] == "0"  # listing opened no log
        out = subprocess.run(["find", mnt, "-maxdepth", "2"], capture_output=True,
                             text=True, check=True).stdout.split()
        for ship in ships:
            assert f"{mnt}/{ship}/events" in out and f"{mnt}/{ship}/info" in out
        for ship, src in ships.items():
            root = Path(mnt) / ship
            info = parse((root / "info").read_text())
            assert info["ship"] == ship and info["events"] == str(EVENTS)
            assert info["path"] == str(src)
            with Book.open(src) as b:
                for n in (1, EVENTS // 2, EVENTS):
                    assert (root / "events" / f"{n:012d}").read_bytes() == b.read(n)
            assert os.stat(root / "events").st_size == EVENTS
            assert len(os.listdir(root / "events")) == EVENTS
            assert (root / "meta" / "who").stat().st_size == 16
        inos = {s: os.stat(Path(mnt) / s / "events" / "000000000003").st_ino for s in ships}
        assert len(set(inos.values())) == 3  # each ship its own inodes
        with pytest.raises(OSError) as e:
            (Path(mnt) / next(iter(ships)) / "new" / "000000000099").write_bytes(b"x" * 8)
        assert e.value.errno == errno.EROFS
        assert ".bookfs-fleet" not in os.listdir(mnt)
        # a name that can never exist stays absent (a negative entry, not a new inode)
        ship = next(iter(ships))
        for _ in range(2):
            assert not os.path.exists(Path(mnt) / ship / "events" / "_spark_metadata")


def test_logs_close_when_idle_and_reopen_with_the_same_inodes(fleet, tmp_path):
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--max-open", "2",
                 "--idle-close", "1") as mnt:
        ships = sorted(os.listdir(mnt))
        first = {s: (os.stat(Path(mnt) / s / "events" / "000000000002").st_ino,
                     (Path(mnt) / s / "events" / "000000000002").read_bytes())
                 for s in ships}
        m = _marker(mnt)
        assert int(m["open"]) <= 2 and int(m["opened"]) == 3 and int(m["closed"]) >= 1
        assert wait_for(lambda: _marker(mnt)["open"] == "0", 10)  # idle: all closed
        for s in ships:  # reopened on use: same inode, same bytes
            p = Path(mnt) / s / "events" / "000000000002"
            assert (os.stat(p).st_ino, p.read_bytes()) == first[s]
            assert parse((Path(mnt) / s / "info").read_text())["events"] == str(EVENTS)


def test_ships_added_and_removed_while_mounted(fleet, tmp_path):
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        before = set(os.listdir(mnt))
        assert len(before) == 3
        new = build_sample(tmp_path / "staging", EVENTS + 5, seed=7)
        who = _who(new)
        os.rename(new, fleet / "s7")
        assert wait_for(lambda: who in os.listdir(mnt), 5)
        assert parse((Path(mnt) / who / "info").read_text())["events"] == str(EVENTS + 5)
        gone = _who(fleet / "s0")
        (Path(mnt) / gone / "info").read_text()  # opened, cached by the kernel
        ino = os.stat(Path(mnt) / gone / "events" / "000000000003").st_ino
        shutil.copytree(fleet / "s0", tmp_path / "backup")
        shutil.rmtree(fleet / "s0")
        assert wait_for(lambda: gone not in os.listdir(mnt), 5)
        assert not os.path.exists(Path(mnt) / gone / "info")
        # put back: another log as far as the kernel knows, with inodes of its own
        os.rename(tmp_path / "backup", fleet / "s0")
        assert wait_for(lambda: gone in os.listdir(mnt), 5)
        again = Path(mnt) / gone / "events" / "000000000003"
        assert os.stat(again).st_ino != ino
        with Book.open(fleet / "s0") as b:
            assert again.read_bytes() == b.read(3)
        for ship in os.listdir(mnt):
            assert int(parse((Path(mnt) / ship / "info").read_text())["events"]) >= EVENTS
        # a pier copied in file by file: its directory first (no log yet: a file saying
        # so), then its log; within RETRY seconds it is shown as its ship
        (fleet / "late").mkdir()
        assert wait_for(lambda: os.path.isfile(Path(mnt) / "late"), 5)
        build_sample(fleet / "late", EVENTS, seed=9)
        late = _who(fleet / "late")
        assert wait_for(lambda: late in os.listdir(mnt), 15)
        assert "late" not in os.listdir(mnt)
        assert parse((Path(mnt) / late / "info").read_text())["events"] == str(EVENTS)


def test_a_damaged_ship_is_an_error_file_beside_healthy_ones(fleet, tmp_path):
    bad = fleet / "broken"
    bad.mkdir()
    (bad / "book.log").write_bytes(os.urandom(4096))
    junk = fleet / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a log\n")
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        names = set(os.listdir(mnt))
        assert {"broken", "junk"} <= names and len(names) == 5
        assert os.path.isfile(Path(mnt) / "junk")  # no log at all: a file from the start
        for name in ("broken", "junk"):
            with pytest.raises(OSError) as e:
                (Path(mnt) / name / "info").read_text()
            assert e.value.errno in (errno.EIO, errno.ENOTDIR)
            assert wait_for(lambda: os.path.isfile(Path(mnt) / name), 5)
            said = (Path(mnt) / name).read_text()
            assert said.startswith(f"{name}: cannot be read: ") and said.count("\n") == 1
        assert _marker(mnt)["errors"] == "2"
        for ship in names - {"broken", "junk"}:  # the others are unaffected
            assert parse((Path(mnt) / ship / "info").read_text())["events"] == str(EVENTS)


def test_a_pier_whose_runtime_holds_the_lock_is_followed(fleet, tmp_path):
    from lmdb_fixtures import make_pier, runtime_lock

    from bookfs.formats.pier import open_book_dir

    pier = make_pier(fleet / "live", [("book", [b"\x00" * 4 + bytes([i]) for i in range(5)])])
    with runtime_lock(pier):
        with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
            ships = os.listdir(mnt)
            live = [s for s in ships if parse((Path(mnt) / s / "info").read_text())
                    ["path"] == str(pier)]
            assert len(live) == 1 and live[0].startswith("~")
            root = Path(mnt) / live[0]
            assert os.stat(root / "events").st_size == 5
            epoch = pier / ".urb" / "log" / "0i0"
            with open_book_dir(str(epoch), writable=True, pier_locked=True) as b:
                b.save(6, [b"\x00" * 4 + b"\x07"])  # the runtime appends
            assert wait_for(lambda: os.path.exists(root / "events" / "6"), 5)
            assert (root / "events" / "000000000006").read_bytes() == b"\x00" * 4 + b"\x07"


def test_bad_usage_is_one_line(tmp_path):
    (tmp_path / "mnt").mkdir()
    res = run_bookfs("mount", "--fleet", str(tmp_path / "nope"), str(tmp_path / "mnt"),
                     check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    res = run_bookfs("mount", "--fleet", str(tmp_path), str(tmp_path / "mnt"), "-o", "rw",
                     check=False)
    assert res.returncode == 2 and "read-only" in res.stderr


def test_info_summarises_the_fleet(fleet, tmp_path):
    import json

    bad = fleet / "broken"
    bad.mkdir()
    (bad / "book.log").write_bytes(os.urandom(4096))
    ships = {_who(fleet / f"s{i}"): fleet / f"s{i}" for i in range(3)}
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        res = run_bookfs("info", mnt)
        head = parse(res.stdout)
        assert head["fleet"] == str(fleet) and head["ships"] == "4"
        assert head["errors"] == "1" and head["events"] == str(3 * EVENTS)
        total = sum((p / "book.log").stat().st_size for p in ships.values())
        assert f"({total:,} bytes)" in head["bytes"]
        lines = {line.split()[0]: line for line in res.stdout.splitlines()[7:]}
        for ship in ships:
            assert lines[ship].split()[1:4] == [str(EVENTS), f"{(ships[ship] / 'book.log').stat().st_size:,}", str(EVENTS)]
            assert "~20" in lines[ship]  # the newest event's date
        assert "error: broken: cannot be read" in lines["broken"]
        got = json.loads(run_bookfs("info", "--json", mnt).stdout)
        assert {s["ship"] for s in got["per_ship"]} == set(ships) | {"broken"}
        one = next(iter(ships))
        res = run_bookfs("info", f"{mnt}/{one}")
        assert parse(res.stdout)["ship"] == one and str(ships[one]) in res.stderr


def test_ships_share_one_bounded_cache():
    from bookfs.fs.cache import EventCache
    from bookfs.fs.fleet.ship import ShipCache

    shared = EventCache(max_bytes=100)
    a, b = ShipCache(shared), ShipCache(shared)
    a.put(1, b"a" * 40)
    b.put(1, b"b" * 40)
    assert a.get(1) == b"a" * 40 and b.get(1) == b"b" * 40  # same event, two ships
    a.clear()  # the log changed (or was closed): its entries are never served again
    assert a.get(1) is None and b.get(1) == b"b" * 40
    for n in range(2, 6):
        a.put(n, b"x" * 40)
    assert shared.bytes <= 100 and b.get(1) is None  # one bound for every ship
