"""The ordered group-commit queue behind ``new/`` (the durability contract of DESIGN.md).

* ``reserve`` hands out the next free event number: one past the last committed event,
  plus the reservations in flight.  Anything else is refused (EEXIST for a taken number,
  EINVAL for a gap or a name that is not a number).
* ``commit`` (called from the **last** ``flush``, i.e. the close of the writer's last
  descriptor; see ``rule.py``) returns only when the event is durable and visible, or
  raises :class:`~bookfs.errors.Refused` (with the errno the FUSE adapter answers).  It
  freezes the staged bytes first, so what is saved is an immutable snapshot; a write
  that failed earlier (EFBIG, ENOSPC, EIO) has *poisoned* the reservation, and then
  commit fails with that errno and saves nothing.  Commits happen
  strictly in event order.  The writer at the head of the queue becomes the *leader*: it
  takes every consecutive ready reservation and saves them with one ``Book.save`` (one
  write, one fdatasync) on the queue's own commit thread (a :class:`WorkerThread`), so
  reads go on meanwhile.  Writers that become ready while a save runs are committed
  together by the next leader: that is the group commit.
* A reservation that fails (write error, a killed writer, a stall) takes every later
  reservation with it (ECANCELED), so no gap is ever left; their numbers become free.
  A writer that waits longer than ``stall_timeout`` for a predecessor that is still being
  written fails with ETIMEDOUT.
* Nothing is visible before ``Book.save`` returns; the engine undoes a failed save.
* Every refused reservation (at ``reserve``, or failed later) is noted in the bounded
  :class:`Refusals` record, which the mount's ``info`` file shows: a shell ignores the
  errno of ``close()``, so ``printf abc > new/N`` returns 0 and this record (with the
  daemon's log) is where the reason can be read.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import trio

from bookfs.errors import BookError, Refused, refuse
from bookfs.formats.eventlog import EventLog
from bookfs.formats.info import NEXT_KEY, REFUSALS_HEADER  # noqa: F401 (re-exported)
from bookfs.formats.layout import MAX_PAYLOAD, MIN_PAYLOAD
from bookfs.fs.append.staging import Staging

log = logging.getLogger(__name__)

OPEN, READY, DONE, FAILED = "open", "ready", "done", "failed"
SAVE, HOLD, FAIL = "save", "hold", "fail"  # a commit check's outcomes (HOLD: not the last)
REFUSALS_KEPT = 20  # refused appends and meta writes remembered for the info file


@dataclass(frozen=True)
class Refusal:
    """One refused append or meta write: when, which file (``new/43``, ``meta/life``),
    the errno, the one-line reason and the writer's process ID (None if unknown)."""

    time_ns: int
    path: str
    errno: int
    reason: str
    pid: int | None = None

    @property
    def errno_name(self) -> str:
        return errno.errorcode.get(self.errno, str(self.errno))

    def line(self) -> str:
        """``2025-01-02 03:04:05 +0100 new/43 EINVAL pid 812: <reason>`` (local time)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.time_ns / 1e9))
        pid = "-" if self.pid is None else self.pid
        return f"{when} {self.path} {self.errno_name} pid {pid}: {self.reason}"


class Refusals:
    """The last ``keep`` refusals of appends (``new/<N>``) and meta writes, oldest first.

    Bounded (a ``deque``), so a writer that is refused in a loop costs no memory; ``total``
    counts every refusal since the mount.  ``render`` is the info file's section."""

    def __init__(self, keep: int = REFUSALS_KEPT):
        self._items: deque[Refusal] = deque(maxlen=keep)
        self.total = 0

    def note(self, path: str, err: int, reason: str, pid: int | None = None) -> None:
        """Record a refusal (not logged: the caller logs it).  ``pid`` is the writer's
        ID as FUSE gives it: its thread's (the process's own, for a single-threaded
        writer).  A reason that starts with ``path: `` loses that prefix (the record
        names the path already)."""
        reason = " ".join(reason.split())  # one line, whatever the message held
        if reason.startswith(path + ": "):
            reason = reason[len(path) + 2:]
        self._items.append(Refusal(time.time_ns(), path, err, reason, pid))
        self.total += 1

    def refuse(self, path: str, err: int, reason: str,
               pid: int | None = None) -> Refused:
        """Record, log once (:func:`~bookfs.errors.refuse`) and build the error to raise."""
        self.note(path, err, reason, pid)
        return refuse(err, reason)

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def render(self) -> str:
        """``last refusals: none``, or a count line and one indented
        :meth:`Refusal.line` per refusal, newest last."""
        if not self._items:
            return f"{REFUSALS_HEADER}: none\n"
        head = (f"{REFUSALS_HEADER}: {len(self._items)} of {self.total} since the mount "
                f"(newest last)\n")
        return head + "".join(f"  {r.line()}\n" for r in self._items)


def _creator(r: "Reservation") -> int | None:
    """The thread that created ``r``'s file, if the fs layer tracks it."""
    return getattr(r.writer, "thread", None)


@dataclass(eq=False)
class Reservation:
    number: int
    name: str  # as created (``42`` or ``000000000042``)
    staging: Staging
    state: str = OPEN
    error: int = 0
    poisoned: int = 0  # errno of a write that failed: the close fails with it
    poison_why: str = ""  # why it failed, for the refusal record (may be empty)
    writer: object = None  # the commit rule's rule.Writer for this file, if any
    #: the fs layer's check of the bytes as they are written (``nodes/new.py``), None
    #: when the payload is not checked
    payload: object = None
    #: set by the fs layer just before ``commit``: ``(errno, why)`` if the bytes are not
    #: an event's payload (not a mug and a noun), None if they are or were not checked
    refused: tuple[int, str] | None = None
    #: the commit rule's check of the close that made it ready (run on the commit thread
    #: just before the save; see CommitQueue.commit), None once passed
    check: object = None
    #: set once ``check`` has been judged (or the reservation finished): a write that
    #: arrives while the check is pending waits for it (``ops.py``)
    judged: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    #: Set when this reservation's own commit has something to look at again: it finished,
    #: or it became the head of the queue with no save running.  Only its waiters wake.
    kick: trio.Event = field(default_factory=trio.Event)

    def finish(self, state: str, err: int = 0) -> None:
        self.state, self.error = state, err
        self.done.set()
        self.kick.set()
        self.judged.set()

    def poison(self, err: int, why: str = "") -> None:
        """A write failed (``why``, if known): nothing of this reservation may be
        committed."""
        if not self.poisoned:
            self.poisoned, self.poison_why = err, why


def _unbox(box: list):
    ok, value = box[0]
    if not ok:
        raise value
    return value


class WorkerThread:
    """One long-lived thread that runs blocking calls for the event loop, handed each
    through a ``SimpleQueue`` and reporting back through the trio token: one queue put and
    one ``run_sync_soon`` per call, with no thread-cache hand-off or capacity limiter
    (``trio.to_thread``'s per-call cost).  The thread starts on first use and stops with
    :meth:`close`.

    The commit queue runs its saves on one (a save is never abandoned half-way: its caller
    waits shielded, since the bytes go to disk whatever happens to the request); ``ops.py``
    runs the commit rule's ``/proc`` probe on another, with a deadline (:meth:`run` with
    ``deadline``): a call that overruns it is left to finish on its own and the thread is
    replaced, so nothing ever waits on it again."""

    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn, *args) -> tuple[trio.Event, list]:
        """Hand ``fn(*args)`` to the thread: ``(done, box)``; ``done`` is set when
        ``box`` holds ``(True, result)`` or ``(False, exception)``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, args=(self._jobs,),
                                            name=self.name, daemon=True)
            self._thread.start()
        done = trio.Event()
        box: list = []
        self._jobs.put((fn, args, box, trio.lowlevel.current_trio_token(), done.set))
        return done, box

    def abandon(self) -> None:
        """Give up on the call in progress: the thread ends once it returns, and the next
        call starts a new one."""
        self._jobs.put(None)
        self._jobs, self._thread = queue.SimpleQueue(), None

    async def run(self, fn, *args, deadline: float | None = None):
        """``fn(*args)`` on the thread; its result, or its exception re-raised.  With a
        ``deadline`` (seconds), :class:`TimeoutError` once it has passed (the thread is
        abandoned); without one the wait is shielded from cancellation."""
        done, box = self.submit(fn, *args)
        if deadline is None:
            with trio.CancelScope(shield=True):
                await done.wait()
        else:
            with trio.move_on_after(deadline):
                await done.wait()
            if not box:
                self.abandon()
                raise TimeoutError(f"{getattr(fn, '__name__', fn)} did not return within "
                                   f"{deadline:g} s")
        return _unbox(box)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            fn, args, box, token, wake = job
            try:
                box.append((True, fn(*args)))
            except BaseException as e:  # handed back to the awaiting task
                box.append((False, e))
            try:
                token.run_sync_soon(wake)
            except trio.RunFinishedError:
                return

    def close(self, wait: bool = True) -> None:
        """Stop the thread once its current call returns (and wait for that, if
        ``wait``)."""
        if self._thread is not None:
            self._jobs.put(None)
            if wait:
                self._thread.join()
            self._thread = None


class CommitQueue:
    """Reservations of ``new/<N>`` and their ordered, grouped commits."""

    def __init__(self, book: EventLog, *, stall_timeout: float = 30.0,
                 spill_dir: str | None = None, on_commit=None,
                 refusals: Refusals | None = None, check_deadline: float = 2.0):
        """``on_commit(first, last)``: called after each save; ``refusals``: where refused
        reservations are noted; ``check_deadline``: seconds the checks of one batch may
        take before the batch fails (EIO) unsaved."""
        self.log = book
        self.check_deadline = check_deadline
        self.refusals = refusals if refusals is not None else Refusals()
        self.stall_timeout = stall_timeout
        self.spill_dir = spill_dir
        self._live: dict[int, Reservation] = {}  # number -> reservation not yet failed
        self._saving: set[int] = set()  # numbers of the batch being saved right now
        self._closed = False
        self._leader = False
        self._on_commit = on_commit
        self.saver = WorkerThread("bookfs-commit")
        self.batches = 0  # saves done (for tests and stats)

    def _head(self) -> int:
        """The number the next committed event must have."""
        return self.log.last + 1 if self.log.count else self._epoch() + 1

    def next_free(self) -> int:
        n = self._head()
        live = self._live
        if live and n in live and n + len(live) - 1 in live:
            # the live reservations are the numbers from the head on, without a gap
            # (reserve takes the next free one, commits take the head, a failure every
            # one from a number on), so 1,000 waiting writers cost one step, not 1,000
            n += len(live)
        while n in live:
            n += 1
        return n

    def _epoch(self) -> int:
        """The epoch base of an empty log (a pier's newest epoch, vere's ``fir_d``)."""
        return getattr(self.log, "epoch", 0)

    def _kick_head(self) -> None:
        """Wake the commit of the reservation at the head of the queue, if any: it may
        lead the next save now.  (Each waiter is woken only by its own events, so an
        append does not wake every other writer.)"""
        head = self._live.get(self._head())
        if head is not None:
            head.kick.set()

    def shutdown(self, why: str) -> None:
        """The mount is going away: fail every reservation that is not being saved right
        now (ESHUTDOWN), so no writer waits for a stalled predecessor while the daemon
        stops, and refuse new ones.  A batch already being saved finishes normally."""
        self._closed = True
        waiting = sorted(n for n in self._live if n not in self._saving)
        if waiting:
            log.warning("new/%d..%d not committed: %s", waiting[0], waiting[-1], why)
            self._fail_from(waiting[0], errno.ESHUTDOWN, why)

    def reserve(self, name: bytes, pid: int | None = None) -> Reservation:
        """Reserve ``new/<name>`` for the writer process ``pid`` (for the refusal record)."""
        text = name.decode("utf-8", "replace")
        path = f"new/{text}"

        def refused(err: int, why: str) -> Refused:
            return self.refusals.refuse(path, err, f"{path}: {why}", pid)

        if self._closed:
            raise refused(errno.ESHUTDOWN, "the mount is being unmounted")
        if not name.isdigit() or len(name) > 20:
            raise refused(errno.EINVAL, "expected a decimal event number, "
                                        f"the next free one is {self.next_free()}")
        n = int(name)
        expected = self.next_free()
        if n in self.log or n in self._live or (self.log.count and n < self.log.first):
            raise refused(errno.EEXIST, f"event {n} is already committed or in "
                                        f"flight; the next free number is {expected}")
        if n != expected:
            raise refused(errno.EINVAL, f"would leave a gap; expected event {expected}")
        r = Reservation(n, text, Staging(MAX_PAYLOAD, self.spill_dir))
        self._live[n] = r
        return r

    def _fail_from(self, number: int, err: int, why: str) -> None:
        """Fail every live reservation numbered ``number`` or later (each one noted in
        the refusal record; the callers log the first)."""
        for n in sorted(k for k in self._live if k >= number):
            r = self._live.pop(n)
            code = err if n == number else errno.ECANCELED
            reason = why
            if n != number:
                reason = f"not committed: predecessor new/{number} failed ({why})"
                log.warning("new/%d %s", n, reason)
            self.refusals.note(f"new/{r.name}", code, reason, _creator(r))
            r.finish(FAILED, code)
        self._kick_head()

    def abandon(self, r: Reservation, why: str, err: int = errno.EIO) -> None:
        """Drop ``r`` (its writer died or went away) and everything after it."""
        if r.state in (OPEN, READY) and self._live.get(r.number) is r:
            log.warning("new/%d abandoned: %s", r.number, why)
            self._fail_from(r.number, err, why)

    def _admit(self, r: Reservation) -> tuple[int, str] | None:
        """``(errno, why)`` if ``r``'s bytes cannot be an event (a poisoning write, fewer
        than ``MIN_PAYLOAD`` bytes, the fs layer's payload check: ``r.refused``); None if
        they can."""
        if r.poisoned:
            why = f": {r.poison_why}" if r.poison_why else ""
            return r.poisoned, (f"not committed, because a write to it failed "
                                f"({errno.errorcode.get(r.poisoned)}{why})")
        size = len(r.staging)
        if size < MIN_PAYLOAD:
            return errno.EINVAL, (f"{size} bytes written, expected at least {MIN_PAYLOAD} "
                                  "(a 4-byte mug, then the jam)")
        return r.refused

    def _judge(self, r: Reservation, shared: dict) -> tuple[str, int, str]:
        """On the commit thread: ``(SAVE, 0, "")``, ``(HOLD, 0, "")`` (the close was not
        the last: ``r`` goes back to being written) or ``(FAIL, errno, why)``.  ``shared``
        is handed to every check of one batch (the checks may share what they read)."""
        if r.check is not None:
            verdict = r.check(shared)
            if verdict == HOLD:
                return HOLD, 0, ""
            if verdict is not None:
                return FAIL, verdict[0], verdict[1]
        bad = self._admit(r)
        return (FAIL, *bad) if bad else (SAVE, 0, "")

    async def commit(self, r: Reservation, check=None) -> bool:
        """Freeze ``r`` and wait until it is durable and visible (True) or has failed
        (:class:`~bookfs.errors.Refused`, with its errno).

        ``check(shared)`` (the commit rule's probe of the close, ``ops.py``) runs on the
        commit thread in the same hand-off as the save, just before it: it returns None (this
        close commits), ``HOLD`` (not the writer's last close: ``r`` is written on, and
        this returns False) or ``(errno, why)`` (``r`` fails).  A batch whose checks take
        longer than ``check_deadline`` fails unsaved (EIO)."""
        if r.state == OPEN:
            r.check = check
            if check is not None:
                r.judged = trio.Event()
            if check is None and (bad := self._admit(r)) is not None:
                self._fail_from(r.number, *bad)
                raise refuse(bad[0], f"new/{r.number}: {bad[1]}")
            r.staging.freeze()
            r.state = READY
            self._kick_head()
        waited, watched = 0.0, None
        while r.state == READY:
            head = self._live.get(self._head())
            if head is r and not self._leader:
                await self._lead()
                continue
            r.kick = trio.Event()  # armed before waiting: no await in between
            with trio.move_on_after(1.0) as scope:
                await r.kick.wait()
            if not scope.cancelled_caught or r.state != READY:
                continue
            head = self._live.get(self._head())
            if head is None or head.state != OPEN:
                watched, waited = None, 0.0
                continue
            # the head is still being written: count the seconds it has blocked us
            waited = waited + 1.0 if head is watched else 1.0
            watched = head
            if waited >= self.stall_timeout:
                why = (f"predecessor new/{head.number} still being written "
                       f"after {self.stall_timeout:g} s")
                log.warning("new/%d not committed (ETIMEDOUT): %s; its number is free "
                            "again", r.number, why)
                self._fail_from(r.number, errno.ETIMEDOUT, why)
        if r.state == FAILED:  # its reason was logged and recorded when it failed
            raise Refused(r.error, f"new/{r.number}: not committed")
        return r.state == DONE

    def _checked_save(self, first: int, batch: list[Reservation], payloads: list,
                      gate: dict) -> tuple[list, int]:
        """The commit thread's half of :meth:`_lead`: judge the batch in order up to the
        first that may not be saved, then save the ones before it, unless the loop gave
        up on the checks meanwhile (``gate``: ``saving`` set here, under its lock, once
        the checks are done; ``abandoned`` set by the loop, under it, when they overran
        the deadline first)."""
        verdicts, shared = [], {}
        for r in batch:
            verdicts.append(self._judge(r, shared))
            if verdicts[-1][0] != SAVE:
                break
        n = sum(1 for v in verdicts if v[0] == SAVE)
        with gate["lock"]:
            if gate["abandoned"]:
                return verdicts, 0
            gate["saving"] = True
        if n:
            self.log.save(first, payloads[:n], self._epoch())
        return verdicts, n

    async def _lead(self) -> None:
        """Check, then save, every consecutive ready reservation from the head, in one
        batch and one hand-off to the commit thread."""
        self._leader = True
        try:
            first = self._head()
            batch = []
            n = first
            while (r := self._live.get(n)) is not None and r.state == READY:
                batch.append(r)
                n += 1
            payloads = [r.staging.payload() for r in batch]
            self._saving = {r.number for r in batch}
            gate = {"lock": threading.Lock(), "abandoned": False, "saving": False}
            done, box = self.saver.submit(self._checked_save, first, batch, payloads, gate)
            # one wake-up a batch, the save's: past the deadline the gate says whether the
            # checks ended in time (the save then goes on) or not (the batch fails unsaved).
            # Shielded: the batch may be saving already, and its bytes go to disk whatever
            # happens to the request; the deadline alone ends this wait early
            with trio.CancelScope(deadline=trio.current_time() + self.check_deadline,
                                  shield=True):
                await done.wait()
            if not done.is_set():
                with gate["lock"]:
                    gate["abandoned"] = not gate["saving"]
                if gate["abandoned"]:  # a check is stuck: nothing of the batch is saved
                    self.saver.abandon()
                    why = (f"the close could not be judged within "
                           f"{self.check_deadline:g} s")
                    log.error("new/%d..%d not committed: %s", first, n - 1, why)
                    self._fail_from(first, errno.EIO, why)
                    return
            with trio.CancelScope(shield=True):  # bytes go to disk whatever happens
                await done.wait()
            try:
                verdicts, saved = _unbox(box)
            except (OSError, BookError) as e:
                err = getattr(e, "errno", None) or errno.EIO
                log.error("commit of events %d..%d failed: %s", first, n - 1, e)
                self._fail_from(first, err, str(e))
                return
            except Exception as e:  # a bug: fail the batch (no gap, no waiter left hanging)
                log.exception("commit of events %d..%d failed unexpectedly", first, n - 1)
                self._fail_from(first, errno.EIO, repr(e))
                return
            if saved:
                self.batches += 1
                if saved > 1:  # the group commit, visible in the daemon's log
                    log.info("group commit: events %d..%d in one save", first,
                             first + saved - 1)
                for r in batch[:saved]:
                    del self._live[r.number]
                    r.finish(DONE)
                if self._on_commit is not None:
                    self._on_commit(first, first + saved - 1)
            for r in batch[saved:len(verdicts)]:
                r.check = None  # judged; those after the first refused are judged later
                r.judged.set()
            if saved < len(verdicts):
                r, (kind, err, why) = batch[saved], verdicts[saved]
                if kind == HOLD:  # not its writer's last close: written on
                    r.state = OPEN
                    r.staging.frozen = False
                    r.kick.set()
                else:
                    log.warning("new/%d abandoned: %s", r.number, why)
                    self._fail_from(r.number, err, why)
        finally:
            self._saving = set()
            self._leader = False
            self._kick_head()  # whoever became ready during the save leads the next one
