"""Issue 19, items 3, 4 and 6: identification never guesses; an index that lied is
rebuilt and the right bytes served; a "verified" mark is trusted only for the file's
current contents.

* #3  a vere ``book.log`` cut to 0..47 bytes (where no header slot is whole) is refused,
      untouched, by every tool, with one line saying why and what to do; ``epoc.txt`` 3
      beside it decides what the bytes cannot (a 16-byte header in a pier is vere's).
* #4  a persisted index with a valid checksum but wrong offsets: the first read that
      finds the lie discards it (memory and file), rescans, and serves the right bytes,
      through the API and through a mount.
* #6  a log mounted read-write once (its index cached as verified to the end), then a
      damaged copy copied over it (``cp`` keeps the inode): a writable open re-verifies,
      so no append is acknowledged behind the damaged deed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bookfs.formats import index as index_mod
from bookfs.formats.book import Book
from bookfs.errors import FormatError
from bookfs.formats.pier import identify, open_source
from bookfs.formats.pier_recovery import recovery_for
from bookfs.formats.vere import VereBook
from index_fixtures import write_index
from lmdb_fixtures import make_pier, payloads
from mounting import mounted, run_bookfs

def _digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its bytes' hash (the index cache is elsewhere)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".vere.lock"}


# --- #3: a vere book.log too short to decide its layout ------------------------------------


def _vere_bytes(tmp_path: Path) -> bytes:
    d = tmp_path / "golden" / "0i0"
    with VereBook.open(d, writable=True, create=True) as b:
        b.save(1, [bytes.fromhex("0102030402"), bytes.fromhex("0000000029")])
        b.save(3, [bytes.fromhex("aabbcc0d3112")])
    return (d / "book.log").read_bytes()


def _cut_vere(tmp_path: Path, length: int, where: str) -> tuple[Path, Path]:
    """``(source, epoch dir)``: a vere log cut to ``length`` bytes, alone (``alone``: a
    Book directory with no epoc.txt) or as the newest epoch of a pier (``pier``)."""
    raw = _vere_bytes(tmp_path)
    if where == "alone":
        d = tmp_path / "alone"
        shutil.copytree(tmp_path / "golden" / "0i0", d)
        (d / "book.log").write_bytes(raw[:length])
        return d, d
    root = make_pier(tmp_path / "pier", [("vere", payloads(1, 3))])
    d = root / ".urb" / "log" / "0i0"
    (d / "book.log").write_bytes(raw[:length])
    return root, d


def _refused_everywhere(length: int, where: str) -> bool:
    """Whether a cut of ``length`` bytes must be refused: every cut under 48 bytes, except
    the bare 16-byte header outside a pier (an empty UIP log is exactly that)."""
    return length < 48 and not (length == 16 and where == "alone")


API_TOOLS = {
    "identify": lambda src: identify(src),
    "open-ro": lambda src: open_source(src).close(),
    "open-rw": lambda src: open_source(src, writable=True).close(),
    "fsck-check": lambda src: recovery_for(src).check(),
    "fsck-repair": lambda src: (lambda r: r.repair(r.check()))(recovery_for(src)),
    "book-open-ro": lambda d: Book.open(d).close(),
    "book-open-rw": lambda d: Book.open(d, writable=True, lock=False).close(),
}


@pytest.mark.parametrize("where", ["alone", "pier"])
def test_item3_every_short_cut_is_refused_untouched_by_the_api(tmp_path, where):
    for length in range(0, 48):
        base = tmp_path / f"n{length}"
        base.mkdir()
        src, d = _cut_vere(base, length, where)
        before = _digest(base / ("alone" if where == "alone" else "pier"))
        for name, call in API_TOOLS.items():
            target = d if name.startswith(("book-", "identify")) else src
            if not _refused_everywhere(length, where):
                continue
            with pytest.raises(FormatError) as exc:
                call(target)
                pytest.fail(f"{name} accepted a {length}-byte cut ({where})")
            msg = str(exc.value)
            assert "\n" not in msg and "book.log" in msg, (length, name, msg)
            assert "nothing was changed" in msg, (length, name, msg)
            assert _digest(base / ("alone" if where == "alone" else "pier")) == before, (
                length, name)
        if length == 16 and where == "alone":
            assert identify(src)[0] == "uip"  # a bare header: an empty UIP log


# one cut of each kind through every tool (the API test above refuses every length, 0..47):
# no header, a cut header, a whole UIP header and part of vere's slot, just short of it
CLI_LENGTHS = [0, 15, 17, 47]


def _cli_tools(src: Path, mnt: Path, out: Path):
    return {
        "info": ["info", str(src)],
        "verify": ["verify", str(src)],
        "show": ["show", str(src), "1"],
        "fsck": ["fsck", str(src)],
        "fsck --repair": ["fsck", "--repair", str(src)],
        "fsck --salvage": ["fsck", "--salvage", str(out / "salvaged"), str(src)],
        "migrate": ["migrate", str(src), str(out / "migrated")],
        "mount rw": ["mount", str(src), str(mnt)],
        "mount ro": ["mount", str(src), str(mnt), "-o", "ro"],
    }


@pytest.mark.parametrize("where,length", [
    (where, length) for where in ("alone", "pier") for length in CLI_LENGTHS
    if _refused_everywhere(length, where)])  # a bare 16-byte header alone: an empty UIP log
def test_item3_every_tool_refuses_a_short_cut_in_one_line(tmp_path, where, length):
    src, d = _cut_vere(tmp_path, length, where)
    top = tmp_path / ("alone" if where == "alone" else "pier")
    before = _digest(top)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    for name, args in _cli_tools(src, mnt, out).items():
        res = run_bookfs(*args, check=False, timeout=60)
        if res.returncode == 0 and name.startswith("mount"):
            run_bookfs("umount", str(mnt), check=False)
        assert res.returncode != 0, f"{name} accepted a {length}-byte cut: {res.stdout}"
        text = (res.stderr + res.stdout).strip()
        assert "Traceback" not in text, (name, text)
        lines = [ln for ln in text.splitlines() if "book.log" in ln]
        assert lines, (name, text)
        assert any("refused" in ln or "nothing was changed" in ln for ln in lines), (name, text)
        assert _digest(top) == before, f"{name} changed the files of a {length}-byte cut"
        assert not (out / "migrated" / "book.log").exists()


def test_item3_pier_with_bare_header_epoch_is_never_appended_to(tmp_path):
    """The issue's case: a pier whose vere epoch is cut to its first 16..47 bytes; a
    read-write mount of the pier must not append UIP deeds beside epoc.txt 3."""
    for length in (16, 30, 47):
        base = tmp_path / f"n{length}"
        base.mkdir()
        src, d = _cut_vere(base, length, "pier")
        before = (d / "book.log").read_bytes()
        mnt = base / "mnt"
        with pytest.raises(RuntimeError, match="book.log"):
            with mounted(src, mnt):
                pass
        assert (d / "book.log").read_bytes() == before


def test_item3_a_uip_log_with_one_whole_deed_is_still_uip(tmp_path):
    """Bytes that decide still decide: a UIP log of one small deed (40..47 bytes) is UIP,
    even beside epoc.txt 3; and an empty UIP log outside a pier opens and takes appends."""
    for n in (4, 5, 11):
        d = tmp_path / f"uip{n}"
        with Book.open(d, writable=True, create=True) as b:
            b.save(1, [bytes(range(n))])
        assert os.path.getsize(d / "book.log") == 16 + n + 20
        (d / "epoc.txt").write_text("3")
        assert identify(d)[0] == "uip"
        with open_source(d) as log:
            assert log.read(1) == bytes(range(n))
    d = tmp_path / "empty"
    Book.open(d, writable=True, create=True).close()
    assert identify(d)[0] == "uip"
    with open_source(d, writable=True) as log:
        log.save(1, [b"abcde"])
    with open_source(d) as log:
        assert log.read(1) == b"abcde"


# --- helpers for #4 and #6 ---------------------------------------------------------------


def _sample_log(path: Path, n: int, seed: int = 0) -> list[bytes]:
    from bookfs.cli.sample import iter_sample_payloads

    events = list(iter_sample_payloads(n, seed))
    with Book.open(path, writable=True, create=True) as book:
        for k in range(0, n, 1000):
            book.save(k + 1, events[k : k + 1000])
    return events


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _persisted_offsets(log_path: Path) -> list[int] | None:
    fd = os.open(log_path, os.O_RDONLY)
    try:
        ix = index_mod.load_index(str(log_path), fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return None if ix is None else list(ix.offsets)


# --- #4: an index that lied is rebuilt, and the right bytes served ------------------------

N4 = 20_000  # one wrong entry among 20,000: the load's 64 samples miss it 99.7% of the time
LIE = 14_000


def _crafted(tmp_path: Path) -> tuple[Path, list[bytes], list[int]]:
    """A log and a crafted index (valid checksum) that drops event LIE's offset: by it,
    event LIE is two deeds long and every later event is served one too far."""
    d = tmp_path / "log"
    events = _sample_log(d, N4)
    with Book.open(d) as book:
        true, end = list(book.index.offsets), book.index.end
    idx = Path(index_mod._index_path(str(d / "book.log"), os.stat(d / "book.log")))
    assert idx.exists()
    write_index(idx, d / "book.log", 1, true[: LIE - 1] + true[LIE:], end)
    return d, events, true


def test_item4_api_read_after_the_lie_serves_the_right_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(index_mod, "_SAMPLE", 0)  # the load's sample misses the lie
    d, events, true = _crafted(tmp_path)
    with Book.open(d) as book:
        assert book.count == N4 - 1  # the lie, as loaded
        assert book.read(LIE - 1) == events[LIE - 2]
        assert book.payload_size(LIE) == len(events[LIE - 1])  # a lookup finds the lie
        assert book.count == N4 and list(book.index.offsets) == true
        for e in (LIE, LIE + 1, N4 - 1, N4):
            assert book.read(e) == events[e - 1]
            book.verify_event(e)
            assert book.read_slice(e, 0, 1 << 20) == events[e - 1]
    assert _persisted_offsets(d / "book.log") == true  # the file was replaced, not kept
    # a read (not a lookup) that finds it, in a reader and in a writer whose crafted
    # index also carries a stamp that matches the log (so the writer trusts its mark)
    idx = Path(index_mod._index_path(str(d / "book.log"), os.stat(d / "book.log")))
    end = os.path.getsize(d / "book.log")
    for writable in (False, True):
        write_index(idx, d / "book.log", 1, true[: LIE - 1] + true[LIE:], end,
                     stamp=writable)
        with Book.open(d, writable=writable) as book:
            assert book.count == N4 - 1
            assert book.read(N4 - 1) == events[N4 - 2]  # beyond the lie: the rescan serves it
            assert book.gulf() == (1, N4) and book.read(N4) == events[N4 - 1]
            if writable:
                book.save(N4 + 1, [events[0]])
    with Book.open(d, use_index_cache=False) as book:
        assert book.gulf() == (1, N4 + 1) and book.read(N4 + 1) == events[0]


def test_item4_verify_rebuilds_a_lying_index_rather_than_report_damage(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(index_mod, "_SAMPLE", 0)
    d, events, true = _crafted(tmp_path)
    with Book.open(d) as book:
        assert book.verify() == [] and book.gulf() == (1, N4)
    crafted_again = true[: LIE - 1] + true[LIE:]
    write_index(Path(index_mod._index_path(str(d / "book.log"), os.stat(d / "book.log"))),
                 d / "book.log", 1, crafted_again, os.path.getsize(d / "book.log"))
    res = run_bookfs("verify", str(d), check=False, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert str(N4) in res.stdout


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_item4_mount_serves_the_right_bytes_after_a_crafted_index(tmp_path, mode):
    d, events, true = _crafted(tmp_path)
    mnt = tmp_path / "mnt"
    opts = ["-o", "ro"] if mode == "ro" else []
    with mounted(d, mnt, *opts):
        ev = mnt / "events"
        for e in (LIE - 1, LIE, LIE + 1, LIE + 2, N4 - 1, N4):
            name = ev / f"{e:012d}"
            assert os.stat(name).st_size == len(events[e - 1]), e
            assert _read(name) == events[e - 1], f"events/{e}: wrong bytes"
        assert _read(ev / f"{N4:012d}") == events[N4 - 1]
    assert _persisted_offsets(d / "book.log") == true


def _lie_in_saved_index(log_dir: Path, k: int) -> None:
    """Rewrite the persisted index of ``log_dir/book.log`` (saved with every event's date)
    without the offset and date of its ``k``-th deed, its checksum valid: every later
    event is then served one deed too far, and the deed before it two deeds long."""
    import struct
    from zlib import crc32

    log = log_dir / "book.log"
    idx = Path(index_mod._index_path(str(log), os.stat(log)))
    raw, head = idx.read_bytes(), index_mod._FILE_HEAD
    fields = list(head.unpack_from(raw))
    count, ndates = fields[4], fields[10]
    assert ndates == count  # (the dates sit between the offsets and the rest)
    offs = raw[head.size : head.size + 8 * count]
    dates = raw[head.size + 8 * count : head.size + 16 * count]
    rest = raw[head.size + 16 * count : -4]
    fields[4], fields[10] = count - 1, ndates - 1
    at = 8 * k
    body = head.pack(*fields) + offs[:at] + offs[at + 8:] + dates[:at] + dates[at + 8:] + rest
    idx.write_bytes(body + struct.pack("<I", crc32(body)))


def _crafted_with_dates(tmp_path: Path, kind: str = "book") -> tuple[Path, list[bytes]]:
    """As :func:`_crafted`, but the lie made in the index a mount saved, with every
    event's date: a fresh mount then has no date pass to run, which would read events by
    number and find the lie before anything is listed.  ``kind``: a UIP Book directory,
    or a pier whose second epoch is a UIP Book (events 11 on; the lie in its index)."""
    from bookfs.cli.sample import iter_sample_payloads
    from lmdb_fixtures import make_pier

    if kind == "book":
        d = log_dir = tmp_path / "log"
        events = _sample_log(d, N4)
    else:
        events = list(iter_sample_payloads(N4, 0))
        d = make_pier(tmp_path / "pier", [("lmdb", events[:10]), ("book", events[10:])])
        log_dir = d / ".urb" / "log" / "0i10"
    with mounted(d, tmp_path / "mnt", "-o", "ro"):
        pass  # its date pass saves every date with the index
    first = 1 if kind == "book" else 11
    _lie_in_saved_index(log_dir, LIE - first)
    return d, events


@pytest.mark.parametrize("kind,opts,listing", [
    ("book", ["-o", "ro"], "events"), ("book", [], "events"),
    ("book", ["-o", "ro,readdirplus=auto"], "events"),
    ("pier", ["-o", "ro"], "events"), ("pier", ["-o", "ro"], "epochs/0i10/events"),
    ("pier", [], "events")],
    ids=["book-ro", "book-rw", "book-ro-auto", "pier-ro", "pier-ro-epoch", "pier-rw"])
def test_item4_a_listing_hands_out_only_proved_sizes_after_a_crafted_index(
        tmp_path, kind, opts, listing):
    """A listing of ``events/`` with its attributes (READDIRPLUS) hands the kernel each
    event's size, which it keeps and cuts every later read to: it takes them from the
    chain of deeds proved through the batch (``EventFiles.confirmed``), as a lookup
    does, never from the persisted index alone; through a UIP Book directory and a pier
    whose UIP Book epoch's index lied, its ``events/`` and the epoch's.  On the old code,
    41 sizes listed were the lie's, and ``events/14000`` read back 91 of its 791 bytes."""
    d, events = _crafted_with_dates(tmp_path, kind)
    with mounted(d, tmp_path / "mnt", *opts) as mnt:
        ev = Path(mnt) / listing
        names = sorted(os.listdir(ev))
        listed = range(1 if listing == "events" else 11, N4 + 1)
        if "readdirplus=auto" not in " ".join(opts):
            assert names == [f"{e:012d}" for e in listed]
        # (with readdirplus=auto the batches after the first are plain READDIRs: names
        # and types from the index, no size; each stat below is a lookup, which proves)
        wrong = [n for n in names if os.stat(ev / n).st_size != len(events[int(n) - 1])]
        assert not wrong, f"{len(wrong)} sizes listed from the lying index: {wrong[:3]}"
        for e in (LIE - 1, LIE, LIE + 1, LIE + 2, N4 - 1, N4):
            assert _read(ev / f"{e:012d}") == events[e - 1], f"events/{e}: wrong bytes"


def test_item4_segments_are_listed_by_the_proved_chain_after_a_crafted_index(tmp_path):
    """``segments/`` lists each segment under its first deed's event number: from the
    proved chain, so that a lying index names none of them wrongly."""
    d, events = _crafted_with_dates(tmp_path)
    with mounted(d, tmp_path / "mnt", "-o", "ro,segment_mb=1") as mnt:
        listed = sorted(os.listdir(Path(mnt) / "segments"))
    with mounted(d, tmp_path / "mnt", "-o", "ro,noindex_cache,segment_mb=1") as mnt:
        truth = sorted(os.listdir(Path(mnt) / "segments"))  # from the log alone
    assert sum(int(n) > LIE for n in truth) > 3  # segments named by events past the lie
    assert listed == truth


# --- #6: a stale "verified" mark ------------------------------------------------------------


def _damaged_copy(d: Path, tmp_path: Path, event: int) -> Path:
    """A copy of ``d``'s book.log with one payload byte of ``event`` flipped."""
    with Book.open(d) as book:
        off = book.index.offset(event)
    raw = bytearray((d / "book.log").read_bytes())
    raw[off + 8 + 6] ^= 0x40
    bad = tmp_path / "damaged.log"
    bad.write_bytes(bytes(raw))
    return bad


def test_item6_api_writable_open_rechecks_a_log_copied_over(tmp_path):
    d = tmp_path / "log"
    events = _sample_log(d, 100)
    Book.open(d, writable=True).close()  # cached, verified to the end, stamped
    scanned = []
    with Book.open(d, writable=True, progress=scanned.append) as book:
        assert book.count == 100
    assert sum(scanned) == 0  # an unchanged log: the stamp holds, nothing is re-read
    bad = _damaged_copy(d, tmp_path, 50)
    ino = os.stat(d / "book.log").st_ino
    subprocess.run(["cp", str(bad), str(d / "book.log")], check=True)
    assert os.stat(d / "book.log").st_ino == ino  # cp keeps the inode
    with Book.open(d, writable=True) as book:
        assert book.gulf() == (1, 49)  # the damaged deed was found; the rest quarantined
        assert book.recovery.quarantined
        book.save(50, [events[49]])
    with Book.open(d, writable=True, use_index_cache=False) as book:
        assert book.gulf() == (1, 50) and book.read(50) == events[49]


def test_item6_mount_never_acknowledges_appends_behind_an_unverified_deed(tmp_path):
    from bookfs.cli.sample import iter_sample_payloads

    d = tmp_path / "log"
    events = _sample_log(d, 100)
    mnt = tmp_path / "mnt"
    with mounted(d, mnt):  # read-write: its index is cached as verified to the end
        assert _read(mnt / "events" / f"{100:012d}") == events[99]
    bad = _damaged_copy(d, tmp_path, 50)
    subprocess.run(["cp", str(bad), str(d / "book.log")], check=True)
    more = list(iter_sample_payloads(30, 7))
    acked: dict[int, bytes] = {}
    with mounted(d, mnt):
        first_free = 1 + len(os.listdir(mnt / "events"))
        for k, p in enumerate(more):
            n = first_free + k
            try:
                with open(mnt / "new" / str(n), "wb") as f:
                    f.write(p)
            except OSError:
                continue
            acked[n] = p
        for n, p in acked.items():
            assert _read(mnt / "events" / f"{n:012d}") == p
    assert len(acked) == 30
    # the next writable open without the cache keeps every acknowledged append
    quarantine_before = sorted(p.name for p in d.iterdir() if p.name.startswith("quarantine"))
    with Book.open(d, writable=True, use_index_cache=False) as book:
        for n, p in acked.items():
            assert book.read(n) == p, f"acknowledged event {n} lost"
    assert sorted(p.name for p in d.iterdir()
                  if p.name.startswith("quarantine")) == quarantine_before


def test_item6_a_reader_beside_a_writer_keeps_the_writers_stamp(tmp_path):
    """A read-only open closing after the writer (a follower mount beside a read-write
    one) must not replace the writer's stamped index with an unstamped one."""
    d = tmp_path / "log"
    events = _sample_log(d, 50)
    with Book.open(d, writable=True) as w:
        reader = Book.open(d)
        w.save(51, [events[0]])
        reader.refresh()
    reader.close()  # after the writer's close
    scanned = []
    with Book.open(d, writable=True, progress=scanned.append) as book:
        assert book.count == 51
    assert sum(scanned) == 0


def test_item6_a_write_that_restores_size_and_mtime_is_still_seen(tmp_path):
    """Rewriting a byte in place and setting mtime back (``touch -d``) leaves size and
    mtime as stamped; ctime, which no program can set, still tells the writer."""
    d = tmp_path / "log"
    _sample_log(d, 60)
    Book.open(d, writable=True).close()
    log_path = d / "book.log"
    st = os.stat(log_path)
    with Book.open(d) as book:
        off = book.index.offset(30)
    with open(log_path, "r+b") as f:
        f.seek(off + 8 + 5)
        b = f.read(1)
        f.seek(off + 8 + 5)
        f.write(bytes([b[0] ^ 1]))
    os.utime(log_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(log_path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    with Book.open(d, writable=True) as book:
        assert book.gulf() == (1, 29) and book.recovery.quarantined


def test_item6_a_racy_stamp_is_not_trusted(tmp_path):
    """A stamp recorded within the tick of the log's ctime (a later write in that tick
    would leave ctime as it was) does not let a writer skip its checks."""
    d = tmp_path / "log"
    _sample_log(d, 40)
    with Book.open(d) as book:
        offsets, end = list(book.index.offsets), book.index.end
    log_path = d / "book.log"
    st = os.stat(log_path)
    idx = Path(index_mod._index_path(str(log_path), st))
    for taken, trusted in ((st.st_ctime_ns + 1_000_000, False),
                           (st.st_ctime_ns + 3_000_000_000, True)):
        write_index(idx, log_path, 1, offsets, end)
        raw = idx.read_bytes()[:-4] + index_mod._STAMP.pack(
            index_mod._STAMP_TAG, st.st_size, st.st_mtime_ns, st.st_ctime_ns, taken)
        from bookfs.formats.layout import crc32

        idx.write_bytes(raw + crc32(raw).to_bytes(4, "little"))
        scanned = []
        with Book.open(d, writable=True, progress=scanned.append):
            pass
        assert (sum(scanned) == 0) == trusted, (taken - st.st_ctime_ns, sum(scanned))
