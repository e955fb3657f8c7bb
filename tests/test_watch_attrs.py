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


def test_a_followers_notices_do_not_grow_with_a_piers_epochs(tmp_path):
    """A read-only follower that sees a pier grow makes the kernel forget the attributes
    of the root, ``events/``, ``info`` and the epochs whose events may have changed: the
    newest, and after a roll the one before it and the new one (``LogWatch.look``,
    ``changing_inodes``).  Before, every epoch's directory, ``events/`` and ``info``
    too: 63 notices a look on a pier of 20 epochs.  Driven directly (``trio.run``) with
    the notices recorded; the mount test above holds what the kernel then shows."""
    import trio

    from bookfs.formats.pier import open_book_dir, open_source
    from bookfs.fs import inodes as I
    from bookfs.fs.ops import LogOperations
    from lmdb_fixtures import make_pier, make_vere_epoch, meta_values, payloads

    root = make_pier(tmp_path / "pier", [("vere", payloads(1 + 3 * k, 3)) for k in range(20)])
    log_dir = root / ".urb" / "log"
    pier = open_source(root)
    try:
        ops = LogOperations(pier)
        told: list[int] = []
        ops.mountpoint = str(tmp_path / "mnt")  # as a mount's: the follower tells its kernel
        ops.invalidate_inode = lambda ino, attr_only=False: told.append(ino)

        async def look() -> list[int]:
            told.clear()
            ops.watch.look()
            for _ in range(1000):  # the drop runs as a system task, in a worker thread
                if told:
                    break
                await trio.sleep(0.01)
            await trio.sleep(0.05)
            return sorted(told)

        def epoch(k: int) -> list[int]:
            return [I.epoch_inode(k, kind) for kind in (I.EPOCH_DIR, I.EPOCH_EVENTS,
                                                         I.EPOCH_INFO)]

        with open_book_dir(str(log_dir / "0i57"), writable=True) as book:
            book.save(61, payloads(61, 2))
        assert trio.run(look) == sorted([I.ROOT, I.EVENTS, I.INFO, *epoch(19)])
        assert pier.gulf() == (1, 62)
        make_vere_epoch(log_dir / "0i62", 62, payloads(63, 2), meta=meta_values())
        (log_dir / "0i62" / "epoc.txt").write_text("3")
        assert trio.run(look) == sorted([I.ROOT, I.EVENTS, I.INFO, *epoch(19), *epoch(20)])
        assert pier.gulf() == (1, 64)
    finally:
        pier.close()
