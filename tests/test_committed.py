"""Readers see only what is committed (issue 32), at the engine level: no mount.

What is checked, for both Book layouts (UIP, ``formats/book.py``; vere's, ``formats/vere.py``)
wherever it applies:

1. the commit mark's record (``formats/mark.py``): it round-trips, a record torn between
   two writes is rejected by its CRC, a record of another file is no mark, and a mark
   whose writer is gone (closed, or SIGKILLed) is no live mark;
2. a live mark bounds every reader: bytes a writer wrote but did not acknowledge (its
   sync has not returned, or its save failed and was undone) are never published, by a
   fresh open or a ``refresh``; a hypothesis model interleaves saves, failed saves,
   uncommitted bytes and readers' looks;
3. with no live mark (vere writes the log, or nobody), a reader publishes a foreign
   writer's whole deeds only after its own ``fdatasync`` (inline, or deferred through
   ``wants_sync``/``make_durable``); a failed sync publishes nothing;
4. vere's header slot is written before the writer's sync: a reader follows the mark,
   not the newest slot;
5. a log rewritten in place (same size, same mtime: only the ctime moved) is rebuilt on
   ``refresh`` (``generation`` grows); an append or a writer's undone save is not;
6. ``identity()``/``continues()`` tell the same log (grown or not) from a replaced,
   rewritten or cut one.

Modules added by this work (``mark.py``, ``committed.py``) are imported inside the tests
that need them, so the behavioural tests also run (and fail) against the engine from
before it, through the public engine API.
"""

from __future__ import annotations

import collections
import errno
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.errors import BookError, NoSuchEvent
from bookfs.formats.book import Book
from bookfs.formats.layout import VERE_SLOT_OFFSETS, VERE_SLOT_SIZE, encode_deed
from bookfs.formats.vere import VereBook
from bookfs.formats.vere_header import Slot, parse_slot, read_slots

LAYOUTS = ("uip", "vere")
ENGINE = {"uip": Book, "vere": VereBook}
U64 = st.integers(0, (1 << 64) - 1)


# --- helpers ---------------------------------------------------------------------------------


def pl(event: int, attempt: int = 0, size: int | None = None) -> bytes:
    """The payload saved for ``event`` at its ``attempt``-th try: distinct for every
    (event, attempt), so bytes of a failed or uncommitted try are never the acknowledged
    ones."""
    r = random.Random(event * 1_000_003 + attempt * 7919)
    n = size if size is not None else r.randrange(8, 160)
    return struct.pack("<II", event, attempt) + r.randbytes(n - 8)


def make_log(directory, layout: str, events: int = 3, *, keep_open: bool = False):
    """A log of ``events`` events (one save) in ``directory``; the writer is returned
    still open (holding the mark) with ``keep_open``, else closed."""
    w = ENGINE[layout].open(directory, writable=True, create=True)
    if events:
        w.save(1, [pl(e) for e in range(1, events + 1)])
    if keep_open:
        return w
    w.close()
    return None


def vere_deed(p: bytes) -> bytes:
    return struct.pack("<Q", len(p)) + p + struct.pack("<Q", len(p))


def append_raw(directory, layout: str, first: int, payloads: list[bytes]):
    """Write ``payloads`` as events ``first, ...`` the way a writer does before its sync
    returns (or as vere or an older bookfs does, with no mark): whole deeds at the end of
    ``book.log`` (and, for vere's layout, a valid header slot whose batch CRC holds, in
    the inactive slot), with no ``fdatasync``.  Returns what :func:`cut_raw` needs to
    take them back."""
    path = os.path.join(directory, "book.log")
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if layout == "uip":
            os.pwrite(fd, b"".join(encode_deed(p) for p in payloads), size)
            return size, None
        slots = [parse_slot(r, w)[0] for w, r in enumerate(read_slots(fd))]
        newest = max((s for s in slots if s), key=lambda s: (s.seq, -s.which))
        assert first == newest.las + 1
        deeds = b"".join(vere_deed(p) for p in payloads)
        target = 1 - newest.which
        old = os.pread(fd, VERE_SLOT_SIZE, VERE_SLOT_OFFSETS[target])
        os.pwrite(fd, deeds, size)
        new = Slot(target, newest.fir, newest.las + len(payloads), newest.seq + 1,
                   len(payloads), zlib.crc32(deeds))
        os.pwrite(fd, new.pack(), new.offset)
        return size, (target, old)
    finally:
        os.close(fd)


def cut_raw(directory, undo) -> None:
    """Take back what :func:`append_raw` wrote (as a writer's undo does)."""
    size, slot = undo
    fd = os.open(os.path.join(directory, "book.log"), os.O_RDWR)
    try:
        if slot is not None:
            os.pwrite(fd, slot[1], VERE_SLOT_OFFSETS[slot[0]])
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


class Syncs:
    """``os.fdatasync``, watched (install with :meth:`install`): every call is counted
    by the inode it syncs, and a hook set for a descriptor runs instead of the real
    call (``hook(fd)``; ``self.real`` is the real one)."""

    def __init__(self):
        self.real = os.fdatasync
        self.by_ino: collections.Counter = collections.Counter()
        self.hooks: dict[int, object] = {}

    def __call__(self, fd: int) -> None:
        self.by_ino[os.fstat(fd).st_ino] += 1
        hook = self.hooks.get(fd)
        if hook is not None:
            return hook(fd)
        return self.real(fd)

    def install(self, mp: pytest.MonkeyPatch) -> Syncs:
        # every module calls os.fdatasync through the one os module
        mp.setattr("bookfs.formats.book.os.fdatasync", self)
        return self

    def of(self, path) -> int:
        """Calls that synced the file now at ``path``."""
        return self.by_ino[os.stat(path).st_ino]

    def failing(self, fd: int, err: int) -> None:
        def fail(_fd):
            raise OSError(err, os.strerror(err))

        self.hooks[fd] = fail


@pytest.fixture
def syncs(monkeypatch) -> Syncs:
    return Syncs().install(monkeypatch)


def events_of(log) -> dict[int, bytes]:
    return dict(log.walk()) if log.count else {}


def ctime_moves(path, action) -> None:
    """Run ``action()`` (idempotent) until the file's ctime has moved from what it was
    (a coarse clock may leave it on the same tick)."""
    before = os.stat(path).st_ctime_ns
    for _ in range(200):
        action()
        if os.stat(path).st_ctime_ns != before:
            return
        time.sleep(0.005)
    raise AssertionError("the ctime never moved")


# --- 1. the mark's record --------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(dev=U64, ino=U64, seq=U64, end=U64, last=U64)
def test_a_mark_record_round_trips(dev, ino, seq, end, last):
    """Whatever it holds, a record reads back as written, in ``MARK_SIZE`` bytes."""
    from bookfs.formats.layout import MARK_SIZE
    from bookfs.formats.mark import Mark, pack, unpack

    raw = pack(dev, ino, seq, end, last)
    assert len(raw) == MARK_SIZE
    assert unpack(raw) == (dev, ino, Mark(end, last, seq))
    assert unpack(raw + b"tail") == (dev, ino, Mark(end, last, seq))
    assert unpack(raw[:-1]) is None


@settings(max_examples=300, deadline=None)
@given(a=st.tuples(U64, U64, U64, U64, U64), b=st.tuples(U64, U64, U64, U64, U64),
       cut=st.integers(1, 55))
def test_a_record_torn_between_two_writes_is_rejected(a, b, cut):
    """A reader's ``pread`` racing the writer's in-place ``pwrite`` can see the start of
    one record and the rest of another: unless that mix is one of the two records, its
    CRC rejects it (the reader looks again); never a third, made-up mark."""
    from bookfs.formats.mark import pack, unpack

    ra, rb = pack(*a), pack(*b)
    mixed = ra[:cut] + rb[cut:]
    if mixed in (ra, rb):
        assert unpack(mixed) is not None
    else:
        assert unpack(mixed) is None


def test_a_live_mark_speaks_only_of_its_own_file(tmp_path):
    """A live writer's record names its file (dev, ino): a reader of another file in the
    same directory (another epoch of a pier shares the pier's mark) finds no mark; a
    record the writer is rewriting (torn) is UNSURE while its writer lives."""
    from bookfs.formats.mark import UNSURE, Mark, MarkReader, MarkWriter, mark_path_for

    d = tmp_path / "b"
    d.mkdir()
    (d / "book.log").write_bytes(b"x" * 100)
    (d / "other.log").write_bytes(b"y" * 100)
    fd = os.open(d / "book.log", os.O_RDONLY)
    writer = MarkWriter.claim(str(d), fd, 100, 7)
    reader = MarkReader(str(d))
    try:
        assert writer.held and reader.path == mark_path_for(str(d))
        mine, other = os.stat(d / "book.log"), os.stat(d / "other.log")
        got = reader.look(mine)
        assert isinstance(got, Mark) and (got.end, got.last) == (100, 7)
        assert reader.look(other) is None
        writer.publish(120, 8)
        assert reader.look(mine)[:2] == (120, 8)
        # a record caught half rewritten: the start of one, the end of another
        from bookfs.formats.mark import pack

        torn = pack(mine.st_dev, mine.st_ino, 99, 500, 9)[:30] + \
            pack(mine.st_dev, mine.st_ino, 98, 400, 10)[30:]
        with open(reader.path, "r+b") as f:
            f.write(torn)
        assert reader.look(mine) is UNSURE
        writer.publish(130, 9)
        assert reader.look(mine)[:2] == (130, 9)
        writer.release()
        assert reader.look(mine) is None  # the record stays, true, but nobody holds it
    finally:
        writer.release()
        reader.close()
        os.close(fd)


CLAIMER = r"""
import os, sys
from bookfs.formats.{mod} import {cls}
w = {cls}.open(sys.argv[1], writable=True)
w.save(w.last + 1, [b"dead" + bytes(range(40))])
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_killed_writers_mark_is_no_live_mark(tmp_path, layout):
    """A writer (another process) holds the mark while it lives: its uncommitted bytes
    are not published.  SIGKILLed, the kernel drops its lock; its record is still there
    and valid, but no live writer speaks for it, so a reader goes by the format's own
    commit point once it has synced the bytes itself."""
    from bookfs.formats.mark import Mark, MarkReader

    d = tmp_path / "log"
    make_log(d, layout, 3)
    mod = "book" if layout == "uip" else "vere"
    cls = "Book" if layout == "uip" else "VereBook"
    proc = subprocess.Popen([sys.executable, "-c", CLAIMER.format(mod=mod, cls=cls), str(d)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        st = os.stat(d / "book.log")
        reader = MarkReader(str(d))
        assert isinstance(reader.look(st), Mark) and reader.look(st).last == 4
        append_raw(d, layout, 5, [pl(5, 1)])  # the live writer's, not acknowledged
        with ENGINE[layout].open(d) as r:
            assert r.gulf() == (1, 4)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            assert reader.look(os.stat(d / "book.log")) is None
            assert r.refresh() == 1 and r.read(5) == pl(5, 1)
        reader.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


# --- 2. a live mark bounds every reader -------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_reader_does_not_publish_deeds_beyond_the_mark(tmp_path, layout):
    """A writer's deeds (and, for vere, its new header slot) in the file before its sync
    returned are not committed: a read-only open and a ``refresh`` hold them back, a read
    of them is ``NoSuchEvent``; once the writer's save commits, they appear."""
    d = tmp_path / "log"
    w = make_log(d, layout, 3, keep_open=True)
    try:
        with ENGINE[layout].open(d) as before:
            undo = append_raw(d, layout, 4, [pl(4, 1), pl(5, 1)])
            with ENGINE[layout].open(d) as fresh:
                for r in (before, fresh):
                    assert r.refresh() == 0
                    assert r.gulf() == (1, 3) and r.count == 3
                    with pytest.raises(NoSuchEvent):
                        r.read(4)
                cut_raw(d, undo)
                w.save(4, [pl(4), pl(5)])
                for r in (before, fresh):
                    assert r.refresh() == 2
                    assert events_of(r) == {e: pl(e) for e in range(1, 6)}
    finally:
        w.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_save_is_published_only_with_its_mark(tmp_path, layout, monkeypatch):
    """The whole of a save (deeds and header synced) is still unpublished until the
    writer's mark says so: the mark, not the file, is the commit point of a live bookfs
    writer (its save has not returned yet)."""
    d = tmp_path / "log"
    w = make_log(d, layout, 3, keep_open=True)
    try:
        with ENGINE[layout].open(d) as r:
            with monkeypatch.context() as mp:
                mp.setattr(w, "_publish_mark", lambda: None, raising=False)
                w.save(4, [pl(4)])
                assert r.refresh() == 0 and r.gulf() == (1, 3)
                with ENGINE[layout].open(d) as fresh:
                    assert fresh.gulf() == (1, 3)
            w._publish_mark()
            assert r.refresh() == 1 and r.read(4) == pl(4)
    finally:
        w.close()


class Interleaving:
    """A writer and a reader of one log in this process (the reader's mark is the
    writer's, held by another open file description), run through a list of steps; after
    every reader step: each event the reader publishes was acknowledged (its save
    returned) with these bytes, none is the bytes of a failed or uncommitted try, the
    reader's last event never goes back, and it never rebuilt (``generation``)."""

    def __init__(self, d: str, layout: str, syncs: Syncs):
        self.d, self.layout, self.syncs = d, layout, syncs
        self.w = make_log(d, layout, 2, keep_open=True)
        self.acked = {1: pl(1), 2: pl(2)}
        self.bad: dict[int, set] = collections.defaultdict(set)
        self.attempt = 0
        self.junk = None
        self.r = ENGINE[layout].open(d)
        self.high = 0
        self.check()

    def check(self) -> None:
        r = self.r
        assert r.generation == 0, "the reader rebuilt a log that was only appended to"
        first, last = r.gulf()
        assert last >= self.high, f"the reader's last event went back {self.high} -> {last}"
        self.high = last
        for e in range(first, last + 1):
            assert e in self.acked, f"event {e} published before any save of it returned"
            got = r.read(e)
            assert got not in self.bad[e], f"event {e}: bytes of a try never acknowledged"
            assert got == self.acked[e]
        with pytest.raises(NoSuchEvent):
            r.read(last + 1)

    def reader(self, op: str) -> None:
        if op == "refresh":
            self.r.refresh()
        else:
            self.r.close()
            self.r = ENGINE[self.layout].open(self.d)
        self.check()

    def undo_junk(self) -> None:
        if self.junk is not None:
            cut_raw(self.d, self.junk)
            self.junk = None

    def junk_step(self, k: int) -> None:
        self.undo_junk()
        self.attempt += 1
        n = self.w.last + 1
        ps = [pl(n + i, 1000 + self.attempt) for i in range(k)]
        for i, p in enumerate(ps):
            self.bad[n + i].add(p)
        self.junk = append_raw(self.d, self.layout, n, ps)

    def save_step(self, k: int, how: str, inner: list[str]) -> None:
        """Save ``k`` events; the reader steps ``inner`` run inside the writer's
        ``fdatasync`` (before it, after it, or before it fails with EIO)."""
        self.undo_junk()
        self.attempt += 1
        n = self.w.last + 1
        ps = [pl(n + i, self.attempt) for i in range(k)]
        real = self.syncs.real

        def hook(fd):
            if how == "after":
                real(fd)
            for op in inner:
                self.reader(op)
            if how == "fail":
                raise OSError(errno.EIO, "injected")
            if how == "before":
                real(fd)

        fd = self.w.fileno()
        self.syncs.hooks[fd] = hook
        try:
            self.w.save(n, ps)
        except OSError as e:
            assert how == "fail" and e.errno == errno.EIO
            assert self.w.last == n - 1
            for i, p in enumerate(ps):
                self.bad[n + i].add(p)
        else:
            assert how != "fail"
            self.acked.update({n + i: p for i, p in enumerate(ps)})
        finally:
            del self.syncs.hooks[fd]

    def close(self) -> None:
        self.r.close()
        self.w.close()


STEPS = st.lists(st.one_of(
    st.tuples(st.just("save"), st.integers(1, 3), st.sampled_from(("before", "after", "fail")),
              st.lists(st.sampled_from(("refresh", "reopen")), max_size=2)),
    st.tuples(st.just("junk"), st.integers(1, 2)),
    st.tuples(st.just("refresh")),
    st.tuples(st.just("reopen")),
), max_size=10)


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=STEPS)
def test_any_interleaving_publishes_only_acknowledged_events(layout, steps):
    """Any interleaving of a writer's saves (a reader looking inside the save, before or
    after its sync, or before the sync fails and the save is undone), bytes it wrote
    and never acknowledged, and a reader's refreshes and reopens keeps the reader to
    acknowledged events, their acknowledged bytes, and a last event that never goes
    back (:class:`Interleaving`)."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        model = Interleaving(os.path.join(tmp, "log"), layout, Syncs().install(mp))
        try:
            for step in steps:
                if step[0] == "save":
                    model.save_step(*step[1:])
                elif step[0] == "junk":
                    model.junk_step(step[1])
                else:
                    model.reader(step[0])
            model.undo_junk()
            model.reader("refresh")
            assert model.r.gulf()[1] == model.w.last  # everything acknowledged is served
        finally:
            model.close()


# --- 3. no live mark: the reader's own sync -----------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_mark_a_reader_syncs_inline_before_it_publishes(tmp_path, layout, syncs):
    """A log whose writer is not bookfs (no live mark): deeds in the file are published
    only once this reader's own ``fdatasync`` of the log returned, inside ``refresh``
    (``inline_sync``, the default) and inside a fresh open."""
    d = tmp_path / "log"
    make_log(d, layout, 3)
    with ENGINE[layout].open(d) as r:
        append_raw(d, layout, 4, [pl(4), pl(5)])
        seen = []

        def watch(fd):
            seen.append(r.count)  # what was published when the sync ran
            syncs.real(fd)

        syncs.hooks[r.fileno()] = watch
        before = syncs.of(d / "book.log")
        assert r.refresh() == 2
        assert seen and seen[0] == 3, "published before (or without) the reader's own sync"
        assert syncs.of(d / "book.log") > before
        assert events_of(r) == {e: pl(e) for e in range(1, 6)}
    append_raw(d, layout, 6, [pl(6)])
    before = syncs.of(d / "book.log")
    with ENGINE[layout].open(d) as fresh:
        assert fresh.last == 6
    assert syncs.of(d / "book.log") > before


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_mark_a_deferred_look_waits_for_make_durable(tmp_path, layout, syncs):
    """``inline_sync = False`` (the FUSE follower's periodic look): ``refresh`` holds the
    new deeds back, syncs nothing and sets ``wants_sync``; ``make_durable()`` (run off
    the event loop) syncs, and the next ``refresh`` publishes them."""
    d = tmp_path / "log"
    make_log(d, layout, 3)
    with ENGINE[layout].open(d) as r:
        r.inline_sync = False
        append_raw(d, layout, 4, [pl(4), pl(5)])
        before = syncs.of(d / "book.log")
        assert r.refresh() == 0
        assert r.gulf() == (1, 3) and r.wants_sync is True
        assert syncs.of(d / "book.log") == before
        assert r.refresh() == 0 and r.gulf() == (1, 3)  # a second look: still held
        r.wants_sync = False  # as the follower does before it syncs
        assert r.make_durable() is True
        assert syncs.of(d / "book.log") == before + 1
        assert r.refresh() == 2
        assert events_of(r) == {e: pl(e) for e in range(1, 6)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_reader_that_syncs_inline_is_not_held_by_a_deferred_look(tmp_path, layout, syncs):
    """Regression (commit "a reader that syncs inline never waits on bytes a deferred
    look held back"): after a deferred look held new deeds back, a look that may sync
    inline (a lookup of an event not seen yet) must sync and publish them at once, not
    return early because nothing it keys on moved since."""
    d = tmp_path / "log"
    make_log(d, layout, 3)
    with ENGINE[layout].open(d) as r:
        r.inline_sync = False
        append_raw(d, layout, 4, [pl(4), pl(5)])
        assert r.refresh() == 0 and r.wants_sync
        r.inline_sync = True
        assert r.refresh() == 2
        assert r.read(5) == pl(5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_failed_reader_sync_publishes_nothing(tmp_path, layout, syncs):
    """The reader's ``fdatasync`` fails with EIO: nothing new is published (and the next
    look tries again); EINVAL or EROFS (a filesystem that holds no dirty pages) count as
    durable."""
    d = tmp_path / "log"
    make_log(d, layout, 3)
    with ENGINE[layout].open(d) as r:
        append_raw(d, layout, 4, [pl(4)])
        syncs.failing(r.fileno(), errno.EIO)
        assert r.refresh() == 0 and r.gulf() == (1, 3)
        assert r.refresh() == 0 and r.gulf() == (1, 3)
        del syncs.hooks[r.fileno()]
        assert r.refresh() == 1 and r.read(4) == pl(4)
        for n, err in ((5, errno.EINVAL), (6, errno.EROFS)):
            append_raw(d, layout, n, [pl(n)])
            syncs.failing(r.fileno(), err)
            assert r.refresh() == 1 and r.read(n) == pl(n)
            del syncs.hooks[r.fileno()]
    append_raw(d, layout, 7, [pl(7)])
    def eio(fd):
        raise OSError(errno.EIO, "injected")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(syncs, "real", eio)  # every sync fails, the fresh reader's too
        try:
            fresh = ENGINE[layout].open(d)
        except BookError:
            pass  # vere's layout: no header state readable as committed yet (said so)
        else:
            with fresh:
                assert fresh.last < 7


# --- 4. vere: the slot written before the sync -----------------------------------------------


def test_vere_a_slot_newer_than_the_mark_is_not_published(tmp_path, monkeypatch):
    """vere's layout writes the new header slot before the save's sync: while the mark
    still says the older slot's ``las_d``, a reader publishes the older slot's state (and
    checks reads of its newest batch against that slot's CRC), never the newer one."""
    d = tmp_path / "log"
    w = make_log(d, "vere", 3, keep_open=True)
    try:
        w.save(4, [pl(4), pl(5)])  # slot: las 5, batch 4..5
        with VereBook.open(d) as r:
            monkeypatch.setattr(w, "_publish_mark", lambda: None, raising=False)
            w.save(6, [pl(6), pl(7), pl(8)])  # the other slot: las 8, synced, no mark
            fd = os.open(d / "book.log", os.O_RDONLY)
            slots = sorted(parse_slot(raw, i)[0].las for i, raw in enumerate(read_slots(fd)))
            os.close(fd)
            assert slots == [5, 8]
            for reader in (r, VereBook.open(d)):
                reader.refresh()
                assert reader.gulf() == (1, 5) and reader.las_d == 5
                assert reader.read(5) == pl(5) and reader.read(4) == pl(4)
                assert reader.verify() == []  # the newest batch it serves checks
                with pytest.raises(NoSuchEvent):
                    reader.read(6)
                if reader is not r:
                    reader.close()
            monkeypatch.undo()
            w._publish_mark()
            assert r.refresh() == 3 and r.read(8) == pl(8)
    finally:
        w.close()


# --- 5. rewritten in place -----------------------------------------------------------------------


def twin_logs(tmp_path: Path, layout: str) -> tuple[Path, Path, bytes]:
    """Two valid logs of the same size, header and last deeds, which differ only in
    event 2's bytes (so no header, slot or last-deed stamp tells them apart: saved as
    events 1..3, then 4, then 5, so neither of vere's slots speaks of event 2's batch).
    Returns both directories and the second log's event 2."""
    other = pl(2, 77, size=len(pl(2)))
    dirs = []
    for name, two in (("a", pl(2)), ("b", other)):
        d = tmp_path / name
        with ENGINE[layout].open(d, writable=True, create=True) as w:
            w.save(1, [pl(1), two, pl(3)])
            w.save(4, [pl(4)])
            w.save(5, [pl(5)])
        dirs.append(d)
    a, b = dirs
    assert os.path.getsize(a / "book.log") == os.path.getsize(b / "book.log")
    raw_a, raw_b = (a / "book.log").read_bytes(), (b / "book.log").read_bytes()
    head = 8192 if layout == "vere" else 16
    assert raw_a != raw_b and raw_a[:head] == raw_b[:head] and raw_a[-100:] == raw_b[-100:]
    return a, b, other


def rewrite_in_place(path: Path, raw: bytes) -> None:
    """Write ``raw`` over ``path``'s bytes (same inode, same size), then put its mtime
    (and atime) back: only the ctime says it was written."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(raw)
    assert os.path.getsize(path) == st.st_size
    ctime_moves(path, lambda: os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns)))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_log_rewritten_in_place_is_rebuilt(tmp_path, layout):
    """A read-only reader, no live writer.  An append is growth: ``generation`` stays.
    Then another valid log of the same size, header and last deeds is written over
    ``book.log`` and its mtime put back: ``refresh`` rebuilds (``generation`` grows),
    and the new bytes are served."""
    a, b, other = twin_logs(tmp_path, layout)
    with ENGINE[layout].open(a) as r:
        g = r.generation
        assert r.read(2) == pl(2)
        with ENGINE[layout].open(b, writable=True) as w:  # both grow by one event
            w.save(6, [pl(6)])
        with ENGINE[layout].open(a, writable=True) as w:
            w.save(6, [pl(6)])
        assert r.refresh() == 1 and r.generation == g, "an append is no rewrite"
        rewrite_in_place(a / "book.log", (b / "book.log").read_bytes())
        r.refresh()
        assert r.generation > g
        assert r.gulf() == (1, 6) and r.read(2) == other
        assert events_of(r) == {**{e: pl(e) for e in range(1, 7)}, 2: other}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_writers_undone_save_is_neither_published_nor_a_rewrite(tmp_path, layout, syncs):
    """With a live mark, a writer's save whose sync fails is undone (the file cut back to
    the same size, its ctime moved): a reader that looked while the bytes were there
    published nothing, and afterwards does not take the undo for a rewrite
    (``generation`` stays)."""
    d = tmp_path / "log"
    w = make_log(d, layout, 3, keep_open=True)
    try:
        with ENGINE[layout].open(d) as r:
            g, size = r.generation, os.path.getsize(d / "book.log")
            time.sleep(0.02)  # a clock tick: the undo moves the ctime

            def inside(fd):
                assert r.refresh() == 0 and r.gulf() == (1, 3)
                raise OSError(errno.EIO, "injected")

            ctime = os.stat(d / "book.log").st_ctime_ns
            syncs.hooks[w.fileno()] = inside
            with pytest.raises(OSError):
                w.save(4, [pl(4, 1)])
            del syncs.hooks[w.fileno()]
            assert os.path.getsize(d / "book.log") == size
            assert os.stat(d / "book.log").st_ctime_ns != ctime
            assert r.refresh() == 0
            assert r.generation == g and r.gulf() == (1, 3)
            w.save(4, [pl(4)])
            assert r.refresh() == 1 and r.generation == g and r.read(4) == pl(4)
    finally:
        w.close()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("how", ["renamed over", "rewritten in place"])
def test_a_rebuilt_view_is_made_durable_before_it_is_served(tmp_path, layout, how, syncs):
    """A log replaced under a reader (renamed over, or rewritten in place) is another
    log: its bytes are published only after this reader's own ``fdatasync`` of the new
    bytes, whatever the reader had synced of the old ones (no live mark)."""
    a, b, other = twin_logs(tmp_path, layout)
    with ENGINE[layout].open(a) as r:
        assert r.last == 5
        if how == "renamed over":
            c = tmp_path / "c"
            shutil.copytree(b, c)  # a new file, not synced by anyone
            os.rename(c / "book.log", a / "book.log")
        else:
            rewrite_in_place(a / "book.log", (b / "book.log").read_bytes())
        before = syncs.of(a / "book.log")
        r.refresh()
        assert r.generation > 0 and r.read(2) == other
        assert syncs.of(a / "book.log") > before, "served new bytes nobody synced"


# --- 6. identity() / continues() ------------------------------------------------------------


def lmdb_epoch(directory, events):
    from lmdb_fixtures import make_lmdb_epoch

    return make_lmdb_epoch(directory, 0, [pl(e) for e in range(1, events + 1)])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_continues_same_or_grown_log(tmp_path, layout):
    """A token from one open is continued by a later open of the same log, unchanged or
    grown by appends."""
    d = tmp_path / "log"
    make_log(d, layout, 3)
    with ENGINE[layout].open(d) as r:
        token = r.identity()
        assert r.continues(token)
    with ENGINE[layout].open(d) as r:
        assert r.continues(token)
    with ENGINE[layout].open(d, writable=True) as w:
        w.save(4, [pl(4)])
    with ENGINE[layout].open(d) as r:
        assert r.continues(token)
        token = r.identity()
    with ENGINE[layout].open(d, writable=True) as w:
        w.save(5, [pl(5), pl(6)])
    with ENGINE[layout].open(d) as r:
        assert r.continues(token)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("change", ["rename", "rewrite", "rewrite-all", "cut"])
def test_continues_false_for_another_log(tmp_path, layout, change):
    """A token is not continued after a rename over the log, a rewrite in place (same
    size; of an early deed only, or of the whole file), or a cut back to fewer events."""
    a, b, _ = twin_logs(tmp_path, layout)
    with ENGINE[layout].open(a) as r:
        token = r.identity()
    if change == "rename":
        c = tmp_path / "c"
        shutil.copytree(a, c)
        os.rename(c / "book.log", a / "book.log")  # the same bytes, another file
    elif change == "rewrite":
        rewrite_in_place(a / "book.log", (b / "book.log").read_bytes())
    elif change == "rewrite-all":
        with ENGINE[layout].open(tmp_path / "d", writable=True, create=True) as w:
            w.save(1, [pl(e, 5, size=len(pl(e))) for e in range(1, 6)])
        raw = (tmp_path / "d" / "book.log").read_bytes()
        assert len(raw) == os.path.getsize(a / "book.log")
        rewrite_in_place(a / "book.log", raw)
    else:  # back to 3 events (vere's header still says 5: its last batch is gone)
        with ENGINE[layout].open(a) as r:
            end_of_3 = r.index.offsets[3]
        os.truncate(a / "book.log", end_of_3)
        with ENGINE[layout].open(a) as r:
            assert r.last == 3
    with ENGINE[layout].open(a) as r:
        assert not r.continues(token)


def test_continues_lmdb_and_pier(tmp_path):
    """The same for an LMDB epoch (grown: continued; renamed over: not) and a pier
    (every epoch continues its own token; a rename over its newest epoch's log does
    not)."""
    import lmdb
    from lmdb_fixtures import make_pier

    from bookfs.formats.lmdb_log import LmdbLog
    from bookfs.formats.pier import Pier

    d = lmdb_epoch(tmp_path / "0i0", 3)
    with LmdbLog.open(d) as r:
        token = r.identity()
        assert r.continues(token)
    env = lmdb.open(str(d), map_size=1 << 32, max_dbs=2)
    with env.begin(write=True, db=env.open_db(b"EVENTS", integerkey=True)) as t:
        t.put(struct.pack("<Q", 4), pl(4))
    env.close()
    with LmdbLog.open(d) as r:
        assert r.count == 4 and r.continues(token)
    other = lmdb_epoch(tmp_path / "x" / "0i0", 3)
    os.rename(other / "data.mdb", d / "data.mdb")
    with LmdbLog.open(d) as r:
        assert not r.continues(token)

    root = make_pier(tmp_path / "pier", [("lmdb", [pl(e) for e in range(1, 4)]),
                                         ("vere", [pl(e) for e in range(4, 6)]),
                                         ("book", [pl(e) for e in range(6, 8)])])
    with Pier.open(root) as p:
        token = p.identity()
        assert p.continues(token)
    with Pier.open(root, writable=True) as p:
        p.save(8, [pl(8)])
    with Pier.open(root) as p:
        assert p.last == 8 and p.continues(token)
    newest = root / ".urb" / "log" / "0i5"
    shutil.copytree(newest, tmp_path / "copy")
    os.rename(tmp_path / "copy" / "book.log", newest / "book.log")
    with Pier.open(root) as p:
        assert p.last == 8 and not p.continues(token)
