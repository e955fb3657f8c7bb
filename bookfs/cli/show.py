"""``bookfs show SOURCE N[..M]``: events as a person reads them.

For each event: its number, date, wire and card tag, its size and mug, and the noun in the
dojo's notation (:mod:`bookfs.noun.render`).  A ship event ``[date [wire card]]`` shows the card
as its noun; any other event shows the whole noun (a lifecycle event of the boot when it is
among the log's first ``life`` events).  A payload that is not a noun (no jam that cues
exactly, no valid ram encoding) is one ``error:`` line: the event, the byte of its payload
where parsing failed, and why.  Events in vere's ram encoding are decoded too (bob atoms
from the pier's ``.urb/bob``; a missing bob file is shown as a reference and said so).

SOURCE is a bookfs mount (its ``events/N`` files are read) or any log
:func:`~bookfs.formats.pier.open_source` opens (a pier, a Book directory, an LMDB epoch).

By default the rendering is abbreviated (:data:`bookfs.noun.render.DEFAULT`) and the jam is
read in place (:class:`~bookfs.noun.view.JamView`): a 100 MB event costs a few reads of its
bytes and prints in well under a second, and memory does not grow with the event.
``--full`` cues the whole event (memory as :func:`~bookfs.noun.cue` needs) and shows
everything.  ``--json`` prints one JSON object per line (the exact noun, no heuristics).

The rendering is :func:`bookfs.noun.event.event_text`; the mount's ``pretty/N`` files serve the same.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable

from bookfs.formats.info import parse as parse_info
from bookfs.noun.event import Pread, event_text
from bookfs.noun.render import DEFAULT

# --- sources -----------------------------------------------------------------------------


def _bob_dir(path: str | None) -> str | None:
    """The ``.urb/bob`` of the pier the source is in (ram events' bob atoms), if any."""
    from bookfs.formats.recovery import bob_dir_for

    return bob_dir_for(path)


class _MountSource:
    """A bookfs mount: ``events/N`` files, ``info`` and ``meta/who``."""

    def __init__(self, path: str):
        self.path = path
        with open(os.path.join(path, "info")) as f:
            fields = {"first": "0", "last": "0", **parse_info(f.read())}
        self.range = int(fields["first"]), int(fields["last"])
        self.life = int(fields["life"]) if fields.get("life", "").isdigit() else None
        self.bob_dir = _bob_dir(fields.get("path"))
        try:
            with open(os.path.join(path, "meta", "who"), "rb") as f:
                self.who = int.from_bytes(f.read(), "little")
        except OSError:
            self.who = None

    def payload(self, event: int) -> tuple[int, Pread, Callable[[], None]]:
        fd = os.open(os.path.join(self.path, "events", str(event)), os.O_RDONLY)
        return os.fstat(fd).st_size, lambda off, n: os.pread(fd, n, off), lambda: os.close(fd)

    def close(self) -> None:
        """Nothing to release: each payload's descriptor is closed by its own closer."""


class _LogSource:
    """A log :func:`~bookfs.formats.pier.open_source` opens, read-only."""

    SMALL = 1 << 20  # payloads up to this are read whole; larger ones in slices

    def __init__(self, path: str):
        from bookfs.errors import MetaAbsent
        from bookfs.formats.pier import open_source

        self.log = open_source(path)
        self.range = self.log.gulf()
        try:
            self.who = int.from_bytes(self.log.read_meta("who"), "little")
            self.life = int.from_bytes(self.log.read_meta("life"), "little")
        except MetaAbsent:
            self.who = self.life = None
        self.bob_dir = _bob_dir(self.log.directory)

    def payload(self, event: int) -> tuple[int, Pread, Callable[[], None]]:
        size = self.log.payload_size(event)
        if size <= self.SMALL:
            data = self.log.read(event)
            return size, lambda off, n: data[off:off + n], lambda: None
        self.log.verify_event(event)  # the format's check, streamed
        return size, lambda off, n: self.log.read_slice(event, off, n), lambda: None

    def close(self) -> None:
        self.log.close()


def is_mount(path: str) -> bool:
    """True if ``path`` looks like a bookfs mount (``events/`` and ``info``)."""
    return os.path.isdir(os.path.join(path, "events")) and os.path.isfile(
        os.path.join(path, "info"))


def open_any(path: str):
    """A mount or a log source for ``show`` and ``report`` (``range``, ``who``,
    ``payload(event)`` and ``close()``)."""
    return _MountSource(path) if is_mount(path) else _LogSource(path)


_RANGE = re.compile(r"(\d+)(?:\.\.(\d+))?")


def parse_range(text: str) -> tuple[int, int]:
    """``N`` or ``N..M`` (N <= M, both >= 1); ``ValueError`` with a one-line reason."""
    m = _RANGE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"expected an event number N or a range N..M, got {text!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else first
    if first < 1 or last < first:
        raise ValueError(f"expected 1 <= N <= M in N..M, got {text!r}")
    return first, last


def run(args) -> int:
    try:
        first, last = parse_range(args.events)
    except ValueError as e:
        print(f"bookfs show: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.source):
        print(f"bookfs show: {args.source}: no such file or directory; expected a bookfs "
              "mount, a pier, a Book directory or an LMDB epoch", file=sys.stderr)
        return 2
    source = open_any(args.source)
    try:
        have = source.range
        if not have[1] or first < have[0] or last > have[1]:
            held = f"it holds {have[0]}..{have[1]}" if have[1] else "it is empty"
            print(f"bookfs show: no event {first if first < have[0] or not have[1] else last}"
                  f" in {args.source} ({held})", file=sys.stderr)
            return 1
        limits = None if args.full else DEFAULT
        out = sys.stdout
        event = first
        for event in range(first, last + 1):
            size, pread, done = source.payload(event)
            try:
                for piece in event_text(event, size, pread, limits=limits, who=source.who,
                                        as_json=args.json, life=source.life,
                                        bob_dir=source.bob_dir):
                    out.write(piece)
            finally:
                done()
        out.flush()
    except OSError as e:
        if not isinstance(e, BrokenPipeError):
            print(f"bookfs show: event {event}: {e.filename or args.source}: {e.strerror}"
                  + _eio_hint(e, args.source), file=sys.stderr)
            return 1
        # show 1..100000 | head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        source.close()
    return 0


def _eio_hint(e: OSError, source: str) -> str:
    """What to run when a mount refused an event's bytes (EIO: they fail the log's check,
    and the mount serves no corrupt byte), naming the log it mounts."""
    import errno

    if e.errno != errno.EIO:
        return ""
    from bookfs.fs.mountinfo import mount_at

    m = mount_at(source)
    log = m.bookfs_source if m is not None and m.is_bookfs and m.bookfs_source else "the log"
    return (f": the mount refused its bytes, which fail the log's check; `bookfs verify "
            f"{log}` names the damage, `bookfs fsck {log}` says what can be repaired")


def register(sub) -> None:
    s = sub.add_parser("show", help="print events as readable nouns", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("source", help="a bookfs mount, a pier, a Book directory or an LMDB epoch")
    s.add_argument("events", metavar="N[..M]", help="an event number or an inclusive range")
    s.add_argument("--full", action="store_true",
                   help="show everything: no abbreviation (cues the whole event)")
    s.add_argument("--json", action="store_true",
                   help="one JSON object per event: the exact noun, date, wire, card")
    s.set_defaults(func=run)
