"""``bookfs show SOURCE N[..M]``: events as a person reads them.
``bookfs show --follow MNT [N[..M]]``: events as they are committed, like ``tail -f``.

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

``--follow`` (``-f``) reads a bookfs mount (read-only ones follow a writer, and a pier's
rolls): it prints every event from N (default: the first one committed after it
started) as it is committed, until event M or Ctrl-C (exit status 130, nothing more
printed).  It waits through the mount's ``follow/N`` (each lookup waits up to the
mount's ``follow_timeout``, then is asked again), in a child process: the kernel lets
no signal end a lookup the mount is serving (``fs/fuse/dev.c``,
``request_wait_answer()``), so Ctrl-C ends ``show`` at once and the child ends when its
lookup is answered.
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
    from bookfs.formats.nouncheck import bob_dir_for

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
    if args.follow:
        return _follow(args)
    if args.events is None:
        print("bookfs show: expected an event number N or a range N..M (or --follow)",
              file=sys.stderr)
        return 2
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


# --- --follow --------------------------------------------------------------------------


def _print_event(source: _MountSource, event: int, args) -> None:
    size, pread, done = source.payload(event)
    try:
        for piece in event_text(event, size, pread, limits=None if args.full else DEFAULT,
                                who=source.who, as_json=args.json, life=source.life,
                                bob_dir=source.bob_dir):
            sys.stdout.write(piece)
    finally:
        done()
    sys.stdout.flush()  # one event at a time: a pipe sees it as it commits


def _wait_in_child(path: str) -> int:
    """``stat(path)`` (a lookup under ``follow/``, which waits) in a child process: 0 once
    it answers, else its errno.  Ctrl-C interrupts our ``waitpid`` at once (a
    ``KeyboardInterrupt``); the child, which ignores it and holds none of our output,
    ends by itself when the mount answers its lookup (module docstring)."""
    import signal

    pid = os.fork()
    if pid == 0:  # the child: no Python cleanup, no output, no traceback
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.stat(path)
        except OSError as e:
            code = e.errno or 1
        except BaseException:
            code = 1
        os._exit(code & 0xFF)
    _, status = os.waitpid(pid, 0)  # Ctrl-C: KeyboardInterrupt here, the child goes on
    return os.waitstatus_to_exitcode(status)


def _follow(args) -> int:
    """``--follow``: print events as they commit, through the mount's ``follow/``."""
    import errno

    path = args.source
    if not is_mount(path) or not os.path.isdir(os.path.join(path, "follow")):
        print(f"bookfs show: --follow reads a bookfs mount's follow/, and {path} is not "
              "one; mount the log first (bookfs mount -o ro LOG MNT)", file=sys.stderr)
        return 2
    try:
        first, last = parse_range(args.events) if args.events else (None, None)
        if args.events and ".." not in args.events:
            last = None  # N alone: from N on
    except ValueError as e:
        print(f"bookfs show: {e}", file=sys.stderr)
        return 2
    event = first
    try:
        source = _MountSource(path)
        if event is None:
            event = source.range[1] + 1 if source.range[1] else 1
        while last is None or event <= last:
            try:
                _print_event(source, event, args)
                event += 1
                continue
            except FileNotFoundError:
                pass  # not committed yet: wait for it
            err = _wait_in_child(os.path.join(path, "follow", str(event)))
            if err in (0, errno.ETIMEDOUT):
                continue  # committed, or not yet: look again
            what = {errno.ENOENT: f"no event {event} (the log starts after it)",
                    errno.ESHUTDOWN: "the mount went away"}.get(err, os.strerror(err))
            print(f"bookfs show: {path}: {what}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # show --follow | head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        print(f"bookfs show: event {event}: {e.filename or path}: {e.strerror}"
              + _eio_hint(e, path), file=sys.stderr)
        return 1
    return 0


def _eio_hint(e: OSError, source: str) -> str:
    """What to run when a mount refused an event's bytes (EIO: they fail the log's check,
    and the mount serves no corrupt byte), naming the log it mounts."""
    import errno

    if e.errno != errno.EIO:
        return ""
    from bookfs.fs.daemon.mountinfo import mount_at

    m = mount_at(source)
    log = m.bookfs_source if m is not None and m.is_bookfs and m.bookfs_source else "the log"
    return (f": the mount refused its bytes, which fail the log's check; `bookfs verify "
            f"{log}` names the damage, `bookfs fsck {log}` says what can be repaired")


def register(sub) -> None:
    s = sub.add_parser("show", help="print events as readable nouns", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("source", help="a bookfs mount, a pier, a Book directory or an LMDB epoch")
    s.add_argument("events", metavar="N[..M]", nargs="?",
                   help="an event number or an inclusive range (with --follow: start at "
                        "N, stop after M; default: from the next event committed, on)")
    s.add_argument("--full", action="store_true",
                   help="show everything: no abbreviation (cues the whole event)")
    s.add_argument("--json", action="store_true",
                   help="one JSON object per event: the exact noun, date, wire, card")
    s.add_argument("-f", "--follow", action="store_true",
                   help="on a bookfs mount: print events as they are committed, until "
                        "Ctrl-C (like tail -f; waits through the mount's follow/)")
    s.set_defaults(func=run)
