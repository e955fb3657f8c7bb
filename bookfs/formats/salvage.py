"""What a salvage writes: the events it recovers, the bytes it leaves out, and publishing.

Every format's :meth:`~bookfs.formats.recovery.Recovery.salvage` builds a new log with
:class:`SalvageBatch` (batched ``save`` calls, payloads under 4 bytes left out), keeps
every byte it does not copy as an event in :class:`LeftOut` (``salvage-left-out.bin``),
and publishes the result by one rename (:func:`publish_salvage`).
"""

from __future__ import annotations

import logging
import os

from bookfs.formats.fileio import fsync_dir
from bookfs.formats.layout import FILE_MODE, MIN_PAYLOAD

log = logging.getLogger(__name__)

_COPY_CHUNK = 8 << 20  # bytes per pread when copying a range aside

#: Bytes a salvage did not copy as events, byte for byte, beside the salvaged log.
LEFT_OUT_NAME = "salvage-left-out.bin"
SALVAGE_REPORT_NAME = "salvage-report.json"
#: A salvage is built in ``OUT + SALVAGE_STAGING_SUFFIX`` and renamed into place.
SALVAGE_STAGING_SUFFIX = ".salvage-partial"
_SALVAGE_STAMP = ".bookfs-salvage"

#: ``kind`` of a left-out range: deeds no committed header vouches for (never
#: acknowledged), bytes that are damaged, a payload too short to be an event.
NOT_COMMITTED, DAMAGED, SHORT_PAYLOAD = "not-committed", "damaged", "short-payload"


class LeftOut:
    """The bytes of a source that a salvage did not copy as events, kept byte for byte in
    ``<out>/salvage-left-out.bin`` (created only when something is left out), each range
    recorded with where it came from, its offset in that file, its ``kind``
    (:data:`NOT_COMMITTED`, :data:`DAMAGED`, :data:`SHORT_PAYLOAD`) and why.  Use as a
    context manager: the file is fsync'd on exit."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, LEFT_OUT_NAME)
        self.records: list[dict] = []
        self._fd: int | None = None
        self._size = 0

    def __enter__(self) -> "LeftOut":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, data) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                               FILE_MODE)
            os.fchmod(self._fd, FILE_MODE)
        mv = memoryview(data)
        while len(mv):
            mv = mv[os.write(self._fd, mv):]

    def _record(self, n: int, kind: str, why: str, extra: dict) -> None:
        self.records.append({"kind": kind, "bytes": n, "file": LEFT_OUT_NAME,
                             "file_offset": self._size, "why": why, **extra})
        self._size += n

    def copy(self, fd: int, off: int, n: int, *, kind: str, why: str, **extra) -> None:
        """Copy the source's bytes ``[off, off + n)`` (``fd``), streamed."""
        if n <= 0:
            return
        pos, stop = off, off + n
        while pos < stop:
            chunk = os.pread(fd, min(_COPY_CHUNK, stop - pos), pos)
            if not chunk:
                break
            self._write(chunk)
            pos += len(chunk)
        self._record(pos - off, kind, why, {"source_offset": off, **extra})

    def add(self, data, *, kind: str, why: str, **extra) -> None:
        """Keep ``data`` (bytes that are not at a file offset, e.g. an LMDB value)."""
        self._write(data)
        self._record(len(data), kind, why, extra)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


def left_out_summary(records: list[dict]) -> dict:
    """``{kind: {"ranges", "bytes", "deeds"}}`` over left-out records (``deeds``: framed
    deeds counted in them, when known)."""
    out: dict = {}
    for r in records:
        k = out.setdefault(r["kind"], {"ranges": 0, "bytes": 0, "deeds": 0})
        k["ranges"] += 1
        k["bytes"] += r["bytes"]
        k["deeds"] += r.get("deeds", 0) or 0
    return out


def write_salvage_report(out: str, result: dict) -> dict:
    """Write ``result`` as ``out/salvage-report.json``, durably."""
    import json

    path = os.path.join(out, SALVAGE_REPORT_NAME)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    return result


def _sync_tree(root: str) -> None:
    """fsync every file and directory under ``root`` (deepest first)."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def _claim_staging(staging: str, source: str) -> int:
    """Create the work directory ``staging`` with its stamp, locked (``flock``) while this
    salvage runs; returns the stamp's descriptor.  A work directory that a killed salvage
    left (its stamp unlocked, or nothing in it) is removed first; one that another salvage
    holds, or that is not a salvage's, is refused."""
    import fcntl
    import json
    import shutil

    from bookfs.errors import BookError

    stamp = os.path.join(staging, _SALVAGE_STAMP)
    if os.path.lexists(staging):
        if not os.path.isdir(staging) or os.path.islink(staging) or (
                os.listdir(staging) and not os.path.isfile(stamp)):
            raise BookError(f"{staging}: exists and is not an unfinished salvage's work "
                            "directory; expected nothing there (remove it or choose another OUT)")
        if os.path.isfile(stamp):
            fd = os.open(stamp, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise BookError(f"{staging}: another salvage is writing it now; expected "
                                "it to finish first (or choose another OUT)") from None
            log.warning("%s: removing what a salvage that did not finish left", staging)
            shutil.rmtree(staging)
            os.close(fd)
        else:
            os.rmdir(staging)
    os.mkdir(staging)
    fd = os.open(stamp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"source": os.path.abspath(source), "pid": os.getpid()}).encode())
    return fd


def publish_salvage(source: str, out: str, fill) -> dict:
    """Run ``fill(root)`` (which writes a salvaged log into the new directory ``root`` and
    returns the report's content) in a work directory beside ``out``
    (``out`` + :data:`SALVAGE_STAGING_SUFFIX`), write the report there, fsync everything,
    and publish it at ``out`` by one rename (:func:`bookfs.formats.fileio.publish_dir`, as
    ``bookfs migrate`` does).  ``out`` must be absent or an empty directory.  A salvage
    killed at any point leaves ``out`` as it was; the next run removes its work directory
    and starts over."""
    import shutil

    from bookfs.errors import BookError
    from bookfs.formats.fileio import publish_dir

    out = os.path.abspath(os.fspath(out))
    staging = out + SALVAGE_STAGING_SUFFIX
    root = os.path.join(staging, os.path.basename(out))
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.path.islink(out)
                                     and not os.listdir(out)):
        raise BookError(f"{out}: not empty; expected a new or empty directory (a salvage "
                        "never writes into an existing log)")
    fd = _claim_staging(staging, source)
    try:
        os.mkdir(root)
        result = fill(root)
        result["out"] = out
        write_salvage_report(root, result)
        _sync_tree(root)
        publish_dir(root, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # nothing was published
        raise
    finally:
        os.close(fd)
    shutil.rmtree(staging)
    return result


class SalvageBatch:
    """Payloads appended to a new log ``dst`` in batches (at most 4096 events or 16 MiB
    each, one ``save`` per batch), numbered from ``first``.

    A payload under 4 bytes (no room for a mug; vere's API and LMDB can hold one) is no
    event bookfs writes: :meth:`add` copies it to ``left_out`` instead, records a gap of
    one event in ``gaps`` (the events after it get lower numbers) and returns False."""

    def __init__(self, dst, first: int, epoch: int, *, left_out=None,
                 gaps: list | None = None):
        self.dst = dst
        self.next_event = first
        self.epoch = epoch
        self.left_out = left_out
        self.gaps = gaps if gaps is not None else []
        self.skipped = 0
        self._batch: list[bytes] = []
        self._bytes = 0

    def add(self, payload: bytes, *, offset: int | None = None,
            original_event: int | None = None) -> bool:
        """Queue ``payload`` as the next event, or leave it out (see the class); ``offset``
        and ``original_event`` say where it came from, for the report."""
        if len(payload) < MIN_PAYLOAD:
            why = (f"a {len(payload)}-byte payload, under the {MIN_PAYLOAD} bytes of a mug: "
                   "not an event bookfs writes")
            where = {"source_offset": offset} if offset is not None else {}
            if self.left_out is not None:
                self.left_out.add(payload, kind=SHORT_PAYLOAD, why=why, deeds=1,
                                  original_event=original_event, **where)
            self.gaps.append({"offset": offset, "bytes": len(payload),
                              "after_new_event": self.next_event - 1, "events_lost": 1,
                              "original_event": original_event, "why": why})
            self.skipped += 1
            return False
        self._batch.append(payload)
        self._bytes += len(payload)
        self.next_event += 1
        if len(self._batch) >= 4096 or self._bytes >= 16 << 20:
            self.flush()
        return True

    def flush(self) -> None:
        if self._batch:
            self.dst.save(self.next_event - len(self._batch), self._batch, epoch=self.epoch)
            self._batch, self._bytes = [], 0
