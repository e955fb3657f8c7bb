"""Big events stream in large READ requests (issue 34.2): the mount raises its backing
device's readahead (``fs/daemon/readahead.py``), so the kernel asks for up
to 1 MiB at a time instead of 128 KiB, and a big event read every way still gives its
bytes exactly."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from bookfs.formats.book import Book
from bookfs.fs.daemon.readahead import READ_AHEAD_KB
from bookfs.fs.daemon.mountinfo import mount_at
from mounting import mounted
from mounting import noun_payload


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_a_big_event_streams_with_a_raised_readahead(tmp_path, mode):
    big = noun_payload(os.urandom(9 << 20))  # 9 MiB: a check streamed, many READs
    with Book.open(tmp_path / "log", writable=True, create=True) as b:
        b.save(1, [noun_payload(b"small"), big])
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    opts = ["-o", "ro"] if mode == "ro" else []
    with mounted(tmp_path / "log", mnt, *opts):
        here = mount_at(str(mnt / "events"), resolve=False) or mount_at(str(mnt))
        with open(f"/sys/class/bdi/{here.device}/read_ahead_kb") as f:
            assert int(f.read()) >= READ_AHEAD_KB
        path = mnt / "events" / f"{2:012d}"
        want = hashlib.sha256(big).hexdigest()
        for bs in ("1M", "4k", "3M"):
            out = subprocess.run(f"dd if={path} bs={bs} status=none | sha256sum",
                                 shell=True, capture_output=True, text=True, check=True)
            assert out.stdout.split()[0] == want, bs
        with open(path, "rb") as f:  # reads at odd offsets and sizes
            f.seek(12345)
            assert f.read(777777) == big[12345:12345 + 777777]
