"""The append engine (``bookfs/fs/append/``) runs without FUSE (issue 36, item 1): driven
here in a process where ``import pyfuse3`` fails, it reserves numbers, stages bytes,
checks the payload as it streams, judges each close (``rule.on_close``), commits in order
with one group save, and refuses what
the contract refuses with :class:`bookfs.errors.Refused` and the errno DESIGN.md names,
leaving the log as it was."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import errno, sys
    sys.modules["pyfuse3"] = None  # import pyfuse3 now raises ImportError
    import trio
    from bookfs.errors import Refused
    from bookfs.formats.book import Book
    from bookfs.fs.append.check import PayloadStream
    from bookfs.fs.append import rule
    from bookfs.fs.append.commit_queue import CommitQueue, WorkerThread
    from bookfs.noun import jam

    def payload(text):
        return b"\\0\\0\\0\\0" + jam(int.from_bytes(text, "little"))

    def refused(fn, *args):
        try:
            fn(*args)
        except Refused as e:
            return e.errno
        return None

    book = Book.open(sys.argv[1], writable=True, create=True)
    queue = CommitQueue(book)
    checker = WorkerThread("check")

    async def append(r, data, at=0):
        r.payload = PayloadStream(checker)
        r.staging.write(at, data)
        await r.payload.wrote(at, data)
        # the writer's last close (no mount: every close is the last)
        return await rule.on_close(queue, None, None, r, 0, None, mounted=False)

    async def main():
        assert refused(queue.reserve, b"2") == errno.EINVAL  # a gap
        assert refused(queue.reserve, b"x") == errno.EINVAL  # not a number
        rs = [queue.reserve(str(n).encode()) for n in (1, 2, 3)]
        assert refused(queue.reserve, b"2") == errno.EEXIST  # in flight
        async with trio.open_nursery() as nursery:  # closed out of order: saved in order
            for r, text in reversed(list(zip(rs, (b"one", b"two", b"three")))):
                nursery.start_soon(append, r, payload(text))
        assert [book.read(n) for n in (1, 2, 3)] == [payload(t) for t in (b"one", b"two", b"three")]
        bad = queue.reserve(b"4")
        try:
            await append(bad, b"\\0\\0\\0\\0\\xff")  # a mug, then no noun
        except Refused as e:
            assert e.errno == errno.EINVAL, e
        else:
            raise AssertionError("a payload that is no noun was committed")
        assert book.last == 3 and queue.next_free() == 4
        holed = queue.reserve(b"4")  # bytes 0..9 never written
        try:
            await append(holed, payload(b"four"), at=10)
        except Refused as e:
            assert e.errno == errno.EINVAL and "never written" in str(queue.refusals.render()), e
        else:
            raise AssertionError("a file with a hole was committed")
        assert book.last == 3 and queue.next_free() == 4
        assert "pyfuse3" not in sys.modules or sys.modules["pyfuse3"] is None

    trio.run(main)
    queue.saver.close()
    book.close()
    print("ok", queue.batches, len(queue.refusals))
""")


def test_the_append_engine_runs_without_fuse(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "log")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    ok, batches, refusals = out.stdout.split()
    assert ok == "ok"
    assert int(batches) <= 3  # 1, 2 and 3 saved in order (together when they could be)
    assert int(refusals) == 5  # the gap, the name, the number in flight, the bad payload,
    # the hole
