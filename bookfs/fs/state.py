"""What a mount holds, declared in one place, as the kernel's ``fs/fuse/fuse_i.h``
declares a FUSE connection's shared state (issue 36, item 2).

The dispatcher (:class:`bookfs.fs.ops.LogOperations`) holds a mount's state; the node
kinds (``fs/nodes/``), the follower (``watch.py``) and the tail (``tail.py``) are handed
it as a :class:`MountState` and use nothing else of it.  :class:`Kernel` is the small
interface through which they tell the kernel to drop what it cached (a fleet's ship
maps it into the fleet's inodes, ``fs/fleet/ship.py``).

Declarations only (``Protocol``), of types from the layers below and of small protocols
for the collaborators that live beside the node kinds (:class:`Watching`,
:class:`Tailing`), so importing this module imports no module of the request path and no
import circle goes through it (``tests/test_layers.py`` counts type-checking imports too).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from bookfs.formats.eventlog import EventLog
from bookfs.fs.append.commit_queue import CommitQueue, Refusals, WorkerThread
from bookfs.fs.append.rule import Mounts
from bookfs.fs.generations import Generations


class Modes(NamedTuple):
    """Permission bits of the mount's files, derived from the source
    (``nodes/base.py``, ``source_modes``)."""

    read: int  # events, segments, info files
    dir: int  # events/, meta/, epochs/, the root
    new: int  # new/: search and list for readers, create for writers
    meta: int  # meta/<key>
    staged: int  # a new/<N> being written


class Kernel(Protocol):
    """What a mount may tell the kernel about its inodes (pyfuse3's notifications; each
    raises OSError ENOENT when the kernel holds nothing of it)."""

    def invalidate_inode(self, inode: int, attr_only: bool = False) -> None:
        """Drop the inode's cached attributes and, unless ``attr_only``, its pages."""

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Drop the dentry ``name`` of directory ``parent``."""


class Watching(Protocol):
    """The watch on the log (``watch.py``): a read-only mount looking at its log again."""

    known: tuple[int, int]

    def look(self, *, inline_sync: bool = True) -> None: ...
    def read_then_recheck(self, inode: int | None, what: str, read: Any, *args: Any
                          ) -> bytes: ...
    def changing_inodes(self, since: int = 0, mtimes: bool = True) -> list[int]: ...
    def drop_attrs_now(self, inodes: list[int]) -> None: ...


class Tailing(Protocol):
    """The lookups waiting under ``follow/`` (``tail.py``)."""

    waiting: int
    arrived: Any  # a trio.Event: set when a wait begins

    def published(self) -> None: ...
    def head(self) -> int: ...
    async def wait_for(self, event: int, what: str, *args: Any, **kw: Any) -> Any: ...


class MountState(Kernel, Protocol):
    """One mount's shared state: the log, its collaborators, and the few services of
    the dispatcher that every node kind uses."""

    log: EventLog  # the log (any format: a Book, vere's, LMDB, a pier)
    epochs: list  # a pier's epochs (shown under epochs/), else empty
    segments: Any  # the bulk view (formats/segments.py), or None where there is none
    readonly: bool
    mountpoint: str | None  # None when the operations are driven without a mount
    mounted_ns: int
    modes: Modes
    no_open: bool  # reads come by inode, without an OPEN (patched pyfuse3, read-only)
    cache_dirs: bool  # listings may be cached by the kernel (patched pyfuse3)
    request_owner: bool  # every FLUSH and WRITE says its caller (the commit rule needs it)
    reads_note: str  # how event reads reach the log, for info's reads: line
    watch: Watching
    generations: Generations  # the log's generation and the inodes' slots
    tail: Tailing
    queue: CommitQueue  # new/'s ordered group commit (fs/append/)
    refusals: Refusals  # refused appends and meta writes, for info
    prober: WorkerThread  # the thread the commit rule's probes run on
    mounts: Mounts  # this mount's device, for the commit rule's probe
    readdir_reply: Any  # pyfuse3.readdir_reply, or a fleet's ship's mapping of it
    # the kinds of node (fs/nodes/), for the few that reach another kind
    event_files: Any
    pretty_files: Any
    segment_files: Any
    new_files: Any

    def handle(self, fh: int) -> Any: ...
    def new_fh(self, handle: Any) -> int: ...
    def file_info(self, fh: int, **kw: Any) -> Any: ...
    def fuse_path(self) -> str: ...
    def entry_attrs(self, ino: int, mode: int, size: int, mtime_ns: int, timeout: float,
                    **kw: Any) -> Any: ...
    async def attrs_of(self, ino: int) -> Any: ...
    def source_here(self) -> bool: ...
