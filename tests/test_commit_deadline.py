"""The commit queue's deadline on a batch's checks (``fs/append/commit_queue.py``,
``CommitQueue._lead``): a batch is saved if and only if its checks (the commit rule's
probe) end within ``check_deadline``; a save that itself runs past the deadline is
waited for, and commits.  Each side of the deadline is held by events the test sets, not
by sleeps racing it, so a loaded machine cannot turn one case into the other: the stuck
check is released only after the commit has failed, and the slow save only after the
deadline has passed."""

from __future__ import annotations

import errno
import threading

import pytest
import trio

from bookfs.errors import Refused
from bookfs.formats.book import Book
from bookfs.fs.append.commit_queue import HOLD, CommitQueue
from bookfs.noun import jam

DEADLINE = 1.0  # seconds; the fast sides take microseconds
PAYLOAD = b"\0\0\0\0" + jam(42)


def _queue(tmp_path, **kw):
    book = Book.open(str(tmp_path / "log"), writable=True, create=True)
    return book, CommitQueue(book, check_deadline=DEADLINE, **kw)


def _ready(queue, number: int):
    r = queue.reserve(str(number).encode())
    r.staging.write(0, PAYLOAD)
    return r


def test_a_check_past_the_deadline_fails_the_batch_and_nothing_is_saved(tmp_path):
    book, queue = _queue(tmp_path)
    release, entered = threading.Event(), threading.Event()

    def stuck(shared):
        entered.set()
        release.wait(30)
        return None  # would have let it commit

    async def main():
        first, second = _ready(queue, 1), _ready(queue, 2)
        thread = None
        failed = []

        async def close(r, check):
            try:
                await queue.commit(r, check)
            except Refused as e:
                failed.append((r.number, e.errno))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(close, first, stuck)
            await trio.to_thread.run_sync(entered.wait, 30)
            thread = queue.saver._thread
            nursery.start_soon(close, second, None)
        assert sorted(failed) == [(1, errno.EIO), (2, errno.ECANCELED)]
        release.set()  # the stuck check returns now, long after its batch failed
        await trio.to_thread.run_sync(thread.join, 30)
        assert not thread.is_alive()
        return queue.next_free()

    assert trio.run(main) == 1  # the numbers are free again
    book.refresh()
    assert book.count == 0  # the abandoned batch was never saved
    assert "could not be judged" in queue.refusals.render()
    queue.saver.close()
    book.close()


def test_a_save_past_the_deadline_is_waited_for_and_commits(tmp_path):
    book, queue = _queue(tmp_path)
    save, passed = book.save, threading.Event()

    def slow_save(*args, **kw):
        passed.wait(30)  # released once the deadline is behind
        return save(*args, **kw)

    book.save = slow_save

    async def main():
        r = _ready(queue, 1)
        result = []

        async def close():
            result.append(await queue.commit(r, lambda shared: None))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(close)
            await trio.sleep(DEADLINE * 1.5)
            assert not result  # still saving, past the deadline
            passed.set()
        return result

    assert trio.run(main) == [True]
    assert book.read(1) == PAYLOAD
    queue.saver.close()
    book.close()


@pytest.mark.parametrize("verdict, expect", [
    (None, "saved"),  # the writer's last close
    (HOLD, "held"),  # not the last close: written on
    ((errno.EIO, "the writer was killed"), "failed"),
])
def test_each_verdict_of_a_check_in_time(tmp_path, verdict, expect):
    book, queue = _queue(tmp_path)

    async def main():
        r = _ready(queue, 1)
        try:
            return "saved" if await queue.commit(r, lambda shared: verdict) else "held"
        except Refused as e:
            assert e.errno == errno.EIO
            return "failed"

    assert trio.run(main) == expect
    book.refresh()
    assert book.count == (1 if expect == "saved" else 0)
    queue.saver.close()
    book.close()


def test_a_commit_cancelled_from_outside_mid_batch_still_finishes_its_reservation(tmp_path):
    """The daemon's shutdown cancels its tasks: a batch whose checks are running then
    still goes on to disk (the commit thread does not stop), so its reservation must be
    finished as saved, never left behind for ``shutdown`` to record as not committed."""
    book, queue = _queue(tmp_path)
    release, entered = threading.Event(), threading.Event()

    def slow_check(shared):
        entered.set()
        release.wait(30)
        return None  # the writer's last close: commit

    async def main():
        r = _ready(queue, 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.commit, r, slow_check)
            await trio.to_thread.run_sync(entered.wait, 30)
            nursery.cancel_scope.cancel()  # the checks are running now
            release.set()
        return r.state

    state = trio.run(main)
    queue.saver.close()  # waits for the thread's last call: the save is over
    queue.shutdown("the test ends")
    book.refresh()
    assert book.count == 1 and book.read(1) == PAYLOAD
    assert state == "done"
    assert "new/1" not in queue.refusals.render()  # never recorded as not committed
    book.close()
