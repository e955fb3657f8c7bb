"""Who still holds an open file: how ``flush`` tells the **last** close from the others.

The kernel sends FLUSH on every ``close()`` of every descriptor that refers to an open
file: the close of a ``dup``, the exit of a forked child, the ``exec`` of a subprocess
(``O_CLOEXEC``), the shell's ``dup2`` dance around ``> new/N``.  Only the close that drops
the last descriptor may commit (DESIGN.md, the ``new/`` contract).  RELEASE does mark the
end, but it is asynchronous: ``close()`` has already returned by then, so it cannot carry
the result.  At FLUSH time the closing descriptor is already gone from its table (a
``close`` removes it before flushing; an exiting process detaches its whole table first),
so the close is the last one exactly when no descriptor anywhere still refers to the file.

:class:`HolderScan` finds those descriptors through ``/proc/<pid>/fd``:

* a descriptor can only reach another process by inheritance (``fork``), so the
  candidates are the creating process plus every process started after the file was
  created.  PIDs grow, so "started after" is "PID above the last PID handed out at
  create time" (``/proc/loadavg``, read with one ``pread``); when no PID at all was handed
  out since the create, the creator is the only candidate and ``/proc`` is not listed;
  when the PID counter has wrapped meanwhile, every process is a candidate.  A steady
  single writer therefore costs one listing of its own ``fd`` directory per close;
* a candidate holds the file if one of its descriptors' link is this file's path and
  ``/proc/<pid>/fdinfo`` confirms the inode and a writable access mode;
* only ``readlink`` is used: a ``stat`` of the link would re-enter this filesystem;
* a previous holder is asked whether a signal killed it only when its descriptor table
  is gone (an exit detaches the table before it closes the descriptors), so a writer's
  ordinary close costs no read of its ``stat``.

A copy that another thread's ``fork`` made a moment before its ``exec`` (every descriptor
is copied, ``O_CLOEXEC`` ones included) is **transient**: it goes away at the exec.  Such
copies must not turn the writer's own close into a non-last one, or a multi-threaded
writer that spawns processes would see ``close()`` return 0 for an event not yet
committed.  So a holder whose copies are all ``O_CLOEXEC``, in a process other than the
creator, is reported as transient, and ``flush`` waits (briefly) for it to go.

FUSE does not say which process a FLUSH comes from, so the closes of such copies are told
from the writer's own by :meth:`HolderScan.creator_waiting`: while no thread of the
creator is blocked in a FUSE request, a flush cannot be the creator's close, and it must
not wait for the commit (its process may be the child a predecessor's writer waits for).
When the two cannot be told apart, the flush waits: the worst case is then a bounded
stall that ends in a failed close, never a close that returns 0 for an event not saved.

Limits, stated: descriptors passed over a Unix socket (``SCM_RIGHTS``) or taken with
``pidfd_getfd`` into a process older than the file are not seen, nor are processes whose
``/proc`` entries the daemon may not read (another user's, when the daemon is not root).
Such a holder's later write is refused (the event was already committed), never merged
into a shorter event.
"""

from __future__ import annotations

import contextlib
import os

PF_EXITING = 0x4  # /proc/<pid>/stat flags bit: the task is exiting
_WRITABLE = (os.O_WRONLY, os.O_RDWR)

#: syscalls that can close a descriptor, per machine: name -> number.  ``close`` and
#: ``dup2``/``dup3`` (onto the descriptor) close one; ``close_range``, ``execve`` (its
#: O_CLOEXEC ones) and the exits close many.
_CLOSERS = {
    "x86_64": {"close": 3, "dup2": 33, "dup3": 292, "close_range": 436, "execve": 59,
               "execveat": 322, "exit": 60, "exit_group": 231},
    "aarch64": {"close": 57, "dup3": 24, "close_range": 436, "execve": 221,
                "execveat": 281, "exit": 93, "exit_group": 94},
}.get(os.uname().machine)

#: syscalls that write to a descriptor (its number the first argument), per machine.
_WRITERS = {
    "x86_64": {1, 18, 20, 296, 328},  # write, pwrite64, writev, pwritev, pwritev2
    "aarch64": {64, 68, 66, 70, 287},
}.get(os.uname().machine)


_loadavg: list[int] = []  # a descriptor of /proc/loadavg, opened on first use


def last_pid() -> int:
    """The PID most recently handed out in this PID namespace (one ``pread`` of a
    descriptor kept open: every append asks, twice)."""
    if not _loadavg:
        _loadavg.append(os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC))
    return int(os.pread(_loadavg[0], 128, 0).split()[-1])


TGID_CACHE = 4096  # thread -> process IDs remembered (cleared when full)
_tgids: dict[int, int] = {}


def tgid(pid: int) -> int:
    """The thread-group (process) ID of thread ``pid`` (FUSE requests carry thread IDs);
    ``pid`` itself if it cannot be read.

    Remembered: a remembered answer ``g`` is re-checked with one ``stat`` of
    ``/proc/g/task/pid``, which exists exactly while ``pid`` is a thread of ``g`` (thread
    IDs are unique at any moment), so a recycled thread ID is never misattributed."""
    g = _tgids.get(pid)
    if g is not None:
        try:
            os.stat(f"/proc/{g}/task/{pid}")
            return g
        except OSError:
            del _tgids[pid]
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                g = int(line.split()[1])
                if len(_tgids) >= TGID_CACHE:
                    _tgids.clear()
                _tgids[pid] = g
                return g
    return pid


def killed_by_signal(pid: int) -> bool:
    """True if ``pid`` is exiting because a signal killed it (its descriptors are being
    closed by the kernel, not by the program).  A process that exits normally, is still
    running, or is gone returns False."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    fields = data[data.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state); flags is field 9, exit_code field 52
    flags = int(fields[6])
    exit_code = int(fields[49]) if len(fields) > 49 else 0
    return bool(flags & PF_EXITING) and (exit_code & 0x7F) != 0


def _fdinfo(pid: int, fd: str) -> tuple[int, int]:
    """``(inode, flags)`` of descriptor ``fd`` of ``pid`` from its fdinfo."""
    ino, flags = -1, -1
    with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
        for line in f:
            if line.startswith(b"flags:"):
                flags = int(line.split()[1], 8)
            elif line.startswith(b"ino:"):
                ino = int(line.split()[1])
    return ino, flags


NOT_HELD, TRANSIENT, HELD = 0, 1, 2


class HolderScan:
    """Finds the processes holding a writable descriptor of one file of this mount.

    ``path`` is the file's path as ``readlink`` of a descriptor shows it (the mount
    point must be a real path, resolved before mounting); ``inode`` its inode number.
    Created when the file is created, by the thread ``creator``."""

    __slots__ = ("path", "inode", "creator", "thread", "since", "last", "fds", "_links",
                 "_tables")

    def __init__(self, path: str, inode: int, creator: int):
        self.path = path
        # Another process's lookup of new/<N> (a second writer's create, a stat) finds no
        # entry and makes the kernel drop the writer's dentry: its links then end in
        # " (deleted)".  The inode check below still tells the file apart.
        self._links = (path, path + " (deleted)")
        self.inode = inode
        self.thread = creator  # the creating thread: it usually writes the file, too
        self.creator = tgid(creator)
        self.since = last_pid()
        self.last: set[int] = {self.creator}  # the holders the previous scan found
        self.fds: set[int] = set()  # the creator's descriptor numbers for the file
        self._tables: set[int] = set()  # processes the last scan found with descriptors

    def _candidates(self) -> list[int]:
        now = last_pid()
        if now == self.since:  # no process (nor thread) started since the create
            return [self.creator]
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        if now < self.since:  # the PID counter wrapped: anyone may be a child
            return pids
        return [self.creator] + [p for p in pids if p > self.since]

    def _holds(self, pid: int) -> int:
        """HELD, TRANSIENT (only ``O_CLOEXEC`` copies, outside the creator) or NOT_HELD."""
        try:
            fd_dir = os.open(f"/proc/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:  # gone, or not ours to read
            return NOT_HELD
        try:
            names = os.listdir(fd_dir)
        except OSError:  # exiting (its table detached)
            return NOT_HELD
        else:
            if names:
                self._tables.add(pid)
            held = NOT_HELD
            links = self._links  # a link is compared before fdinfo is read (cheaper)
            for name in names:
                try:
                    if os.readlink(name, dir_fd=fd_dir) not in links:
                        continue
                except OSError:
                    continue
                flags = self._writable_flags(pid, name)
                if flags is None:
                    continue
                if pid == self.creator:
                    self.fds.add(int(name))
                    return HELD
                if not flags & os.O_CLOEXEC:
                    return HELD
                held = TRANSIENT
            return held
        finally:
            os.close(fd_dir)

    def note_creator_fds(self) -> None:
        """Record the creator's descriptor numbers for the file (called on its writes,
        so the numbers are known before its close).

        A ``new/`` file is written with ``direct_io``, so the writing thread sits in its
        ``write`` call while the WRITE is answered: when that is the creating thread,
        ``/proc/<pid>/task/<tid>/syscall`` names the descriptor, and one link and one
        fdinfo confirm it.  Otherwise the creator's whole table is scanned."""
        if self.fds:
            return
        fd = self._writing_fd()
        if fd is not None and self._writable_flags(self.creator, str(fd), link=True) is not None:
            self.fds.add(fd)
        else:
            self._holds(self.creator)

    def _writable_flags(self, pid: int, name: str, link: bool = False) -> int | None:
        """The open flags of descriptor ``name`` of ``pid`` if it is a writable descriptor
        of this file (by fdinfo's inode; with ``link``, its link is checked first, which
        callers that read the link themselves skip); None if not, or if it is gone."""
        try:
            if link and os.readlink(f"/proc/{pid}/fd/{name}") not in self._links:
                return None
            ino, flags = _fdinfo(pid, name)
        except (OSError, ValueError):
            return None
        if ino != self.inode or flags & os.O_ACCMODE not in _WRITABLE:
            return None
        return flags

    def _writing_fd(self) -> int | None:
        """The descriptor the creating thread is writing to right now, if it is inside
        a write call."""
        if _WRITERS is None:
            return None
        with contextlib.suppress(OSError, ValueError), \
                open(f"/proc/{self.creator}/task/{self.thread}/syscall", "rb") as f:
            fields = f.read().split()
            if len(fields) > 1 and fields[0].isdigit() and int(fields[0]) in _WRITERS:
                return int(fields[1], 16)
        return None  # not inside a write (or gone, or unreadable)

    def creator_waiting(self) -> bool:
        """True if a thread of the creating process may be closing this file right now:
        it is inside ``close``/``dup2``/``dup3`` on one of the creator's descriptor
        numbers for it, or inside ``close_range``, ``execve`` or an exit.  False means
        the flush being answered comes from another process: a copy.  When it cannot be
        told (unknown machine, unknown descriptor numbers, unreadable ``/proc``), True:
        the safe side."""
        if _CLOSERS is None or not self.fds:
            return True
        single = {_CLOSERS[k] for k in ("close",) if k in _CLOSERS}
        onto = {_CLOSERS[k] for k in ("dup2", "dup3") if k in _CLOSERS}
        many = {_CLOSERS[k] for k in ("close_range", "execve", "execveat", "exit",
                                      "exit_group") if k in _CLOSERS}
        try:
            tasks = os.listdir(f"/proc/{self.creator}/task")
        except OSError:
            return False  # gone: none of its closes is pending
        for tid in tasks:
            try:
                with open(f"/proc/{self.creator}/task/{tid}/syscall", "rb") as f:
                    fields = f.read().split()
            except OSError:
                return True
            if not fields or fields[0] == b"running" or fields[0] == b"-1":
                continue
            try:
                nr = int(fields[0])
                args = [int(a, 16) for a in fields[1:4]]
            except ValueError:
                return True
            if nr in many:
                return True
            if nr in single and args[0] in self.fds:
                return True
            if nr in onto and args[1] in self.fds:
                return True
        return False

    @staticmethod
    def _dropping(pid: int) -> bool:
        """True if process ``pid`` is inside a call that drops descriptors (``close``,
        ``close_range``, ``dup2``/``dup3``, ``execve``, an exit): a fork child on its way
        to ``exec``, whose ``O_CLOEXEC`` copies are going away.  Such a child may be
        blocked in this very filesystem (closing another copy), so nobody may wait for
        it."""
        if _CLOSERS is None:
            return False
        closers = set(_CLOSERS.values())
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return True  # gone
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/syscall", "rb") as f:
                    nr = f.read().split(maxsplit=1)[0]
            except (OSError, IndexError):
                continue
            if nr.lstrip(b"-").isdigit() and int(nr) in closers:
                return True
        return False

    def holders(self) -> tuple[dict[int, int], bool]:
        """``({pid: HELD or TRANSIENT}, killed)`` for the processes holding the file now.
        ``killed`` is True when nobody holds it any more and one of the previous holders
        (so the process whose close this is) is exiting because a signal killed it: a
        writer that never finished."""
        found = {}
        self._tables.clear()
        for pid in self._candidates():
            how = self._holds(pid)
            if how == TRANSIENT and self._dropping(pid):
                continue  # its O_CLOEXEC copy is on its way out
            if how:
                found[pid] = how
        previous, self.last = self.last, set(found)
        if found:
            return found, False
        # An exit closes the descriptors after detaching the table, so a holder whose
        # table still lists descriptors is not being killed: only the others are asked.
        return found, any(killed_by_signal(pid) for pid in previous
                          if pid not in self._tables)
