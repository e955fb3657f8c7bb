"""Which mount is at a path: the kernel's table, ``/proc/self/mountinfo``, read in one
place for every tool that must know whether a path is a bookfs mount (``umount``,
``append``, ``spark``) and for the daemon's watchdog.

A bookfs mount has type ``fuse.bookfs`` (FUSE subtype ``bookfs``) and source
``bookfs:<source path>`` unless the user gave another ``fsname=``.  Several mounts may
stack at one path; the last line for it is the one on top, which is the one a path
lookup reaches.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from bookfs.errors import UsageError

FUSE_SUBTYPE = "bookfs"  # mounts show as type fuse.bookfs
FSTYPE = "fuse." + FUSE_SUBTYPE
FSNAME_PREFIX = "bookfs:"  # the mount's source column: bookfs:<source>
MOUNTINFO = "/proc/self/mountinfo"


def unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: the mount's ID, where it is, its per-mount options
    (``ro``, ``nodev``...), its type, its source column and its device
    (``major:minor``, shared by every bind mount of one filesystem)."""

    mount_id: str
    point: str
    options: tuple[str, ...]
    fstype: str
    source: str
    device: str = ""

    @property
    def readonly(self) -> bool:
        return "ro" in self.options

    @property
    def is_bookfs(self) -> bool:
        return self.fstype == FSTYPE

    @property
    def bookfs_source(self) -> str | None:
        """The source path a bookfs mount serves; None if ``fsname=`` replaced it."""
        if self.source.startswith(FSNAME_PREFIX):
            return self.source[len(FSNAME_PREFIX):]
        return None


def mount_at(path: str, *, resolve: bool = True) -> Mount | None:
    """The mount on top at ``path`` (resolved with realpath unless ``resolve`` is false:
    the watchdog looks at a path whose daemon may be dead), or None if nothing is mounted
    exactly there."""
    real = os.path.realpath(path) if resolve else path
    found = None
    with open(MOUNTINFO) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) > 5 and unescape(fields[4]) == real and rfields:
                found = Mount(fields[0], real, tuple(fields[5].split(",")), rfields[0],
                              unescape(rfields[1]) if len(rfields) > 1 else "", fields[2])
    return found


def mounts_under(path: str) -> list[Mount]:
    """Every mount strictly inside the directory ``path`` (already resolved), the deepest
    and latest first: the order they can be unmounted in (a read-write mount's
    companion binds, ``fs/daemon/companion.py``)."""
    prefix = path.rstrip("/") + "/"
    found = []
    with open(MOUNTINFO) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) > 5 and rfields and unescape(fields[4]).startswith(prefix):
                found.append(Mount(fields[0], unescape(fields[4]),
                                   tuple(fields[5].split(",")), rfields[0],
                                   unescape(rfields[1]) if len(rfields) > 1 else "",
                                   fields[2]))
    found.reverse()
    found.sort(key=lambda m: m.point.count("/"), reverse=True)
    return found


def mount_devices() -> dict[int, str]:
    """Every mount in this process's mount namespace: its ID -> its filesystem's
    ``major:minor`` (a mount and its bind mounts share one)."""
    with open(MOUNTINFO) as f:
        return {int(fields[0]): fields[2] for fields in (line.split(maxsplit=3) for line in f)}


def bookfs_mount_at(path: str) -> Mount:
    """The bookfs mount at ``path``; :class:`UsageError` (one line, naming what is
    there instead) if nothing or something else is mounted there."""
    m = mount_at(path)
    if m is None:
        raise UsageError(f"{path}: not a bookfs mount point (nothing is mounted there); "
                         "expected the mount point of 'bookfs mount'")
    if not m.is_bookfs:
        raise UsageError(f"{path}: not a bookfs mount point (a {m.fstype} mount, not "
                         "bookfs); expected the mount point of 'bookfs mount'")
    return m
