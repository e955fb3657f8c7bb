"""Issue 33, item 4: right after the writer's close of ``new/N`` returned 0, everything a
reader can ask about ``events/`` includes event N: its size (the event count), its
listing, the name itself and ``info``'s ``last:``, on a read-write mount whose reads go
through the read-only companion (another kernel connection, whose cached attributes the
commit must drop before the close is answered: ``fs/daemon/companion.py``) and on a single
connection.  Before, ``stat MNT/events`` showed the old count in 88 of 2,000 appends:
the kernel kept the directory's attributes for ``CHANGING`` (1 s)."""

from __future__ import annotations

import os

import pytest

from lmdb_fixtures import make_pier
from mount_fixtures import mnt, mounted, payload, small_src  # noqa: F401  (fixtures)

APPENDS = 300


def _info_last(m) -> int:
    for line in open(f"{m}/info"):
        if line.startswith("last:"):
            return int(line.split()[1])
    raise AssertionError("no last: in info")


@pytest.mark.parametrize("source", ["book", "pier"])
@pytest.mark.parametrize("how", ["companion", "single_connection"])
def test_everything_about_events_includes_an_event_once_its_close_returned(
        small_src, tmp_path, mnt, how, source):
    """Each append is followed at once (no sleep) by a ``stat`` of ``events/`` (its size is
    the count; a pier's newest ``epochs/0i<N>/events`` too), a ``stat`` of the event's
    name, a listing and ``info``; all must already include it, every time.  The
    directories are stat'ed before each append too, so the kernel holds their
    attributes when the commit lands."""
    opts = ("-o", "single_connection") if how == "single_connection" else ()
    src = small_src
    epoch_events = None
    if source == "pier":
        src = make_pier(tmp_path / "pier", [("lmdb", [payload(n, 30) for n in range(1, 6)]),
                                            ("book", [payload(n, 30) for n in range(6, 11)])])
        epoch_events = f"{mnt}/epochs/0i5/events"
    stale: list[str] = []
    log = tmp_path / "daemon.log"
    with mounted(src, mnt, *opts, log_file=str(log)):
        if how == "companion":
            assert "companion" in open(f"{mnt}/info").read()
            # the commit tells the companion's connection itself (no race with its
            # follower): it took a copy of the companion's /dev/fuse descriptor
            assert "no copy of its connection" not in log.read_text()
        count = os.stat(f"{mnt}/events").st_size
        for k in range(APPENDS):
            n = count + 1
            os.stat(f"{mnt}/events")  # cached by the kernel now
            if epoch_events:
                os.stat(epoch_events)
            with open(f"{mnt}/new/{n}", "wb") as f:
                f.write(payload(n, 40 + k % 50))
            count = n
            size = os.stat(f"{mnt}/events").st_size
            if size != count:
                stale.append(f"append {k}: events/ size {size}, expected {count}")
            if epoch_events and os.stat(epoch_events).st_size != n - 5:
                stale.append(f"append {k}: epochs/0i5/events size is not {n - 5}")
            try:
                os.stat(f"{mnt}/events/{n}")
            except OSError as e:
                stale.append(f"append {k}: events/{n}: {e}")
            if k % 10 == 0:
                if len(os.listdir(f"{mnt}/events")) != count:
                    stale.append(f"append {k}: the listing misses it")
                if _info_last(mnt) != n:
                    stale.append(f"append {k}: info last {_info_last(mnt)}, expected {n}")
    assert not stale, f"{len(stale)} of {APPENDS} appends: {stale[:5]}"


@pytest.mark.parametrize("epochs", [1, 20])
def test_a_commit_tells_the_kernel_of_four_inodes_however_many_epochs(tmp_path, epochs):
    """What a commit makes the kernel forget before the close is answered (``ops.py``,
    ``_committed``, driven directly on a writable pier): the attributes an append
    changed other than mtimes, ``events/``'s and ``info``'s and the newest epoch's
    ``events/`` and ``info``, four notices on each connection whatever the number of
    epochs.  Before, every epoch's three inodes and the root were dropped too: on a
    pier of 20 epochs, 64 notices before each close's answer, which appended at 0.6x a
    pier of one (``docs/benchmarks.md``).  The test above holds the newest epoch's
    ``events/`` fresh through a real mount."""
    from bookfs.formats.pier import open_source
    from bookfs.fs import inodes as I
    from bookfs.fs.ops import LogOperations

    src = make_pier(tmp_path / "pier", [("book", [payload(n, 30) for n in
                                                  range(1 + 5 * k, 6 + 5 * k)])
                                        for k in range(epochs)])
    pier = open_source(src, writable=True)
    try:
        ops = LogOperations(pier)
        told: list[tuple[int, bool]] = []
        ops.mountpoint = str(tmp_path / "mnt")  # as a mount's: the commit tells its kernel
        ops.invalidate_inode = lambda ino, attr_only=False: told.append((ino, attr_only))
        last = 5 * epochs
        pier.save(last + 1, [payload(last + 1, 30)])
        ops._committed(last + 1, last + 1)
        newest = epochs - 1
        assert told == [(I.EVENTS, True), (I.INFO, True),
                        (I.epoch_inode(newest, I.EPOCH_EVENTS), True),
                        (I.epoch_inode(newest, I.EPOCH_INFO), True)]
    finally:
        pier.close()
