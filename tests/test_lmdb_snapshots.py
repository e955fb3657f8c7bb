"""An LMDB epoch read while a writer (another process, as vere is) works on it (issue 32).

bookfs reads LMDB outside its reader table (``lock=False``: ``formats/lmdb_log.py`` says
why), so ``formats/lmdb_snapshots.py`` must make every read safe by itself.  Checked here:

* a writer that grows its map (``MDB_MAP_FULL``, ``mdb_env_set_mapsize``) never makes a
  reader fail (``MDB_MAP_RESIZED`` is adopted) nor read wrong bytes;
* a read whose snapshot a writer may have recycled (the newest meta page is beyond
  snapshot + 1 once it copied out) is read again, and gives up with :class:`BookError`
  after ``TRIES``; so is one that *failed* in such a snapshot (a cursor in recycled
  pages finds a key missing, a gap, or LMDB's own error);
* ``walk()`` over a store a writer keeps committing to yields contiguous, right values;
* a ``data.mdb`` renamed over is opened again (``generation`` grows, its values served);
  a store that was only appended to never is, even when a commit lands while the
  reader looks;
* a new transaction is published only after the reader's own ``fdatasync`` of
  ``data.mdb`` (inline, or deferred through ``wants_sync``/``make_durable``).

Writers are subprocesses (the ``lmdb`` binding refuses a second open of one environment
in a process, and vere is another process).  ``lmdb_snapshots`` is imported inside the
tests that patch it, so the others also run against the engine from before it.
"""

from __future__ import annotations

import inspect
import os
import random
import struct
import subprocess
import sys
import textwrap
import time

import lmdb
import pytest

from bookfs.errors import BookError
from bookfs.formats.lmdb_log import LmdbLog

KEY = struct.Struct("<Q")


def value(e: int, size: int | None = None) -> bytes:
    """The value of event ``e`` every writer here stores, and the tests expect."""
    r = random.Random(e * 7919 + 17)
    n = size if size is not None else r.randrange(40, 700)
    return struct.pack("<Q", e) + r.randbytes(n)


#: What a writer process runs before its script: :func:`value`, and its imports.
VALUE_SRC = "import random, struct\n" + inspect.getsource(value)


def make_store(d, last: int, *, map_size: int = 1 << 20, size: int | None = None) -> None:
    """An epoch ``d`` (named ``0i0``) holding events 1..``last`` in a map of ``map_size``."""
    d.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(d), map_size=map_size, max_dbs=2, subdir=True)
    try:
        db = env.open_db(b"EVENTS", integerkey=True, create=True)
        with env.begin(write=True, db=db) as t:
            for e in range(1, last + 1):
                t.put(KEY.pack(e), value(e, size))
        env.sync(True)
    finally:
        env.close()


def writer(script: str, *args) -> subprocess.Popen:
    """A writer process running ``script`` (after :data:`VALUE_SRC`); it prints one line
    when it is done."""
    return subprocess.Popen([sys.executable, "-c", VALUE_SRC + textwrap.dedent(script),
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return out.strip()


class Syncs:
    """``os.fdatasync`` calls counted by the inode they sync (``calls(path)``)."""

    def __init__(self, monkeypatch, on_sync=None):
        self.real = os.fdatasync
        self.by_ino: dict[int, int] = {}
        self.on_sync = on_sync
        monkeypatch.setattr("bookfs.formats.lmdb_log.os.fdatasync", self)

    def __call__(self, fd):
        ino = os.fstat(fd).st_ino
        self.by_ino[ino] = self.by_ino.get(ino, 0) + 1
        if self.on_sync is not None:
            self.on_sync(fd)
        return self.real(fd)

    def calls(self, path) -> int:
        return self.by_ino.get(os.stat(path).st_ino, 0)


#: a writer script's start: the store ``d`` (``sys.argv[1]``) open with a map of MAP, and
#: ``e``, the next event to put
OPEN_STORE = """
    import lmdb, random, sys, time
    d = sys.argv[1]
    env = lmdb.open(d, map_size=MAP, max_dbs=2)
    db = env.open_db(b"EVENTS", integerkey=True)
    with env.begin() as t:
        e = t.stat(db)["entries"] + 1
"""

GROWER = OPEN_STORE.replace("MAP", "1 << 20") + """
    target = int(sys.argv[2])
    grown = 0
    while env.info()["last_pgno"] * 4096 < target:
        try:
            with env.begin(write=True, db=db) as t:
                for k in range(e, e + 40):
                    t.put(struct.pack("<Q", k), value(k, 3000))
            e += 40
        except lmdb.MapFullError:  # as vere does: a bigger map, and on
            env.set_mapsize(env.info()["map_size"] * 2)
            grown += 1
    print(e - 1, grown)
"""


def test_a_map_the_writer_grew_is_adopted(tmp_path, monkeypatch):
    """A writer opens its store with a 1 MiB map, and on ``MapFullError`` doubles it
    (``set_mapsize``) and writes on, to 24 MiB, well past the reader's own map: the
    reader refreshes and reads all along with no error (``MDB_MAP_RESIZED`` is answered
    by adopting the writer's map), every byte right, and never takes the growing store
    for another one (``generation``)."""
    resized, counted = [], False
    try:
        from bookfs.formats.lmdb_snapshots import Snapshots
    except ImportError:  # the engine before lmdb_snapshots.py: the reads must still work
        pass
    else:
        real, counted = Snapshots.resize, True
        monkeypatch.setattr(Snapshots, "resize", lambda self: (resized.append(1), real(self)))
    d = tmp_path / "0i0"
    make_store(d, 10, size=3000)
    rng = random.Random(3)
    with LmdbLog.open(d) as log:
        proc = writer(GROWER, d, 24 << 20)
        looks = 0
        while proc.poll() is None or looks == 0:
            log.refresh()
            looks += 1
            last = log.last
            assert log.read(last) == value(last, 3000)
            e = rng.randint(1, last)
            assert log.read(e) == value(e, 3000) and log.payload_size(e) == 3008
            assert log.generation == 0, "a store only appended to was opened again"
        last, grown = map(int, finish(proc).split())
        assert grown >= 3
        log.refresh()
        assert log.gulf() == (1, last)
        for e, v in log.walk():
            assert v == value(e, 3000)
    if counted:
        assert resized, "the reader never met a grown map: the test proves nothing"


def test_a_read_whose_snapshot_may_be_recycled_is_read_again(tmp_path, monkeypatch):
    """After copying out of snapshot S, a read finds the newest transaction beyond S + 1
    (a writer may have reused S's pages from S + 3 on): it reads again in a new
    transaction and returns the right bytes; a store where that never stops gives up
    after ``TRIES`` reads with :class:`BookError`, never returning what it copied."""
    from bookfs.formats.lmdb_snapshots import TRIES

    d = tmp_path / "0i0"
    make_store(d, 20)
    with LmdbLog.open(d) as log:
        snaps = log._snaps
        real = snaps.newest
        state = {"ahead": 3, "calls": 0}

        def newest():
            state["calls"] += 1
            if state["ahead"]:
                state["ahead"] -= 1
                return real() + 2
            return real()

        monkeypatch.setattr(snaps, "newest", newest)
        assert log.read(7) == value(7)
        assert state["calls"] == 4  # three reads judged recycled, then the good one
        state.update(ahead=2, calls=0)
        assert dict(log.walk(5, 9)) == {e: value(e) for e in range(5, 10)}
        assert state["calls"] == 3
        state.update(ahead=10 ** 9, calls=0)
        with pytest.raises(BookError, match="replaced the pages"):
            log.read(7)
        assert state["calls"] == TRIES


def test_a_failure_inside_a_recycled_snapshot_is_read_again(tmp_path, monkeypatch):
    """Reading pages a writer recycled can fail as well as give wrong bytes (a cursor
    walks into another part of the tree: a key missing, a gap, LMDB's own error), and
    such a failure says no more than wrong bytes would: when the newest transaction is
    beyond snapshot + 1, the read is tried again in a new transaction.  (Seen live: a
    walk beside a fast writer raised "EVENTS ends before event N" with the newest
    transaction 6 past the walk's snapshot.)  A failure in a snapshot nobody can have
    recycled is the store's own, and is raised."""
    from bookfs.errors import NoSuchEvent

    d = tmp_path / "0i0"
    make_store(d, 20)
    with LmdbLog.open(d) as log:
        snaps = log._snaps
        real = snaps.newest
        state = {"ahead": 0}

        def newest():
            if state["ahead"]:
                state["ahead"] -= 1
                return real() + 2
            return real()

        monkeypatch.setattr(snaps, "newest", newest)
        fails = {"walk": 0, "get": 0}
        cursor, get = log._cursor_from, log._get

        def broken_cursor(txn, start, end):
            if fails["walk"]:
                fails["walk"] -= 1
                raise NoSuchEvent(f"EVENTS ends before event {end}")
            return cursor(txn, start, end)

        def broken_get(txn, event):
            if fails["get"]:
                fails["get"] -= 1
                raise lmdb.CorruptedError("recycled page")
            return get(txn, event)

        monkeypatch.setattr(log, "_cursor_from", broken_cursor)
        monkeypatch.setattr(log, "_get", broken_get)
        state["ahead"], fails["walk"] = 1, 1
        assert dict(log.walk(5, 9)) == {e: value(e) for e in range(5, 10)}
        state["ahead"], fails["get"] = 1, 1
        assert log.read(7) == value(7)
        # nobody recycled the snapshot: the failure is the store's
        fails["get"] = 1
        with pytest.raises(lmdb.CorruptedError):
            log.read(7)


APPENDER = OPEN_STORE.replace("MAP", "1 << 30") + """
    last = int(sys.argv[2])
    r = random.Random(5)
    txns = 0
    while e <= last:
        with env.begin(write=True, db=db) as t:
            for _ in range(r.randint(1, 3)):
                if e <= last:
                    t.put(struct.pack("<Q", e), value(e))
                    e += 1
        txns += 1
    print(txns)
"""


@pytest.mark.parametrize("fast", [
    False,
    pytest.param(True, marks=pytest.mark.skipif(
        not os.environ.get("BOOKFS_LONG_TESTS"), reason="long variant: BOOKFS_LONG_TESTS=1")),
])
def test_walk_while_a_writer_commits(tmp_path, fast):
    """A writer commits thousands of small transactions (the pages of each snapshot are
    recycled a few transactions later), while the reader refreshes and walks everything
    it published, again and again: every walk is contiguous and every value right.
    ``fast``: the writer does not sync (thousands of transactions a second, several
    inside one batch of a walk)."""
    d = tmp_path / "0i0"
    make_store(d, 50, map_size=1 << 30)
    total = 4000
    with LmdbLog.open(d) as log:
        script = APPENDER.replace("max_dbs=2)", "max_dbs=2, sync=False)") if fast else APPENDER
        proc = writer(script, d, total)
        walks = 0
        deadline = time.monotonic() + 60
        while (proc.poll() is None or walks < 2) and time.monotonic() < deadline:
            log.refresh()
            expected = log.first
            for e, v in log.walk():
                assert e == expected, f"walk skipped from {expected} to {e}"
                assert v == value(e), f"event {e}: wrong bytes"
                expected += 1
            assert expected == log.last + 1
            assert log.generation == 0, "a store only appended to was opened again"
            walks += 1
        assert int(finish(proc)) > 1000
        log.refresh()
        assert log.gulf() == (1, total)
        assert dict(log.walk(total - 300, total)) == {
            e: value(e) for e in range(total - 300, total + 1)}


def test_a_replaced_data_mdb_is_opened_again(tmp_path):
    """Another store renamed over ``data.mdb`` is another log: ``refresh`` opens it
    (``generation`` grows) and serves its values, not the old map's."""
    d = tmp_path / "0i0"
    make_store(d, 10)
    other = tmp_path / "new" / "0i0"
    other.mkdir(parents=True)
    env = lmdb.open(str(other), map_size=1 << 20, max_dbs=2, subdir=True)
    with env.begin(write=True, db=env.open_db(b"EVENTS", integerkey=True)) as t:
        for e in range(1, 13):
            t.put(KEY.pack(e), b"new!" + value(e))
    env.close()
    with LmdbLog.open(d) as log:
        g = log.generation
        assert log.read(3) == value(3)
        os.rename(other / "data.mdb", d / "data.mdb")
        log.refresh()
        assert log.generation > g
        assert log.gulf() == (1, 12)
        assert log.read(3) == b"new!" + value(3)
        assert dict(log.walk()) == {e: b"new!" + value(e) for e in range(1, 13)}
        assert log.refresh() == 0 and log.generation == g + 1  # once


ADDER = """
    import lmdb, sys
    d, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    env = lmdb.open(d, map_size=1 << 20, max_dbs=2, sync=False, metasync=False)
    db = env.open_db(b"EVENTS", integerkey=True)
    with env.begin(write=True, db=db) as t:
        for e in range(first, last + 1):
            t.put(struct.pack("<Q", e), value(e))
    print("ok")
"""


def test_a_transaction_is_published_after_the_readers_own_sync(tmp_path, monkeypatch):
    """vere's commit is durable when it returns, but a reader cannot know a writer's
    commit returned: it publishes a new transaction only once its own ``fdatasync`` of
    ``data.mdb`` covered it.  Inline (the default): inside ``refresh``, before the new
    events appear.  Deferred (``inline_sync = False``): ``refresh`` holds them back and
    sets ``wants_sync``; ``make_durable`` syncs; the next ``refresh`` publishes."""
    d = tmp_path / "0i0"
    make_store(d, 10)
    seen = []
    with LmdbLog.open(d) as log:
        syncs = Syncs(monkeypatch, on_sync=lambda fd: seen.append(log.count))
        data = d / "data.mdb"
        assert finish(writer(ADDER, d, 11, 15)) == "ok"  # not synced by the writer
        assert log.refresh() == 5 and log.read(15) == value(15)
        assert syncs.calls(data) >= 1, "published without the reader's own sync"
        assert seen[0] == 10, "published before the reader's own sync returned"

        log.inline_sync = False
        before = syncs.calls(data)
        assert finish(writer(ADDER, d, 16, 20)) == "ok"
        assert log.refresh() == 0 and log.gulf() == (1, 15) and log.wants_sync
        assert syncs.calls(data) == before
        log.wants_sync = False  # as the follower does before it syncs
        assert log.make_durable() is True
        assert syncs.calls(data) == before + 1
        assert log.refresh() == 5 and log.read(20) == value(20)


@pytest.mark.parametrize("commits", [1, 2])
def test_commits_that_land_while_the_reader_looks_are_no_rewrite(tmp_path, monkeypatch,
                                                                 commits):
    """``refresh`` reads the newest transaction id, then (the ctime having moved) the
    meta page of the published transaction: a writer's commits can land between the two.
    One commit writes the other meta page; a second writes its meta over the published
    transaction's page (``mdb_env_write_meta()``: ``toggle = txnid & 1``), so that page
    does differ from the published view's.  Either way that is commits, not a rewrite in
    place (a newer id once the page was read says so): the store is not opened again
    (``generation`` stays) and the new events are published.  (Seen live, with one
    commit: a reader beside a writer growing its map opened the store again about once
    per ten commits; with two, in CI on a loaded machine, a mount answered ESTALE for
    ``follow/2401``.)  The race is set up by answering the newest id as it was just
    before the commits."""
    d = tmp_path / "0i0"
    make_store(d, 10)
    with LmdbLog.open(d) as log:
        published = log._newest_txnid()
        time.sleep(0.02)  # a clock tick: the commits move the ctime
        for k in range(commits):
            assert finish(writer(ADDER, d, 11 + 2 * k, 12 + 2 * k)) == "ok"
        assert log._newest_txnid() == published + commits
        real = log._newest_txnid
        stale = [published]
        monkeypatch.setattr(log, "_newest_txnid",
                            lambda: stale.pop() if stale else real())
        log.refresh()
        assert log.generation == 0, "commits were taken for a rewrite in place"
        log.refresh()
        last = 10 + 2 * commits
        assert log.gulf() == (1, last) and log.generation == 0
        assert log.read(last) == value(last)


def test_a_failed_sync_publishes_nothing(tmp_path, monkeypatch):
    """The reader's own ``fdatasync`` of ``data.mdb`` fails (EIO): the new transaction is
    not published; once a sync succeeds, it is."""
    import errno

    d = tmp_path / "0i0"
    make_store(d, 10)
    with LmdbLog.open(d) as log:
        failing = [True]

        def sync(fd):
            if failing[0]:
                raise OSError(errno.EIO, "injected")
            return os.fsync(fd)

        monkeypatch.setattr("bookfs.formats.lmdb_log.os.fdatasync", sync)
        assert finish(writer(ADDER, d, 11, 12)) == "ok"
        assert log.refresh() == 0 and log.gulf() == (1, 10)
        failing[0] = False
        assert log.refresh() == 2 and log.read(12) == value(12)


def test_a_value_over_a_chunk_is_read_in_slices_each_checked(tmp_path, monkeypatch):
    """``read`` and ``walk`` take a value over ``_CHUNK`` in slices, each in a checked
    transaction of its own (a long copy under a busy writer would be judged recycled again
    and again): the bytes are the value's, whole, and a slice judged recycled is read
    again on its own."""
    from bookfs.formats import lmdb_log

    monkeypatch.setattr(lmdb_log, "_CHUNK", 4096)
    d = tmp_path / "0i0"
    d.mkdir()
    big = {e: value(e, 20_000 + e) for e in (1, 2, 3)}
    env = lmdb.open(str(d), map_size=1 << 22, max_dbs=2, subdir=True)
    with env.begin(write=True, db=env.open_db(b"EVENTS", integerkey=True, create=True)) as t:
        for e, v in big.items():
            t.put(KEY.pack(e), v)
    env.close()
    with LmdbLog.open(d) as log:
        snaps = log._snaps
        real, calls = snaps.newest, []

        def newest():
            calls.append(1)
            return real() + (5 if len(calls) == 3 else 0)  # one slice judged recycled

        monkeypatch.setattr(snaps, "newest", newest)
        assert log.read(2) == big[2]
        assert len(calls) >= 2 + 20_000 // 4096  # one checked transaction per slice
        assert dict(log.walk()) == big
