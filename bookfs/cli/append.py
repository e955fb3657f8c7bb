"""``bookfs append MNT FILE...``: append files as events through a mount's ``new/``, and
say what happened to each one.

Appending is ``cp FILE MNT/new/N``, but a shell ignores the errno of ``close()``, which is
where a refused append is reported (DESIGN.md, the ``new/`` contract): ``printf abc >
new/N`` returns 0.  This command does the same create, write and close, takes the real
result of each ``close()`` (the commit; 0 means durable and visible), and for a refusal
reads the reason from the ``last refusals`` section of ``MNT/info``, matched by path and
by this process's ID.

Contract:

* Each FILE (``-`` is standard input, at most once) becomes the next event, in the order
  given.  One line per file: ``event 43 <- a.bin (1,234 bytes)`` on stdout, or
  ``a.bin: refused: <reason> [ERRNO]`` on stderr.
* It stops at the first refusal, because the files are a sequence: the next one would
  otherwise take the refused one's place.  ``--keep-going`` goes on with the next file
  (at the number the refused one would have had).
* Without ``--at`` the number is the mount's ``next:`` (in ``info``).  If another writer
  takes it first (EEXIST at create), the next number is tried, so the file still goes in,
  at the first free number; if a number turns out to leave a gap (another writer's
  reservation failed and freed its number), ``next:`` is read again; if another writer's
  failed event cancelled this one (ECANCELED, nothing saved), a regular file is sent
  again.  With ``--at N`` the first file must become event N, the next N+1, ...; a
  number taken or out of order is a refusal, and nothing is retried.
* Only whole files are committed: if reading a FILE fails, or a signal stops the command
  before the file's close, the half-written ``new/<N>`` is emptied before its close, so
  the daemon refuses it.
* A close whose outcome nobody can know is not a refusal: when the daemon went away
  during it (ENOTCONN, ECONNABORTED: killed after the whole deed was written, say) or
  the close was interrupted (:data:`INDETERMINATE`), or it failed and the mount no longer
  answers, the event may or may not be in the log.  It says so (``a.bin: outcome
  unknown: ...``) and how to check: remount, then read ``next:`` in ``MNT/info`` (past
  the number: the file is that event; compare it with ``MNT/events/<N>``).  Then it
  stops, ``--keep-going`` or not, with the files after it not tried: appending again
  before checking could append the same file twice.
* Exit status: 0 if every file went in, 1 if any was refused, 2 for bad usage (MNT not a
  bookfs mount or mounted read-only, a FILE missing, unreadable or a directory, ``-``
  twice), checked before anything is appended; 3 if an outcome is unknown (above); 128 +
  the signal's number (130 for Ctrl-C) if a signal stopped it before a file (below).
* Ctrl-C (SIGINT), SIGTERM and SIGHUP (:class:`Signals`): what it says is what the log
  holds, whenever the signal comes.  During start-up (loading, the checks, finding the
  mount, checking the files): ``interrupted`` (``bookfs.cli.main``) or ``bookfs append:
  interrupted; nothing was appended``.
  Before a file's close has started (before its create, while it is read or written):
  the file is emptied, its close refused, nothing of it saved, and ``bookfs append:
  interrupted; FILE and the files after it were not appended``.  Once its close has
  started, the close is waited for (so does the kernel: ``fs/fuse/file.c``,
  ``fuse_flush()``, sends the FLUSH with ``args.force``, and ``fs/fuse/dev.c``,
  ``request_wait_answer()``, waits a forced request out whatever the signal) and its
  outcome is reported as without the signal (``event 43 <- a.bin``, a refusal, an
  unknown outcome); then it stops before the next file, with the line above for it.  A
  signal that comes while the last file is committed leaves nothing undone: the status
  is then as without it.  Another signal changes nothing (SIGKILL still ends it: a
  writer killed before its close commits nothing).  Every event appended has its
  ``event`` line on stdout before the command stops.
* Payloads are checked (issue 21): each regular FILE must be a 4-byte mug and a jam that
  cues completely and exactly, or vere's ram encoding, whatever the mug
  (:mod:`bookfs.noun.payload`, the daemon's own check).  Every FILE
  is checked before anything is appended; one that is not a payload is bad usage (exit
  2), named with the byte where parsing failed.  Standard input and pipes are read once,
  so the mount checks them as they are written, and refuses one that is not a payload at
  its close (a refusal, exit 1).  ``--unchecked`` checks nothing here and sets
  ``user.bookfs.unchecked`` on each ``new/<N>`` it writes, so the mount accepts it as
  it is (as ``-o unchecked_payloads`` does for a whole mount).
* Events only: ``meta/`` fields are written with ``cp``/``printf`` and their refusals read
  in ``info``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import stat
import sys
import time
from dataclasses import dataclass
from datetime import datetime

from bookfs.formats.layout import MIN_PAYLOAD
from bookfs.formats.info import NEXT_KEY, REFUSALS_HEADER
from bookfs.fs.daemon.mountinfo import bookfs_mount_at
from bookfs.noun.payload import check_payload_file

CHUNK = 1 << 20  # bytes per write
#: A close that fails with one of these has an unknown outcome: the daemon went away (or
#: the connection to it was cut) while it committed, or the close was interrupted; the
#: event may be durable.  Never a refusal, never retried.
INDETERMINATE = frozenset({errno.ENOTCONN, errno.ECONNABORTED, errno.ECONNRESET,
                           errno.EINTR, errno.ETIMEDOUT, errno.ENODEV, errno.ENXIO,
                           errno.EPIPE})
EXIT_UNKNOWN = 3
MAX_TRIES = 100  # create attempts per file while other writers take the numbers
STDIN = "-"
UNCHECKED_XATTR = "user.bookfs.unchecked"  # nodes/new.py: "1" turns the check off
_LINE = re.compile(r"^  (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}) (\S+) (\S+) "
                   r"pid (\S+): (.*)$")


#: The signals the command answers: Ctrl-C, ``kill``'s default, a terminal that went away.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Tests only: ``POINT[:K[:SIGNAME]]`` sends this process SIGINT (or SIGNAME) the K-th
#: time (1 by default) it reaches POINT, one of :data:`POINTS`, so every moment a signal
#: can come is reached without timing (tests/test_append_interrupt.py).
SIGNAL_AT_ENV = "BOOKFS_TEST_APPEND_SIGNAL"
#: Where :data:`SIGNAL_AT_ENV` can send it, in the order a run reaches them: start-up
#: (``start``, ``checked``), each FILE's open, the create of ``new/<N>``, each read and
#: write, its end read, just before and just after the close, and after its line.
POINTS = ("start", "checked", "open", "create", "read", "write", "eof", "close", "closed",
          "reported")


class UsageError(Exception):
    """Bad usage: one line for the user, exit status 2."""


class Interrupted(KeyboardInterrupt):
    """A signal of :data:`SIGNALS` stopped the command where nothing is half done."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Signals:
    """SIGINT, SIGTERM and SIGHUP while ``bookfs append`` runs; the first one counts.

    Python runs a signal's handler between two bytecodes of the main thread, so a handler
    that raises can cut the command anywhere: between the close that committed a file and
    the line that says so (issue 33, item 7).  This handler raises :class:`Interrupted`
    only while :attr:`raising` (start-up, and inside :meth:`interruptible`: a FILE's open
    and reads, which may wait for ever on a pipe or a FIFO, and hold nothing of the
    mount).  Everywhere else it only notes the signal, and the command asks :meth:`check`
    where stopping leaves nothing half done: before each file's create, between its
    writes, before its close.  Once a file's close has started, its outcome is reported
    first.  Nothing the handler could interrupt is lost by the wait: the kernel does not
    let a SIGINT or SIGTERM cut short a FUSE request (create, write, truncate, close)
    once the daemon has it (``fs/fuse/dev.c``, ``request_wait_answer()``: only a fatal
    signal ends the wait of an unforced one), and Python retries the system calls a
    handler that does not raise interrupted (PEP 475), ``close`` excepted."""

    def __init__(self):
        self.signum: int | None = None
        self.raising = True  # start-up: nothing is under way
        self._points: dict[str, tuple[int, int]] = {}
        at = os.environ.get(SIGNAL_AT_ENV, "")
        if at:
            point, _, rest = at.partition(":")
            k, _, name = rest.partition(":")
            if point not in POINTS:
                raise ValueError(f"{SIGNAL_AT_ENV}={at}: expected one of {POINTS}")
            self._points[point] = (int(k or 1), getattr(signal, name or "SIGINT"))

    def install(self) -> None:
        for s in SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self.raising:
            self.raising = False  # once: the code that catches it runs held
            raise Interrupted(self.signum)

    def hold(self) -> None:
        """From now on a signal is only noted (until :meth:`interruptible`)."""
        self.raising = False

    def check(self) -> None:
        """Raise :class:`Interrupted` if a signal came."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def interruptible(self):
        """A block a signal may cut short (it raises :class:`Interrupted`)."""
        self.raising = True
        try:
            self.check()
            yield
        finally:
            self.raising = False

    def point(self, name: str) -> None:
        """Where :data:`SIGNAL_AT_ENV` may send a signal (tests only)."""
        hit = self._points.get(name)
        if hit is not None:
            k, signum = hit
            self._points[name] = (k - 1, signum)
            if k == 1:
                os.kill(os.getpid(), signum)  # handled before os.kill returns

    @contextlib.contextmanager
    def masked(self):
        """A block the signals wait out, blocked in this thread: a thread started in it
        (tqdm's monitor) inherits the mask and never takes one, so they all come to the
        main thread, and :meth:`finish` can block them in the whole process."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def finish(self) -> None:
        """Block the signals for the rest of the process: the command has said what it
        did, and a signal now (or while Python exits, which puts back the default
        handlers) must not change its status.  A blocked signal still pending when the
        process exits is dropped."""
        self.hold()
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


@dataclass(frozen=True)
class Recorded:
    """One line of the mount's refusal record."""

    when: float  # seconds since the epoch (whole seconds)
    path: str
    errno_name: str
    pid: int | None
    reason: str


def mount_readonly(path: str) -> bool:
    """Whether the bookfs mount at ``path`` is read-only.  Raises :class:`UsageError` if
    ``path`` is not a bookfs mount point."""
    return bookfs_mount_at(path).readonly


def read_info(mnt: str) -> tuple[dict[str, str], list[Recorded]]:
    """``MNT/info`` as ``(key -> value, the refusal record oldest first)``."""
    with open(os.path.join(mnt, "info"), encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    keys: dict[str, str] = {}
    record: list[Recorded] = []
    section = False  # inside the refusal record
    for line in lines:
        m = _LINE.match(line) if section else None
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S %z").timestamp()
            pid = int(m.group(4)) if m.group(4).isdigit() else None
            record.append(Recorded(when, m.group(2), m.group(3), pid, m.group(5)))
        elif ":" in line and not line.startswith(" "):
            key, _, value = line.partition(":")
            keys[key.strip()] = value.strip()
            section = key == REFUSALS_HEADER
    return keys, record


def refusal_reason(mnt: str, path: str, err: int, since: float) -> str:
    """Why ``path`` (``new/43``) was refused to this process since ``since``: the newest
    matching line of the refusal record, else the errno's text."""
    name = errno.errorcode.get(err, str(err))
    try:
        _, record = read_info(mnt)
    except OSError:
        record = []
    for r in reversed(record):
        if r.path == path and r.pid in (os.getpid(), None) and r.when >= int(since):
            return f"{r.reason} [{r.errno_name}]"
    return f"{os.strerror(err)} [{name}]"


def next_number(mnt: str) -> int:
    keys, _ = read_info(mnt)
    try:
        return int(keys[NEXT_KEY])
    except (KeyError, ValueError):
        raise UsageError(f"{mnt}/info has no '{NEXT_KEY}:' line; expected a read-write "
                         "bookfs mount") from None


def check_files(files: list[str], payloads: bool = False) -> list[int | None]:
    """The size of each FILE (None for stdin or a pipe), or :class:`UsageError`; with
    ``payloads``, also that each regular FILE is an event payload (a mug and a noun)."""
    if files.count(STDIN) > 1:
        raise UsageError("'-' (standard input) can be given only once")
    sizes: list[int | None] = []
    for name in files:
        if name == STDIN:
            sizes.append(None)
            continue
        try:
            st = os.stat(name)
        except OSError as e:
            raise UsageError(f"{name}: {e.strerror}; expected a file to append") from None
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{name}: is a directory; expected a file to append")
        if not os.access(name, os.R_OK):
            raise UsageError(f"{name}: not readable; expected a file to append")
        sizes.append(st.st_size if stat.S_ISREG(st.st_mode) else None)
    if payloads:
        for name, size in zip(files, sizes):
            if size is None:
                continue  # read once: the mount checks it as it is written
            try:
                bad = check_payload_file(name)
            except OSError:
                continue  # its append reads it again, and says what failed then
            if bad is not None:
                raise UsageError(f"{name}: not an event payload: {bad.refusal}; nothing was "
                                 "appended (--unchecked appends it as it is)")
    return sizes


class Appender:
    """Appends files through ``MNT/new/`` one at a time (see the module's contract).
    ``signals`` (:class:`Signals`, held) is asked where a file may stop."""

    def __init__(self, mnt: str, at: int | None, progress, unchecked: bool = False,
                 signals: Signals | None = None):
        self.mnt = mnt
        self.unchecked = unchecked  # ask the mount not to check the payloads
        self.at = at  # the number the next file must take, if insisted on
        self.progress = progress
        self.signals = signals or Signals()
        self.unknown = False  # a close's outcome is unknown: append nothing more

    def _answers(self) -> bool:
        """Whether the mount still answers (its ``info`` can be read)."""
        try:
            read_info(self.mnt)
        except OSError:
            return False
        return True

    def _unknown(self, shown: str, n: int, err: int) -> str:
        """The line for a close whose outcome is unknown, with how to check it."""
        self.unknown = True
        name = errno.errorcode.get(err, str(err))
        return (f"{shown}: outcome unknown: new/{n}: the close failed with "
                f"{os.strerror(err)} [{name}], which does not say whether the event was "
                f"saved (the mount's daemon went away during the commit?); it may be "
                f"event {n}.  To check: remount, then read 'next:' in {self.mnt}/info: "
                f"if it is past {n}, {shown} is event {n} (compare it with "
                f"{self.mnt}/events/{n}); do not append it again before checking")

    def _create(self) -> tuple[int, int] | tuple[None, str]:
        """``(number, fd)`` of a new ``new/<N>``, or ``(None, reason)`` if refused;
        :class:`Interrupted` before a create after a signal."""
        n = self.at if self.at is not None else next_number(self.mnt)
        gap_retried = False
        for _ in range(MAX_TRIES):
            since = time.time()
            self.signals.check()  # nothing of this file exists yet
            self.signals.point("create")
            try:
                fd = os.open(os.path.join(self.mnt, "new", str(n)),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                return n, fd
            except OSError as e:
                if self.at is None and e.errno == errno.EEXIST:
                    n += 1  # another writer took it: the next one is free
                    continue
                if self.at is None and e.errno == errno.EINVAL and not gap_retried:
                    fresh = next_number(self.mnt)  # a number freed under us: ask again
                    gap_retried = True
                    if fresh != n:
                        n = fresh
                        continue
                return None, f"new/{n}: " + refusal_reason(
                    self.mnt, f"new/{n}", e.errno or errno.EIO, since)
        return None, f"new/{n}: other writers took {MAX_TRIES} numbers in a row; try again"

    def append(self, name: str) -> tuple[int | None, str]:
        """Append FILE ``name``: ``(event number, line)`` or ``(None, line)``, or
        :class:`Interrupted` if a signal stopped it with nothing of it appended.  Without
        ``--at``, a regular file whose commit was cancelled because another writer's
        predecessor failed (ECANCELED: nothing of it was saved) is tried again."""
        for _ in range(MAX_TRIES):
            n, line, err = self._append_once(name)
            if err != errno.ECANCELED or self.at is not None or name == STDIN:
                break
        return n, line

    def _append_once(self, name: str) -> tuple[int | None, str, int]:
        """One attempt: ``(number, line, 0)``, or ``(None, reason, errno of the close)``.
        Only a whole file is ever committed: if reading it fails or a signal comes before
        its close, the file in ``new/`` is emptied first, so its close is refused."""
        shown = "stdin" if name == STDIN else name
        try:
            with self.signals.interruptible():  # opening a FIFO waits for its writer
                self.signals.point("open")
                src = sys.stdin.buffer if name == STDIN else open(name, "rb")  # noqa: SIM115
        except OSError as e:
            return None, f"{shown}: {e.strerror}; nothing appended", 0
        try:
            n, fd = self._create()
            if n is None:
                return None, f"{shown}: refused: {fd}", 0
            return self._write_and_close(src, shown, n, fd)
        finally:
            if src is not sys.stdin.buffer:
                src.close()

    def _write_and_close(self, src, shown: str, n: int,
                         fd: int) -> tuple[int | None, str, int]:
        """Write ``src`` to the new ``new/<n>`` (``fd``) and close it: the outcome, or
        :class:`Interrupted` once a signal's file is refused.  Nothing here raises between
        the create and the outcome (the signals are held, a read excepted)."""
        sig = self.signals
        since = time.time()
        written, err, whole, why, stopped = 0, 0, False, "", False
        try:
            if self.unchecked:
                try:
                    os.setxattr(fd, UNCHECKED_XATTR, b"1")
                except OSError as e:
                    why = (f"{shown}: refused: new/{n}: the mount would not turn its "
                           f"payload check off ({UNCHECKED_XATTR}: {e.strerror}); "
                           "nothing appended (mount it with -o unchecked_payloads)")
            while not why:
                if sig.signum is not None:
                    stopped = True
                    break
                try:
                    with sig.interruptible():  # a pipe may wait for ever
                        sig.point("read")
                        chunk = src.read(CHUNK)
                except Interrupted:
                    stopped = True
                    break
                except OSError as e:
                    why = f"{shown}: {e.strerror} while reading it; nothing appended"
                    break
                if not chunk:
                    sig.point("eof")
                    whole = sig.signum is None  # a signal before the close: stop here
                    stopped = not whole
                    break
                view = memoryview(chunk)
                while view:
                    k = os.write(fd, view)
                    view = view[k:]
                    written += k
                    self.progress.update(k)
                    sig.point("write")
        except OSError as e:  # the write failed: the daemon fails the close too
            err = e.errno or errno.EIO
        except BaseException:  # a bug: never leave a file that an exit would commit
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        kept = written  # the bytes new/<n> holds at its close
        if not whole:  # never commit part of a file (read error, a signal)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                kept = 0
        # the close: a signal from here on is noted, and the outcome reported first
        sig.point("close")
        closed = 0
        try:
            os.close(fd)  # the commit: 0 means durable and visible
        except OSError as e:
            closed = e.errno or errno.EIO
        sig.point("closed")
        if not closed:
            if not whole:  # a part committed: the truncate failed (never seen)
                self.progress.update(kept - written)
                return n, (f"event {n} <- {shown} ({kept:,} bytes: only the first part "
                           f"of it, {'interrupted' if stopped else 'not all written'})"), 0
            if self.at is not None:
                self.at = n + 1
            return n, f"event {n} <- {shown} ({written:,} bytes)", 0
        self.progress.update(-written)
        could = kept >= MIN_PAYLOAD and not err  # what a commit would have saved
        if could and (closed in INDETERMINATE or not self._answers()):
            return None, self._unknown(shown, n, closed), closed
        if stopped:
            raise Interrupted(sig.signum)  # refused: nothing of it is in the log
        if why:
            return None, why, 0
        err = err or closed
        reason = refusal_reason(self.mnt, f"new/{n}", err, since)
        return None, f"{shown}: refused: new/{n}: {reason}", err


def run(args) -> int:
    """The command (module docstring).  It answers SIGINT, SIGTERM and SIGHUP itself
    (:class:`Signals`) and returns with them blocked: it is the process's last work."""
    signals = Signals()
    signals.install()
    try:
        return _run(args, signals)
    finally:
        signals.finish()


def _say(line: str, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


def _run(args, signals: Signals) -> int:
    try:  # start-up: a signal stops it here with nothing done
        signals.point("start")
        from bookfs.cli.commands import _progress_bar

        if not os.path.isdir(args.mountpoint):
            raise UsageError(f"{args.mountpoint}: not a directory; expected a bookfs "
                             "mount point")
        if mount_readonly(args.mountpoint):
            raise UsageError(f"{args.mountpoint}: mounted read-only; expected a read-write "
                             "mount (bookfs mount SOURCE MNT without -o ro)")
        if args.at is not None and args.at < 1:
            raise UsageError(f"--at {args.at}: expected an event number of 1 or more")
        sizes = check_files(args.files, payloads=not args.unchecked)
        signals.point("checked")
        signals.hold()
    except UsageError as e:
        signals.hold()
        _say(f"bookfs append: {e}", err=True)
        return 2
    except Interrupted as e:
        _say("bookfs append: interrupted; nothing was appended", err=True)
        return 128 + e.signum
    total = None if None in sizes else sum(sizes)
    refused = 0
    with signals.masked():
        bar = _progress_bar(total, "append")
    with bar:
        appender = Appender(args.mountpoint, args.at, bar, unchecked=args.unchecked,
                            signals=signals)
        for i, name in enumerate(args.files):
            try:
                n, line = appender.append(name)
            except UsageError as e:
                _say(f"bookfs append: {e}", err=True)
                return 2
            except Interrupted as e:
                _say(f"bookfs append: interrupted; {'stdin' if name == STDIN else name} "
                     "and the files after it were not appended", err=True)
                return 128 + e.signum
            if n is None:
                refused += 1
                _say(line, err=True)
                if appender.unknown:  # never on after an unknown outcome, --keep-going or not
                    rest = args.files[i + 1:]
                    if rest:
                        _say(f"bookfs append: stopped after an unknown outcome; not tried: "
                             f"{' '.join(rest)}", err=True)
                    return EXIT_UNKNOWN
                if not args.keep_going:
                    break  # with --at, the next file would insist on the same number
            else:
                _say(line)
            signals.point("reported")
    return 1 if refused else 0


def register(sub) -> None:
    s = sub.add_parser("append", help="append files as events through a mount",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("mountpoint", metavar="MNT", help="a read-write bookfs mount")
    s.add_argument("files", metavar="FILE", nargs="+",
                   help="a payload (4-byte mug, then the jam) per event; - for stdin")
    s.add_argument("--at", type=int, metavar="N",
                   help="the first file must become event N (refused if the log has moved "
                        "on); the next ones N+1, ...")
    s.add_argument("--keep-going", action="store_true",
                   help="after a refusal, go on with the next file")
    s.add_argument("--unchecked", action="store_true",
                   help="append the files as they are, even if they are not a mug and a "
                        "noun (the mount is asked not to check them either)")
    s.set_defaults(func=run)
