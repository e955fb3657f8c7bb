"""Crafted persisted indexes for tests: files that pass the index's own checks (magic,
identity, header bytes, the last deed's tail bytes, checksum) but may list wrong offsets,
so a test can show what a read does with an index that lies."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

from bookfs.formats import index as index_mod
from bookfs.formats.layout import crc32


def write_index(idx: Path, log_path: Path, first: int, offsets: list[int], end: int,
                stamp: bool = False) -> None:
    """Write at ``idx`` an index of ``log_path`` with these offsets whose mark says
    verified to ``end``: with no stamp (as an index from before stamps), or with a stamp
    crafted to match the log as it is now (``stamp``)."""
    st = os.stat(log_path)
    data = log_path.read_bytes()
    head = index_mod._FILE_HEAD.pack(index_mod._FILE_MAGIC, st.st_dev, st.st_ino, first,
                                     len(offsets), end, end, 0, data[:16],
                                     data[end - 12:end] if offsets else bytes(12), 0)
    body = head + array("Q", offsets).tobytes()
    if stamp:
        body += index_mod._STAMP.pack(index_mod._STAMP_TAG, st.st_size, st.st_mtime_ns,
                                      st.st_ctime_ns, st.st_ctime_ns + 3_000_000_000)
    idx.write_bytes(body + crc32(body).to_bytes(4, "little"))
