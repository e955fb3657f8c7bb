"""A read-only follower that sees the log grow drops the kernel's cached attributes of
``events/``, the root and ``info`` (``LogWatch._drop_attrs``).  It once called a method
that no longer existed: every growth logged an AttributeError and the kernel kept the old
size for up to a second."""

from __future__ import annotations

import os
import time

from bookfs.formats.book import Book
from mounting import mounted, noun_payload


def test_growth_drops_the_directories_attributes(tmp_path):
    src = tmp_path / "log"
    with Book.open(src, writable=True, create=True) as b:
        b.save(1, [noun_payload(b"event one")])
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log_file = tmp_path / "daemon.log"
    with mounted(src, mnt, "-o", "ro", log_file=str(log_file)):
        assert os.stat(mnt / "events").st_size == 1  # cached by the kernel
        with Book.open(src, writable=True) as b:
            b.save(2, [noun_payload(b"event two"), noun_payload(b"event three")])
        deadline = time.monotonic() + 60
        while os.stat(mnt / "events").st_size != 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.stat(mnt / "events").st_size == 3
        time.sleep(0.3)  # the drop runs as a system task once the growth is seen
    text = log_file.read_text()
    assert "invalidating the kernel's cached attributes failed" not in text, text[-2000:]
