"""Listings of ``events/`` (issue 34.1) on every source kind, with both ways a listing
reaches the kernel (``-o readdirplus=always``, the default, and ``auto``), through the
tools that list: ``find -type f``, ``ls -l``, a list-then-stat walk (Hadoop's, tar's)
and ``os.scandir``.  Every one sees every event once, with its payload size and its
date as mtime (or the log's time for an event without one), and the listing code takes
each path it has: a batch per call (a Book's offsets, patched pyfuse3's
``readdir_reply_run``), one by one (LMDB, a pier), names only (READDIR)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.formats.pier import open_source
from bookfs.fs.dates import EventDates
from bookfs.noun import DA_UNIX_EPOCH, jam, mug
from bookfs.noun.codec import cord, from_list
from lmdb_fixtures import make_lmdb_epoch, make_pier, make_vere_epoch
from mounting import mounted, run_bookfs

N = 700  # more than a few READDIRPLUS replies (about 195 entries each)


def payload(i: int) -> bytes:
    if i % 97 == 0:
        return b"\x00\x00\x00\x00" + bytes([0xFF, i & 0xFF, 7])  # not a noun: no date
    big = 1 << (8 * (70 << 10)) if i == 5 else i  # one event over the whole-read size
    noun = ((((1_600_000_000 + 37 * i) + DA_UNIX_EPOCH) << 64 | (i << 40),
             (from_list([cord("a"), cord("b")]), (cord("hear"), big))))
    return mug(noun).to_bytes(4, "little") + jam(noun)


def make(root: Path, kind: str) -> Path:
    events = [payload(i) for i in range(1, N + 1)]
    if kind == "uip":
        with Book.open(root / "uip", writable=True, create=True) as b:
            b.save(1, events)
        return root / "uip"
    if kind == "lmdb":
        return make_lmdb_epoch(root / "0i0", 0, events)
    if kind == "vere":  # vere's layout: offsets, but its own published view
        return make_vere_epoch(root / "vere", 0, events)
    return make_pier(root / "pier", [("lmdb", events[:300]), ("book", events[300:])])


def expected(src: Path) -> dict[str, tuple[int, int]]:
    with open_source(src) as log:
        dates = EventDates(log)
        first, last = log.gulf()
        return {f"{e:012d}": (log.payload_size(e), dates.mtime_ns(e))
                for e in range(first, last + 1)}


def walk_listing(events: Path) -> dict[str, tuple[int, int]]:
    names = os.listdir(events)  # every name first, then each stat'ed (Hadoop, tar)
    out = {}
    for n in names:
        st = os.stat(events / n)
        out[n] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("mode", ["always", "auto"])
@pytest.mark.parametrize("kind", ["uip", "vere", "lmdb", "pier"])
def test_every_tool_lists_every_event_with_its_size_and_date(tmp_path, kind, mode):
    src = make(tmp_path, kind)
    want = expected(src)
    assert len(want) == N
    assert len({m for _, m in want.values()}) > N - 20  # real dates, not one log time
    for tool in ("find", "ls", "walk", "scandir"):
        mnt = tmp_path / f"mnt-{tool}"
        mnt.mkdir()
        with mounted(src, mnt, "-o", f"ro,readdirplus={mode}"):  # a fresh mount each
            ev = mnt / "events"
            if tool == "find":
                out = subprocess.run(["find", str(ev), "-type", "f"], capture_output=True,
                                     text=True, check=True).stdout.split()
                assert sorted(Path(p).name for p in out) == sorted(want)
                got = {n: (os.stat(ev / n).st_size, os.stat(ev / n).st_mtime_ns)
                       for n in want}
            elif tool == "ls":
                out = subprocess.run(["ls", "-l", "--time-style=+%s.%N", str(ev)],
                                     capture_output=True, text=True, check=True).stdout
                rows = [r.split() for r in out.splitlines() if r.startswith("-")]
                got = {r[-1]: (int(r[4]), int(r[5].replace(".", ""))) for r in rows}
            elif tool == "walk":
                got = walk_listing(ev)
            else:
                with os.scandir(ev) as it:
                    got = {e.name: (e.stat().st_size, e.stat().st_mtime_ns) for e in it}
            assert got == want, (kind, mode, tool)


def test_an_unknown_readdirplus_value_is_refused(tmp_path):
    src = make(tmp_path, "uip")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = run_bookfs("mount", str(src), str(mnt), "-o", "ro,readdirplus=sometimes",
                     check=False)
    assert res.returncode == 2
    assert "readdirplus='sometimes'" in res.stderr and "expected always or auto" in res.stderr
    assert not os.path.ismount(mnt)


@pytest.mark.parametrize("mode", ["ro", "ro,readdirplus=auto"])
def test_a_listing_across_the_wrap_of_the_event_inodes(tmp_path, mode):
    """Event inode numbers wrap every ``inodes.EVENT_SPAN`` event numbers (a generation
    slot's span), so a batch of the listing that would cross a wrap is listed one by one:
    a log whose events run from 20 before the wrap to 280 after it lists every event with
    its size.  (The batch path returned a bare number there, which the listing could not
    unpack: the listing answered EIO.)"""
    from bookfs.fs import inodes as I

    first = I.EVENT_SPAN - 20
    events = [payload(i) for i in range(1, 301)]
    with Book.open(tmp_path / "log", writable=True, create=True) as b:
        b.save(first, events, epoch=first - 1)
    with mounted(tmp_path / "log", tmp_path / "mnt", "-o", mode) as mnt:
        ev = Path(mnt) / "events"
        names = sorted(os.listdir(ev))
        assert names == [f"{first + k:012d}" for k in range(300)]
        sizes = [os.stat(ev / n).st_size for n in names]
        assert sizes == [len(p) for p in events]
