"""What every kind of node shares: cache timeouts, permissions, the :class:`Kind` base.

Cache timeouts (each kind's docstring says which it uses and why):

* ``FOREVER`` (a day): immutable entries and attributes (``events/<N>``, a complete
  segment, the names of the fixed directories and files);
* ``CHANGING`` (1 s): attributes an append changes (a directory's size and mtime,
  ``meta/*``'s mtime).  Without attribute caching on directories,
  ``default_permissions`` would cost a round trip per directory on every path walk;
* ``GROWING`` (0): files whose size an append changes (``info``, the last segment):
  every ``stat`` asks, so ``tail -f`` (which polls ``fstat``) sees the new size.

Permissions: the mount uses ``default_permissions``; owner and group come from the source
log file, and the modes give each class (user, group, other) only what every user of that
class could do on disk along the whole path (:func:`surely`, :func:`source_bits`; the
README's ``allow_other`` paragraph and ``docs/architecture.md``, "Permissions"), looked at
again while mounted (:class:`SourceAccess`): no user reads or appends through the mount
who could not read or write the log itself.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
import time
from typing import NamedTuple

import pyfuse3

from bookfs.errors import refuse
from bookfs.formats.layout import (
    EPOC_NAME,
    EPOCH_NAME,
    LMDB_DATA_NAME,
    LOG_NAME,
    META_NAME,
    PIER_LOG_DIR,
)
from bookfs.fs.state import Modes, MountState  # noqa: F401 (Modes re-exported)

log = logging.getLogger(__name__)

FOREVER = 24 * 3600.0  # cache timeout for immutable entries (seconds)
CHANGING = 1.0  # attribute timeout for things an append changes (seconds)
GROWING = 0.0  # attribute timeout for files whose size an append changes


def _source_file(book) -> str:
    """The file whose owner and mode stand for the log: the newest epoch's log for a
    pier, ``book.log`` (or LMDB's ``data.mdb``) otherwise."""
    epochs = getattr(book, "epochs", None)
    if epochs:
        book = epochs[-1].log
    for attr in ("log_path", "data_path"):
        path = getattr(book, attr, None)
        if path and os.path.exists(path):
            return path
    data = os.path.join(book.directory, "data.mdb")
    return data if os.path.exists(data) else book.directory


# --- the rule: never more than the source gives (README, "allow_other") --------------------

#: seconds a look at the source's permissions is believed (then the next request looks
#: again; with ``CHANGING`` on every directory, a ``chmod`` reaches users within ~1.25 s)
REFRESH = 0.25
#: the files a log is read from, in its directory or in each epoch's of a pier
READ_FILES = (LOG_NAME, META_NAME, EPOC_NAME, LMDB_DATA_NAME)
USER, GROUP, OTHER = 6, 3, 0  # a class, as the shift of its three bits
#: POSIX ACLs as Linux stores them (``include/uapi/linux/posix_acl_xattr.h``: a u32 version
#: 2, then ``(u16 tag, u16 perm, u32 id)`` per entry; tags ``include/uapi/linux/posix_acl.h``)
ACL_XATTR = "system.posix_acl_access"
_ACL_ENTRY = struct.Struct("<HHI")
_ACL_NAMED_OR_GROUP = (0x02, 0x04, 0x08)  # ACL_USER, ACL_GROUP_OBJ, ACL_GROUP
_ACL_MASK, _ACL_OTHER = 0x10, 0x20


class Node(NamedTuple):
    """What the access check of one file or directory on disk depends on: its owner,
    group and mode bits, and for one with an ACL the bits every user but its owner
    surely has (:func:`acl_non_owner`), else None."""

    uid: int
    gid: int
    mode: int
    acl: int | None


def acl_non_owner(raw: bytes) -> int:
    """The bits that every user but the owner surely has on a node whose access ACL is
    ``raw``: such a user is checked against a named-user entry, a group entry (the
    owning group's or a named one, each cut by the mask) or ``other``'s
    (``fs/posix_acl.c``, ``posix_acl_permission``), and which one depends on who they
    are and their groups, so only the bits all of these give.  An ACL that does not
    parse gives nothing (deny)."""
    if len(raw) < 4 or (len(raw) - 4) % _ACL_ENTRY.size or raw[:4] != b"\x02\0\0\0":
        return 0
    mask, other, entries = 7, 0, 7
    for tag, perm, _ in _ACL_ENTRY.iter_unpack(raw[4:]):
        if tag == _ACL_MASK:
            mask = perm & 7
        elif tag == _ACL_OTHER:
            other = perm & 7
        elif tag in _ACL_NAMED_OR_GROUP:
            entries &= perm
    return entries & mask & other


def node(path: str) -> Node:
    """:class:`Node` of ``path`` (``stat``, and its ACL if it has one)."""
    st = os.stat(path)
    try:
        acl = acl_non_owner(os.getxattr(path, ACL_XATTR))
    except OSError as e:
        if e.errno not in (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        acl = None
    return Node(st.st_uid, st.st_gid, st.st_mode & 0o777, acl)


def surely(n: Node, cls: int, uid: int, gid: int) -> int:
    """The bits (``rwx`` as 4, 2, 1) that *every* user of class ``cls`` of a mount whose
    files show owner ``uid`` and group ``gid`` has on the node ``n`` on disk.

    Who is in a class: USER is the user ``uid`` (with any groups); GROUP, every other
    user with ``gid`` among their groups; OTHER, every user neither ``uid`` nor in
    ``gid``.  On ``n`` the kernel checks such a user as ``n``'s owner (if they are its
    owner), else as its group (if ``n``'s group is among theirs), else as other
    (``fs/namei.c``, ``acl_permission_check``).  Which applies is known only where the
    class says it: USER owns ``n`` exactly when ``n.uid == uid``, and GROUP and OTHER
    never own it then; a GROUP user is in ``n``'s group when ``n.gid == gid``, an OTHER
    user is not.  Anything not known counts every way it could go: the bits are those
    that all of them give (a GROUP or OTHER user might own ``n``; any user might be in
    its group).  A node with an ACL gives a non-owner :func:`acl_non_owner`'s bits."""
    owner, group, other = n.mode >> 6 & 7, n.mode >> 3 & 7, n.mode & 7
    if n.acl is not None:
        non_owner = n.acl
    elif n.gid == gid and cls == GROUP:
        non_owner = group
    elif n.gid == gid and cls == OTHER:
        non_owner = other
    else:
        non_owner = group & other
    if cls == USER:
        return owner if n.uid == uid else non_owner
    return non_owner if n.uid == uid else owner & non_owner


class Looks:
    """Looks at directories, each kept for :data:`REFRESH` seconds: what many logs
    share (a fleet's ships, ``fs/fleet/ship.py``: every directory from ``/`` down to the
    fleet's), looked at once in that time rather than once per log.  A ``chmod``,
    ``chown`` or a link replaced on such a directory is seen within :data:`REFRESH`, as
    on one log's own path.  At most :data:`LOOKS_KEPT` directories are kept."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[float, Node]] = {}
        self._reals: dict[str, tuple[float, str]] = {}

    def node(self, path: str) -> Node:
        """:func:`node` of the directory ``path``, as looked at in the last
        :data:`REFRESH` seconds."""
        return self._kept(self._nodes, path, node)

    def realpath(self, path: str) -> str:
        """``path`` with symbolic links resolved: its parent's resolution kept, its own
        name looked at now (:func:`_real`)."""
        parent, name = os.path.split(path)
        if not parent or name in ("", ".", ".."):
            return os.path.realpath(path)
        return _real(os.path.join(self._kept(self._reals, parent, os.path.realpath), name))

    @staticmethod
    def _kept(table: dict, path: str, look):
        now = time.monotonic()
        got = table.get(path)
        if got is None or now - got[0] >= REFRESH:
            if len(table) >= LOOKS_KEPT:
                table.clear()
            got = table[path] = (now, look(path))
        return got[1]


LOOKS_KEPT = 100_000  # directories a Looks keeps (a few hundred bytes each)


def _real(path: str) -> str:
    """``path`` with symbolic links resolved, its parent's already being resolved (one
    ``lstat`` unless it is a link)."""
    return os.path.realpath(path) if os.path.islink(path) else path


def source_paths(directory: str, looks: Looks | None = None
                 ) -> tuple[str, list[str], list[str]]:
    """``(standing, files, directories)`` of the log in ``directory``, symbolic links
    resolved: the file whose owner stands for it (a pier's newest epoch's ``book.log``
    or ``data.mdb``, else the directory's, else the directory itself); every file it is
    read from (:data:`READ_FILES` in the directory, and for a pier its top-level
    ``.urb/log/data.mdb`` and those of each epoch ``.urb/log/0i<N>``; the directory
    itself if there is none); and every directory on their paths, from ``/`` down.
    OSError if one cannot be looked at.  ``looks``: the directory's parent resolved as
    :class:`Looks` keeps it."""
    top = looks.realpath(directory) if looks is not None else os.path.realpath(directory)
    places, files = [top], []
    if os.path.isdir(os.path.join(top, PIER_LOG_DIR)):
        log_dir = os.path.realpath(os.path.join(top, PIER_LOG_DIR))
        epochs = sorted((int(m.group(1)), m.group(0)) for m in
                        map(EPOCH_NAME.fullmatch, os.listdir(log_dir)) if m)
        places = [_real(os.path.join(log_dir, name)) for _, name in epochs] or [top]
        files = [p for p in [_found(os.path.join(log_dir, LMDB_DATA_NAME))] if p]
    found = {(place, name): _found(os.path.join(place, name))
             for place in places for name in READ_FILES}
    files += [p for p in found.values() if p]
    standing = next((found[places[-1], name] for name in (LOG_NAME, LMDB_DATA_NAME)
                     if found[places[-1], name]), places[-1])
    files = files or [top]
    dirs: dict[str, None] = {}
    for path in (top, *files):
        d, chain = (path if path == top else os.path.dirname(path)), []
        while d not in dirs:
            chain.append(d)
            if d == os.path.dirname(d):
                break
            d = os.path.dirname(d)
        dirs.update(dict.fromkeys(reversed(chain)))
    return standing, files, list(dirs)


def _found(path: str) -> str | None:
    """``path``, symbolic links resolved (its parent's already being resolved), if it
    names something that exists, else None: one ``lstat``, and more only for a link."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISLNK(st.st_mode):
        return path
    return os.path.realpath(path) if os.path.exists(path) else None


def source_bits(directory: str, uid: int, gid: int, standing: str | None = None,
                looks: Looks | None = None, paths: tuple | None = None) -> int:
    """The mode bits (``0o777``: read and write per class) that the log in ``directory``
    gives the classes of a mount whose files show owner ``uid`` and group ``gid``: a
    class reads if every user of it (:func:`surely`) can search every directory from
    ``/`` to each file the log is read from and can read each of those files; it writes
    if every user of it can search them all and write the file that stands for the log
    (``standing``, if given, else :func:`source_paths`'s).  OSError if a path cannot be
    looked at.  ``looks``: the directories as :class:`Looks` keeps them; ``paths``: what
    :func:`source_paths` just gave for ``directory``, if the caller has it."""
    found, files, dirs = paths or source_paths(directory, looks)
    if standing is not None:
        standing = os.path.realpath(standing) if looks is None else looks.realpath(standing)
    else:
        standing = found
    dir_nodes = [node(d) for d in dirs] if looks is None else [looks.node(d) for d in dirs]
    file_nodes = [node(f) for f in files]
    writable = file_nodes[files.index(standing)] if standing in files else node(standing)
    mode = 0
    for cls in (USER, GROUP, OTHER):
        if all(surely(n, cls, uid, gid) & 1 for n in dir_nodes):
            r = all(surely(n, cls, uid, gid) & 4 for n in file_nodes)
            w = surely(writable, cls, uid, gid) & 2
            mode |= ((4 if r else 0) | w) << cls
    return mode


def directory_bits(path: str, uid: int, gid: int, umask: int | None = None) -> int:
    """The read and search bits (``0o555`` at most) that the directory ``path`` gives
    the classes of a mount whose root shows owner ``uid`` and group ``gid`` (a fleet's
    root: ``fs/fleet/ops.py``): for each class, the bits every user of it has on ``path``
    (:func:`surely`), if every one of them can search every directory above it; none if
    it cannot be looked at.  With ``umask=``, ``0o555 & ~umask``."""
    if umask is not None:
        return 0o555 & ~umask
    try:
        top = os.path.realpath(path)
        chain = [top]
        while chain[-1] != os.path.dirname(chain[-1]):
            chain.append(os.path.dirname(chain[-1]))
        above, here = [node(d) for d in chain[1:]], node(top)
    except OSError:
        return 0
    mode = 0
    for cls in (USER, GROUP, OTHER):
        if all(surely(n, cls, uid, gid) & 1 for n in above):
            mode |= (surely(here, cls, uid, gid) & 5) << cls
    return mode


def modes_from(mode: int, readonly: bool, umask: int | None = None) -> Modes:
    """The mount's :class:`Modes` from the bits the source gives (:func:`source_bits`),
    or from ``0o777 & ~umask`` when the ``umask=`` option replaces them: read bits for
    files, search where readable, write only on a read-write mount."""
    if umask is not None:
        mode = 0o777 & ~umask
    r = mode & 0o444
    w = 0 if readonly else mode & 0o222
    rx = r | (r >> 2)
    return Modes(read=r, dir=rx, new=rx | w | (w >> 1), meta=r | w, staged=w)


NO_ACCESS = Modes(0, 0, 0, 0, 0)


class SourceAccess:
    """A single mount's permissions as the source gives them *now*: looked at again
    (:func:`source_bits`) by the first request more than :data:`REFRESH` seconds after
    the last look, so a ``chmod`` or ``chown`` of the log or of any directory above it
    reaches the mount's users within about a second (the kernel keeps a directory's
    attributes ``CHANGING``, then asks again before its next permission check:
    ``fs/fuse/dir.c``, ``fuse_permission``).  The owner and group the mount shows, and
    that the classes are counted from, are the log's when it was mounted.  A source
    that cannot be looked at (its directory renamed or removed) gives no access until
    it can again."""

    def __init__(self, book, readonly: bool, owner: tuple[int | None, int | None],
                 umask: int | None):
        self.log, self.readonly, self.umask = book, readonly, umask
        st = os.stat(_source_file(book))
        self.source_owner = st.st_uid, st.st_gid
        self.uid = st.st_uid if owner[0] is None else owner[0]
        self.gid = st.st_gid if owner[1] is None else owner[1]
        self._at = time.monotonic()
        self._failed = False
        self._modes = self._look()

    def _look(self) -> Modes:
        if self.umask is not None:
            return modes_from(0, self.readonly, self.umask)
        try:
            bits = source_bits(self.log.directory, *self.source_owner,
                               standing=_source_file(self.log))
        except OSError as e:
            if not self._failed:  # said once per failure, not at every look
                log.warning("%s: cannot look at the source's permissions (%s): no access "
                            "through the mount until it can", self.log.directory, e)
            self._failed = True
            return NO_ACCESS
        self._failed = False
        return modes_from(bits, self.readonly)

    def now(self) -> Modes:
        """The modes, looked at again if the last look is over :data:`REFRESH` old."""
        at = time.monotonic()
        if at - self._at >= REFRESH:
            self._at = at
            self._modes = self._look()
        return self._modes


class LiveModes:
    """:class:`Modes` read from a :class:`SourceAccess` at each use: what
    :func:`source_modes` gives a mount, so every node kind's ``fs.modes.read`` (...)
    follows the source."""

    __slots__ = ("access",)

    def __init__(self, access: SourceAccess):
        self.access = access

    read = property(lambda self: self.access.now().read)
    dir = property(lambda self: self.access.now().dir)
    new = property(lambda self: self.access.now().new)
    meta = property(lambda self: self.access.now().meta)
    staged = property(lambda self: self.access.now().staged)


def source_modes(book, readonly: bool, *, owner: tuple[int | None, int | None] = (None, None),
                 umask: int | None = None) -> tuple[int, int, LiveModes]:
    """``(uid, gid, modes)`` for a single mount: the source log file's owner and group
    at mount time, and :class:`LiveModes`: for each class (user, group, other) the log's
    read and write bits, each only where every user of the class could do the same on
    disk, along the whole path (:func:`source_bits`), followed while mounted
    (:class:`SourceAccess`).  Write bits are dropped on a read-only mount.  With the
    kernel's ``default_permissions`` this lets no user read through the mount who could
    not read the log, nor append who could not write it (root is, as always, exempt).

    The mount options ``uid=``/``gid=`` (``owner``) replace the owner and group, and
    ``umask=`` replaces the modes with ``0o777 & ~umask`` (then the same rules: read bits
    for files, search where readable, write only on a read-write mount): an explicit
    grant by whoever mounts, as on other filesystems."""
    access = SourceAccess(book, readonly, owner, umask)
    return access.uid, access.gid, LiveModes(access)


def modes_of(path: str, directory: str, readonly: bool, *,
             owner: tuple[int | None, int | None] = (None, None),
             umask: int | None = None, looks: Looks | None = None,
             paths: tuple | None = None, st: os.stat_result | None = None
             ) -> tuple[int, int, Modes, os.stat_result]:
    """What a fleet mount shows of a ship whose log is not open: ``(uid, gid, modes,
    stat)`` of a log whose source file (the file whose owner and mode stand for it) is
    ``path`` and whose directory is ``directory``: that file's owner (or ``owner``'s),
    the modes :func:`source_bits` gives (or ``umask``'s) as :func:`source_modes` gives
    an open one, and that file's ``stat``.  OSError if a path cannot be looked at.
    ``looks`` and ``paths``: :func:`source_bits`'s; ``st``: ``path``'s ``stat``, just
    taken by the caller."""
    st = st or os.stat(path)
    bits = 0 if umask is not None else source_bits(directory, st.st_uid, st.st_gid,
                                                   standing=path, looks=looks, paths=paths)
    modes = modes_from(bits, readonly, umask)
    uid, gid = owner
    return (st.st_uid if uid is None else uid), (st.st_gid if gid is None else gid), modes, st


def make_attrs(uid: int, gid: int, ino: int, mode: int, size: int, mtime_ns: int,
               timeout: float, nlink: int = 1, entry_timeout: float | None = None
               ) -> pyfuse3.EntryAttributes:
    """One node's attributes as every mount answers them: owner ``uid``/``gid``, 4 KiB
    blocks, atime = ctime = mtime, the attribute ``timeout`` (and the entry's, unless
    ``entry_timeout``)."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = ino
    a.st_mode = mode
    a.st_nlink = nlink
    a.st_uid, a.st_gid = uid, gid
    a.st_size = size
    a.st_blksize = 4096
    a.st_blocks = (size + 511) // 512
    a.st_atime_ns = a.st_ctime_ns = a.st_mtime_ns = mtime_ns
    a.attr_timeout = timeout
    a.entry_timeout = timeout if entry_timeout is None else entry_timeout
    return a


class BytesHandle:
    """A snapshot served to readers (``info``, a meta field, a rendering)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


def negative() -> pyfuse3.EntryAttributes:
    """A negative entry the kernel may cache: for names that can never exist."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = 0
    a.entry_timeout = FOREVER
    return a


class Kind:
    """One kind of node: the handlers the dispatcher (:mod:`bookfs.fs.ops`) routes the
    inodes of its range to.  The defaults are the answers for a kind that does not do
    the request (and for an inode no kind owns): no such file (``attrs``, ``open``), not
    readable (``read_inode``: EBADF), fixed attributes (``setattr``)."""

    def __init__(self, fs: MountState):
        self.fs = fs
        self.log = fs.log

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        """GETATTR (and the attributes a lookup answers)."""
        raise pyfuse3.FUSEError(errno.ENOENT)

    def existing(self, event: int) -> int:
        """``event``, once the log holds it: an event not seen yet makes the follower look
        at the log once (a writer may just have committed it); still absent, ENOENT."""
        if event not in self.log:
            self.fs.watch.look()
            if event not in self.log:
                raise pyfuse3.FUSEError(errno.ENOENT)
        return event

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        """OPEN (on a mount that answers opens; ``writing``: the flags that would)."""
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        """A READ with no open behind it (fh 0: the no-open path)."""
        raise pyfuse3.FUSEError(errno.EBADF)

    async def setattr(self, ino: int, attr, fields, fh, ctx) -> pyfuse3.EntryAttributes:
        """SETATTR: a node's attributes are fixed unless its kind says otherwise."""
        if fields.update_size:
            raise refuse(errno.EROFS, f"inode {ino}: events are immutable; append through new/")
        raise refuse(errno.EPERM, f"inode {ino}: attributes are fixed")
