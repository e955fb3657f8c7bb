"""Issue 21, item 5: an epoch is identified by what its files hold; ``epoc.txt`` is a
cross-check.

vere's branch ``ml/bob`` writes ``epoc.txt`` 3 for an LMDB epoch (image.bin + ram events,
``pkg/noun/version.h``), ``ml/book`` writes 3 for a ``book.log`` epoch.  So:

* an LMDB epoch whose ``epoc.txt`` says 3 is read (``open_source``, ``recovery_for``,
  ``bookfs info``, ``bookfs fsck``, a read-only mount), and so is the ``0i0`` that
  ``ml/book``'s migration of a pre-epoch pier leaves (``epoc.txt`` 3 beside the old
  ``data.mdb``, with or without an empty ``book.log``);
* a Book epoch with ``epoc.txt`` 3 is still read, and so is a ``book.log`` that ``ml/book``
  wrote into an ``ml/bob`` epoch whose ``EVENTS`` was still empty;
* ``epoc.txt`` 1 beside a ``book.log`` and no ``data.mdb`` (no vere writes that) is refused
  by every tool with one line saying what was found and what was expected, untouched;
* with no ``epoc.txt`` an epoch is still identified by its files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from pathlib import Path

import lmdb
import pytest

from bookfs.errors import FormatError, ReadOnly
from bookfs.formats.layout import crc32
from bookfs.formats.lmdb_log import LmdbLog
from bookfs.formats.epochs import epoch_kind
from bookfs.formats.pier import Pier, identify, open_source
from bookfs.formats.pier_recovery import recovery_for
from lmdb_fixtures import (
    MAP_SIZE,
    make_pier,
    make_top_meta,
    make_vere_epoch,
    meta_values,
    payloads,
    write_meta_db,
)
from mounting import mounted, run_bookfs


# --- what vere writes --------------------------------------------------------------------


def make_bob_epoch(directory: Path, base: int, events, *, meta=None) -> Path:
    """An epoch as vere's ``ml/bob`` writes it: one LMDB environment with its four tables
    (``pkg/vere/db/lmdb.c``: META, EVENTS with MDB_INTEGERKEY, BLOBS with MDB_INTEGERKEY,
    LEASES with MDB_INTEGERKEY | MDB_DUPSORT), ``epoc.txt`` 3 (``U3E_VER3``, "image.bin +
    ram events") and ``vere.txt``."""
    directory.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(directory), map_size=MAP_SIZE, max_dbs=4, subdir=True)
    try:
        events_db = env.open_db(b"EVENTS", integerkey=True, create=True)
        blobs = env.open_db(b"BLOBS", integerkey=True, create=True)
        env.open_db(b"LEASES", integerkey=True, dupsort=True, create=True)
        events = list(events)
        with env.begin(write=True) as txn:
            for i, value in enumerate(events, start=base + 1):
                txn.put(struct.pack("<Q", i), value, db=events_db)
            if events:
                txn.put(struct.pack("<Q", base + 1), struct.pack("<Q", 7), db=blobs)
        write_meta_db(env, meta if meta is not None else meta_values())
        env.sync(True)
    finally:
        env.close()
    (directory / "epoc.txt").write_text("3")
    (directory / "vere.txt").write_text("4.0-bob")
    return directory


def fresh_vere_log(base: int) -> bytes:
    """What ``u3_book_init`` on ``ml/book`` writes into an epoch ``0i<base>`` with no
    ``book.log`` (``pkg/vere/db/book.c``, ``_book_make_head``): both slots with
    fir = las = base, seq 0, bat 0, sum 0, then the file extended to 8192 bytes."""
    body = struct.pack("<IIQQQQI", 0x424F4F4B, 1, base, base, 0, 0, 0)
    slot = body + struct.pack("<I", crc32(body))
    raw = bytearray(8192)
    raw[0:48] = slot
    raw[4096:4144] = slot
    return bytes(raw)


def test_fresh_vere_log_is_the_reference_golden():
    # reference-formats.md §2: "A fresh 0i5 has fir=5, las=5, seq=0 in both slots, crc
    # 0x49dd984c"
    raw = fresh_vere_log(5)
    assert struct.unpack_from("<I", raw, 44)[0] == 0x49DD984C
    assert raw[4096:4144] == raw[0:48] and len(raw) == 8192


def _relabel(d: Path, epoc: str | None) -> None:
    if epoc is None:
        (d / "epoc.txt").unlink()
    else:
        (d / "epoc.txt").write_text(epoc)


# --- the cases ------------------------------------------------------------------------------
#
# Each returns ``(source, events)``: ``events`` is every payload the source holds, in order
# from event 1 (``None``: the source must be refused).  ``REFUSED`` names what the one line
# of the refusal says.

A = payloads(1, 40)
B = payloads(41, 25)
C = payloads(66, 9)


def case_bob_newest(tmp):
    """An LMDB pier whose newest epoch is ml/bob's: epoc.txt 3 beside data.mdb."""
    root = make_pier(tmp / "pier", [("lmdb", A)])
    make_bob_epoch(root / ".urb/log/0i40", 40, B)
    return root, A + B


def case_bob_middle(tmp):
    """ml/bob's LMDB epoch (epoc.txt 3) between an LMDB epoch and a Book epoch."""
    root = make_pier(tmp / "pier", [("lmdb", A)])
    make_bob_epoch(root / ".urb/log/0i40", 40, B)
    d = make_vere_epoch(root / ".urb/log/0i65", 65, C, meta=meta_values())
    (d / "epoc.txt").write_text("3")
    return root, A + B + C


def case_lmdb_says_3(tmp):
    """A plain LMDB epoch (EVENTS and META only) relabelled epoc.txt 3."""
    root = make_pier(tmp / "pier", [("lmdb", A), ("lmdb", B)])
    _relabel(root / ".urb/log/0i40", "3")
    return root, A + B


def case_bob_epoch_alone(tmp):
    """ml/bob's epoch directory given on its own."""
    root = make_pier(tmp / "pier", [("lmdb", A)])
    return make_bob_epoch(root / ".urb/log/0i40", 40, B), B


def _migrated_pier(tmp, with_book: bool):
    """A pre-epoch pier after ml/book's ``_disk_migrate_epoc`` (pkg/vere/disk.c): 0i0 made
    with epoc.txt 3 (``_disk_epoc_zero``), the top-level data.mdb hard-linked into it, and
    (``with_book``: what the code intends; at 48131d38 ``u3_book_init`` of ``log/tmp``
    fails first) an empty book.log that ``u3_book_init(0i0)`` creates."""
    root = tmp / "pier"
    log_dir = root / ".urb" / "log"
    log_dir.mkdir(parents=True)
    env = lmdb.open(str(log_dir), map_size=MAP_SIZE, max_dbs=2, subdir=True)
    try:
        db = env.open_db(b"EVENTS", integerkey=True, create=True)
        with env.begin(write=True, db=db) as txn:
            for i, value in enumerate(A, start=1):
                txn.put(struct.pack("<Q", i), value)
        write_meta_db(env, meta_values(version=2))
        env.sync(True)
    finally:
        env.close()
    d = log_dir / "0i0"
    d.mkdir()
    (d / "epoc.txt").write_text("3")
    (d / "vere.txt").write_text("4.0-book")
    os.link(log_dir / "data.mdb", d / "data.mdb")
    os.link(log_dir / "lock.mdb", d / "lock.mdb")
    if with_book:
        (d / "book.log").write_bytes(fresh_vere_log(0))
        (d / "meta.bin").write_bytes(bytes(256))
    return root, A


def case_migrated_0i0(tmp):
    return _migrated_pier(tmp, with_book=False)


def case_migrated_0i0_with_empty_book(tmp):
    return _migrated_pier(tmp, with_book=True)


def case_book_opened_bob_epoch(tmp):
    """ml/book started on a pier whose newest epoch ml/bob had just rolled (EVENTS still
    empty): u3_book_init creates book.log beside data.mdb and appends there."""
    root = make_pier(tmp / "pier", [("lmdb", A)])
    d = make_bob_epoch(root / ".urb/log/0i40", 40, [])
    tmp_vere = make_vere_epoch(tmp / "scratch" / "0i40", 40, B, meta=meta_values())
    for name in ("book.log", "meta.bin"):
        shutil.copy(tmp_vere / name, d / name)
    return root, A + B


def case_bob_with_empty_book(tmp):
    """ml/book opened ml/bob's epoch that already held events: an empty book.log (its
    fresh header) beside data.mdb, whose EVENTS hold the epoch's events."""
    root = make_pier(tmp / "pier", [("lmdb", A)])
    d = make_bob_epoch(root / ".urb/log/0i40", 40, B)
    (d / "book.log").write_bytes(fresh_vere_log(40))
    return root, A + B


def case_book_says_3(tmp):
    """A Book epoch (vere's layout) with epoc.txt 3: read as before."""
    return make_pier(tmp / "pier", [("lmdb", A), ("vere", B)]), A + B


def case_no_epoc_lmdb(tmp):
    root = make_pier(tmp / "pier", [("lmdb", A), ("lmdb", B)])
    _relabel(root / ".urb/log/0i40", None)
    return root, A + B


def case_no_epoc_book(tmp):
    root = make_pier(tmp / "pier", [("lmdb", A), ("vere", B)])
    _relabel(root / ".urb/log/0i40", None)
    return root, A + B


def case_no_epoc_empty_book_beside_lmdb(tmp):
    root, events = case_bob_with_empty_book(tmp)
    _relabel(root / ".urb/log/0i40", None)
    return root, events


def case_epoc1_book(tmp):
    """epoc.txt 1 beside book.log and no data.mdb: written by no vere."""
    root = make_pier(tmp / "pier", [("lmdb", A), ("vere", B)])
    _relabel(root / ".urb/log/0i40", "1")
    return root, None


def case_epoc2_book_alone(tmp):
    """The same, given as the epoch directory itself, epoc.txt 2."""
    root = make_pier(tmp / "pier", [("lmdb", A), ("vere", B)])
    d = root / ".urb/log/0i40"
    _relabel(d, "2")
    return d, None


CASES = {f.__name__[5:]: f for f in (
    case_bob_newest, case_bob_middle, case_lmdb_says_3, case_bob_epoch_alone,
    case_migrated_0i0, case_migrated_0i0_with_empty_book, case_book_opened_bob_epoch,
    case_bob_with_empty_book, case_book_says_3, case_no_epoc_lmdb, case_no_epoc_book,
    case_no_epoc_empty_book_beside_lmdb, case_epoc1_book, case_epoc2_book_alone)}

#: What each refusal's one line must say: what was found and what epoc.txt expected.
REFUSED = {
    "epoc1_book": ("0i40: found book.log and no data.mdb", "epoc.txt says 1",
                   "an LMDB epoch (data.mdb)", "refused, nothing was changed"),
    "epoc2_book_alone": ("0i40: found book.log and no data.mdb", "epoc.txt says 2",
                         "an LMDB epoch (data.mdb)", "refused, nothing was changed"),
}


def _state(top: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``top``: its mtime and its bytes' hash (nothing created either)."""
    return {str(p.relative_to(top)): (p.stat().st_mtime_ns,
                                      hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(top.rglob("*")) if p.is_file()}


def _top(src: Path) -> Path:
    for p in (src, *src.parents):
        if (p / ".urb").is_dir():
            return p
    return src


# --- the matrix: case x tool -----------------------------------------------------------------


def _open_source(src, events):
    with open_source(src) as log:
        assert log.count == len(events)
        assert [p for _, p in log.walk()] == events
        if isinstance(log, Pier):
            for e in log.epochs:
                if isinstance(e.log, LmdbLog):
                    assert e.log.format.startswith("lmdb (epoc ")


def _recovery(src, events):
    rep = recovery_for(src).check()
    assert rep.clean, rep.all_problems()
    assert rep.events == len(events)


def _info(src, events):
    res = run_bookfs("info", str(src), check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"events:   {len(events)}\n" in res.stdout, res.stdout
    return res


def _fsck(src, events):
    res = run_bookfs("fsck", str(src), check=False, timeout=120)
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"({len(events)}), 0 problem(s)" in res.stdout.splitlines()[-1], res.stdout
    return res


TOOLS = {"open_source": _open_source, "recovery_for": _recovery, "info": _info,
         "fsck": _fsck}


def _refusal_line(name, tool, src) -> str:
    """The one line ``tool`` refuses ``src`` with."""
    if tool in ("open_source", "recovery_for"):
        with pytest.raises(FormatError) as exc:
            if tool == "open_source":
                open_source(src).close()
            else:
                recovery_for(src).check()
        return str(exc.value)
    res = run_bookfs(tool, str(src), check=False, timeout=120)
    assert res.returncode != 0, (name, tool, res.stdout)
    assert res.stdout == "" or "Traceback" not in res.stdout
    text = res.stderr.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, (name, tool, text)
    return text


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("name", list(CASES))
def test_matrix(tmp_path, name, tool):
    src, events = CASES[name](tmp_path)
    top = _top(Path(src))
    before = _state(top)
    if events is None:
        line = _refusal_line(name, tool, src)
        assert "\n" not in line
        for part in REFUSED[name]:
            assert part in line, (name, tool, line)
    else:
        TOOLS[tool](src, events)
    assert _state(top) == before, f"{tool} changed the files of {name}"


# --- the identification itself ---------------------------------------------------------------


EXPECTED_KIND = {
    "bob_newest": ("0i40", "lmdb"), "bob_middle": ("0i40", "lmdb"),
    "lmdb_says_3": ("0i40", "lmdb"), "migrated_0i0": ("0i0", "lmdb"),
    "migrated_0i0_with_empty_book": ("0i0", "lmdb"),
    "book_opened_bob_epoch": ("0i40", "book"), "bob_with_empty_book": ("0i40", "lmdb"),
    "book_says_3": ("0i40", "book"), "no_epoc_lmdb": ("0i40", "lmdb"),
    "no_epoc_book": ("0i40", "book"), "no_epoc_empty_book_beside_lmdb": ("0i40", "lmdb"),
}


@pytest.mark.parametrize("name", list(EXPECTED_KIND))
def test_epoch_kind_and_identify_agree(tmp_path, name):
    root, _ = CASES[name](tmp_path)
    epoch, kind = EXPECTED_KIND[name]
    d = root / ".urb" / "log" / epoch
    before = _state(root)
    assert epoch_kind(str(d)) == kind
    assert identify(d)[0] == ("lmdb" if kind == "lmdb" else "vere")
    assert _state(root) == before


def test_lmdb_epoch_says_3_through_every_open(tmp_path):
    root, events = case_bob_newest(tmp_path)
    with Pier.open(root) as pier:
        assert pier.format == "pier (2 epochs: lmdb, lmdb)"
        newest = pier.epochs[-1].log
        assert isinstance(newest, LmdbLog) and newest.format == "lmdb (epoc 3)"
        assert newest.gulf() == (41, 65)
        assert pier.meta() == meta_values()
    # LMDB epochs are read-only: a writable open says so (not "no such file book.log")
    with pytest.raises(ReadOnly, match="newest epoch is LMDB"):
        open_source(root, writable=True)
    res = _info(root, events)
    assert "0i40 lmdb 41..65" in res.stdout


def test_lmdb_epoch_says_3_read_only_mount(tmp_path):
    root, events = case_bob_middle(tmp_path)
    before = _state(root)
    with mounted(root, tmp_path / "mnt", "-o", "ro") as mnt:
        names = sorted(os.listdir(f"{mnt}/events"))
        assert names == [f"{e:012d}" for e in range(1, len(events) + 1)]
        for e in (1, 40, 41, 65, 66, len(events)):
            with open(f"{mnt}/events/{e}", "rb") as f:
                assert f.read() == events[e - 1]
        assert sorted(os.listdir(f"{mnt}/epochs")) == ["0i0", "0i40", "0i65"]
        assert len(os.listdir(f"{mnt}/epochs/0i40/events")) == len(B)
        with open(f"{mnt}/info") as f:
            info = f.read()
        assert "0i40 lmdb 41..65" in info and "0i65 vere-book 66..74" in info
    assert _state(root) == before


def test_migrated_0i0_read_only_mount(tmp_path):
    root, events = case_migrated_0i0_with_empty_book(tmp_path)
    with mounted(root, tmp_path / "mnt", "-o", "ro") as mnt:
        assert len(os.listdir(f"{mnt}/events")) == len(events)
        with open(f"{mnt}/events/{len(events)}", "rb") as f:
            assert f.read() == events[-1]


@pytest.mark.parametrize("name", ["epoc1_book", "epoc2_book_alone"])
def test_refusal_through_the_mount(tmp_path, name):
    src, _ = CASES[name](tmp_path)
    top = _top(Path(src))
    before = _state(top)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (["-o", "ro"], []):
        res = run_bookfs("mount", str(src), str(mnt), *args, check=False, timeout=120)
        if res.returncode == 0:
            run_bookfs("umount", str(mnt), check=False)
        assert res.returncode != 0, res.stdout
        text = res.stderr.strip()
        assert len(text.splitlines()) == 1 and "Traceback" not in text, text
        for part in REFUSED[name]:
            assert part in text, text
        assert not os.listdir(mnt)
    assert _state(top) == before


def test_epoch_without_any_store_is_refused_in_one_line(tmp_path):
    """A roll cut short after epoc.txt: neither store yet.  Refused, saying so."""
    root = make_pier(tmp_path / "pier", [("lmdb", A), ("vere", B)])
    d = root / ".urb/log/0i40"
    for name in ("book.log", "meta.bin"):
        (d / name).unlink()
    before = _state(root)
    for epoc, expect in (("3", "expected data.mdb or book.log"),
                         ("2", "expected data.mdb;")):
        (d / "epoc.txt").write_text(epoc)
        before = _state(root)
        for call in (lambda: open_source(root), lambda: recovery_for(root).check(),
                     lambda: identify(d)):
            with pytest.raises(FormatError) as exc:
                call()
            msg = str(exc.value)
            assert "\n" not in msg and f"epoc.txt says {epoc}" in msg and expect in msg, msg
            assert "neither book.log nor data.mdb" in msg
        assert _state(root) == before


def test_unknown_epoc_is_refused_wherever_the_epoch_is_opened(tmp_path):
    root = make_pier(tmp_path / "pier", [("lmdb", A), ("vere", B)])
    d = root / ".urb/log/0i40"
    (d / "epoc.txt").write_text("4")
    for call in (lambda: open_source(root), lambda: open_source(d), lambda: identify(d)):
        with pytest.raises(FormatError, match=r"epoch format b'4', expected 1, 2 \(LMDB\) "
                                              r"or 3 \(Book, or LMDB with ram events\)"):
            call()


def test_both_stores_beside_epoc_1_read_data_mdb(tmp_path):
    """Every vere opens an epoc.txt 1 or 2 epoch with LMDB: a stray book.log beside its
    data.mdb is not read (as before)."""
    root = make_pier(tmp_path / "pier", [("lmdb", A), ("lmdb", B)])
    d = root / ".urb/log/0i40"
    make_vere_epoch(tmp_path / "x" / "0i40", 40, payloads(41, 3))
    shutil.copy(tmp_path / "x" / "0i40" / "book.log", d / "book.log")
    with open_source(root) as pier:
        assert isinstance(pier.epochs[-1].log, LmdbLog) and pier.count == len(A + B)


def test_top_level_meta_only_pier_with_bob_epochs(tmp_path):
    """A pier that ml/bob rolled twice: both epochs LMDB with epoc.txt 3, meta at the top."""
    root = tmp_path / "pier"
    log_dir = root / ".urb" / "log"
    log_dir.mkdir(parents=True)
    make_top_meta(log_dir, meta_values(who=1))
    make_bob_epoch(log_dir / "0i0", 0, A, meta=meta_values(who=1))
    make_bob_epoch(log_dir / "0i40", 40, B, meta=meta_values(who=1))
    with open_source(root) as pier:
        assert pier.format == "pier (2 epochs: lmdb, lmdb)"
        assert [p for _, p in pier.walk()] == A + B
        assert pier.read_meta("who") == (1).to_bytes(16, "little")
