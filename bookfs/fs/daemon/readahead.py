"""A mount's readahead: big events stream in 1 MiB READ requests, not 128 KiB ones.

Set once the kernel has taken the mount's INIT reply (which would set it back), by the
daemon of every mount (``fs/daemon/mount.py``); measured in ``docs/benchmarks.md`` ("A big event
read cold and warm").
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

__all__ = ["READ_AHEAD_KB", "after_init", "raise_to"]


#: The kernel's readahead for a mount's files, KiB: READ requests of up to 1 MiB (libfuse
#: asks for 256 pages a request, ``max_pages``) instead of 128 KiB.
READ_AHEAD_KB = 1024


async def after_init(mountpoint: str, device: str) -> None:
    """:func:`raise_to` once the kernel has taken this mount's INIT reply (which
    would set the readahead back): a ``stat`` of the mount point returns only then (the
    kernel holds every request until the INIT reply set ``fc->initialized``:
    ``fs/fuse/dev.c``, ``fuse_block_alloc()`` in ``fuse_get_req()``), served by this
    daemon's own loop from a worker thread."""
    import trio

    try:
        await trio.to_thread.run_sync(os.stat, mountpoint)
    except OSError as e:
        log.info("readahead left as it was (the mount point: %s)", e)
        return
    raise_to(device)


def raise_to(device: str) -> None:
    """Let the kernel read ahead ``READ_AHEAD_KB`` of a file of this mount (``major:minor``)
    at once, so a big event streams in 1 MiB READ requests, not 128 KiB ones (8x fewer
    round trips).  FUSE sets its backing device's readahead only at INIT, to at most what
    the daemon's ``max_readahead`` and the default (128 KiB) allow (``fs/fuse/inode.c``,
    ``process_init_reply()``: ``ra_pages = min(s_bdi->ra_pages, max_readahead /
    PAGE_SIZE)``); ``/sys/class/bdi/<major:minor>/read_ahead_kb`` sets it afterwards
    (``mm/backing-dev.c``, ``read_ahead_kb_store()``).  Needs root; otherwise, or if the
    file is not there, nothing changes (logged)."""
    path = f"/sys/class/bdi/{device}/read_ahead_kb"
    try:
        with open(path, "r+") as f:
            if int(f.read().strip() or 0) < READ_AHEAD_KB:
                f.seek(0)
                f.write(str(READ_AHEAD_KB))
    except (OSError, ValueError) as e:
        log.info("readahead left as it was (%s: %s)", path, e)
