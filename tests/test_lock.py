"""One writer, any number of lock-free readers, across real processes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bookfs.formats.book import Book
from bookfs.errors import LockHeld
from bookfs.formats.lock import WriterLock

HOLDER = textwrap.dedent(
    """
    import sys
    from bookfs.formats.book import Book
    book = Book.open(sys.argv[1], writable=True, create=True)
    print("ready", flush=True)
    sys.stdin.readline()
    book.close()
    print("closed", flush=True)
    sys.stdin.readline()
    """
)

# The follower test's payloads, shared by the writer child and the reading parent.
PAY = textwrap.dedent(
    """
    import random
    def pay(e):
        return random.Random(e).randbytes(50_000 + (e * 7919) % 400_000)
    """
)
exec(PAY)  # defines pay() here too

APPENDER = PAY + textwrap.dedent(
    """
    import sys, time
    from bookfs.formats.book import Book
    d, batches, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    book = Book.open(d, writable=True)
    e = 1
    for k in range(batches):
        book.save(e, [pay(e + j) for j in range(per)])
        e += per
        time.sleep(0.03)
    book.close()
    """
)


class Holder:
    """A child process holding the writer lock of a book."""

    def __init__(self, d):
        self.p = subprocess.Popen([sys.executable, "-c", HOLDER, str(d)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.p.pid

    def close_book(self):
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().strip() == "closed"

    def finish(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)
        self.p.stdin.close()
        self.p.stdout.close()


@pytest.fixture
def holder():
    made = []

    def start(d):
        h = Holder(d)
        made.append(h)
        return h

    yield start
    for h in made:
        h.finish()


def test_second_writer_is_refused_naming_the_holder(make_book, payload, holder):
    d = make_book([10, 20])
    h = holder(d)
    with pytest.raises(LockHeld) as ei:
        Book.open(d, writable=True)
    msg = str(ei.value)
    assert f"pid {h.pid}" in msg and str(d / "book.lock") in msg
    assert ei.value.errno == errno.EBUSY
    assert WriterLock.is_held(str(d / "book.lock"))
    # readers take no lock: a read-only open works while the writer holds it
    with Book.open(d) as reader:
        assert reader.gulf() == (1, 2)
        assert reader.read(2) == payload(2, 20)
    # the holder closes its book: the lock is free again
    h.close_book()
    assert not WriterLock.is_held(str(d / "book.lock"))
    with Book.open(d, writable=True) as book:
        book.save(3, [b"abcd"])


def test_lock_is_released_when_the_holder_is_killed(make_book, holder):
    d = make_book([10])
    h = holder(d)
    with pytest.raises(LockHeld):
        Book.open(d, writable=True)
    os.kill(h.pid, signal.SIGKILL)
    h.p.wait(timeout=30)
    assert h.p.returncode == -signal.SIGKILL
    with Book.open(d, writable=True) as book:
        assert book.gulf() == (1, 1)
        book.save(2, [b"abcd"])
        assert open(d / "book.lock").readline().strip() == str(os.getpid())


def test_lock_is_released_on_close_and_refused_within_one_process(make_book):
    d = make_book([10])
    first = Book.open(d, writable=True)
    try:
        with pytest.raises(LockHeld) as ei:
            Book.open(d, writable=True)
        assert f"pid {os.getpid()}" in str(ei.value)
        # a reader in the same process opening and closing the files does not drop it
        Book.open(d).close()
        with pytest.raises(LockHeld):
            Book.open(d, writable=True)
    finally:
        first.close()
    assert not WriterLock.is_held(str(d / "book.lock"))
    with Book.open(d, writable=True):
        pass
    with Book.open(d, writable=True):
        pass


def test_a_reader_does_not_block_a_writer(make_book, holder):
    d = make_book([10])
    with Book.open(d) as reader:
        h = holder(d)  # the child acquires the lock while we read
        assert WriterLock.is_held(str(d / "book.lock"))
        assert reader.gulf() == (1, 1)
        h.close_book()


def test_failed_open_releases_the_lock(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    (d / "book.log").write_bytes(b"not a book log at all")
    (d / "meta.bin").write_bytes(bytes(256))
    for _ in range(2):
        with pytest.raises(Exception):
            Book.open(d, writable=True)
        assert not WriterLock.is_held(str(d / "book.lock"))


def test_reader_follows_a_growing_log_seeing_only_whole_verified_events(tmp_path):
    d = tmp_path / "b"
    Book.open(d, writable=True, create=True).close()
    batches, per = 12, 3
    total = batches * per
    reader = Book.open(d)
    child = subprocess.Popen([sys.executable, "-c", APPENDER, str(d), str(batches), str(per)])
    try:
        seen = 0
        counts = []
        deadline = time.monotonic() + 60
        while seen < total:
            assert time.monotonic() < deadline, f"saw {seen} of {total} events"
            reader.refresh()
            count = reader.count
            assert count >= seen and count <= total
            if count:
                assert reader.gulf() == (1, count)
            for e in range(seen + 1, count + 1):  # every newly visible event is whole
                reader.verify_event(e)
                assert reader.payload_size(e) == len(pay(e))
                assert reader.read(e) == pay(e)
            if count != seen:
                counts.append(count)
            seen = count
            if child.poll() is not None and reader.refresh() == 0 and reader.count == seen:
                break
        assert child.wait(timeout=60) == 0
        reader.refresh()
        assert reader.count == total
        assert reader.verify() == []
        # it saw the log grow in steps, not all at once at the end
        assert len(counts) >= 2, counts
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.close()
    with Book.open(d, writable=True) as book:
        assert book.recovery.clean and book.gulf() == (1, total)
