"""Staging buffers for new/ and meta/ writes, and the engine's refusal to save a payload
that changes while it is saved (issue 9, items 1, 2 and 11)."""

from __future__ import annotations

import errno
import os

import psutil
import pytest

from bookfs.formats.book import Book
from bookfs.errors import PayloadTooLarge
from bookfs.fs.append.staging import Staging, StagingFrozen


def test_truncate_far_spills_to_a_sparse_file():
    rss = psutil.Process().memory_info().rss
    s = Staging(1 << 32, spill=1 << 20)
    s.write(0, b"abcd")
    s.truncate(1 << 30)
    assert s.spilled and len(s) == 1 << 30
    assert psutil.Process().memory_info().rss - rss < 64 << 20
    s.truncate(6)
    assert s.getvalue() == b"abcd\0\0"
    s.close()


def test_frozen_buffer_refuses_writes_and_truncates():
    s = Staging(100)
    s.write(0, b"abcd")
    s.freeze()
    with pytest.raises(StagingFrozen) as e:
        s.write(4, b"x")
    assert e.value.errno == errno.EBADF
    with pytest.raises(StagingFrozen):
        s.truncate(2)
    assert s.getvalue() == b"abcd"


def test_limits_raise_efbig():
    s = Staging(1 << 32)
    with pytest.raises(PayloadTooLarge):
        s.write(1 << 32, b"x")
    with pytest.raises(PayloadTooLarge):
        s.truncate((1 << 32) + 1)


class ShiftyBlob:
    """A large payload whose bytes change between reads (a buffer written while saved)."""

    def __init__(self, n: int, grow: int):
        self.n, self.grow, self.calls = n, grow, 0

    def __len__(self):
        return self.n

    def chunks(self):
        self.calls += 1
        size = self.n + self.grow * self.calls
        for off in range(0, size, 1 << 16):
            yield b"\x07" * min(1 << 16, size - off)


@pytest.mark.parametrize("grow", [1, 4096, -4096])
def test_save_refuses_a_blob_that_changes_size(tmp_path, grow):
    d = tmp_path / "b"
    with Book.open(d, writable=True, create=True) as book:
        book.save(1, [b"\0\0\0\0first"])
        size = os.path.getsize(d / "book.log")
        with pytest.raises(OSError) as e:
            book.save(2, [ShiftyBlob(1 << 20, grow)])
        assert e.value.errno == errno.EIO
        assert os.path.getsize(d / "book.log") == size and book.last == 1
    with Book.open(d) as book:
        book.verify()
        assert book.gulf() == (1, 1)
