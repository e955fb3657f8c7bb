"""A read-only mount's follower takes a writer's burst of commits together (issue 34,
item 4): it looks at the log at most once per ``LOOK_BURST`` while commits pour in, not
once per commit, and still sees every one of them.  (A read-write mount's companion is
such a follower: it once looked, and dropped the kernel's attributes in a worker thread,
for each of its writer's commits, which cost the appends a third of their CPU.)

The follower runs in-process (``LogOperations`` driven directly, as ``test_ops_direct``
does) with its real inotify watch, and another open of the log commits one event per
save from a worker thread."""

from __future__ import annotations

import time

import pytest
import trio

from bookfs.formats.book import Book
from bookfs.fs import watch as watch_module
from bookfs.fs.ops import LogOperations
from mount_fixtures import payload, small_src  # noqa: F401

COMMITS = 300


@pytest.mark.parametrize("burst", [watch_module.LOOK_BURST,
                                   watch_module.COMPANION_LOOK_BURST])
def test_a_burst_of_commits_is_seen_in_few_looks(small_src, burst):
    """A plain follower's bound, and a read-write mount's companion's (``-o companion``:
    its read-write daemon tells the kernel of each commit, so it looks less often)."""
    with Book.open(small_src) as book:
        ops = LogOperations(book)
        ops.watch.look_burst = burst
        looks = []
        look = ops.watch.look

        def counted(**kw):
            looks.append(time.monotonic())
            return look(**kw)

        ops.watch.look = counted
        first = book.last + 1
        last = first + COMMITS - 1
        timing = {}

        def write():
            with Book.open(small_src, writable=True) as w:
                timing["start"] = time.monotonic()
                for n in range(first, last + 1):
                    w.save(n, [payload(n, 64)])
                timing["end"] = time.monotonic()

        async def main():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ops.watch_loop)
                await trio.sleep(0.2)  # the watch is placed
                await trio.to_thread.run_sync(write)
                with trio.fail_after(60):
                    while book.last != last:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()

        trio.run(main)
    during = [t for t in looks if timing["start"] <= t <= timing["end"]]
    span = timing["end"] - timing["start"]
    # one look when the burst begins, then at most one per look_burst (the writer's
    # speed does not matter: a slow writer makes the bound larger, never smaller)
    assert len(during) <= span / burst + 2, (len(during), span)
    assert book.last == last  # every commit was seen
