"""A log opened from its persisted index walks the chain of deeds once, before it first
answers an event's size or bytes by number (``Book._confirm_offset``): the whole log for
its last event (4.5 s on the 10-million-event ship from the disk).  A mount runs that
walk in a worker thread, never on the event loop, which would answer no other request
meanwhile.

Driven directly (s3ql-style, ``LogOperations`` under ``trio.run``) so that the thread
the walk ran in can be seen, for every request that reads an event by number, over the
source kinds whose index can be a hint (a UIP Book directory, a pier with a UIP Book
epoch); and once through a real mount."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest
import trio

from bookfs.formats import book as book_module
from bookfs.formats.book import Book
from bookfs.formats.info import parse
from bookfs.formats.pier import open_source
from bookfs.fs import inodes as I
from bookfs.fs.ops import LogOperations
from mount_fixtures import payload

CTX = SimpleNamespace(pid=os.getpid(), uid=0, gid=0, umask=0o022)
N = 3000  # events: far more than one walk of a deed at a time (framing._WALK_ALONE)


def _book_dir(tmp_path):
    d = tmp_path / "book"
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, [payload(n, 40 + n % 50) for n in range(1, N + 1)])
    return d


def _pier(tmp_path):
    from lmdb_fixtures import make_pier

    return make_pier(tmp_path / "pier", [("lmdb", [payload(n, 30) for n in range(1, 11)]),
                                         ("book", [payload(n, 40) for n in range(11, N + 1)])])


SOURCES = {"UIP Book": _book_dir, "pier, UIP Book epoch": _pier}


@pytest.fixture(params=list(SOURCES))
def hinted(request, tmp_path, monkeypatch):
    """A read-only log opened from the persisted index a first open left, and the list
    of threads each chain walk ran in."""
    src = SOURCES[request.param](tmp_path)
    open_source(src).close()  # builds and persists the index
    log = open_source(src)
    walks = []
    real = book_module.confirm_chain

    def watched(*args):
        walks.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(book_module, "confirm_chain", watched)
    yield log, walks
    log.close()


def _requests(ops, last):
    """Each request that reads ``last`` by number first."""
    name = b"%012d" % last
    ino = I.event_inode(last)
    return {
        "lookup": lambda: ops.lookup(I.EVENTS, name, CTX),
        "getattr": lambda: ops.getattr(ino, CTX),
        "read": lambda: ops.read_inode(ino, 0, 0, 10),  # the no-open path: fh 0
        "pretty": lambda: ops.lookup(I.PRETTY, name, CTX),
        "info": lambda: ops.getattr(I.INFO, CTX),
    }


@pytest.mark.parametrize("request_kind", ["lookup", "getattr", "read", "pretty", "info"])
def test_the_chain_walk_never_runs_on_the_event_loop(hinted, request_kind):
    log, walks = hinted
    ops = LogOperations(log)
    last = log.last

    async def go():
        return await _requests(ops, last)[request_kind]()

    got = trio.run(go)
    assert walks, "the request read the last event by number, so the chain was walked"
    assert not any(walks), "a chain walk ran on the event loop's thread"
    if request_kind in ("lookup", "getattr"):
        assert got.st_size == log.payload_size(last)


def test_the_chain_is_confirmed_once_by_number(hinted):
    """``chain_confirmed`` says whether a read by number walks first; ``confirm_to``
    walks, once."""
    log, walks = hinted
    last = log.last
    assert not log.chain_confirmed(last) and log.chain_confirmed(last + 1)
    log.confirm_to(last)
    assert log.chain_confirmed(last) and len(walks) == 1
    log.payload_size(last)
    log.read(last)
    assert len(walks) == 1


def test_lookups_in_order_hand_the_walk_over_once_a_step_not_once_an_event(hinted):
    """A reader that goes forward through ``events/`` (a listing stat'ed in order, as
    ``readdirplus=auto`` leaves Hadoop's ``listStatus`` to do; ``cat events/*``): each
    lookup of an event past the confirmed chain hands a walk to a worker thread, about
    100 µs of hand-off each on this machine.  The walk goes on past the event by one step
    (``framing.walk_ahead``), so 600 lookups in order make one walk, not 600 (a liststat
    of 100,000 events with ``readdirplus=auto`` went from 15.1 s to 5.1 s)."""
    log, walks = hinted
    ops = LogOperations(log)
    first = log.first if log.first > 1 else 1

    async def go():
        sizes = []
        for e in range(first, first + 600):
            sizes.append((await ops.lookup(I.EVENTS, b"%012d" % e, CTX)).st_size)
        return sizes

    sizes = trio.run(go)
    assert sizes == [log.payload_size(e) for e in range(first, first + 600)]
    assert 1 <= len(walks) <= 2, f"{len(walks)} chain walks for 600 lookups in order"
    assert not any(walks), "a chain walk ran on the event loop's thread"


def test_a_walk_under_way_is_waited_for_not_walked_again(hinted, monkeypatch):
    """A listing starts the walk of its next step in the background
    (``EventFiles.walk_soon``); a request that needs an event within it meanwhile waits
    for that walk rather than walking the same deeds in a second thread, and one past it
    walks on from where it ended: no deed is walked twice."""
    log, walks = hinted
    ef = LogOperations(log).event_files
    first = log.first if log.first > 1 else 11  # (the pier's Book epoch starts at 11)
    spans = []
    inner = book_module.confirm_chain

    def spanned(fd, offsets, k, i, *rest):
        spans.append((k, i))
        return inner(fd, offsets, k, i, *rest)

    monkeypatch.setattr(book_module, "confirm_chain", spanned)

    async def go():
        ef.walk_soon(first + 100)  # a listing's next step
        ef.walk_soon(first + 200)  # one under way already: nothing more
        await ef.confirmed(first + 50)
        assert log.chain_confirmed(first + 100)
        await ef.confirmed(log.last)

    trio.run(go)
    assert spans and not any(walks), "a chain walk ran on the event loop's thread"
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), f"deeds walked twice: {spans}"
    assert log.chain_confirmed(log.last)


def test_through_a_mount_the_last_event_of_a_hinted_index(tmp_path):
    """Through a real read-only mount of a log opened from its persisted index: the
    last event's size and bytes (the walk run by the daemon's worker thread) and info."""
    from mounting import mounted

    d = _book_dir(tmp_path)
    Book.open(d).close()  # the index persisted
    with mounted(d, tmp_path / "mnt", "-o", "ro") as mnt:
        path = os.path.join(mnt, "events", "%012d" % N)
        assert os.stat(path).st_size == len(payload(N, 40 + N % 50))
        with open(path, "rb") as f:
            assert f.read() == payload(N, 40 + N % 50)
        with open(os.path.join(mnt, "info")) as f:
            assert parse(f.read())["events"] == str(N)


def test_through_a_mount_a_listing_stated_in_order_and_read_in_order(tmp_path):
    """Through a real ``-o ro,readdirplus=auto`` mount of a log opened from its persisted
    index: the names listed first (plain READDIR builds no inode), then each event
    stat'ed in order (a LOOKUP each, the walk going ahead of them), then each read in
    order: every size and every byte is the event's own."""
    from mounting import mounted

    d = _book_dir(tmp_path)
    Book.open(d).close()  # the index persisted
    with mounted(d, tmp_path / "mnt", "-o", "ro,readdirplus=auto") as mnt:
        events = os.path.join(mnt, "events")
        names = sorted(os.listdir(events))
        assert names == ["%012d" % e for e in range(1, N + 1)]
        sizes = [os.stat(os.path.join(events, n)).st_size for n in names]
        assert sizes == [len(payload(e, 40 + e % 50)) for e in range(1, N + 1)]
        for e in range(1, N + 1, 7):
            with open(os.path.join(events, "%012d" % e), "rb") as f:
                assert f.read() == payload(e, 40 + e % 50)


def test_a_segment_is_named_and_read_by_the_proved_index(tmp_path, monkeypatch):
    """A persisted index that drops one deed's offset (its checksum valid, the load's
    sample made to miss it) numbers every later deed one too low.  A segment after the
    lie is looked up and read by the index the chain walk proved (the lying one is
    rebuilt), so the name it answers to is its first deed's true event number, and
    every deed in its bytes is the event its position says."""
    import errno
    from pathlib import Path

    import pyfuse3

    from bookfs.formats import index as index_mod
    from bookfs.formats.deeds import UIP
    from bookfs.formats.layout import HEADER_SIZE
    from index_fixtures import write_index

    monkeypatch.setattr(index_mod, "_SAMPLE", 0)
    d, lie, span = tmp_path / "log", 1000, 16 << 10
    events = [payload(e, 40 + e % 50) for e in range(1, N + 1)]
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, events)
    with Book.open(d) as b:
        true, end = list(b.index.offsets), b.index.end
    idx = Path(index_mod._index_path(str(d / "book.log"), os.stat(d / "book.log")))
    write_index(idx, d / "book.log", 1, true[: lie - 1] + true[lie:], end)
    book = Book.open(d)
    try:
        assert book.count == N - 1  # the lie, as loaded
        ops = LogOperations(book, segment_span=span)
        k = (true[2000] - HEADER_SIZE) // span  # a segment well after the lie
        told = ops.segments.get(k).first  # its name by the lying index
        right = true.index(min(o for o in true if o >= HEADER_SIZE + k * span)) + 1

        async def lookup(first):
            return await ops.lookup(I.SEGMENTS, b"%012d" % first, CTX)

        with pytest.raises(pyfuse3.FUSEError) as e:
            trio.run(lookup, told)  # the lying name: no segment starts there
        assert e.value.errno == errno.ENOENT and told == right - 1
        a = trio.run(lookup, right)
        data = trio.run(ops.read_inode, a.st_ino, 0, 0, a.st_size)
        got = [(event, bytes(p)) for event, _, p in UIP.walk(memoryview(data), right)]
        assert got and got == [(e, events[e - 1]) for e, _ in got]
        assert book.count == N
    finally:
        book.close()
