"""A fleet of real-layout piers (``.urb/log/0i<N>/``: LMDB and Book epochs) answers
``stat`` of a closed ship's fixed entries from its card, kept in a card file of its own
(issue 24, ``formats/shipcard.py``): ``find MNT -maxdepth 2`` opens no pier once each has
a card, the attributes are those the open pier gives, and a pier changed since its card
was written (an append, a roll, an epoch removed, ``data.mdb`` replaced, meta rewritten)
is opened and shown as it is, through a real FUSE mount."""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import lmdb
import pytest

from bookfs.formats.info import parse
from bookfs.formats.pier import Pier
from bookfs.noun import patp
from lmdb_fixtures import make_lmdb_epoch, make_pier, meta_values, runtime_lock
from mount_fixtures import mounted, payload
from test_fleet_cards import (_elsewhere, _find, _marker, check_change,
                              check_found_from_cards, check_same_open_or_closed)

#: the pier every test changes: an LMDB epoch, then a Book epoch in vere's layout, as a
#: ship upgraded to vere's Book keeps them
LAYOUT = (("lmdb", 10), ("vere", 12))


def _events(first: int, n: int) -> list[bytes]:
    return [payload(e, 8 + e % 50) for e in range(first, first + n)]


def _pier(path: Path, layout=LAYOUT, who: int = 0x100) -> Path:
    epochs, first = [], 1
    for kind, n in layout:
        epochs.append((kind, _events(first, n)))
        first += n
    return make_pier(path, epochs, meta=meta_values(who=who))


def _count(path: Path) -> int:
    with Pier.open(path) as p:
        return p.count


def _fleet(tmp_path: Path, layouts) -> Path:
    d = tmp_path / "fleet"
    d.mkdir()
    for i, layout in enumerate(layouts):
        _pier(d / f"p{i:02d}", layout, who=0x100 + i)
    time.sleep(0.05)  # past the racy margin of the files' ctimes: a card may be kept
    return d


def _keep_cards(fleet: Path, tmp_path: Path) -> None:
    """One mount that opens every pier (each keeps its card)."""
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        for s in os.listdir(mnt):
            (Path(mnt) / s / "info").read_bytes()
        assert _marker(mnt)["opened"] == len(os.listdir(fleet))


MIXED = [LAYOUT, (("lmdb", 7),), (("vere", 9),), (("lmdb", 4), ("lmdb", 5)),
         (("lmdb", 3), ("book", 6)), (("vere", 5), ("vere", 0)),
         (("lmdb", 2), ("vere", 3), ("vere", 4))]


def test_find_opens_no_pier_once_each_has_a_card(tmp_path):
    fleet = _fleet(tmp_path, MIXED)
    n = len(MIXED)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--max-open", "2",
                 "--ships-ahead", "0") as mnt:  # (test_fleet_ahead.py builds ahead)
        first = _find(mnt)
        assert _marker(mnt)["opened"] == n  # each once, its card kept
        counts = {s: os.stat(Path(mnt) / s / "events").st_size for s in os.listdir(mnt)}
    assert sorted(counts.values()) == sorted(sum(k for _, k in lay) for lay in MIXED)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--max-open", "2") as mnt:
        check_found_from_cards(mnt, first, counts)


def test_pier_attributes_are_the_same_before_and_after_it_is_opened(tmp_path):
    fleet = _fleet(tmp_path, [LAYOUT, (("lmdb", 4), ("book", 6))])
    _keep_cards(fleet, tmp_path)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--idle-close", "1") as mnt:
        check_same_open_or_closed(mnt, [10, 22])


def _log_dir(pier: Path) -> Path:
    return pier / ".urb" / "log"


def _newest(pier: Path) -> Path:
    return max(_log_dir(pier).glob("0i*"), key=lambda d: int(d.name[2:]))


def _append_vere(pier: Path, *, runtime: bool = False) -> None:
    """An event appended to the newest (vere Book) epoch; ``runtime``: by the running vere
    that holds the pier's lock."""
    from bookfs.formats.vere import VereBook

    with _elsewhere(), VereBook.open(_newest(pier), writable=True, lock=not runtime) as b:
        b.save(b.last + 1, [payload(b.last + 1, 40)])


def _append_book(pier: Path) -> None:
    from bookfs.formats.book import Book

    with _elsewhere(), Book.open(_newest(pier), writable=True) as b:
        b.save(b.last + 1, [payload(b.last + 1, 40)])


def _append_lmdb(pier: Path) -> None:
    """A commit to the newest LMDB epoch, as a running (LMDB) vere makes one."""
    last = _count(pier)
    env = lmdb.open(str(_newest(pier)), max_dbs=2, subdir=True)
    try:
        db = env.open_db(b"EVENTS", integerkey=True)
        with env.begin(write=True, db=db) as txn:
            txn.put(struct.pack("<Q", last + 1), payload(last + 1, 40))
    finally:
        env.close()


def _roll(pier: Path) -> None:
    from lmdb_fixtures import make_vere_epoch

    last = _count(pier)
    d = _log_dir(pier) / f"0i{last}"
    make_vere_epoch(d, last, _events(last + 1, 4), meta=meta_values())
    (d / "epoc.txt").write_text("3")


def _chop(pier: Path) -> None:
    """The oldest epoch removed (``vere chop``): the pier starts later, with fewer events."""
    oldest = min(_log_dir(pier).glob("0i*"), key=lambda d: int(d.name[2:]))
    shutil.rmtree(oldest)


def _drop_newest(pier: Path) -> None:
    shutil.rmtree(_newest(pier))


def _replace_mdb(pier: Path) -> None:
    """The newest epoch's ``data.mdb`` replaced by another holding more events."""
    d = _newest(pier)
    base = int(d.name[2:])
    other = make_lmdb_epoch(pier.parent.parent / "other", base, _events(base + 1, 15))
    os.replace(other / "data.mdb", d / "data.mdb")


def _meta_bin(pier: Path) -> None:
    from bookfs.formats.vere import VereBook

    with _elsewhere(), VereBook.open(_newest(pier), writable=True) as b:
        b.save_meta("life", (17 + 123456789).to_bytes(4, "little"))


def _top_meta(pier: Path) -> None:
    from lmdb_fixtures import write_meta_db

    env = lmdb.open(str(_log_dir(pier)), max_dbs=2, subdir=True)
    try:
        write_meta_db(env, {"life": (17 + 123456789).to_bytes(4, "little")})
    finally:
        env.close()


LMDB_NEWEST = (("lmdb", 10), ("lmdb", 12))
BOOK_NEWEST = (("lmdb", 10), ("book", 12))
#: each change: the pier's layout, what is done, and why the card is not believed
CHANGES = {
    "unchanged": (LAYOUT, None, None),
    "vere epoch appended": (LAYOUT, _append_vere, "stale"),
    "UIP Book epoch grown": (BOOK_NEWEST, _append_book, "stale"),
    "LMDB epoch committed": (LMDB_NEWEST, _append_lmdb, "stale"),
    "roll: an epoch added": (LAYOUT, _roll, "stale"),
    "chop: the oldest epoch removed": (LAYOUT, _chop, "stale"),
    "the newest epoch removed": (LAYOUT, _drop_newest, "stale"),
    "data.mdb replaced": (LMDB_NEWEST, _replace_mdb, "stale"),
    "meta.bin rewritten": (LAYOUT, _meta_bin, "stale"),
    "top-level META rewritten": (LMDB_NEWEST, _top_meta, "stale"),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("while_mounted", [False, True], ids=["unmounted", "mounted"])
def test_a_pier_changed_since_its_card_is_opened_and_shown_as_it_is(tmp_path, change,
                                                                     while_mounted):
    layout, act, why = CHANGES[change]
    fleet = _fleet(tmp_path, [layout, LAYOUT])
    src = fleet / "p00"
    _keep_cards(fleet, tmp_path)
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        check_change(mnt, patp(0x100), src, act, why, while_mounted, _count)


def test_a_live_pier_is_shown_from_its_card_until_its_runtime_writes(tmp_path):
    """A running vere holds ``.vere.lock``: the fleet's read-only open takes no lock, so a
    live pier is no error file, open or not; a card stands for it while its files are
    unchanged, and its next commit makes the card stale."""
    fleet = _fleet(tmp_path, [LAYOUT])
    pier = fleet / "p00"
    _keep_cards(fleet, tmp_path)
    with runtime_lock(pier):
        with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
            (ship,) = os.listdir(mnt)
            assert os.path.isdir(Path(mnt) / ship)
            assert os.stat(Path(mnt) / ship / "events").st_size == 22
            assert _marker(mnt)["opened"] == 0 and _marker(mnt)["cards_read"] == 1
            time.sleep(0.05)
            _append_vere(pier, runtime=True)  # the runtime commits
            time.sleep(1.2)  # past the kernel's attribute cache
            assert os.stat(Path(mnt) / ship / "events").st_size == 23
            m = _marker(mnt)
            assert m["opened"] == 1 and m["cards_stale"] == 1
            assert parse((Path(mnt) / ".bookfs-fleet").read_text())["errors"] == "0"


def test_a_card_file_is_checked_and_pruned_with_the_indexes(tmp_path):
    from bookfs.formats import index as X
    from bookfs.formats import shipcard

    pier = _pier(tmp_path / "p")
    time.sleep(0.05)
    before = shipcard.looked(str(pier))
    with Pier.open(pier) as p:
        assert shipcard.write_card(str(pier), p, before)
    seen, card = shipcard.read_card(str(pier))
    assert isinstance(card, shipcard.Card) and card.count == 22
    (path,) = [p for p in Path(X.cache_dir()).iterdir() if p.suffix == ".card"]
    assert oct(Path(X.cache_dir()).stat().st_mode & 0o777) == "0o700"
    # a flipped byte in the card: its CRC fails, no card
    raw = bytearray(path.read_bytes())
    raw[20] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert shipcard.read_card(str(pier))[1] == "missing"
    # pruned by the byte budget, as an index is; nothing else in the directory is
    (Path(X.cache_dir()) / "notes.txt").write_text("mine")
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    assert X.prune_cache(X.cache_dir(), keep=0, budget=0) == [str(path)]
    assert (Path(X.cache_dir()) / "notes.txt").exists()
