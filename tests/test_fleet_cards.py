"""A fleet mount answers ``stat`` of a closed ship's fixed entries from its card (issue 24,
``find MNT -maxdepth 2`` in under a second): no log is opened while a card holds, the
attributes are those the open log gives, and a log changed since its card was written is
opened and shown as it is (``formats/shipcard.py``), through a real FUSE mount."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.formats.info import parse
from bookfs.noun import patp
from mount_fixtures import build_sample, mounted, payload, wait_for

EVENTS = 30
FIXED = ("events", "meta", "new", "info", "pretty", "follow")


def _who(path: Path) -> str:
    with Book.open(path) as b:
        return patp(int.from_bytes(b.meta()["who"], "little"))


def _count(path: Path) -> int:
    with Book.open(path) as b:
        return b.count


def _marker(mnt) -> dict[str, int]:
    got = parse((Path(mnt) / ".bookfs-fleet").read_text())
    return {k: int(got.get(k, -1)) for k in ("open", "opened", "cards_read", "cards_stale",
                                             "cards_missing")}


def _attrs(path) -> tuple:
    st = os.lstat(path)
    return (st.st_ino, st.st_mode, st.st_nlink, st.st_size, st.st_mtime_ns, st.st_uid,
            st.st_gid)


def _find(mnt) -> list[str]:
    return subprocess.run(["find", mnt, "-maxdepth", "2"], capture_output=True, text=True,
                          check=True).stdout.split()


def _fleet(tmp_path: Path, n: int) -> Path:
    d = tmp_path / "fleet"
    d.mkdir()
    for i in range(n):
        build_sample(d / f"s{i:02d}", EVENTS + i, seed=i)
    return d


def test_find_opens_no_log_once_each_ship_has_a_card(tmp_path):
    n = 12
    fleet = _fleet(tmp_path, n)
    counts = {_who(fleet / f"s{i:02d}"): EVENTS + i for i in range(n)}
    # the first find: no index, no card yet; each log is opened once (and its card kept)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--max-open", "2",
                 "--ships-ahead", "0") as mnt:  # (test_fleet_ahead.py builds ahead)
        first = _find(mnt)
        assert _marker(mnt)["opened"] == n  # each once: the bound closes, never reopens
    # a new daemon: every card holds, so nothing is opened
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--max-open", "2") as mnt:
        check_found_from_cards(mnt, first, counts)


def check_found_from_cards(mnt, first: list[str], counts: dict[str, int]) -> None:
    """A find on the fresh fleet mount ``mnt`` lists what the ``first`` find listed and
    opens no log: every ship (``counts``: ship -> events) is answered from its card, and
    what each card said is what its log says once opened."""
    assert sorted(_find(mnt)) == sorted(first)
    for ship, count in counts.items():
        for name in FIXED:
            assert f"{mnt}/{ship}/{name}" in first
        assert os.stat(Path(mnt) / ship / "events").st_size == count
        assert os.stat(Path(mnt) / ship / "info").st_size > 0
    m = _marker(mnt)
    assert m["opened"] == 0 and m["open"] == 0
    assert m["cards_read"] == len(counts) and m["cards_stale"] == 0
    for ship, count in counts.items():  # what the cards said, the opened logs say
        text = (Path(mnt) / ship / "info").read_bytes()
        assert parse(text.decode())["events"] == str(count)
        assert len(text) == os.stat(Path(mnt) / ship / "info").st_size
    assert _marker(mnt)["opened"] == len(counts)


def test_attributes_are_the_same_before_and_after_the_log_is_opened(tmp_path):
    fleet = _fleet(tmp_path, 2)
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        _find(mnt)
        for ship in os.listdir(mnt):  # opened: cards kept
            (Path(mnt) / ship / "info").read_bytes()
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--idle-close", "1") as mnt:
        check_same_open_or_closed(mnt, [EVENTS, EVENTS + 1])


def check_same_open_or_closed(mnt, sizes: list[int]) -> None:
    """On the fresh fleet mount ``mnt`` (``--idle-close 1``; every ship's card kept, and
    ``sizes`` their ``events/`` sizes, sorted), every ship's root and fixed entries have
    the same attributes closed (from the card), open, and closed again when idle; each
    log is opened once, for the reads that open it."""
    ships = sorted(os.listdir(mnt))
    paths = [Path(mnt) / s for s in ships]
    paths += [Path(mnt) / s / name for s in ships for name in FIXED]
    closed = {p: _attrs(p) for p in paths}
    assert _marker(mnt)["opened"] == 0
    assert sorted(closed[Path(mnt) / s / "events"][3] for s in ships) == sizes
    for s in ships:  # open every log (a read inside it), then ask again past the cache
        (Path(mnt) / s / "events" / "000000000001").read_bytes()
        assert parse((Path(mnt) / s / "info").read_text())["ship"] == s
    assert _marker(mnt)["opened"] == len(ships)
    time.sleep(1.2)  # past every attribute timeout (CHANGING is 1 s)
    assert {p: _attrs(p) for p in paths} == closed
    # closed again when idle: the same once more, and no log opened for it
    assert wait_for(lambda: _marker(mnt)["open"] == 0, 10)
    time.sleep(1.2)
    assert {p: _attrs(p) for p in paths} == closed
    assert _marker(mnt)["opened"] == len(ships)


@contextlib.contextmanager
def _elsewhere():
    """A writer that keeps its indexes elsewhere (another user's cache): the card stays
    in the fleet's cache, and only its witnesses can tell it is stale."""
    from bookfs.formats.index import configure_cache

    configure_cache(enabled=False)
    try:
        yield
    finally:
        configure_cache()


def _append(src: Path) -> None:
    with Book.open(src, writable=True) as b:
        b.save(b.last + 1, [payload(b.last + 1, 64)])


def _grow(src: Path) -> None:
    with _elsewhere():
        _append(src)


def _truncate(src: Path) -> None:
    with Book.open(src) as b:
        cut = b.index.offset(b.last)
    os.truncate(src / "book.log", cut)


def _replace(src: Path) -> None:
    other = build_sample(src.parent.parent / "other", EVENTS + 7, seed=0)
    os.replace(other / "book.log", src / "book.log")


def _same_bytes_old_mtime(src: Path) -> None:
    log = src / "book.log"
    st = os.stat(log)
    data = log.read_bytes()
    with open(log, "r+b") as f:  # the same bytes written over (ctime moves, nothing else)
        f.write(data)
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))


def _meta(src: Path) -> None:
    with _elsewhere(), Book.open(src, writable=True) as b:
        life = int.from_bytes(b.meta()["life"], "little")
        b.save_meta("life", (life + 123456789).to_bytes(4, "little"))


#: each change, and why the card is not believed: its witnesses differ ("stale"), or
#: there is none for the file as it is now ("missing": a new inode has no index yet; a
#: writer sharing the fleet's index cache saved the index without the card)
CHANGES = {"unchanged": (None, None), "grown": (_grow, "stale"),
           "truncated": (_truncate, "stale"), "replaced": (_replace, "missing"),
           "rewritten, mtime put back": (_same_bytes_old_mtime, "stale"),
           "meta.bin rewritten": (_meta, "stale"),
           "grown, the writer's index saved": (_append, "missing")}


def check_change(mnt, ship: str, src: Path, act, why: str | None, while_mounted: bool,
                 count) -> None:
    """``act(src)`` (None: nothing) changes the log ``src`` of ``ship`` (closed, its card
    kept) under the fleet mount ``mnt``, after a first look from the card when
    ``while_mounted``; the ship then shows ``count(src)`` events (``events/``'s size and
    its ``info``), and its card was believed (``why`` None) or not, for the reason ``why``
    (``"stale"``, ``"missing"``) and the log opened to answer."""
    events, info = Path(mnt) / ship / "events", Path(mnt) / ship / "info"
    if while_mounted:  # seen closed from its card first, then changed under the mount
        assert os.stat(events).st_size == count(src) and _marker(mnt)["opened"] == 0
    if act is not None:
        time.sleep(0.05)  # leave the tick of the card's ctimes
        act(src)
    if while_mounted:
        time.sleep(1.2)  # past the kernel's attribute cache
    size = os.stat(events).st_size
    info_size = os.stat(info).st_size
    m = _marker(mnt)
    assert size == count(src)
    if why is None:
        assert m["opened"] == 0
        assert m["cards_stale"] == 0 and m["cards_read"] == 1
    else:  # not believed, for the reason expected; the log was opened to answer
        assert m["opened"] == 1 and m[f"cards_{why}"] == 1
        assert m["cards_read"] == int(while_mounted)  # the look before the change
        assert m["cards_stale" if why == "missing" else "cards_missing"] == 0
    text = info.read_bytes()
    assert len(text) == info_size
    assert parse(text.decode())["events"] == str(count(src))


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("while_mounted", [False, True], ids=["unmounted", "mounted"])
def test_a_log_changed_since_its_card_is_opened_and_shown_as_it_is(tmp_path, change,
                                                                    while_mounted):
    fleet = _fleet(tmp_path, 2)
    src = fleet / "s00"
    ship = _who(src)
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        for s in os.listdir(mnt):
            (Path(mnt) / s / "info").read_bytes()  # opened: cards kept
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        act, why = CHANGES[change]
        check_change(mnt, ship, src, act, why, while_mounted, _count)


def test_a_pier_made_again_with_a_roll_shows_it(tmp_path):
    """The pier's card (a card file, ``test_fleet_piercards.py``) is not believed for the
    pier made again in its place: stale, or missing when its directory is a new inode."""
    from lmdb_fixtures import make_pier

    fleet = tmp_path / "fleet"
    fleet.mkdir()
    pier = make_pier(fleet / "p", [("book", [b"\x00" * 4 + bytes([i]) for i in range(5)])])
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        (ship,) = os.listdir(mnt)
        assert os.stat(Path(mnt) / ship / "events").st_size == 5
    shutil.rmtree(pier)
    make_pier(fleet / "p", [("book", [b"\x00" * 4 + bytes([i]) for i in range(5)]),
                            ("book", [b"\x00" * 4 + bytes([i]) for i in range(3)])])
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        assert os.stat(Path(mnt) / ship / "events").st_size == 8
        m = _marker(mnt)
        assert m["opened"] == 1 and m["cards_read"] == 0
        assert m["cards_missing"] + m["cards_stale"] >= 1


def test_a_closed_ships_listing_looks_at_its_witnesses_once(tmp_path, monkeypatch):
    """The listing of a closed ship's root looks at its witnesses (four ``lstat``), then
    reads its card, checked against those same witnesses: it does not look at them a
    second time (the old code did, in ``read_card``).  Driven directly."""
    from bookfs.formats import shipcard
    from bookfs.fs.fleet.builder import build_cards
    from bookfs.fs.fleet.ops import FleetOperations

    fleet = tmp_path / "fleet"
    ship = build_sample(fleet / "s0", 12)
    assert build_cards([str(ship)]) == [str(ship)]
    time.sleep(0.05)  # past the racy margin of the files' last change
    ops = FleetOperations(str(fleet), str(tmp_path / "mnt"))
    looks = []
    real = shipcard.witnesses
    monkeypatch.setattr(shipcard, "witnesses", lambda p: looks.append(p) or real(p))
    entries = dict(ops.faces.listing(ops._order[0]))
    assert entries[b"events"].st_size == 12  # from the card
    assert looks == [str(ship)] and ops.faces.read == 1
