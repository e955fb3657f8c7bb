"""A read-only mount follows a log another process appends to: events appear once
committed, never earlier (BookKeeper's "read up to the last add confirmed")."""

from __future__ import annotations

import os

from bookfs.formats.book import Book
from bookfs.formats.layout import encode_deed
from bookfs.noun.render import human_bytes
from mount_fixtures import mnt, mounted, payload, small_src  # noqa: F401


def info(m) -> dict:
    rows = (line.split(":", 1) for line in open(f"{m}/info").read().splitlines())
    return {k.strip(): v.strip() for k, v in rows}


def test_ro_mount_follows_writer(small_src, mnt):
    with mounted(small_src, mnt, "-o", "ro"):
        assert info(mnt)["last"] == "10"
        assert not os.path.exists(f"{mnt}/events/11")
        with Book.open(small_src, writable=True) as book:
            book.save(11, [payload(11, 500), payload(12, 7)])
            assert open(f"{mnt}/events/11", "rb").read() == payload(11, 500)
            assert open(f"{mnt}/events/000000000012", "rb").read() == payload(12, 7)
            assert info(mnt)["last"] == "12" and info(mnt)["events"] == "12"
            assert len(os.listdir(f"{mnt}/events")) == 12
            assert os.stat(f"{mnt}/events/12").st_ino == 2**63 + 12
            book.save(13, [payload(13, 3000)])
            assert sorted(os.listdir(f"{mnt}/events"))[-1] == "000000000013"
            assert os.path.getsize(f"{mnt}/events/13") == 3000
        assert info(mnt)["bytes"] == human_bytes(os.path.getsize(small_src / "book.log"))


def test_half_written_deed_is_invisible(small_src, mnt):
    """A deed written with pwrite in pieces directly to book.log is not exposed until it
    is complete and its CRC checks."""
    data = payload(11, 10_000)
    deed = encode_deed(data)
    log = small_src / "book.log"
    end = os.path.getsize(log)
    with mounted(small_src, mnt, "-o", "ro"):
        assert info(mnt)["last"] == "10"
        fd = os.open(log, os.O_WRONLY)
        try:
            # in pieces: the length, half the payload, everything but the trailer, all
            for cut in (8, 8 + 5000, len(deed) - 12, len(deed) - 4):
                os.pwrite(fd, deed[:cut], end)
                assert not os.path.exists(f"{mnt}/events/11"), cut
                assert not os.path.exists(f"{mnt}/events/000000000011"), cut
                assert info(mnt)["last"] == "10", cut
                assert len(os.listdir(f"{mnt}/events")) == 10, cut
            # a complete deed with a bad CRC is not exposed either
            bad = bytearray(deed)
            bad[100] ^= 1
            os.pwrite(fd, bytes(bad), end)
            assert not os.path.exists(f"{mnt}/events/11")
            assert info(mnt)["last"] == "10"
            os.pwrite(fd, deed, end)  # now right
            os.fsync(fd)
        finally:
            os.close(fd)
        assert open(f"{mnt}/events/11", "rb").read() == data
        assert info(mnt)["last"] == "11"
        assert len(os.listdir(f"{mnt}/events")) == 11
