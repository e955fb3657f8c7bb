"""Adversarial tests of the engine and CLI (issue 9, engine half): things a demanding or
hostile user does that the crash tests do not.

* #3  the writer lock holds whatever path a log is opened by (pier, ``.urb/log``, an
      epoch, a Book directory inside a pier), through the API and through real mounts;
* #4  planted symlinks never make bookfs write through them, and a FIFO, socket or
      directory where ``book.log``/``meta.bin`` belongs is one clear error, never a hang;
* #7  a persisted index with a valid checksum but wrong offsets never serves wrong bytes;
* #6  a read-only follower sees a recovery (shrink, replace) and bumps ``generation``.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bookfs.formats import index as index_mod
from bookfs.formats.book import Book
from bookfs.errors import BookError, CorruptDeed, LockHeld, NotRegularFile, PathEscape
from bookfs.formats.lock import WriterLock, enclosing_pier, lock_path_for
from bookfs.formats.pier import Pier, open_source
from bookfs.formats.vere import VereBook
from index_fixtures import write_index
from lmdb_fixtures import make_pier, payloads
from mounting import mounted, noun, run_bookfs

LAYOUTS = {"book": Book, "vere": VereBook}
TIMEOUT = 10  # seconds a CLI call may take before it counts as a hang


def make_log(directory: Path, layout: str, events: list[bytes], base: int = 0) -> Path:
    """A plain (not in a pier) log of ``layout`` holding ``events`` from ``base + 1``."""
    with LAYOUTS[layout].open(directory, writable=True, create=True) as log:
        if events:
            log.save(base + 1, events, epoch=base)
    return directory


# --- #3: the writer lock, whatever path is opened ---------------------------------------------


@pytest.fixture(params=["book", "vere"])
def pier(request, tmp_path):
    """A pier whose two epochs are Book logs of one layout: events 1..10 then 11..15."""
    root = make_pier(tmp_path / "pier", [(request.param, payloads(1, 10)),
                                          (request.param, payloads(11, 5))])
    return root


def _paths_into(root: Path) -> dict[str, Path]:
    log_dir = root / ".urb" / "log"
    return {"pier": root, "urb-log": log_dir, "newest-epoch": log_dir / "0i10",
            "old-epoch": log_dir / "0i0"}


@pytest.mark.parametrize("where", ["pier", "urb-log", "newest-epoch", "old-epoch"])
def test_lock_path_for_any_path_inside_a_pier_is_its_vere_lock(pier, where):
    path = _paths_into(pier)[where]
    assert enclosing_pier(path) == os.path.realpath(pier)
    assert lock_path_for(path) == os.path.join(os.path.realpath(pier), ".vere.lock")


def test_lock_path_for_a_plain_book_and_a_symlinked_epoch(tmp_path, pier):
    plain = make_log(tmp_path / "plain", "book", payloads(1, 2))
    assert enclosing_pier(plain) is None
    assert lock_path_for(plain) == str(plain / "book.lock")
    link = tmp_path / "epoch-link"
    link.symlink_to(pier / ".urb" / "log" / "0i10")  # the real path is what counts
    assert lock_path_for(link) == os.path.join(os.path.realpath(pier), ".vere.lock")


@pytest.mark.parametrize("where", ["newest-epoch", "urb-log", "pier"])
def test_pier_writer_then_any_path_writer_is_refused(pier, where):
    with Pier.open(pier, writable=True):
        with pytest.raises(LockHeld, match=rf"\.vere\.lock: .*pid {os.getpid()}"):
            open_source(_paths_into(pier)[where], writable=True)


@pytest.mark.parametrize("where", ["newest-epoch", "old-epoch"])
def test_epoch_writer_then_pier_writer_is_refused(pier, where):
    with open_source(_paths_into(pier)[where], writable=True) as epoch:
        with pytest.raises(LockHeld, match=rf"\.vere\.lock: .*pid {os.getpid()}"):
            Pier.open(pier, writable=True)
        assert not (Path(epoch.directory) / "book.lock").exists()
    with Pier.open(pier, writable=True) as p:  # released on close
        p.save(16, [b"\0\0\0\0abc"])


def test_book_directory_anywhere_inside_a_pier_takes_the_pier_lock(pier, tmp_path):
    inner = make_log(tmp_path / "scratch", "book", payloads(1, 3))
    moved = pier / "backups" / "copy"
    moved.parent.mkdir()
    inner.rename(moved)
    with Book.open(moved, writable=True):
        assert WriterLock.is_held(str(pier / ".vere.lock"))
        with pytest.raises(LockHeld):
            Pier.open(pier, writable=True)


def test_plain_book_keeps_book_lock(tmp_path):
    d = make_log(tmp_path / "plain", "vere", payloads(1, 2))
    with VereBook.open(d, writable=True):
        assert WriterLock.is_held(str(d / "book.lock"))
        with pytest.raises(LockHeld, match=r"book\.lock"):
            open_source(d, writable=True)


def _mount_fails(source, mountpoint) -> str:
    os.makedirs(mountpoint, exist_ok=True)
    res = run_bookfs("mount", str(source), str(mountpoint), check=False, timeout=TIMEOUT)
    assert res.returncode != 0, f"second writer mounted: {res.stdout}"
    assert not os.path.ismount(mountpoint)
    return res.stderr


@pytest.mark.parametrize("first", ["pier", "newest-epoch"])
def test_two_writable_mounts_of_one_pier_are_refused(pier, tmp_path, first):
    second = "newest-epoch" if first == "pier" else "pier"
    paths = _paths_into(pier)
    with mounted(paths[first], tmp_path / "m1") as m1:
        err = _mount_fails(paths[second], tmp_path / "m2")
        assert ".vere.lock" in err and "locked for writing by pid" in err
        # the first writer still appends, and the log holds exactly what it acknowledged
        with open(f"{m1}/new/16", "wb") as f:
            f.write(noun(b"\0\0\0\0only"))
    with Pier.open(pier) as p:
        assert p.gulf() == (1, 16)
        assert p.read(16) == noun(b"\0\0\0\0only")


# --- #4: planted symlinks and special files -----------------------------------------------------


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside every log directory that nothing may ever write."""
    v = tmp_path / "outside" / "victim"
    v.parent.mkdir()
    v.write_bytes(b"precious bytes, not a log\n")
    return v


@pytest.mark.parametrize("layout", ["book", "vere"])
@pytest.mark.parametrize("target", ["book.log", "victim"])
def test_book_lock_symlink_is_refused(tmp_path, victim, layout, target):
    d = make_log(tmp_path / "log", layout, payloads(1, 3))
    dest = d / "book.log" if target == "book.log" else victim
    (d / "book.lock").unlink()  # left behind by the writer that made the log
    (d / "book.lock").symlink_to(dest)
    before = dest.read_bytes()
    with pytest.raises(PathEscape, match=r"book\.lock: a symlink"):
        LAYOUTS[layout].open(d, writable=True)
    assert dest.read_bytes() == before
    with LAYOUTS[layout].open(d) as log:  # readers take no lock
        assert log.gulf() == (1, 3)


@pytest.mark.parametrize("layout", ["book", "vere"])
@pytest.mark.parametrize("opened", ["pier", "newest-epoch"])
@pytest.mark.parametrize("target", ["book.log", "victim"])
def test_vere_lock_symlink_is_refused(tmp_path, victim, layout, opened, target):
    root = make_pier(tmp_path / "pier", [(layout, payloads(1, 4))])
    log = root / ".urb" / "log" / "0i0" / "book.log"
    dest = log if target == "book.log" else victim
    lock = root / ".vere.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(dest)
    before = dest.read_bytes()
    path = root if opened == "pier" else log.parent
    with pytest.raises(PathEscape, match=r"\.vere\.lock: a symlink"):
        open_source(path, writable=True)
    assert dest.read_bytes() == before


@pytest.mark.parametrize("layout", ["book", "vere"])
@pytest.mark.parametrize("temp", ["book.log.creating", "meta.bin.creating"])
def test_creating_symlink_is_refused(tmp_path, victim, layout, temp):
    d = tmp_path / "new"
    d.mkdir()
    (d / temp).symlink_to(victim)
    before = victim.read_bytes()
    with pytest.raises(NotRegularFile, match=rf"{temp}: a symlink, expected a regular file"):
        LAYOUTS[layout].open(d, writable=True, create=True)
    assert victim.read_bytes() == before


@pytest.mark.parametrize("layout", ["book", "vere"])
def test_stale_regular_creating_file_is_replaced(tmp_path, layout):
    d = tmp_path / "new"
    d.mkdir()
    (d / "book.log.creating").write_bytes(b"half a file from a crash")
    (d / "meta.bin.creating").write_bytes(b"x")
    with LAYOUTS[layout].open(d, writable=True, create=True) as log:
        log.save(1, [b"\0\0\0\0a"])
    assert sorted(p.name for p in d.iterdir() if "creating" in p.name) == []
    with LAYOUTS[layout].open(d) as log:
        assert log.read(1) == b"\0\0\0\0a"


def test_index_cache_symlink_is_never_written_through(tmp_path, victim, cache_dir):
    d = make_log(tmp_path / "log", "book", payloads(1, 5))
    st = os.stat(d / "book.log")
    idx = Path(index_mod._index_path(str(d / "book.log"), st))
    idx.unlink()
    idx.symlink_to(victim)
    before = victim.read_bytes()
    with Book.open(d, writable=True) as book:  # loads (refuses the link), then persists
        book.save(6, [b"\0\0\0\0six!"])
    assert victim.read_bytes() == before
    assert not idx.is_symlink() and idx.stat().st_size > 0


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_index_cache_special_file_does_not_hang(tmp_path, cache_dir, kind):
    d = make_log(tmp_path / "log", "book", payloads(1, 5))
    idx = Path(index_mod._index_path(str(d / "book.log"), os.stat(d / "book.log")))
    idx.unlink()
    os.mkfifo(idx) if kind == "fifo" else idx.mkdir()
    res = run_bookfs("info", str(d), check=False, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    assert "events:" in res.stdout


def test_quarantine_symlink_is_never_written_through(tmp_path, victim):
    d = make_log(tmp_path / "log", "book", payloads(1, 4))
    size = os.path.getsize(d / "book.log")
    with open(d / "book.log", "ab") as f:  # a whole foreign deed-sized block: quarantined
        f.write(bytes(range(256)) * 4)
    now = int(time.time())
    for t in range(now, now + 30):
        (d / f"quarantine-book.log.at-{size}-{t}").symlink_to(victim)
    before = victim.read_bytes()
    with Book.open(d, writable=True) as book:
        (qpath, off, n) = book.recovery.quarantined[0]
    assert victim.read_bytes() == before
    assert not os.path.islink(qpath) and os.path.getsize(qpath) == n == 1024


# Special files where book.log or meta.bin belongs: one clear line, never a hang.

def _make_special(path: Path, kind: str) -> contextlib.AbstractContextManager:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(path.parent)  # a relative name keeps under the 108-byte sun_path limit
        try:
            s.bind(path.name)
        finally:
            os.chdir(cwd)
        return contextlib.closing(s)
    return contextlib.nullcontext()


EXPECTED = {"fifo": "a FIFO", "directory": "a directory", "socket": "a socket"}


@pytest.fixture(params=["fifo", "directory", "socket"])
def special(request, tmp_path):
    """``(directory, file name, kind)``: a UIP Book log whose book.log or meta.bin (the
    test's ``name`` parameter) was replaced by a special file of ``kind``."""
    def make(name: str, layout: str = "book"):
        d = make_log(tmp_path / "log", layout, payloads(1, 3))
        (d / name).unlink()
        stack.enter_context(_make_special(d / name, request.param))
        return d, request.param

    with contextlib.ExitStack() as stack:
        yield make


@pytest.mark.parametrize("layout", ["book", "vere"])
@pytest.mark.parametrize("name", ["book.log", "meta.bin"])
@pytest.mark.parametrize("writable", [False, True])
def test_special_file_api_open_is_a_clear_error(special, layout, name, writable):
    d, kind = special(name, layout)
    t0 = time.monotonic()
    with pytest.raises(NotRegularFile) as ei:
        open_source(d, writable=writable)
    assert time.monotonic() - t0 < 5
    msg = str(ei.value)
    assert msg == f"{d / name}: {EXPECTED[kind]}, expected a regular file; refusing it"


def _cli_line(*args) -> subprocess.CompletedProcess:
    try:
        return run_bookfs(*args, check=False, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"bookfs {' '.join(args)} hung for over {TIMEOUT} s")


@pytest.mark.parametrize("name", ["book.log", "meta.bin"])
def test_special_file_info_is_one_line(special, name):
    d, kind = special(name)
    res = _cli_line("info", str(d))
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert f"{d / name}: {EXPECTED[kind]}, expected a regular file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["book.log", "meta.bin"])
def test_special_file_mount_is_one_line(special, name, tmp_path):
    d, kind = special(name)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = _cli_line("mount", str(d), str(mnt))
    assert res.returncode != 0
    assert not os.path.ismount(mnt)
    assert "Traceback" not in res.stderr
    assert f"{d / name}: {EXPECTED[kind]}, expected a regular file" in res.stderr


@pytest.mark.parametrize("name", ["book.log", "meta.bin"])
def test_special_file_fsck_does_not_hang(special, name):
    d, kind = special(name)
    res = _cli_line("fsck", str(d))
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert str(d / name) in res.stderr + res.stdout


# --- #7: a crafted persisted index is only a hint ----------------------------------------------


def _sizes(count: int, seed: int) -> list[int]:
    """Payload sizes with many repeats, so a shifted offset often lands on a deed of the
    very size the index expects (the case framing alone cannot catch)."""
    rng = random.Random(seed)
    return [rng.choice([4, 9, 9, 9, 37, 37, 200]) for _ in range(count)]


def _crafted_offsets(true: list[int], end: int, rng: random.Random) -> tuple[list[int], int]:
    kind = rng.choice(["drop", "drop", "shift-tail", "swap", "nudge", "duplicate"])
    offs = list(true)
    k = rng.randrange(1, len(offs) - 1)
    if kind == "drop":  # one deed missing: every later event is served one too far
        del offs[k]
    elif kind == "shift-tail":
        del offs[k : k + rng.randrange(1, 4)]
    elif kind == "swap":
        j = rng.randrange(1, len(offs))
        offs[k], offs[j] = offs[j], offs[k]
    elif kind == "nudge":
        offs[k] += rng.choice([-8, -1, 1, 8, 20])
    else:
        offs[k] = offs[k - 1]
    return offs, end


@pytest.mark.parametrize("seed", range(12))
def test_crafted_index_never_serves_wrong_bytes(tmp_path, seed):
    sizes = _sizes(150, seed)
    events = [random.Random(seed * 1000 + e).randbytes(n) for e, n in enumerate(sizes, 1)]
    d = make_log(tmp_path / "log", "book", events)
    log_path = d / "book.log"
    with Book.open(d) as book:
        true = list(book.index.offsets)
        end = book.index.end
    idx = Path(index_mod._index_path(str(log_path), os.stat(log_path)))
    assert idx.exists()
    rng = random.Random(seed)
    offs, end = _crafted_offsets(true, end, rng)
    write_index(idx, log_path, 1, offs, end)
    refused = 0
    with Book.open(d) as book:
        for event in range(book.first, book.last + 1):
            want = events[event - 1]
            for how in ("read", "verify+slice"):
                try:
                    if how == "read":
                        got = book.read(event)
                    else:
                        book.verify_event(event)
                        got = book.read_slice(event, 0, 1 << 20)
                except CorruptDeed:
                    refused += 1
                    continue
                assert got == want, f"event {event} ({how}) served another event's bytes"
    # whatever happened, the next open serves every event, byte for byte
    with Book.open(d) as book:
        assert book.gulf() == (1, 150)
        for event in (1, 75, 150):
            assert book.read(event) == events[event - 1]
        assert [book.read(e) for e in range(1, 151)] == events


def test_crafted_index_read_is_logged_and_discarded(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(index_mod, "_SAMPLE", 0)  # a crafted index the load sample misses
    events = [b"\0\0\0\0" + bytes([e]) * 5 for e in range(1, 41)]  # all the same size
    d = make_log(tmp_path / "log", "book", events)
    log_path = d / "book.log"
    with Book.open(d) as book:
        true, end = list(book.index.offsets), book.index.end
    idx = Path(index_mod._index_path(str(log_path), os.stat(log_path)))
    write_index(idx, log_path, 1, true[:10] + true[11:], end)  # event 11 dropped
    with Book.open(d) as book:
        assert book.read(9) == events[8]
        assert book.gulf() == (1, 39)  # what the crafted index says
        # issue 19 #4: the read that finds the lie (event 10's len_d does not span to the
        # next indexed offset) discards the index and rescans; every event is then served
        assert book.read(10) == events[9]
        assert book.gulf() == (1, 40) and book.generation == 0  # nothing served changed
        assert book.read(11) == events[10]
        book.verify_event(39)
        assert list(book.index.offsets) == true
    assert "disagrees with the log's framing" in caplog.text
    with Book.open(d) as book:  # rebuilt from the log
        assert book.gulf() == (1, 40) and book.read(11) == events[10]


@pytest.mark.parametrize("layout", ["book", "vere"])
def test_read_slice_checks_the_framing_the_index_names(tmp_path, layout):
    """Whatever puts a wrong offset in memory (a bug, a crafted cache), read_slice
    refuses to serve a deed whose len_d is not the indexed size."""
    events = [random.Random(e).randbytes(40 + e) for e in range(1, 21)]
    d = make_log(tmp_path / "log", layout, events)
    rng = random.Random(7)
    with LAYOUTS[layout].open(d) as log:
        offsets = log.index.offsets
        for _ in range(40):
            i = rng.randrange(len(offsets))
            saved = offsets[i]
            offsets[i] = saved + rng.choice([-9, -8, -1, 1, 3, 8, 16])
            try:
                for call in (lambda: log.read(i + 1), lambda: log.verify_event(i + 1),
                             lambda: log.read_slice(i + 1, 0, 1 << 16)):
                    try:
                        got = call()
                    except CorruptDeed:
                        continue
                    assert got is None or got == events[i], f"event {i + 1}: wrong bytes"
            finally:
                offsets[i] = saved


# --- #6: a follower sees a recovery ----------------------------------------------------------


def _new(event: int, size: int = 0) -> bytes:
    """The payload a recovered writer re-appends as ``event``: not the old one."""
    return b"NEW!" + random.Random(-event).randbytes(size or 10 + event % 7)


@pytest.mark.parametrize("size", ["shorter", "longer"])
def test_book_follower_rebuilds_after_recovery_reappends(tmp_path, size):
    old = payloads(1, 40)
    d = make_log(tmp_path / "log", "book", old)
    with Book.open(d) as follower:
        assert [follower.read(e) for e in (25, 30, 40)] == [old[24], old[29], old[39]]
        g0 = follower.generation
        cut = follower.index.offsets[23]  # the writer's recovery cuts from event 24 on
        with open(d / "book.log", "r+b") as f:
            f.truncate(cut)
        k = 5 if size == "shorter" else 400
        with Book.open(d, writable=True) as writer:
            writer.save(24, [_new(e, k) for e in range(24, 41)])
        assert follower.refresh() >= 0
        assert follower.generation > g0
        assert follower.gulf() == (1, 40)
        for e in (23, 25, 30, 40):
            want = old[e - 1] if e < 24 else _new(e, k)
            assert follower.read(e) == want
            follower.verify_event(e)
            assert follower.read_slice(e, 0, 1 << 20) == want
        g1 = follower.generation
        with Book.open(d, writable=True) as writer:  # a plain append: no new generation
            writer.save(41, [b"\0\0\0\0plain"])
        assert follower.refresh() == 1 and follower.generation == g1


@pytest.mark.parametrize("layout", ["book", "vere"])
def test_follower_reopens_a_log_replaced_by_rename(tmp_path, layout):
    old = payloads(1, 30)
    d = make_log(tmp_path / "log", layout, old)
    other = make_log(tmp_path / "other", layout, [_new(e) for e in range(1, 26)])
    with LAYOUTS[layout].open(d) as follower:
        assert follower.read(25) == old[24]
        g0 = follower.generation
        os.replace(other / "book.log", d / "book.log")
        os.replace(other / "meta.bin", d / "meta.bin")
        follower.refresh()
        assert follower.generation > g0
        assert follower.gulf() == (1, 25)
        assert follower.read(25) == _new(25)
        assert follower.read_slice(20, 0, 100) == _new(20)


def test_vere_follower_rebuilds_after_batch_rollback(tmp_path):
    old = payloads(1, 40)
    d = tmp_path / "0i0"
    with VereBook.open(d, writable=True, create=True) as w:
        w.save(1, old[:30])
        w.save(31, old[30:])  # the newest batch: events 31..40
    with VereBook.open(d) as follower:
        assert follower.read(35) == old[34]
        g0 = follower.generation
        off = follower.index.offsets[34] + 12
        with open(d / "book.log", "r+b") as f:  # a bit flips in the newest batch
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 1]))
        with VereBook.open(d, writable=True) as writer:  # rolls 31..40 back, re-appends
            assert writer.recovery.rolled_back == (31, 40)
            writer.save(31, [_new(e) for e in range(31, 41)])
        follower.refresh()
        assert follower.generation > g0
        assert follower.gulf() == (1, 40)
        assert follower.read(35) == _new(35) and follower.read(30) == old[29]


def test_pier_generation_follows_its_newest_epoch(tmp_path):
    root = make_pier(tmp_path / "pier", [("book", payloads(1, 10)), ("book", payloads(11, 10))])
    newest = root / ".urb" / "log" / "0i10"
    with Pier.open(root) as pier:
        g0 = pier.generation
        assert pier.read(15) == payloads(11, 10)[4]
        with open(newest / "book.log", "r+b") as f:
            f.truncate(pier.newest.log.index.offsets[3])  # cut from event 14 on
        with Book.open(newest, writable=True) as w:
            w.save(14, [_new(e) for e in range(14, 21)])
        pier.refresh()
        assert pier.generation > g0
        assert pier.read(15) == _new(15)
