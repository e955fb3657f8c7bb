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
  create time" (``/proc/loadavg``); when the PID counter has wrapped meanwhile, every
  process is a candidate.  A steady single writer therefore costs one ``listdir`` of
  ``/proc`` plus one of its own ``fd`` directory;
* a candidate holds the file if one of its descriptors' link is this file's path and
  ``/proc/<pid>/fdinfo`` confirms the inode and a writable access mode;
* only ``readlink`` is used: a ``stat`` of the link would re-enter this filesystem.

A copy that another thread's ``fork`` made a moment before its ``exec`` (every descriptor
is copied, ``O_CLOEXEC`` ones included) is **transient**: it goes away at the exec.  Such
copies must not turn the writer's own close into a non-last one, or a multi-threaded
writer that spawns processes would see ``close()`` return 0 for an event not yet
committed.  So a holder whose copies are all ``O_CLOEXEC``, in a process other than the
creator, is reported as transient, and ``flush`` waits (briefly) for it to go.

Limits, stated: descriptors passed over a Unix socket (``SCM_RIGHTS``) or taken with
``pidfd_getfd`` into a process older than the file are not seen, nor are processes whose
``/proc`` entries the daemon may not read (another user's, when the daemon is not root).
Such a holder's later write is refused (the event was already committed), never merged
into a shorter event.
"""

from __future__ import annotations

import os

PF_EXITING = 0x4  # /proc/<pid>/stat flags bit: the task is exiting
_WRITABLE = (os.O_WRONLY, os.O_RDWR)


def last_pid() -> int:
    """The PID most recently handed out in this PID namespace."""
    with open("/proc/loadavg", "rb") as f:
        return int(f.read().split()[-1])


def tgid(pid: int) -> int:
    """The thread-group (process) ID of thread ``pid`` (FUSE requests carry thread IDs);
    ``pid`` itself if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
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

    __slots__ = ("path", "inode", "creator", "since", "last")

    def __init__(self, path: str, inode: int, creator: int):
        self.path = path
        self.inode = inode
        self.creator = tgid(creator)
        self.since = last_pid()
        self.last: set[int] = {self.creator}  # the holders the previous scan found

    def _candidates(self) -> list[int]:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        if last_pid() < self.since:  # the PID counter wrapped: anyone may be a child
            return pids
        return [self.creator] + [p for p in pids if p > self.since]

    def _holds(self, pid: int) -> int:
        """HELD, TRANSIENT (only ``O_CLOEXEC`` copies, outside the creator) or NOT_HELD."""
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, exiting (its table detached), or not ours to read
            return NOT_HELD
        held = NOT_HELD
        for name in names:
            try:
                if os.readlink(f"{fd_dir}/{name}") != self.path:
                    continue
                ino, flags = _fdinfo(pid, name)
            except (OSError, ValueError):
                continue
            if ino != self.inode or flags & os.O_ACCMODE not in _WRITABLE:
                continue
            if pid == self.creator or not flags & os.O_CLOEXEC:
                return HELD
            held = TRANSIENT
        return held

    def holders(self) -> tuple[dict[int, int], bool]:
        """``({pid: HELD or TRANSIENT}, killed)`` for the processes holding the file now.
        ``killed`` is True when nobody holds it any more and one of the previous holders
        (so the process whose close this is) is exiting because a signal killed it: a
        writer that never finished."""
        found = {}
        for pid in self._candidates():
            how = self._holds(pid)
            if how:
                found[pid] = how
        previous, self.last = self.last, set(found)
        return found, not found and any(killed_by_signal(pid) for pid in previous)
