"""Seals (``formats/seals.py``): a large deed's CRC per block, made with its whole check and
kept beside the index, so that a read, a cold one on a new mount too, is checked block by
block as it is served (issue 34.2).

The class of bugs held here: a byte served that no check vouches for.  A block read under
a seal must pass that block's CRC; a seal kept from an earlier open must be used only for
the deed it was made from; a seal older than its deed must not turn sound bytes into EIO;
a damaged deed must answer EIO to every read that covers the damage, on every source kind
that seals, and the kinds that do not seal must read as before.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookfs.errors import CorruptDeed
from bookfs.formats import index as ix
from bookfs.formats.book import Book
from bookfs.formats.pier import open_source
from bookfs.formats.seals import (BLOCK, KEEP, SEALED_FROM, Seal, SealBroken, SealStore,
                                  read_sealed)
from lmdb_fixtures import make_pier, make_vere_epoch
from mount_fixtures import payload
from mounting import mounted, run_bookfs
from page_cache import evict, pages, resident

BIG = SEALED_FROM + 5 * BLOCK + 1234  # a last block shorter than the others


def _book(root: Path, sizes=(40, BIG, 60)) -> Path:
    d = root / "uip"
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, [payload(n, size) for n, size in enumerate(sizes, 1)])
    return d


def _flip(log_file: Path, at: int) -> None:
    with open(log_file, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


def _payload_start(log: Book, event: int) -> int:
    return log._locate(event)[0] + 8


# --- the seal, on its own --------------------------------------------------------------


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    d = _book(tmp_path_factory.mktemp("seal"))
    with Book.open(d) as b:
        yield b, b.seal(2), payload(2, BIG)


@settings(max_examples=200, deadline=None)
@given(start=st.integers(0, BIG + BLOCK), size=st.integers(0, 3 * BLOCK))
def test_a_sealed_read_gives_exactly_the_payload(sealed, start, size):
    b, seal, want = sealed
    assert b.read_sealed(2, seal, start, size) == want[start : start + size]


@settings(max_examples=150, deadline=None)
@given(at=st.integers(0, BIG - 1), flip=st.integers(1, 255),
       start=st.integers(0, BIG), size=st.integers(1, 3 * BLOCK))
def test_a_sealed_read_serves_no_byte_that_changed(sealed, at, flip, start, size):
    """Any byte of the payload changed on disk after the seal: a read either gives the
    sealed bytes exactly or refuses (SealBroken), and refuses whenever it covers the
    change's block."""
    b, seal, want = sealed
    pos = _payload_start(b, 2) + at
    old = os.pread(b.fileno(), 1, pos)
    fd = os.open(b.log_path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([old[0] ^ flip]), pos)
        try:
            got = b.read_sealed(2, seal, start, size)
        except SealBroken:
            got = None
        covers = start < BIG and start // BLOCK <= at // BLOCK <= (min(BIG, start + size)
                                                                    - 1) // BLOCK
        assert got is None if covers else got == want[start : start + size]
    finally:
        os.pwrite(fd, old, pos)
        os.close(fd)


def test_a_seal_covers_the_payload_in_blocks(sealed):
    b, seal, want = sealed
    assert (seal.off, seal.n) == b._locate(2) and len(seal.sums) == -(-BIG // BLOCK)
    assert b.seal(1) is None and b.seal(3) is None  # under SEALED_FROM: checked whole


def test_a_rotten_block_is_refused_and_the_others_served(tmp_path):
    d = _book(tmp_path)
    with Book.open(d) as b:
        seal = b.seal(2)
        k = 7
        _flip(d / "book.log", _payload_start(b, 2) + k * BLOCK + 99)
        want = payload(2, BIG)
        assert b.read_sealed(2, seal, 0, k * BLOCK) == want[: k * BLOCK]
        assert b.read_sealed(2, seal, (k + 1) * BLOCK, BLOCK) == want[(k + 1) * BLOCK:
                                                                      (k + 2) * BLOCK]
        for start, size in ((k * BLOCK, 1), (k * BLOCK - 10, 20), (0, BIG)):
            with pytest.raises(SealBroken):
                b.read_sealed(2, seal, start, size)
        with pytest.raises(CorruptDeed):  # the whole check tells damage from a stale seal
            b.seal(2, fresh=True)
    with Book.open(d) as b:  # and the damaged deed's seal is not kept for a later open
        with pytest.raises(CorruptDeed):
            b.seal(2)


def test_a_kept_seal_is_used_by_a_new_open_without_reading_the_payload(tmp_path):
    d = _book(tmp_path)
    with Book.open(d) as b:
        made = b.seal(2)
        start = _payload_start(b, 2)
    evict(d / "book.log")
    with Book.open(d) as b:
        kept = b.seal(2)
        assert kept == made
        got = resident(d / "book.log")
        inner = pages(start + 2 * BLOCK, BIG - 4 * BLOCK)  # (the ends share pages with
        assert not any(got[p] & 1 for p in inner)          # len_d and the trailer)


def test_a_kept_seal_is_not_used_for_another_deed(tmp_path):
    """A log replaced by one whose deed 2 is as large but other bytes (a new CRC): the
    seal kept for the old one does not hold, a new one is made."""
    d = _book(tmp_path)
    with Book.open(d) as b:
        old = b.seal(2)
        start = _payload_start(b, 2)
    other = payload(99, BIG)
    fd = os.open(d / "book.log", os.O_WRONLY)  # the same file, its deed 2 rewritten
    try:
        os.pwrite(fd, other, start)
        os.pwrite(fd, Book.DEEDS.encode(other)[-12:-8], start + BIG)  # and its CRC
    finally:
        os.close(fd)
    with Book.open(d) as b:
        new = b.seal(2)
        assert new.crc != old.crc
        assert b.read_sealed(2, new, 0, BIG) == other


def test_a_store_keeps_the_newest_and_survives_a_bad_file(tmp_path):
    d = _book(tmp_path, sizes=(40,))
    st_log = os.stat(d / "book.log")
    store = SealStore(str(d / "book.log"), st_log)
    from array import array
    third = KEEP // 4 // 3  # CRCs a seal: three fit in the store's budget, four do not
    for e in range(5):
        store.put([(e, Seal(e, BLOCK * third, e, array("I", [e]) * third))])
    again = SealStore(str(d / "book.log"), st_log)
    assert [again.get(e) is not None for e in range(5)] == [False, False, True, True, True]
    assert again.get(4) == Seal(4, BLOCK * third, 4, array("I", [4]) * third)
    (path,) = Path(ix.cache_dir()).glob("*.sums")
    raw = bytearray(path.read_bytes())
    raw[100] ^= 1  # the file's own CRC fails: nothing is taken from it
    path.write_bytes(bytes(raw))
    assert SealStore(str(d / "book.log"), st_log).get(4) is None


def test_with_the_cache_off_nothing_is_kept(tmp_path):
    d = _book(tmp_path)
    ix.configure_cache(enabled=False)
    try:
        with Book.open(d) as b:
            assert b.seal(2) is not None
        with Book.open(d) as b:
            assert b.seal(2) is not None
    finally:
        ix.configure_cache()
    assert not list(Path(ix.cache_dir()).glob("*.sums"))


def test_read_sealed_reads_only_the_blocks_it_serves(sealed, monkeypatch):
    b, seal, _ = sealed
    asked = []
    real = b.DEEDS.payload_at

    def counting(fd, off, n, skip=0):
        asked.append((skip, n))
        return real(fd, off, n, skip)

    monkeypatch.setattr(type(b.DEEDS), "payload_at", staticmethod(counting))
    read_sealed(b.fileno(), seal, 3 * BLOCK + 5, 10, b.DEEDS)
    assert asked == [(3 * BLOCK, BLOCK)]


# --- through a mount, on each kind of source ---------------------------------------------


def _uip_src(root: Path) -> Path:
    return _book(root)


def _pier_src(root: Path) -> Path:
    return make_pier(root / "pier", [("lmdb", [payload(n, 40) for n in range(1, 4)]),
                                     ("book", [payload(4, 40), payload(5, BIG),
                                               payload(6, 60)])])  # (the last deed of a
    # log is its tail, which an open checks: damage there is a torn tail, not a read's)


def _vere_src(root: Path) -> Path:
    return make_vere_epoch(root / "0i0", 0, [payload(1, 40), payload(2, BIG)])


SEALING = {"UIP Book": (_uip_src, 2), "pier, Book epoch": (_pier_src, 5)}


def _log_file(src: Path) -> Path:
    (found,) = [p for p in src.rglob("*.log") if p.stat().st_size > BIG]
    return found


def _sha_of(path: Path, bs: str = "1M") -> subprocess.CompletedProcess:
    return subprocess.run(f"dd if={path} bs={bs} status=none | sha256sum; "
                          "exit ${PIPESTATUS[0]}", shell=True, capture_output=True,
                          text=True, executable="/bin/bash")


@pytest.mark.parametrize("kind", list(SEALING))
def test_a_cold_read_on_a_new_mount_is_served_by_the_kept_seal(tmp_path, kind):
    make, event = SEALING[kind]
    src = make(tmp_path)
    want = hashlib.sha256(payload(event, BIG)).hexdigest()
    path = tmp_path / "mnt" / "events" / str(event)
    with mounted(src, tmp_path / "mnt", "-o", "ro"):
        assert _sha_of(path).stdout.split()[0] == want  # the first read ever seals it
    assert len(list(Path(ix.cache_dir()).glob("*.sums"))) == 1
    log_file = _log_file(src)
    with open_source(src) as log:
        inner = log.epoch_of(event).log if hasattr(log, "epoch_of") else log
        start = _payload_start(inner, event)
    with mounted(src, tmp_path / "mnt", "-o", "ro"):
        os.stat(path)  # (the chain walk of a new mount's index reads past the deed)
        evict(log_file)
        with open(path, "rb") as f:  # a read of one block brings back about that block
            assert f.read(4096) == payload(event, BIG)[:4096]
        got = resident(log_file)  # (and the readaheads: the mount's 1 MiB, the disk's)
        far = pages(start + 32 * BLOCK, BIG - 36 * BLOCK)
        assert not any(got[p] & 1 for p in far), "the whole deed was read for one block"
        for bs in ("1M", "4k", "3M"):
            assert _sha_of(path, bs).stdout.split()[0] == want, bs


@pytest.mark.parametrize("kind", list(SEALING))
def test_damage_after_the_seal_answers_eio_and_never_serves_it(tmp_path, kind):
    make, event = SEALING[kind]
    src = make(tmp_path)
    path = tmp_path / "mnt" / "events" / str(event)
    with mounted(src, tmp_path / "mnt", "-o", "ro"):
        path.read_bytes()
    with open_source(src) as log:
        inner = log.epoch_of(event).log if hasattr(log, "epoch_of") else log
        start = _payload_start(inner, event)
    k = 40
    _flip(_log_file(src), start + k * BLOCK + 7)
    evict(_log_file(src))
    want = payload(event, BIG)
    with mounted(src, tmp_path / "mnt", "-o", "ro"):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(fd, BLOCK, 0) == want[:BLOCK]  # an intact block is served
            with pytest.raises(OSError) as e:
                os.pread(fd, 4096, k * BLOCK)
            assert e.value.errno == errno.EIO
        finally:
            os.close(fd)
        res = _sha_of(path)
        assert res.returncode != 0 and "Input/output error" in res.stderr
        with pytest.raises(OSError) as e:  # once found, the damaged deed keeps no seal
            with open(path, "rb") as f:
                f.seek((k + 8) * BLOCK)
                f.read(4096)
        assert e.value.errno == errno.EIO


def test_a_stale_seal_does_not_turn_sound_bytes_into_eio(tmp_path):
    """A kept seal whose deed CRC and size still match, but whose blocks do not (as after
    a rewrite that kept the CRC): the first block that fails gets the whole deed checked,
    which holds, so the read is served and the seal replaced."""
    from array import array
    src = _book(tmp_path)
    with Book.open(src) as b:
        real = b.seal(2)
    store = SealStore(str(src / "book.log"), os.stat(src / "book.log"))
    store.put([(2, Seal(real.off, real.n, real.crc, array("I", [0] * len(real.sums))))])
    path = tmp_path / "mnt" / "events" / "2"
    with mounted(src, tmp_path / "mnt", "-o", "ro"):
        assert path.read_bytes() == payload(2, BIG)
    assert SealStore(str(src / "book.log"), os.stat(src / "book.log")).get(2) == real


def test_a_layout_without_a_deed_crc_reads_as_before(tmp_path):
    src = _vere_src(tmp_path)
    path = tmp_path / "mnt" / "events" / "2"
    with mounted(src, tmp_path / "mnt", "-o", "ro"):
        assert path.read_bytes() == payload(2, BIG)
    assert not list(Path(ix.cache_dir()).glob("*.sums"))


@pytest.mark.parametrize("stale", [False, True])
def test_a_rendering_of_a_sealed_event_reads_it_by_its_seal(tmp_path, stale):
    """``pretty/N`` checks the event as ``events/`` does and reads a large one in place:
    by its seal, and a stale seal is replaced there too."""
    from array import array
    src = _book(tmp_path)
    with Book.open(src) as b:
        real = b.seal(2)
    if stale:
        store = SealStore(str(src / "book.log"), os.stat(src / "book.log"))
        store.put([(2, Seal(real.off, real.n, real.crc, array("I", [1] * len(real.sums))))])
    with mounted(src, tmp_path / "mnt", "-o", "ro"):
        text = (tmp_path / "mnt" / "pretty" / "2").read_text()
    shown = run_bookfs("show", str(src), "2").stdout  # the CLI: checked whole, read_slice
    noun = [line for line in shown.splitlines() if line.startswith("noun:")]
    assert text.startswith("event: 2\n") and noun and noun[0] in text.splitlines()


def test_seals_made_at_once_in_many_threads_are_all_kept(tmp_path):
    """A mount seals in worker threads, several events at once: the store they share is
    kept whole (every seal right, every one persisted)."""
    from concurrent.futures import ThreadPoolExecutor
    sizes = [SEALED_FROM + k * BLOCK for k in range(1, 5)]
    d = _book(tmp_path, sizes=sizes)
    with Book.open(d) as b:
        with ThreadPoolExecutor(4) as pool:
            for fresh in (False, True, True):
                made = list(pool.map(lambda e: b.seal(e, fresh=fresh), range(1, 5)))
        for e, seal in enumerate(made, 1):
            assert b.read_sealed(e, seal, 0, seal.n) == payload(e, sizes[e - 1])
    kept = SealStore(str(d / "book.log"), os.stat(d / "book.log"))
    assert [kept.get(e) for e in range(1, 5)] == made


def test_a_large_append_is_sealed_so_its_first_read_is_checked_by_blocks(tmp_path):
    """A large event appended through the mount is sealed in the background while its
    bytes are still in memory: its seal is kept, right, and its first read uses it."""
    from mount_fixtures import wait_for
    src = _book(tmp_path, sizes=(40,))
    big = payload(2, BIG)
    (tmp_path / "big").write_bytes(big)
    with mounted(src, tmp_path / "mnt"):
        res = subprocess.run(["cp", str(tmp_path / "big"), str(tmp_path / "mnt/new/2")],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        st_log = os.stat(src / "book.log")
        assert wait_for(lambda: SealStore(str(src / "book.log"), st_log).get(2) is not None,
                        timeout=30)
        with Book.open(src) as b:
            assert SealStore(str(src / "book.log"), st_log).get(2) == b.seal(2, fresh=True)
        assert (tmp_path / "mnt/events/2").read_bytes() == big


def test_a_mount_holds_a_bounded_number_of_seals(tmp_path, monkeypatch):
    """The checks a mount holds are bounded by count and by their seals' bytes: reading
    more large events than that costs a check again (here from the kept seal), never
    memory."""
    import trio
    from bookfs.fs.nodes import events as E

    sizes = [SEALED_FROM + k * BLOCK for k in range(1, 6)]
    d = _book(tmp_path, sizes=sizes)
    crcs = -(-sizes[-1] // BLOCK) * 4
    monkeypatch.setattr(E, "SEAL_BYTES", 2 * crcs)  # two of these seals, not three

    with Book.open(d) as b:
        node = E.EventFiles.__new__(E.EventFiles)  # what sealed() uses: the log, the held
        node.log, node.checked_large = b, {}

        async def run():
            for e in range(1, 6):
                await node.sealed(e)
        trio.run(run)
        assert sorted(node.checked_large) == [4, 5]
        assert sum(len(s.sums) for s in node.checked_large.values()) * 4 <= 2 * crcs


def test_verify_seals_every_large_deed_in_its_one_pass(tmp_path):
    """``bookfs verify`` checks every deed's CRC; the large ones it seals in the same
    pass, so a log verified once serves even their first reads block by block."""
    sizes = (40, BIG, 60, SEALED_FROM + 3 * BLOCK, 50)
    d = _book(tmp_path, sizes=sizes)
    res = run_bookfs("verify", str(d), check=False)
    assert res.returncode == 0, res.stderr
    store = SealStore(str(d / "book.log"), os.stat(d / "book.log"))
    with Book.open(d) as b:
        for e, size in enumerate(sizes, 1):
            want = b.seal(e, fresh=True)
            assert store.get(e) == want and (want is None) == (size < SEALED_FROM)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_crc_check_of_a_range_seals_alike_in_one_process_or_several(tmp_path,
                                                                         monkeypatch,
                                                                         workers):
    """The check of a large range runs in forked workers: their seals come back to the
    caller, the same as one process's, and none past the first bad deed."""
    from bookfs.formats import deedcheck
    sizes = [SEALED_FROM + k * BLOCK for k in range(1, 5)]
    d = _book(tmp_path, sizes=sizes)
    monkeypatch.setattr(deedcheck, "_PARALLEL_BYTES", 0)  # any range: the workers' path
    with Book.open(d) as b:
        ix = b._index
        made: list = []
        assert deedcheck.first_bad_deed(b.fileno(), ix.offsets, 0, ix.end, workers=workers,
                                        seals=made) is None
        assert made == [(i, b.seal(i + 1, fresh=True)) for i in range(4)]
        _flip(d / "book.log", _payload_start(b, 3) + 5)
        made = []
        assert deedcheck.first_bad_deed(b.fileno(), ix.offsets, 0, ix.end, workers=workers,
                                        seals=made) == 2
        assert [i for i, _ in made] == [0, 1]


@pytest.mark.parametrize("kind", list(SEALING))
def test_verify_event_checks_the_whole_deed_even_with_a_kept_seal(tmp_path, kind):
    """``verify_event`` promises that a later unchecked ``read_slice`` is safe (``bookfs
    show``, the noun check and ``info`` read so): it must check the whole deed every
    time, and not take a kept seal's word for bytes that changed since."""
    make, event = SEALING[kind]
    src = make(tmp_path)
    with open_source(src) as log:
        log.verify_event(event)  # made and kept the seal
        inner = log.epoch_of(event).log if hasattr(log, "epoch_of") else log
        at = _payload_start(inner, event) + 30 * BLOCK
    _flip(_log_file(src), at)
    with open_source(src) as log:
        with pytest.raises(CorruptDeed):
            log.verify_event(event)
