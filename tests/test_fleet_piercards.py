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
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import pytest

from bookfs.formats.info import parse
from bookfs.formats.pier import Pier
from bookfs.noun import patp
from lmdb_fixtures import make_lmdb_epoch, make_pier, meta_values
from mount_fixtures import mounted, payload, wait_for
from test_fleet_cards import FIXED, _attrs, _elsewhere, _find, _marker

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
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--max-open", "2") as mnt:
        first = _find(mnt)
        assert _marker(mnt)["opened"] == n  # each once, its card kept
        counts = {s: os.stat(Path(mnt) / s / "events").st_size for s in os.listdir(mnt)}
    assert sorted(counts.values()) == sorted(sum(k for _, k in lay) for lay in MIXED)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--max-open", "2") as mnt:
        assert sorted(_find(mnt)) == sorted(first)
        for ship, count in counts.items():
            for name in FIXED:
                assert f"{mnt}/{ship}/{name}" in first
            assert os.stat(Path(mnt) / ship / "events").st_size == count
            assert os.stat(Path(mnt) / ship / "info").st_size > 0
        m = _marker(mnt)
        assert m["opened"] == 0 and m["open"] == 0
        assert m["cards_read"] == n and m["cards_stale"] == 0
        for ship, count in counts.items():  # what the cards said is what the piers say
            text = (Path(mnt) / ship / "info").read_bytes()
            assert parse(text.decode())["events"] == str(count)
            assert len(text) == os.stat(Path(mnt) / ship / "info").st_size
        assert _marker(mnt)["opened"] == n


def test_pier_attributes_are_the_same_before_and_after_it_is_opened(tmp_path):
    fleet = _fleet(tmp_path, [LAYOUT, (("lmdb", 4), ("book", 6))])
    _keep_cards(fleet, tmp_path)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--idle-close", "1") as mnt:
        ships = sorted(os.listdir(mnt))
        paths = [Path(mnt) / s for s in ships]
        paths += [Path(mnt) / s / name for s in ships for name in FIXED]
        closed = {p: _attrs(p) for p in paths}
        assert _marker(mnt)["opened"] == 0
        assert sorted(closed[Path(mnt) / s / "events"][3] for s in ships) == [10, 22]
        for s in ships:  # open every pier (a read inside it), then ask again past the cache
            (Path(mnt) / s / "events" / "000000000001").read_bytes()
        assert _marker(mnt)["opened"] == 2
        time.sleep(1.2)  # past every attribute timeout (CHANGING is 1 s)
        assert {p: _attrs(p) for p in paths} == closed
        assert wait_for(lambda: _marker(mnt)["open"] == 0, 10)  # closed when idle
        time.sleep(1.2)
        assert {p: _attrs(p) for p in paths} == closed
        assert _marker(mnt)["opened"] == 2


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
        ship = patp(0x100)
        events, info = Path(mnt) / ship / "events", Path(mnt) / ship / "info"
        if while_mounted:  # seen closed from its card first, then changed under the mount
            assert os.stat(events).st_size == _count(src) and _marker(mnt)["opened"] == 0
        if act is not None:
            time.sleep(0.05)  # leave the tick of the card's ctimes
            act(src)
        if while_mounted:
            time.sleep(1.2)  # past the kernel's attribute cache
        size = os.stat(events).st_size
        info_size = os.stat(info).st_size
        m = _marker(mnt)
        assert size == _count(src)
        if why is None:
            assert m["opened"] == 0 and m["cards_stale"] == 0 and m["cards_read"] == 1
        else:  # not believed; the pier was opened to answer
            assert m["opened"] == 1 and m[f"cards_{why}"] == 1
            assert m["cards_read"] == int(while_mounted)  # the look before the change
        text = info.read_bytes()
        assert len(text) == info_size
        assert parse(text.decode())["events"] == str(_count(src))


def test_a_live_pier_is_shown_from_its_card_until_its_runtime_writes(tmp_path):
    """A running vere holds ``.vere.lock``: the fleet's read-only open takes no lock, so a
    live pier is no error file, open or not; a card stands for it while its files are
    unchanged, and its next commit makes the card stale."""
    fleet = _fleet(tmp_path, [LAYOUT])
    pier = fleet / "p00"
    _keep_cards(fleet, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from bookfs.formats.lock import WriterLock; "
         f"l = WriterLock({str(pier / '.vere.lock')!r}); print('held', flush=True); "
         "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
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
    finally:
        holder.stdin.close()
        holder.wait(10)


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
