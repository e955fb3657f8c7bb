"""``bookfs fsck``: check a log, repair what is safe, salvage what can be saved.

Checking reads the log raw (read-only, it never uses the recovering open) and reports every
problem with its byte offset: the header, ``meta.bin``, broken framing, each deed whose CRC
fails, a torn tail, and bytes past the last deed that are not a torn tail.

``--repair`` fixes only what is safe: a torn tail (an incomplete final deed, which can hold
no valid event) is cut.  Everything else is left for ``--salvage``.

``--salvage OUT`` rescans the damaged regions at every byte offset for valid deeds (a
candidate is accepted only when its length trailer and CRC agree) and writes every
recoverable event, in log order, to a new log in ``OUT``, with ``salvage-report.json``
listing the gaps.  Deeds carry no event numbers: where the framing is intact a lost deed is
a known event; after a framing break the number of lost events is unknown, so the events
after it are numbered by position and the report says so.

Exit status (like e2fsck): 0 no problem; 1 problems found and all repaired; 4 problems
left; 8 the log could not be checked at all (not a Book log, unreadable); 2 bad usage.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field

from . import recovery
from .errors import BookError
from .index import OffsetIndex, scan_framing
from .layout import (
    DEED_LEN,
    DEED_OVERHEAD,
    HEADER,
    HEADER_SIZE,
    LOG_NAME,
    MAGIC,
    META_NAME,
    META_SIZE,
    VERSION,
)

EXIT_CLEAN, EXIT_REPAIRED, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 4, 8


@dataclass
class Problem:
    kind: str  # header | meta | crc | framing | torn-tail | garbage
    offset: int | None
    message: str
    event: int | None = None


@dataclass
class Report:
    path: str
    first: int = 0
    last: int = 0
    events: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: (offset, bytes) of regions past framing breaks that may hold valid deeds
    damaged: list[tuple[int, int]] = field(default_factory=list)
    torn_tail: tuple[int, int] | None = None
    #: offsets of every framed deed, in log order (across damaged regions)
    offsets: list[int] = field(default_factory=list, repr=False)
    #: how many framed deeds precede the first framing break (their numbers are certain)
    numbered: int = 0

    @property
    def clean(self) -> bool:
        return not self.problems


def check(directory: str, *, progress=None) -> Report:
    """Check the UIP-layout log in ``directory`` without modifying anything."""
    log_path = os.path.join(directory, LOG_NAME)
    rep = Report(log_path)
    fd = os.open(log_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE:
            rep.problems.append(Problem("header", 0, f"{size} bytes, under the 16-byte header"))
            return rep
        magic, version, fir = HEADER.unpack(os.pread(fd, HEADER_SIZE, 0))
        if magic != MAGIC or version != VERSION:
            raise BookError(f"{log_path}: not a UIP Book log (magic {magic:#010x}, "
                            f"version {version})")
        _check_meta(directory, rep)
        index = OffsetIndex(first=fir)
        pos = HEADER_SIZE
        numbered = None
        while True:
            index.end = pos
            stop = scan_framing(fd, index, size, progress=progress)
            if stop >= size:
                break
            if numbered is None:
                numbered = len(index.offsets)
            if recovery.is_torn_tail(fd, stop, size):
                rep.torn_tail = (stop, size - stop)
                rep.problems.append(Problem("torn-tail", stop, f"{size - stop} bytes at "
                                            f"offset {stop} are an incomplete final deed"))
                break
            nxt = recovery.find_valid_deeds(fd, stop + 1, size, limit=1)
            end = nxt[0] if nxt else size
            rep.damaged.append((stop, end - stop))
            rep.problems.append(Problem("framing", stop, f"{end - stop} bytes at offset "
                                        f"{stop} do not frame a deed" +
                                        (f"; valid deeds resume at {end}" if nxt else "")))
            if not nxt:
                break
            pos = end
        # every CRC, continuing past failures (framing holds, so positions are known)
        i = 0
        while True:
            bad = recovery.first_bad_deed(fd, index.offsets, i, index.end, progress=progress)
            if bad is None:
                break
            off = index.offsets[bad]
            known = numbered is None or bad < numbered
            rep.problems.append(Problem(
                "crc", off, f"deed at offset {off} fails its CRC check" +
                ("" if known else " (its event number is unknown: it follows damage)"),
                event=fir + bad if known else None))
            i = bad + 1
        rep.offsets = list(index.offsets)
        rep.numbered = len(rep.offsets) if numbered is None else numbered
        rep.events = len(index.offsets)
        rep.first = fir if rep.events else 0
        rep.last = fir + rep.events - 1 if rep.events else 0
    finally:
        os.close(fd)
    return rep


def _check_meta(directory: str, rep: Report) -> None:
    meta = os.path.join(directory, META_NAME)
    try:
        size = os.stat(meta).st_size
    except FileNotFoundError:
        rep.problems.append(Problem("meta", None, f"{meta} is missing"))
        return
    if size != META_SIZE:
        rep.problems.append(Problem("meta", None, f"{meta} has {size} bytes, expected "
                                    f"{META_SIZE}"))


def repair(directory: str, rep: Report) -> bool:
    """Cut a torn tail, the only repair that is always safe (it was shown to hold no valid
    deed), and nothing else.  Returns True if the log is clean afterwards."""
    if rep.torn_tail is not None:
        fd = os.open(os.path.join(directory, LOG_NAME), os.O_RDWR | os.O_CLOEXEC)
        try:
            off, n = rep.torn_tail
            if os.fstat(fd).st_size != off + n:
                raise BookError(f"{directory}: the log changed while being checked")
            os.ftruncate(fd, off)
            os.fsync(fd)
        finally:
            os.close(fd)
        rep.problems = [p for p in rep.problems if p.kind != "torn-tail"]
        rep.torn_tail = None
    return rep.clean


def salvage(directory: str, rep: Report, out: str) -> dict:
    """Write every recoverable event of a checked log to a new log in ``out``, in log
    order, and ``out/salvage-report.json`` with the gaps; returns that report.  The deeds
    are those ``check`` framed (scanning resumes after damage at the next offset where a
    valid deed starts); each is re-checked here and only valid ones are copied."""
    from .book import Book
    from .layout import META_FIELDS

    log_path = os.path.join(directory, LOG_NAME)
    first = rep.first or 1
    gaps: list[dict] = []
    os.makedirs(out, exist_ok=True)
    fd = os.open(log_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        with Book.open(out, writable=True, create=True) as dst:
            meta_src = os.path.join(directory, META_NAME)
            if os.path.exists(meta_src) and os.path.getsize(meta_src) == META_SIZE:
                with open(meta_src, "rb") as f:
                    raw = f.read()
                for key, (o, n) in META_FIELDS.items():
                    dst.save_meta(key, raw[o : o + n])
            event = first  # the next number to give in the new log
            batch: list[bytes] = []
            batch_bytes = 0

            def flush() -> None:
                nonlocal batch, batch_bytes
                if batch:
                    dst.save(event - len(batch), batch, epoch=first - 1)
                    batch, batch_bytes = [], 0

            original_known = True
            prev_end = HEADER_SIZE
            for i, off in enumerate(rep.offsets):
                if off != prev_end:  # bytes lost to broken framing: count unknown
                    gaps.append({"offset": prev_end, "bytes": off - prev_end,
                                 "after_new_event": event - 1, "events_lost": "unknown"})
                    original_known = False
                (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
                prev_end = off + n + DEED_OVERHEAD
                if not recovery.deed_crc_ok(fd, off, n):
                    gaps.append({"offset": off, "bytes": n + DEED_OVERHEAD,
                                 "after_new_event": event - 1, "events_lost": 1,
                                 "original_event": first + i if original_known else None})
                    continue  # framing is intact: later original numbers stay known
                batch.append(os.pread(fd, n, off + 8))
                batch_bytes += n
                event += 1
                if len(batch) >= 4096 or batch_bytes >= 16 << 20:
                    flush()
            flush()
            if prev_end < size:
                gaps.append({"offset": prev_end, "bytes": size - prev_end,
                             "after_new_event": event - 1, "events_lost": "unknown"})
            result = {
                "source": log_path,
                "out": os.path.abspath(out),
                "recovered": dst.count,
                "first": dst.first,
                "last": dst.last,
                "gaps": gaps,
                "note": ("a Book log is contiguous, so recovered events are numbered in log "
                         "order from the original first event; after the first gap their "
                         "original numbers are higher than their new ones"),
            }
    finally:
        os.close(fd)
    with open(os.path.join(out, "salvage-report.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result


def run(args) -> int:
    """The ``bookfs fsck`` command."""
    from .cli import _progress_bar

    try:
        size = os.path.getsize(os.path.join(args.source, LOG_NAME))
        with _progress_bar(2 * size, "fsck") as bar:  # framing pass, then every CRC
            rep = check(args.source, progress=bar.update)
    except (BookError, OSError) as e:
        print(f"bookfs fsck: {e}", file=sys.stderr)
        return EXIT_ERROR
    for p in rep.problems:
        where = f"offset {p.offset}" if p.offset is not None else "-"
        ev = f" (event {p.event})" if p.event is not None else ""
        print(f"{p.kind:10} {where:>20}{ev}: {p.message}")
    print(f"{rep.path}: events {rep.first}..{rep.last} ({rep.events} framed), "
          f"{len(rep.problems)} problem(s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"path": rep.path, "first": rep.first, "last": rep.last,
                       "events": rep.events, "problems": [asdict(p) for p in rep.problems]},
                      f, indent=2)
    code = EXIT_CLEAN if rep.clean else EXIT_PROBLEMS
    if args.repair and rep.torn_tail is not None:
        off = rep.torn_tail[0]
        if repair(args.source, rep):
            print(f"repaired: cut the torn tail at offset {off}; the log is clean")
            code = EXIT_REPAIRED
        else:
            print(f"repaired: cut the torn tail at offset {off}; other problems remain: "
                  "use --salvage OUT to copy every recoverable event")
    elif args.repair and not rep.clean:
        print("not repaired: only a torn tail is safe to cut; use --salvage OUT")
    if args.salvage:
        res = salvage(args.source, rep, args.salvage)
        print(f"salvaged {res['recovered']} events into {res['out']} "
              f"({len(res['gaps'])} gap(s); see salvage-report.json)")
    return code


def register(sub) -> None:
    s = sub.add_parser("fsck", help="check, repair or salvage a log", description=__doc__,
                       formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    s.add_argument("source", help="directory holding book.log and meta.bin")
    s.add_argument("--repair", action="store_true", help="cut a torn tail (nothing else)")
    s.add_argument("--salvage", metavar="OUT", help="write every recoverable event to a "
                                                    "new log in OUT")
    s.add_argument("--json", metavar="FILE", help="also write the findings as JSON")
    s.set_defaults(func=run)
