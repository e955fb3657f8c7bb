"""The offset index: where each event's deed starts, 8 bytes per event.

The index is derived data.  It is built by one forward pass over the log's framing
(``framing.py``), kept in memory as an ``array('Q')`` of offsets, and persisted under the
user's cache directory (``$BOOKFS_CACHE_DIR``, else XDG ``~/.cache/bookfs/index``), never
inside the pier.  :func:`configure_cache` overrides that place (``--index-dir``,
``-o index_dir=``) or turns persistence off (``--no-index-cache``, ``-o noindex_cache``:
nothing is read or written).  The cache directory is private (0700, owned by the user);
a load touches its file, and each process's first save prunes the directory: the
``INDEX_KEEP`` most recently used indexes stay, and older ones too while the directory
stays within ``INDEX_BUDGET`` bytes (a fleet's thousand small indexes are kept, a few
large ones are not), and any unused for ``INDEX_MAX_AGE`` go (only files named and shaped
like ours; never through a symlink), as do temporary files of saves cut short (a process
killed mid-save) once ``TEMP_MAX_AGE`` old.  A persisted index is validated against its
log on load (identity, header bytes, the last deed's tail bytes, a sample of deed lengths,
its own CRC) and rebuilt when anything disagrees; a log grown since: only the new part.

An index file may end with a *card*: opaque bytes a caller stored with the index
(:func:`save_index` ``card=``), written in the same atomic replace, so that the card
speaks of exactly the offsets and timeline beside it.  :func:`read_card` gives them back
reading only the file's tail (never the offsets): a fleet mount keeps there what the
attributes of a closed log's entries need (``formats/shipcard.py``), and decides itself
whether they still hold.  Nothing here trusts a card; a load ignores it.  A log with no
persisted index of its own (a pier) keeps its card in a *card file*
(:func:`save_card_file`, :func:`read_card_file`): named as an index is, written and
pruned as one, its card's bytes and CRC laid out as at an index file's end.

Besides offsets the index keeps a sparse *timeline*: ``(first event, unix ns)`` points
recorded when the log is seen to grow, at most one per second.  An event's mtime is the
time of the growth that brought it, so mtimes follow append order.  After a rebuild from
scratch every existing event gets the log file's mtime.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import logging
import os
import random
import re
import stat
import struct
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass, field

from bookfs.errors import BookError
from bookfs.formats.datecolumn import DateColumn
from bookfs.formats.deeds import UIP
from bookfs.formats.fileio import open_regular, private_dir
from bookfs.formats.layout import HEADER_SIZE, crc32

log = logging.getLogger(__name__)

_FILE_MAGIC = b"BFSIDX03"
# magic, dev, ino, first, count, end, verified_end, ntimes, header16, tail12, ndates; then
# the offsets (8 * count), the dates (8 * ndates: datecolumn.py), the timeline (16 *
# ntimes), the optional stamp and card, and the CRC of it all
_FILE_HEAD = struct.Struct("<8sQQQQQQQ16s12sQ")
_TIME = struct.Struct("<QQ")
#: The optional trailer that vouches for ``verified_end`` (see :class:`FileStamp`):
#: tag, the log's size, mtime_ns and ctime_ns when its contents were known, and when that
#: was recorded (wall clock, ns).
_STAMP = struct.Struct("<8sQQQQ")
_STAMP_TAG = b"VSTAMP01"
#: The optional card at the very end (before the file's CRC): the card's bytes, then
#: their CRC, their length and this tag, so the tail alone finds and checks them.
_CARD_FOOT = struct.Struct("<II8s")
_CARD_TAG = b"BFSCARD1"
_CARD_TAIL = 16 << 10  # bytes of an index file's tail read to find its card
#: A card file (:func:`save_card_file`): this magic, then a card as at an index's end.
#: Of the index files' magic family, so that :func:`prune_cache` counts and prunes it.
_CARD_MAGIC = b"BFSIDXC1"
_SAMPLE = 64  # deeds (len_d, let_d) re-checked against the log when a persisted index is loaded

INDEX_KEEP = 64  # persisted indexes always kept in the cache directory (most recently used)
INDEX_BUDGET = 1 << 30  # bytes: older indexes are kept too while the directory stays within
INDEX_MAX_AGE = 90 * 24 * 3600  # seconds: an index unused for this long is pruned
_INDEX_NAME = re.compile(r"[0-9a-f]{40}\.(?:idx|card|sums)")  # what _index_path names; only these
_TEMP_NAME, TEMP_MAX_AGE = re.compile(r"\.tmp-[a-z0-9_]{8}"), 3600  # _replace's, unused 1 h
_MAGIC_FAMILY = _FILE_MAGIC[:6]  # every version of our index files starts with this


@dataclass
class _CacheSettings:
    directory: str | None = None  # None: $BOOKFS_CACHE_DIR or the platform's user cache
    enabled: bool = True
    pruned: bool = False  # this process has pruned the directory once
    keep: int = INDEX_KEEP  # the prune's bound (keep_at_least raises it)


_settings = _CacheSettings()


def configure_cache(directory: str | None = None, *, enabled: bool = True) -> None:
    """Set, for this process (and a daemon it forks), where persisted indexes live
    (``directory``; ``None`` restores the default of :func:`cache_dir`) and whether any is
    read or written at all (``enabled=False``: every open scans the log's framing)."""
    _settings.directory = os.path.abspath(directory) if directory else None
    _settings.enabled = enabled
    _settings.pruned = False


def keep_at_least(n: int) -> None:
    """Make this process's prune keep at least ``n`` indexes (a fleet mount of ``n``
    logs: else a daemon's first save could drop those of its ships' indexes beyond
    :data:`INDEX_KEEP` and :data:`INDEX_BUDGET`, and each would be built again at its next
    open)."""
    _settings.keep = max(_settings.keep, n)


def cache_enabled() -> bool:
    """False once :func:`configure_cache` turned persisted indexes off."""
    return _settings.enabled


def cache_dir() -> str:
    """Where persisted indexes live: the :func:`configure_cache` directory, else
    ``$BOOKFS_CACHE_DIR``, else the platform's user cache (``~/.cache/bookfs/index``)."""
    if _settings.directory:
        return _settings.directory
    env = os.environ.get("BOOKFS_CACHE_DIR")
    if env:
        return env
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("bookfs"), "index")


def prune_cache(directory: str, *, keep: int = INDEX_KEEP, budget: int = INDEX_BUDGET,
                max_age: float = INDEX_MAX_AGE, now: float | None = None) -> list[str]:
    """Delete from ``directory`` the persisted indexes that are neither among the ``keep``
    most recently used (by mtime, which a load refreshes) nor within ``budget`` bytes
    counted from the most recently used down, and those unused for more than ``max_age``
    seconds; returns the paths deleted.  Only regular files (never followed through a
    symlink) named ``<40 hex>.idx`` (``.card``, ``.sums``) whose first bytes are an index magic
    are candidates, and temporary files of saves cut short (``.tmp-`` and mkstemp's 8
    characters) once :data:`TEMP_MAX_AGE` old.  Errors are skipped."""
    now = time.time() if now is None else now
    ours: list[tuple[float, int, str]] = []
    with contextlib.suppress(OSError), os.scandir(directory) as it:
        for entry in it:
            if _TEMP_NAME.fullmatch(entry.name):  # a save cut short (its process killed)
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > TEMP_MAX_AGE:
                        os.unlink(entry.path)
            if not _INDEX_NAME.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    ours.append((st.st_mtime, st.st_size, entry.path))
    ours.sort(reverse=True)
    doomed, total = [], 0
    for k, (mtime, size, p) in enumerate(ours):
        if now - mtime > max_age:
            doomed.append(p)
            continue
        total += size
        if k >= keep and total > budget:
            doomed.append(p)
    deleted = []
    for path in doomed:
        with contextlib.suppress(OSError, BookError):
            fd = open_regular(path, os.O_RDONLY)  # no symlink, no FIFO
            try:
                magic = os.pread(fd, len(_MAGIC_FAMILY), 0)
            finally:
                os.close(fd)
            if magic == _MAGIC_FAMILY:
                os.unlink(path)
                deleted.append(path)
    if deleted:
        log.info("pruned %d old index file(s) from %s", len(deleted), directory)
    return deleted


@dataclass
class OffsetIndex:
    """Offsets of consecutive deeds.  ``offsets[i]`` is where event ``first + i`` starts;
    ``end`` is the offset just past the last indexed deed.  ``verified_end``: every deed
    wholly below it has had its CRC checked by a writer's recovery or written by us."""

    first: int = 0
    offsets: array = field(default_factory=lambda: array("Q"))
    end: int = HEADER_SIZE
    verified_end: int = HEADER_SIZE
    times: list[tuple[int, int]] = field(default_factory=list)
    #: Set by :func:`load_index`: the persisted stamp matched the log as it is now, so
    #: ``verified_end`` speaks of the file's current contents (else it was reset).
    stamp: "FileStamp | None" = None
    #: The dates of the first ``len(dates)`` events (``datecolumn.py``), persisted here.
    dates: DateColumn = field(default_factory=DateColumn)

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def last(self) -> int:
        return self.first + len(self.offsets) - 1 if self.offsets else 0

    def offset(self, event: int) -> int:
        return self.offsets[event - self.first]

    def payload_size(self, event: int) -> int:
        i = event - self.first
        nxt = self.offsets[i + 1] if i + 1 < len(self.offsets) else self.end
        return UIP.payload_size(self.offsets[i], nxt)

    def truncate(self, count: int) -> None:
        """Keep only the first ``count`` deeds."""
        if count < len(self.offsets):
            new_end = self.offsets[count] if count < len(self.offsets) else self.end
            del self.offsets[count:]
            self.dates.truncate(count)
            self.end = new_end
            self.verified_end = min(self.verified_end, new_end)
            last = self.last
            while self.times and self.times[-1][0] > last:
                self.times.pop()

    def note_growth(self, first_new: int, now_ns: int) -> None:
        """Record that events from ``first_new`` on arrived at ``now_ns`` (1 s granularity)."""
        if not self.times or now_ns - self.times[-1][1] >= 1_000_000_000:
            self.times.append((first_new, max(now_ns, self.times[-1][1] if self.times else 0)))

    def mtime_ns(self, event: int) -> int:
        if not self.times:
            return 0
        i = bisect.bisect_right(self.times, (event, 1 << 64)) - 1
        return self.times[max(i, 0)][1]

    def memory_bytes(self) -> int:
        """Bytes this index holds per its arrays (8 per event plus the timeline)."""
        return self.offsets.itemsize * self.offsets.buffer_info()[1] + 16 * len(self.times)


@dataclass(frozen=True)
class FileStamp:
    """What a persisted ``verified_end`` is worth: the log's ``(size, mtime_ns, ctime_ns)``
    at a moment its writer knew every deed below the mark to be good (it had checked their
    CRCs, or written them itself); the device and inode are in the index's own head.

    Why this evidence, and not a hash.  A CRC pass over the log is what the mark saves; a
    hash of every page behind it costs the same reads (the CRC is as fast as any hash
    here), so it would save nothing.  A *sampled* hash is not sound: one flipped byte in a
    damaged copy lands in a sample with the probability of the sampled fraction.  The
    kernel's ctime is: every write, truncate or ``cp`` over the file (which keeps the
    inode), any ``touch`` or ``utime`` that sets mtime back, sets ctime to the current
    time, and no system call lets a program choose it.  So equal ``(dev, ino, size,
    mtime, ctime)`` means nobody wrote the file since, with one exception, the racy
    window (git's "racily clean" index): a filesystem stamps times with a coarse clock
    (a kernel tick, a second on some filesystems), so a write in the same tick as the
    stamp's ctime leaves ctime unchanged.  A stamp is therefore recorded only once the
    clock has moved past that tick (:func:`settle_stamp`), and a load trusts it only if
    it was (``taken_ns - ctime_ns`` at least :func:`racy_margin`).  What remains is a
    write by another program within one tick of the writer's own last write, under the
    writer's lock, keeping the size: not something a stamp can see, nor a sample.

    Cost: one ``fstat`` per open and per save, and at a writer's close a wait of at most
    :func:`racy_margin` (20 ms) when the log changed within it.  A stamp that does not
    match makes a writable open check every CRC again, as a first open does."""

    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> "FileStamp":
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def racy_margin(ctime_ns: int) -> int:
    """How long after a change its ctime may still be shared by a later change: two ticks
    of a 100 Hz kernel clock on a filesystem with sub-millisecond times, 2 s on one that
    keeps whole seconds or milliseconds (FAT keeps 2 s mtimes)."""
    return 2_000_000_000 if ctime_ns % 1_000_000 == 0 else 20_000_000


def settle_stamp(fd: int, stamp: FileStamp | None, *, wait: bool = True) -> int | None:
    """``taken_ns`` for ``stamp`` if the log open at ``fd`` still matches it and the clock
    has left its ctime's tick (waiting up to :func:`racy_margin` for that when ``wait``
    and the margin is short), else ``None``: the stamp is not worth recording."""
    if stamp is None:
        return None
    for _ in range(2):
        if FileStamp.of(os.fstat(fd)) != stamp:
            return None
        now = time.time_ns()
        margin = racy_margin(stamp.ctime_ns)
        late = stamp.ctime_ns + margin - now
        if late <= 0:
            return now
        if not wait or margin > 100_000_000:
            return now  # recorded as racy: a load will not trust it
        time.sleep(late / 1e9)
    return None


# --- persistence ---------------------------------------------------------------------------


def _index_path(log_path: str, st: os.stat_result, ext: str = ".idx") -> str:
    return os.path.join(cache_dir(), _index_name(log_path, st.st_dev, st.st_ino) + ext)


@functools.lru_cache(maxsize=4096)  # an open, its card and its save each ask; a realpath
def _index_name(log_path: str, dev: int, ino: int) -> str:  # is an lstat per path part
    return hashlib.sha256(f"{os.path.realpath(log_path)}\0{dev}\0{ino}".encode()).hexdigest()[:40]


def discard_index(log_path: str, fd: int) -> None:
    """Delete the persisted index of this log (it was found wrong), so the next open
    rebuilds it from the log.  Failure is logged, not raised."""
    if not _settings.enabled:
        return
    try:
        os.unlink(_index_path(log_path, os.fstat(fd)))
    except FileNotFoundError:
        return  # nothing persisted: nothing to discard
    except OSError as e:
        log.warning("could not discard the index of %s: %s", log_path, e)


def save_index(log_path: str, fd: int, index: OffsetIndex,
               stamp: FileStamp | None = None, card: bytes | None = None) -> None:
    """Persist ``index`` atomically (temp file + rename).  Failure is logged, not raised:
    the index is only a cache.  Nothing is written when the cache is off
    (:func:`configure_cache`); the first save of a process prunes the directory.

    ``stamp``: the log as it was when every deed below ``index.verified_end`` was known
    good (:class:`FileStamp`).  It is recorded only if the log still matches it
    (:func:`settle_stamp`); without it a later load keeps the offsets but not the mark.

    ``card``: bytes stored at the file's end with this index (module docstring); a save
    without one drops the card the file had."""
    if not _settings.enabled:
        return
    try:
        taken = settle_stamp(fd, stamp)
        if taken is None:  # a reader beside a writer: never replace a stamped index of
            # this very file that covers as much (the writer's next open would re-check)
            have = load_index(log_path, fd, os.fstat(fd).st_size)
            if have is not None and have.stamp is not None and have.end >= index.end:
                return
        st = os.fstat(fd)
        path = _index_path(log_path, st)
        header16 = os.pread(fd, HEADER_SIZE, 0)
        tail12 = UIP.tail_before(fd, index.end) if index.offsets else b""
        ndates = min(len(index.dates), index.count)
        head = _FILE_HEAD.pack(
            _FILE_MAGIC, st.st_dev, st.st_ino, index.first, index.count, index.end,
            index.verified_end, len(index.times), header16, tail12.ljust(12, b"\0"), ndates,
        )
        offs = index.offsets
        if sys.byteorder != "little":
            offs = array("Q", offs)
            offs.byteswap()
        times = b"".join(_TIME.pack(e, t) for e, t in index.times)
        if taken is not None:
            times += _STAMP.pack(_STAMP_TAG, stamp.size, stamp.mtime_ns, stamp.ctime_ns,
                                 taken)
        if card is not None:
            times += card + _CARD_FOOT.pack(crc32(card), len(card), _CARD_TAG)
        crc = crc32(offs, crc32(head))
        for chunk in index.dates.chunks(ndates):  # read twice (CRC, write), never held
            crc = crc32(chunk, crc)
        dates = index.dates.chunks(ndates)
        crc = crc32(times, crc)
        _replace(path, (head, offs, dates, times, struct.pack("<I", crc)))
    except (OSError, BookError) as e:
        log.warning("could not persist the index of %s: %s", log_path, e)


def _replace(path: str, chunks) -> None:
    """Write ``chunks`` as the file ``path`` of the private cache directory, atomically
    (a temp file renamed over it); the first write of a process then prunes the
    directory.  OSError and BookError reach the caller."""
    private_dir(os.path.dirname(path), "index cache directory")
    fd_tmp, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd_tmp, "wb") as f:
            for chunk in chunks:
                if isinstance(chunk, (bytes, bytearray, memoryview, array)):
                    f.write(chunk)
                else:  # an iterator of chunks (the dates)
                    f.writelines(chunk)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    if not _settings.pruned:
        _settings.pruned = True
        prune_cache(os.path.dirname(path), keep=_settings.keep)


def save_card_file(key_path: str, st: os.stat_result, card: bytes, kind="card") -> None:
    """Store ``card`` alone, for a log with no persisted index to keep it with (a pier), as
    a *card file* named as an index is (``key_path``, ``st``'s device and inode; ``kind``
    its suffix), written as one is (private directory, atomic replace, a CRC, pruned with
    the indexes).  Nothing written with the cache off; failures logged."""
    if not _settings.enabled:
        return
    body = _CARD_MAGIC + card + _CARD_FOOT.pack(crc32(card), len(card), _CARD_TAG)
    try:
        _replace(_index_path(key_path, st, f".{kind}"), (body, struct.pack("<I", crc32(body))))
    except (OSError, BookError) as e:
        log.warning("could not keep the card of %s: %s", key_path, e)


def read_card(log_path: str, st: os.stat_result) -> bytes | None:
    """The card stored with the persisted index of the log at ``log_path`` whose ``stat``
    is ``st`` (its device and inode name the index), or ``None``: no index, no card, the
    cache off or its directory not private, a card whose own CRC fails.  Reads only the
    index file's tail, never the log, and says nothing of whether the card still holds
    (its caller checks).  A card found touches the index file, so pruning keeps it."""
    if not _settings.enabled:
        return None
    return _tail_card(_index_path(log_path, st), _FILE_HEAD.size)


def read_card_file(key_path: str, st: os.stat_result, kind="card") -> bytes | None:
    """The card :func:`save_card_file` stored for ``key_path`` and ``st``, or ``None``, as
    :func:`read_card` (the file touched when found; never trusted here)."""
    if not _settings.enabled:
        return None
    return _tail_card(_index_path(key_path, st, f".{kind}"), len(_CARD_MAGIC))


def _tail_card(path: str, head: int) -> bytes | None:
    """The card at the end of the cache file ``path``, after ``head`` bytes of its own."""
    try:
        private_dir(os.path.dirname(path), "index cache directory", create=False)
        ifd = open_regular(path, os.O_RDONLY)
    except (OSError, BookError):
        return None
    try:
        size = os.fstat(ifd).st_size
        tail = os.pread(ifd, min(size, _CARD_TAIL), max(0, size - _CARD_TAIL))
        card = _card_in(tail, size, head)
        if card is None and size > _CARD_TAIL:  # a card longer than the tail read
            n = _card_len(tail)
            if n is not None and n + _CARD_FOOT.size + 4 <= size:
                card = _card_in(os.pread(ifd, n + _CARD_FOOT.size + 4,
                                         size - n - _CARD_FOOT.size - 4), size, head)
    except OSError:
        return None
    finally:
        os.close(ifd)
    if card is not None:
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)
    return card


def _card_len(tail: bytes) -> int | None:
    if len(tail) < _CARD_FOOT.size + 4:
        return None
    crc, n, tag = _CARD_FOOT.unpack_from(tail, len(tail) - 4 - _CARD_FOOT.size)
    return n if tag == _CARD_TAG else None


def _card_in(tail: bytes, file_size: int, head: int) -> bytes | None:
    """The card at the end of ``tail`` (the last bytes of a file of ``file_size`` bytes
    whose first ``head`` bytes are no card's) if it is whole there and its CRC holds."""
    n = _card_len(tail)
    foot = _CARD_FOOT.size + 4
    if n is None or n + foot > len(tail) or n + foot + head > file_size:
        return None
    crc = _CARD_FOOT.unpack_from(tail, len(tail) - foot)[0]
    card = tail[len(tail) - foot - n : len(tail) - foot]
    return card if crc32(card) == crc else None


def load_index(log_path: str, fd: int, size: int) -> OffsetIndex | None:
    """The persisted index of this log if it is valid for it, else ``None`` (and a log line
    saying why).  A valid index may cover less than the log: the caller extends it.
    Always ``None`` when the cache is off or its directory is not private; a valid index's
    file is touched, so pruning keeps the indexes in use."""
    if not _settings.enabled:
        return None
    st = os.fstat(fd)
    path = _index_path(log_path, st)
    try:
        private_dir(os.path.dirname(path), "index cache directory", create=False)
        ifd = open_regular(path, os.O_RDONLY)  # never a symlink, never a FIFO that hangs
    except FileNotFoundError:
        return None
    except (OSError, BookError) as e:
        log.info("index %s unreadable (%s); rebuilding", path, e)
        return None
    try:
        raw, ndates, crc_ok = _read_index_file(ifd)
        why = _validate(raw, fd, st, size, crc_ok)
    except OSError as e:
        why = f"unreadable: {e}"
    if isinstance(why, str):
        os.close(ifd)
        log.info("index for %s is stale (%s); rebuilding", log_path, why)
        return None
    ndates = min(ndates, why.count)
    if ndates:  # the dates are read in place from this file (datecolumn.py)
        why.dates = DateColumn((ifd, _FILE_HEAD.size + 8 * why.count, ndates))
    else:
        os.close(ifd)
    with contextlib.suppress(OSError):  # the LRU clock of prune_cache
        os.utime(path, follow_symlinks=False)
    return why


def _read_index_file(ifd: int) -> tuple[bytes, int, bool]:
    """An index file's bytes less its dates section, the number of dates, and whether
    the file's CRC holds (computed over the dates too, streamed: never held whole)."""
    total = os.fstat(ifd).st_size
    hs = _FILE_HEAD.size
    head = os.pread(ifd, hs, 0)
    if len(head) < hs or head[:8] != _FILE_MAGIC:
        return head, 0, False
    count, ndates = _FILE_HEAD.unpack(head)[4], _FILE_HEAD.unpack(head)[10]
    at = hs + 8 * count
    if at + 8 * ndates + 4 > total:
        return head, 0, False
    offs = _pread_exact(ifd, 8 * count, hs)
    crc = crc32(offs, crc32(head))
    for k in range(at, at + 8 * ndates, 1 << 20):
        crc = crc32(_pread_exact(ifd, min(1 << 20, at + 8 * ndates - k), k), crc)
    rest = _pread_exact(ifd, total - at - 8 * ndates, at + 8 * ndates)
    crc_ok = len(rest) >= 4 and crc32(rest[:-4], crc) == struct.unpack_from(
        "<I", rest, len(rest) - 4)[0]
    return head + offs + rest, ndates, crc_ok


def _pread_exact(fd: int, n: int, off: int) -> bytes:
    data = os.pread(fd, n, off)
    if len(data) != n:
        raise OSError(f"short read ({len(data)} of {n} bytes at {off})")
    return data


def _validate(raw: bytes, fd: int, st: os.stat_result, size: int, crc_ok: bool):
    """The index in ``raw`` (an index file less its dates: :func:`_read_index_file`) if
    it holds for the log ``fd`` (``st``, ``size`` bytes), else why not."""
    hs = _FILE_HEAD.size
    if len(raw) < hs + 4 or raw[:8] != _FILE_MAGIC:
        return "not an index file"
    (magic, dev, ino, first, count, end, verified_end, ntimes, header16, tail12, _) = (
        _FILE_HEAD.unpack_from(raw)
    )
    body = hs + 8 * count + 16 * ntimes
    extra = len(raw) - 4 - body  # the stamp and the card, each optional
    n_card = _card_len(raw)
    if n_card is not None and extra - n_card - _CARD_FOOT.size in (0, _STAMP.size):
        extra -= n_card + _CARD_FOOT.size
    if extra not in (0, _STAMP.size):
        return "wrong size"
    if not crc_ok:
        return "checksum mismatch"
    if (dev, ino) != (st.st_dev, st.st_ino):
        return "a different file"
    if end > size:
        return f"covers {end} bytes but the log has {size}"
    if os.pread(fd, HEADER_SIZE, 0) != header16:
        return "the log header changed"
    offsets = array("Q")
    offsets.frombytes(raw[hs : hs + 8 * count])
    if sys.byteorder != "little":
        offsets.byteswap()
    if count:
        if UIP.tail_before(fd, end) != tail12:
            return "the last deed changed"
        if offsets[0] != HEADER_SIZE:
            return "does not start after the header"
        rng = random.Random()  # seeded from the OS: a crafted index cannot know the picks
        picks = {0, count - 1} | {rng.randrange(count) for _ in range(_SAMPLE)}
        for i in picks:
            nxt = offsets[i + 1] if i + 1 < count else end
            why = UIP.spans(fd, offsets[i], nxt)
            if why is not None:
                return f"deed {i}'s {why}"
    elif end != HEADER_SIZE:
        return "empty index not at the header"
    times = [
        _TIME.unpack_from(raw, hs + 8 * count + 16 * k) for k in range(ntimes)
    ]
    stamp = None
    if extra == _STAMP.size:
        tag, ssize, mtime, ctime, taken = _STAMP.unpack_from(raw, body)
        here = FileStamp.of(st)
        if (tag == _STAMP_TAG and here == FileStamp(ssize, mtime, ctime)
                and taken - ctime >= racy_margin(ctime)):
            stamp = here
    # the mark speaks of the file only while nobody has written it since (FileStamp)
    mark = min(verified_end, end) if stamp is not None else HEADER_SIZE
    return OffsetIndex(first, offsets, end, mark, times, stamp)
