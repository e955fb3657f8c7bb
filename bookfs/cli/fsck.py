"""``bookfs fsck``: check a log, repair what is safe, salvage what can be saved.

SOURCE is any source bookfs opens: a UIP-layout or vere-layout Book directory, an LMDB
epoch, or a pier (each epoch checked through its own format).  The source is identified
first, by the same detection the mount uses; an unknown or mismatched layout is refused
and nothing is touched.  Each format fills in the same ladder:

check      read-only: every problem with its byte offset (headers, meta.bin, framing, CRCs
           or batch CRCs, torn tails, bytes that are not committed deeds); with --nouns,
           also every event decoded: a jam that cues completely and exactly, or vere's
           ram encoding (bob atoms from the pier's .urb/bob), and every event that does
           not decode listed with the byte of its payload where parsing failed (the only
           check of an old payload in vere's layout, which has no CRC per deed, and in
           LMDB).  It only reports: nothing is repaired or cut because an event does not
           decode.  --mugs is accepted as --nouns: a stored mug is the mug of Arvo's state
           after the event, which cannot be checked without replaying the ship.
--repair   only what is safe for the format, saying each thing done.  UIP layout: cut a
           torn tail.  vere's layout: what a writable open does (roll back a batch that was
           never acknowledged, cut a torn tail, copy anything that may hold events to a
           quarantine file before cutting it, rewrite a header slot; pad a file under 8192
           bytes).  Both: create a missing meta.bin zero-filled.  LMDB: refused (bookfs
           never writes LMDB).  A pier: its .vere.lock is taken, each Book epoch repaired.
--salvage OUT  every recoverable event into a new log in OUT (a pier: OUT/0iN/ per
           epoch), with salvage-report.json listing the gaps.  Only committed events become
           events of the new log: deeds past the committed end (a batch the format's
           recovery rolls back), damaged bytes and payloads under 4 bytes are copied byte
           for byte to salvage-left-out.bin beside it, and the summary line says what was
           left out and why.  OUT is built in OUT.salvage-partial and renamed into place:
           a killed salvage leaves OUT as it was, and running it again starts over.  A log
           is contiguous, so events after a gap get lower numbers than they had: a warning
           on stderr says so, for each log where it happened.

Exit status (like e2fsck): 0 no problem; 1 problems found and all repaired; 4 problems
left; 8 the source could not be checked at all (not a log, unreadable); 2 bad usage (no
such SOURCE directory, OUT or FILE where they cannot be written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from bookfs.errors import BookError, ReadOnly
from bookfs.formats.nouncheck import MUGS_NOTE
from bookfs.formats.reports import CheckReport

EXIT_CLEAN, EXIT_REPAIRED, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 4, 8


def check(path: str, *, mugs: bool = False, progress=None) -> CheckReport:
    """Check the source at ``path`` through its format's recovery (nothing is modified)."""
    from bookfs.formats.pier_recovery import recovery_for

    return recovery_for(path).check(mugs=mugs, progress=progress)


def repair(path: str, rep: CheckReport) -> list[str]:
    """The format's safe repairs for a checked source; returns what was done."""
    from bookfs.formats.pier_recovery import recovery_for

    return recovery_for(path).repair(rep)


def salvage(path: str, rep: CheckReport, out: str, *, progress=None) -> dict:
    """Every recoverable event of a checked source into a new log at ``out`` (the
    format's ``Recovery.salvage``: only committed events become events; the rest is kept
    in ``out/salvage-left-out.bin``; published by rename)."""
    from bookfs.formats.pier_recovery import recovery_for

    return recovery_for(path).salvage(rep, out, progress=progress)


def _print_report(rep: CheckReport) -> None:
    for p in rep.all_problems():
        where = f"offset {p.offset}" if p.offset is not None else "-"
        ev = f" (event {p.event})" if p.event is not None else ""
        print(f"{p.kind:10} {where:>20}{ev}: {p.message}")
    for part in rep.parts:
        print(f"  {part.path}: {part.format}, events {part.first}..{part.last} "
              f"({part.events}), {len(part.all_problems())} problem(s)")
    print(f"{rep.path} ({rep.format}): events {rep.first}..{rep.last} ({rep.events}), "
          f"{len(rep.all_problems())} problem(s){nouns_clause(rep)}")


def nouns_clause(rep: CheckReport) -> str:
    """``; nouns: N checked (R ram), K do not decode`` for a report made with --nouns
    (its epochs' counts included), else empty."""
    reps = [rep, *rep.parts]
    checked = sum(r.nouns_checked for r in reps)
    if not checked:
        return ""
    ram = sum(r.nouns_ram for r in reps)
    bad = sum(1 for p in rep.all_problems() if p.kind == "noun")
    return (f"; nouns: {checked} checked ({ram} ram), {bad} do not decode"
            + (" (reported only: nothing is repaired or cut for it)" if bad else ""))


def left_out_line(res: dict) -> str:
    """What a salvage left out of the new log and why, in one clause for its summary line
    (``res`` is what ``salvage`` returned): deeds never committed, payloads under 4 bytes,
    damaged bytes, and the file(s) holding them byte for byte."""
    from bookfs.formats.salvage import (
        DAMAGED,
        NOT_COMMITTED,
        SHORT_PAYLOAD,
        left_out_summary,
    )

    records = res.get("left_out") or []
    if not records:
        return "nothing left out"
    by = left_out_summary(records)
    parts = []
    if NOT_COMMITTED in by:
        k = by[NOT_COMMITTED]
        first = next(r for r in records if r["kind"] == NOT_COMMITTED)
        more = f" (and {k['ranges'] - 1} more range(s))" if k["ranges"] > 1 else ""
        where = f"{first['epoch']}: " if "epoch" in first else ""
        parts.append(f"{k['deeds']} deed(s) never committed ({k['bytes']} bytes; "
                     f"{where}{first['why']}{more})")
    if SHORT_PAYLOAD in by:
        events = [str(r.get("original_event")) for r in records if r["kind"] == SHORT_PAYLOAD]
        parts.append(f"{by[SHORT_PAYLOAD]['ranges']} payload(s) under 4 bytes, no room for "
                     f"a mug (event(s) {', '.join(events[:5])}"
                     f"{', ...' if len(events) > 5 else ''})")
    if DAMAGED in by:
        parts.append(f"{by[DAMAGED]['bytes']} damaged byte(s) (deeds that fail their CRC or "
                     "do not frame)")
    files = sorted({os.path.join(res["out"], r["file"]) for r in records})
    return (f"left out, not as events: {'; '.join(parts)}; kept byte for byte in "
            f"{', '.join(files)}")


def _plural(n: int, word: str) -> str:
    """``1 gap``, ``2 gaps``, ``no gap``."""
    return f"no {word}" if n == 0 else f"{n} {word}" if n == 1 else f"{n} {word}s"


def renumbering(res: dict) -> list[str]:
    """One line per salvaged log whose events were renumbered: events recovered after a
    gap that lost events have lower numbers in the new, contiguous log than in the source.
    ``res`` is what ``salvage`` returned (a pier's report lists its epochs)."""
    logs = ({name: e["last"] for name, e in res["epochs"].items()} if "epochs" in res
            else {None: res.get("last")})
    out = []
    for name, last in logs.items():
        gaps = [g for g in res["gaps"] if g.get("epoch") == name
                and g.get("events_lost", 0) != 0 and last
                and g.get("after_new_event", last) < last]
        if not gaps:
            continue
        known = sum(g["events_lost"] for g in gaps if isinstance(g["events_lost"], int))
        unknown = any(not isinstance(g["events_lost"], int) for g in gaps)
        lost = (f"{known} event(s)" if not unknown else
                f"{known} event(s) plus an unknown number" if known else
                "an unknown number of events")
        where = os.path.join(res["out"], name) if name else res["out"]
        after = gaps[0]["after_new_event"]
        out.append(f"{where}: events after {after} are RENUMBERED: {lost} lost in "
                   f"{_plural(len(gaps), 'gap')} before its last event, so each later "
                   "event has a lower number than in the source (see salvage-report.json)")
    return out


def run(args) -> int:
    """The ``bookfs fsck`` command."""
    from bookfs.cli.commands import _progress_bar
    from bookfs.errors import UsageError
    from bookfs.formats.pier_recovery import recovery_for

    if args.salvage and os.path.isdir(args.salvage) and os.listdir(args.salvage):
        raise UsageError(f"--salvage {args.salvage}: not empty; expected a new or empty "
                         "directory (a salvage never writes into an existing log)")
    try:
        rec = recovery_for(args.source)
        if args.mugs:
            print(f"bookfs fsck: note: {MUGS_NOTE}", file=sys.stderr)
        nouns = args.nouns or args.mugs
        factor = 2 if nouns else 1
        with _progress_bar(factor * rec.size(), "fsck") as bar:
            rep = rec.check(mugs=nouns, progress=bar.update)
    except (BookError, OSError) as e:
        print(f"bookfs fsck: {e}", file=sys.stderr)
        return EXIT_ERROR
    _print_report(rep)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"path": rep.path, "format": rep.format, "first": rep.first,
                       "last": rep.last, "events": rep.events,
                       "problems": [asdict(p) for p in rep.all_problems()]}, f, indent=2)
    code = EXIT_CLEAN if rep.clean else EXIT_PROBLEMS
    if args.repair:
        try:
            done = rec.repair(rep) if not rep.clean or not rec.writes else []
        except ReadOnly as e:  # a format bookfs never writes: checked only
            print(f"not repaired: {e}")
        except BookError as e:
            print(f"bookfs fsck: repair failed: {e}", file=sys.stderr)
            return EXIT_ERROR
        else:
            for line in done:
                print(f"repaired: {line}")
            if rep.clean and rec.writes:
                print("nothing to repair")
            else:
                after = rec.check(mugs=nouns)
                if after.clean:
                    print("the log is clean")
                    code = EXIT_REPAIRED
                elif all(p.kind == "noun" for p in after.all_problems()):
                    print(f"{len(after.all_problems())} event(s) do not decode: reported "
                          "only, nothing is repaired, cut or quarantined for that")
                else:
                    print(f"{len(after.all_problems())} problem(s) remain: "
                          + ("only a torn tail is safe to cut in the UIP layout; "
                             if rec.kind == "uip" else "")
                          + "use --salvage OUT to copy every recoverable event")
                    for p in after.all_problems():
                        print(f"  {p.kind}: {p.message}")
                rep = after
    if args.salvage:
        try:
            with _progress_bar(rec.size(), "salvage") as bar:
                res = rec.salvage(rep, args.salvage, progress=bar.update)
        except (BookError, OSError) as e:
            print(f"bookfs fsck: salvage failed, {args.salvage} was not written: {e}",
                  file=sys.stderr)
            return EXIT_ERROR
        where = " across its epochs" if "epochs" in res else ""
        print(f"salvaged {res['recovered']} events into {res['out']} "
              f"({_plural(len(res['gaps']), 'gap')}{where}; {left_out_line(res)}; see "
              "salvage-report.json)")
        for line in renumbering(res):
            print(f"bookfs fsck: warning: {line}", file=sys.stderr)
    return code


def register(sub) -> None:
    s = sub.add_parser("fsck", help="check, repair or salvage any log", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    from bookfs.cli.args import dir_to_create, file_to_write, log_source

    s.add_argument("source", type=log_source,
                   help="a Book directory (UIP or vere layout), an LMDB epoch, a pier, or a "
                        "bookfs mount of one")
    s.add_argument("--repair", action="store_true",
                   help="do the repairs that are safe for the format, and say what was done")
    s.add_argument("--salvage", metavar="OUT", type=dir_to_create,
                   help="write every recoverable event to a new log in OUT (new or empty)")
    s.add_argument("--nouns", action="store_true",
                   help="also decode every event (jam or ram) and list each that does not "
                        "decode, with the byte where parsing failed (reported, never "
                        "repaired)")
    s.add_argument("--mugs", action="store_true",
                   help="the same as --nouns (a stored mug is the mug of Arvo's state "
                        "after the event: it cannot be checked without replaying the ship)")
    s.add_argument("--json", metavar="FILE", type=file_to_write,
                   help="also write the findings as JSON")
    s.set_defaults(func=run)
