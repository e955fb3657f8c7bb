"""Which close of a ``new/`` or ``meta/`` file commits it: the commit rule.

``docs/reliability.md`` ("The commit rule") states the rule and cites the kernel source
for every fact used here.  In short, with the patched pyfuse3 every FLUSH and WRITE carries
what the kernel sent with it: the calling thread's ID (``ctx.pid``) and a ``lock_owner``
that names the caller's descriptor table (FLUSH always, WRITE for direct I/O).  Threads
of a process share one table; a forked child has its own.

* The **writer** of a file is the process that created it.  :class:`Writer` learns its
  table from the first request of the creating thread that carries one (its first write,
  or the first close of a shell's redirection), with no look at ``/proc``.
* A FLUSH from any other table (a forked child's exit, the ``exec`` of a subprocess, a
  descriptor passed to another process) is a **copy**'s close: it commits nothing and
  returns at once.
* A FLUSH from the writer's table commits, unless :func:`probe` finds that the closing
  task's table still holds another descriptor of the file (a ``dup``), or that the closing
  task is exiting because a signal killed it.

:func:`probe` is the only place that reads ``/proc``, and it reads only the closing task
itself, in files whose kernel code takes no lock the closer can hold (no ``exec``, cred
or mmap lock: the citations are in ``docs/reliability.md``).  It still runs off the event
loop with a deadline (:func:`closing` on a worker, :func:`commit_check` on the commit
thread).  Where it cannot tell, it answers UNKNOWN and the append fails loudly, with
nothing committed.

:func:`on_close` is what a close of ``new/<N>`` does, from the request to the commit: the
rule's verdict, the hole and payload checks, the ordered commit; the FUSE adapter
(``fs/nodes/new.py``) calls it and answers the errno of what it refuses.
"""

from __future__ import annotations

import errno
import functools
import os

from bookfs.errors import Refused
from bookfs.fs.append.check import hole_refusal
from bookfs.fs.append.commit_queue import (
    DONE,
    FAILED,
    HOLD,
    OPEN,
    CommitQueue,
    Reservation,
)
from bookfs.fs.daemon.mountinfo import mount_devices

#: probe verdicts
COPY = "copy"  # the closing task is not the writer: a copy's close commits nothing
HELD = "held"  # the writer's table still holds another descriptor of the file (a dup)
LAST = "last"  # the writer's last descriptor: commit
KILLED = "killed"  # the writer is exiting because a signal killed it: commit nothing
UNKNOWN = "unknown"  # cannot be told (the closer's /proc unreadable): fail, commit nothing
PROBE_DEADLINE = 10.0  # seconds the commit rule's /proc probe may take (rule.probe)
#: ``BOOKFS_BENCH_SKIP_PROBE=1`` (benchmarks only: bench/bench_append.py's "bookfs-noprobe"
#: source) commits at every close of the writer's table without probing it, so the probe's
#: cost can be measured; it gives up the dup and killed-writer checks.
SKIP_PROBE = bool(os.environ.get("BOOKFS_BENCH_SKIP_PROBE"))

_NO_MM = b"0 0 0 0 0 0 0"  # /proc/<tid>/statm of a task with no mm (exiting, past exit_mm)
_WRITABLE = (os.O_WRONLY, os.O_RDWR)


class Writer:
    """The writer of one open file: its creating thread and, once a request of that
    thread has carried it, its descriptor table (the kernel's ``lock_owner``).

    **A table that changes under the writer.**  A task's table is replaced while it
    lives in three ways, each time by a copy, and only when another task shares it
    (``atomic_read(&files->count) > 1``): ``unshare(CLONE_FILES)`` (``kernel/fork.c``,
    ``ksys_unshare()`` -> ``unshare_fd()``), ``close_range(..., CLOSE_RANGE_UNSHARE)``
    (``fs/file.c``, ``__close_range()``), and ``exec`` (``fs/exec.c``, ``begin_new_exec()``
    -> ``unshare_files()``: a table shared with another process, since ``de_thread()``
    has ended the other threads first).  The copy holds the file too, and so does the
    table left behind, which other tasks still use: no close of either can then be known
    to be the last.  So once the creating thread is seen with another table than the one
    learned (``changed``), every close of the file fails loudly (:func:`probe` answers
    UNKNOWN: EIO, nothing committed), never a 0 for a close that left a copy able to
    write on, nor one that committed nothing."""

    __slots__ = ("thread", "table", "changed")

    def __init__(self, thread: int):
        self.thread = thread
        self.table = 0  # unknown until the creating thread sends a lock_owner
        self.changed = False  # the creating thread was seen with another table since

    def saw(self, ctx) -> None:
        """Learn the writer's table from a request of the creating thread (a direct-I/O
        WRITE carries ``lock_owner``; 0 means the kernel sent none), and notice when that
        thread shows up with another table (class docstring)."""
        if not ctx.lock_owner or ctx.pid != self.thread:
            return
        if not self.table:
            self.table = ctx.lock_owner
        elif ctx.lock_owner != self.table:
            self.changed = True

    def closing(self, ctx) -> bool | None:
        """Is this FLUSH the writer's table closing?  True or False from the request
        alone; None when the table is not known yet and another thread closes (a thread of
        the writer or a forked child), or when the writer's table changed: :func:`probe`
        tells."""
        self.saw(ctx)
        if self.changed:
            return None
        if self.table:
            return ctx.lock_owner == self.table
        return None


class Mounts:
    """Which mount IDs show this mount's files (the mount itself, its bind mounts).
    ``device`` is the mount's ``major:minor``; every mount's ID and device are read from
    ``/proc/self/mountinfo`` (the daemon's own) when the mount is made, and again when a
    descriptor shows an ID that is not known to be this mount's.

    The kernel reuses a freed mount ID (``fs/namespace.c``: ``mnt_alloc_id()`` takes the
    first free key of ``mnt_id_xa`` with ``__xa_alloc()``, ``mnt_free_id()`` gives it back
    with ``xa_erase()``; ``ida_alloc()``/``ida_free()`` before 6.8, the same rule), so an ID seen on another filesystem may
    since show a bind mount of this one: such an ID is asked again, never trusted.  An ID
    once seen on this mount is remembered, so the mount itself, and a bind mount seen
    before it was detached by ``umount -l`` (gone from the table), still count."""

    def __init__(self, device: str | None):
        self.device = device
        self.seen: dict[int, str] = mount_devices() if device else {}  # ID -> device

    def ours(self, mnt_id: int) -> bool | None:
        """True if ``mnt_id`` shows this mount, False if another filesystem, None if it
        cannot be told (a mount ID never seen, gone from the table)."""
        if self.device is None:
            return None
        if self.seen.get(mnt_id) != self.device:  # unknown, or another filesystem's then
            self.seen.update(mount_devices())
        if mnt_id not in self.seen:
            return None
        return self.seen[mnt_id] == self.device


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _same_process(tid: int, thread: int) -> bool | None:
    """Is ``thread`` (the creator) a thread of ``tid``'s process?  ``/proc/<tid>/task``
    lists exactly the closing task's thread group.  None if that cannot be told: the
    creating thread has ended, or this kernel cannot say whether it lives."""
    if os.path.exists(f"/proc/{tid}/task/{thread}"):
        return True
    return None if not _alive(thread) else False


PIDFD_THREAD = os.O_EXCL  # pidfd_open(2): a pidfd for a thread, not only a leader (6.9)


def _alive(thread: int) -> bool | None:
    """Is thread ``thread`` alive?  ``pidfd_open(PIDFD_THREAD)``: a syscall on the thread
    itself, no ``/proc``, no waiting.  A kernel before 6.9 takes no ``PIDFD_THREAD``;
    there a thread that leads its process is asked without it, and any other cannot be
    told (None): no other process's ``/proc`` is read."""
    for flags in (PIDFD_THREAD, 0):
        try:
            os.close(os.pidfd_open(thread, flags))
            return True
        except ProcessLookupError:
            return False
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return None


def _killed(tid: int) -> bool | None:
    """For a closing task that is exiting: True if a signal killed it (the low 7 bits of
    ``exit_code``, field 52 of ``/proc/<tid>/stat``), False for an ordinary exit."""
    data = _read(f"/proc/{tid}/stat")
    fields = data[data.rindex(b")") + 2:].split()
    if len(fields) < 50:
        return None  # a kernel too old to show exit_code
    return (int(fields[49]) & 0x7F) != 0


def _writable_py(tid: int) -> list[tuple[int, int]]:
    """``(inode, mount ID)`` of every writable descriptor in the table of task ``tid``,
    from ``/proc/<tid>/fdinfo`` (``_fdscan.writable`` does the same in C)."""
    found = []
    fd_dir = os.open(f"/proc/{tid}/fdinfo", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in os.listdir(fd_dir):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd_dir)
                try:
                    info = os.read(fd, 4096)
                finally:
                    os.close(fd)
            except FileNotFoundError:
                continue  # closed meanwhile (by another thread of the closer)
            fields = dict(line.partition(b":")[::2] for line in info.split(b"\n", 4)[:4])
            try:
                flags, ino, mnt = (int(fields[b"flags"], 8), int(fields[b"ino"]),
                                   int(fields[b"mnt_id"]))
            except (KeyError, ValueError):
                continue
            if flags & os.O_ACCMODE in _WRITABLE:
                found.append((ino, mnt))
    finally:
        os.close(fd_dir)
    return found


try:
    from bookfs.fs.append._fdscan import (
        writable as _writable,  # the same scan in C, without the GIL
    )
    #: which descriptor scan this daemon uses (a mount's info file shows it)
    SCAN = "C"
except ImportError:  # not built (pyproject.toml marks it optional): the Python scan
    _writable = _writable_py
    SCAN = "Python (bookfs/fs/append/_fdscan.c did not build)"


def _holds(tid: int, inode: int, mounts: Mounts, writable=None) -> str:
    """HELD if the closing task's table holds a writable descriptor of this file (its
    inode on one of this mount's mount IDs), LAST if not, UNKNOWN if a descriptor of the
    same inode number shows a mount that cannot be told.  ``writable``: the table's
    writable descriptors if already scanned (:func:`probe`'s ``scans``)."""
    verdict = LAST
    for ino, mnt in _writable(tid) if writable is None else writable:
        if ino == inode:
            ours = mounts.ours(mnt)
            if ours:
                return HELD
            if ours is None:
                verdict = UNKNOWN
    return verdict


def probe(tid: int, writer: Writer, inode: int, mounts: Mounts,
          known: bool | None, scans: dict | None = None) -> tuple[str, str]:
    """``(verdict, why)`` for the FLUSH of thread ``tid`` on the file ``inode``.

    ``known`` is :meth:`Writer.closing`'s answer (True: the writer's table; None: not yet
    known).  Reads only the closing task's own ``/proc`` entries: ``task/<creator>``,
    ``statm``, and, for a task that is exiting, ``stat``; otherwise ``fdinfo``.  Blocking
    (run it in a worker thread with a deadline).

    ``scans`` (table -> its writable descriptors) lets the closes of one batch share one
    scan of a table: each closer is blocked in its close meanwhile, so a scan taken while
    they all wait is as true for each of them."""
    if tid <= 0:
        return UNKNOWN, "the kernel did not say which process closed it"
    if writer.changed:
        return UNKNOWN, ("its writer's descriptor table changed while it held the file "
                         "(unshare(CLONE_FILES), close_range(CLOSE_RANGE_UNSHARE), or an "
                         "exec of a table shared with another process): whether another "
                         "copy still holds it cannot be told")
    try:
        if known is None:
            same = _same_process(tid, writer.thread)
            if same is None:
                return UNKNOWN, (f"the thread that created it ({writer.thread}) has ended, "
                                 f"so whether thread {tid} is its writer cannot be told")
            if not same:
                return COPY, ""
        if _read(f"/proc/{tid}/statm").startswith(_NO_MM):
            # exiting (do_exit runs exit_mm before exit_files): its table is detached,
            # so no other descriptor of it can remain; a signal's kill commits nothing
            killed = _killed(tid)
            if killed is None:
                return UNKNOWN, "the kernel does not show why the writer exited"
            return (KILLED, "its writer was killed before it closed the file") if killed \
                else (LAST, "")
        if scans is not None and known and writer.table:
            if writer.table not in scans:
                scans[writer.table] = _writable(tid)
            verdict = _holds(tid, inode, mounts, scans[writer.table])
        else:
            verdict = _holds(tid, inode, mounts)
    except (OSError, ValueError) as e:
        return UNKNOWN, (f"process {tid}'s /proc entries could not be read "
                         f"({errno.errorcode.get(getattr(e, 'errno', 0) or 0, e)})")
    if verdict == UNKNOWN:
        return UNKNOWN, ("a descriptor of it shows a mount this daemon cannot identify "
                         "(one left open on a mount that is gone? close it and retry)")
    return verdict, ""


async def closing(prober, mounts: Mounts, writer: Writer | None, inode: int, ctx, *,
                  mounted: bool = True) -> tuple[str, str]:
    """What this close (a FLUSH) of ``inode`` is: ``(verdict, why)`` with verdict COPY
    (another table: commit nothing), HELD (the writer's table holds another descriptor),
    LAST (commit), KILLED or UNKNOWN (commit nothing; fail).  ``ctx`` is what the kernel
    sent with the request (the caller's thread, ``lock_owner``).

    Decided from the request where it can be (a copy's close costs no probe); the
    writer's closes are probed on ``prober`` (a worker thread: :func:`probe` blocks),
    with ``PROBE_DEADLINE``.  Without a mount (``mounted`` False: operations driven
    directly) or a caller (``ctx`` None), every close is the last."""
    if writer is None or ctx is None or not mounted:
        return LAST, ""
    known = writer.closing(ctx)
    if known is False:
        return COPY, ""
    if SKIP_PROBE:
        return LAST, ""
    try:
        return await prober.run(probe, ctx.pid, writer, inode, mounts, known,
                                deadline=PROBE_DEADLINE)
    except TimeoutError as e:
        return UNKNOWN, f"the close could not be judged ({e})"


def commit_check(tid: int, writer: Writer, mounts: Mounts, inode: int, known,
                 scans: dict) -> object:
    """The commit queue's check of the writer's close of ``inode`` (``commit_queue.py``,
    run on the commit thread in the save's own hand-off; ``scans`` shared by one batch):
    None to commit, ``HOLD`` if it was not the last close, ``(EIO, why)`` to fail."""
    verdict, why = probe(tid, writer, inode, mounts, known, scans)
    if verdict == LAST:
        return None
    if verdict in (HELD, COPY):
        return HOLD
    return errno.EIO, why


async def on_close(queue: CommitQueue, prober, mounts: Mounts, r: Reservation, inode: int,
                ctx, *, mounted: bool = True) -> bool:
    """A close (FLUSH) of the file ``r`` is written in (``inode``, its inode on the mount),
    judged by the commit rule and, when it is the writer's last, committed: the whole of
    what a close of ``new/<N>`` does, in one place.

    True once ``r`` is durable and visible.  False for a close that commits nothing: a
    copy's (another table, at once, from the request alone), one while the writer's table
    holds another descriptor (HELD: ``r`` is written on), one after the commit.
    :class:`~bookfs.errors.Refused` when the append fails: a write that failed (its
    errno), a killed writer or a close that cannot be judged (EIO, ``r`` abandoned with
    every later reservation), bytes that are no event (EINVAL: a hole, or the payload
    check's verdict, finished here before the commit freezes the bytes), or the commit
    queue's own refusals.  The writer's closes are probed on the commit thread, in the
    save's own hand-off (:func:`commit_check`); a close from a thread whose table is not
    known yet is probed first, on ``prober``, before anything is frozen (a child's close
    must not stop the writer's writes)."""
    if r.state == FAILED:
        raise Refused(r.error, f"new/{r.name}: not committed")
    writer = r.writer
    known = None if ctx is None else writer.closing(ctx)
    if known is False or r.state == DONE:
        return False  # a copy's close (another table): commits nothing, waits for nothing
    check = None
    if r.state == OPEN and known is None and mounted:
        verdict, why = await closing(prober, mounts, writer, inode, ctx, mounted=mounted)
        if verdict == COPY:
            return False
        if verdict != UNKNOWN and not writer.table:
            writer.table = ctx.lock_owner  # a thread of the writer: its table now
        if verdict == HELD:
            if r.poisoned:
                raise Refused(r.poisoned, f"new/{r.name}: a write to it failed")
            return False
        if verdict in (KILLED, UNKNOWN):
            if r.state == OPEN:
                queue.abandon(r, why, errno.EIO)  # noted in the refusals
            raise Refused(errno.EIO, f"new/{r.name}: {why}")
    elif r.state == OPEN and ctx is not None and mounted and not SKIP_PROBE:
        check = functools.partial(commit_check, ctx.pid, writer, mounts, inode, known)
    if r.state == OPEN and not r.poisoned:
        # every byte written (checked or not), then the payload's check, finished before
        # the commit freezes the bytes (nothing awaits in between); refused by the queue
        # only if this close is the last
        if (hole := hole_refusal(r.staging)) is not None:
            r.refused = errno.EINVAL, hole
        else:
            why = None if r.payload is None else await r.payload.verdict(r.staging)
            r.refused = None if why is None else (errno.EINVAL, why.refusal)
    if r.state == FAILED:
        raise Refused(r.error, f"new/{r.name}: not committed")
    if await queue.commit(r, check):
        return True
    if r.poisoned:  # a dup's close: its write failed
        raise Refused(r.poisoned, f"new/{r.name}: a write to it failed")
    return False
