"""What one task of ``format("bookfs")`` reads, and how a read is cut into tasks; the batch
reader and the stream reader (:mod:`bookfs.spark.source`) share it.

A read of a mount with ``segments/`` is planned as the segment files holding its event
range (:func:`bookfs.spark.rows.plan_segments`), packed into runs of consecutive segments
of about :data:`MAX_PARTITION_BYTES` and about equal bytes (:func:`pack`, :func:`balanced`),
one run a task (:class:`SegmentRuns`).  A task takes each segment of its run through the
mount, mapped or read (:class:`SegmentBytes`; only the bytes of its own deeds when the
range covers part of a segment, skipping the others by their length words), checks every
deed's CRC and makes Arrow batches of the columns asked for (:mod:`bookfs.spark.rows`).
A task asked for ``event``, ``size`` and ``epoch`` alone reads each segment's sizes file instead
(``segments/<K>.sizes``, 8 bytes an event: :func:`_sizes_batches`), what ``ls -l events/``
shows: no payload byte is read and no CRC checked, as on the ``events/`` path.
A mount without ``segments/`` (a pier or LMDB mount) is read from its ``events/`` files,
:data:`EVENTS_PER_PARTITION` a task (:class:`EventFiles`).  Every task checks that it
returned exactly the events it was planned for: a stale view of the mount fails the task,
never drops a row.
"""

from __future__ import annotations

import errno
import mmap
import os
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from bookfs.spark.columns import SHIP
from bookfs.spark.rows import DECODED, EventMtime, _batches, _segment_batches, plan_segments

#: Events per partition when reading ``events/`` (no ``segments/`` on the mount).
EVENTS_PER_PARTITION = 5000
#: The columns a segment's sizes file gives (:func:`_sizes_batches`; ``epoch`` is null on
#: the ``segments/`` path: a plain Book log has no epochs).
FROM_SIZES = frozenset({"event", "epoch", "size"})


def reads_sizes(columns) -> bool:
    """Whether a read of ``columns`` (None: every column) takes the segments' sizes files
    instead of the segments: :data:`FROM_SIZES` and ``ship`` alone."""
    return columns is not None and set(columns) - {SHIP} <= FROM_SIZES
#: Bytes of ``segments/`` one task reads, about (option ``maxPartitionBytes``; a read is cut
#: into :func:`task_count` runs of about equal bytes, :func:`balanced`).  Four times Spark's
#: own file sources' default (``spark.sql.files.maxPartitionBytes``) because a Python data
#: source's task costs Spark 4.3 tens of milliseconds besides its work (on 2 cores, 16
#: one-row partitions take 0.6 s more than 2): over the 1,000,000-event sample's 2.4 GB,
#: ``event``+``size`` took 1.15 s in 128 MiB tasks, 0.86 s in 256 MiB and 0.71 s in
#: 512 MiB, and every column 3.67, 3.42 and 3.37 s (medians of 3 interleaved rounds).
#: A task's memory does not grow with it: its segments are taken one at a time.
MAX_PARTITION_BYTES = 512 << 20
#: The fewest bytes a task is given when a read is cut finer for the cores
#: (:func:`task_count`), as Spark's files keep ``spark.sql.files.openCostInBytes``: below it
#: a task's fixed cost outweighs its work.
MIN_TASK_BYTES = 16 << 20


@dataclass(frozen=True)
class Mount:
    """A mount to read; ``ship`` is its @p when the table has a ``ship`` column."""

    path: str
    ship: str | None = None


def committed(path: str, first: int | None = None) -> tuple[int, int] | None:
    """``(first, last)`` committed events of the mount at ``path`` (None while it has
    none): the count is ``events/``'s size, the first event the mount's ``info`` (pass
    ``first`` when known: it is read only then)."""
    count = os.stat(os.path.join(path, "events")).st_size
    if not count:
        return None
    if first is None:
        from bookfs.formats.info import parse

        with open(os.path.join(path, "info")) as f:
            first = int(parse(f.read(1 << 16))["first"])
    return first, first + count - 1


class SegmentRange:
    """Events ``lo..hi`` of the segment file holding events ``first..last`` of the mount
    at ``mnt``; ``size``: the segment file's bytes (what planning packs by)."""

    def __init__(self, first: int, last: int, lo: int, hi: int, mnt: str = "",
                 size: int = 0):
        self.first, self.last, self.lo, self.hi = first, last, lo, hi
        self.mnt, self.size = mnt, size


class SegmentRuns(InputPartition):
    """One task's read: consecutive :class:`SegmentRange` parts of one mount, packed up to
    :data:`MAX_PARTITION_BYTES`; ``ship``: the value of the ``ship`` column (None: no such
    column)."""

    def __init__(self, ranges: list[SegmentRange], mnt: str, ship: str | None = None):
        super().__init__((mnt, ranges[0].first, ranges[0].lo, ranges[-1].hi))
        self.ranges, self.mnt, self.ship = ranges, mnt, ship


def task_count(total: int, max_bytes: int, cores: int | None = None) -> int:
    """How many tasks read ``total`` bytes: ``ceil(total / max_bytes)``, rounded up to a
    multiple of ``cores`` (so the last wave of tasks is as full as the others: on 2 cores,
    242 MiB is 2 tasks, not 1) while each task keeps :data:`MIN_TASK_BYTES`; never fewer
    than ``ceil(total / max_bytes)``, so a small ``maxPartitionBytes`` still makes small
    tasks.  ``cores``: by default the CPUs the planner may run on (its affinity mask, not
    ``os.cpu_count()``, which counts the host's), as Spark's ``local[*]`` counts them; on
    a cluster it only sets a floor, and ``maxPartitionBytes`` the size."""
    if not cores:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            cores = os.cpu_count() or 1
    cores = max(1, cores)
    k = max(1, -(-total // max(max_bytes, 1)))
    most = total // MIN_TASK_BYTES  # tasks that each keep MIN_TASK_BYTES
    return max(k, min(-(-k // cores) * cores, most))


def balanced(items: list, size_of, runs: int) -> list[list]:
    """``items`` in at most ``runs`` runs of consecutive ones of about equal bytes
    (``size_of(item)``), an item going to the run its middle byte falls in, so a run
    passes ``total / runs`` bytes by at most half of each of its two end items (fewer runs
    when items are fewer or larger).

    Packing greedily up to ``maxPartitionBytes`` instead left a small last run: the
    100,000-event sample's 242 MiB of segments made tasks of 117, 117 and 8 MiB, one more
    wave of tasks on 2 cores for 3 % of the bytes, a fifth of an ``event``+``size`` read."""
    sizes = [size_of(x) for x in items]
    total = sum(sizes)
    k = max(1, runs)
    out: list[list] = []
    before, last = 0, -1
    for item, size in zip(items, sizes):
        run = min(k - 1, (before + size // 2) * k // total) if total else 0
        if run != last:
            out.append([])
            last = run
        out[-1].append(item)
        before += size
    return out


def pack(ranges: list[SegmentRange], max_bytes: int) -> list[list[SegmentRange]]:
    """``ranges`` (consecutive segments) in :func:`task_count` :func:`balanced` runs by
    their segments' bytes."""
    total = sum(r.size for r in ranges)
    return balanced(ranges, lambda r: r.size, task_count(total, max_bytes))


class EventFiles(InputPartition):
    """The ``events/`` files of the events listed (ascending) of the mount at ``mnt``."""

    def __init__(self, events: list[int], mnt: str = "", ship: str | None = None):
        super().__init__((mnt, events[0], events[-1]))
        self.events, self.mnt, self.ship = events, mnt, ship


class Packed(InputPartition):
    """Several planned partitions of different mounts read by one task, one after the
    other (:func:`pack_mounts`): many small ships cost one task per ``max_bytes``, as
    one log holding their bytes would, instead of one task each."""

    def __init__(self, parts: list[InputPartition]):
        super().__init__(tuple(p.value for p in parts))
        self.parts = parts


def _part_bytes(part, max_bytes: int, per_partition: int) -> int:
    if isinstance(part, SegmentRuns):
        return sum(r.size for r in part.ranges)
    if isinstance(part, EventFiles):  # no sizes planned: a full run counts as max_bytes
        return max_bytes * len(part.events) // max(per_partition, 1)
    return 0


def pack_mounts(parts: list[InputPartition], max_bytes: int,
                per_partition: int = EVENTS_PER_PARTITION) -> list[InputPartition]:
    """``parts`` (planned per mount, in order) with consecutive ones packed into
    :class:`Packed` tasks: :func:`task_count` :func:`balanced` runs of about
    ``max_bytes``."""
    sizes = {id(p): _part_bytes(p, max_bytes, per_partition) for p in parts}
    groups = balanced(parts, lambda p: sizes[id(p)],
                      task_count(sum(sizes.values()), max_bytes))
    return [g[0] if len(g) == 1 else Packed(g) for g in groups]


def plan(mount: Mount, since: int | None, until: int | None, per_partition: int,
         max_bytes: int = MAX_PARTITION_BYTES, columns: list[str] | None = None
         ) -> tuple[list[InputPartition], int]:
    """The partitions that read events ``since..until`` (inclusive; None: the mount's
    first, last) of ``mount``, and the last event they hold (less than ``since`` if
    none).  ``segments/`` ranges (:func:`bookfs.spark.plan_segments`) when the mount has
    them, packed in runs of at most ``max_bytes`` (:func:`pack`) of what the tasks read
    (for ``columns`` that :func:`_sizes_batches` gives, 8 bytes an event, so such a read
    is one task up to 2 million events), else ``events/`` files in runs of
    ``per_partition``."""
    if since is not None and until is not None and since > until:
        return [], since - 1
    mnt = mount.path
    if os.path.isdir(os.path.join(mnt, "segments")):
        lo, hi, chosen = plan_segments(mnt, since, until)
        seg_dir = os.path.join(mnt, "segments")
        if reads_sizes(columns):
            ranges = [SegmentRange(*t, mnt=mnt, size=8 * (t[3] - t[2] + 1)) for t in chosen]
        else:
            ranges = [SegmentRange(*t, mnt=mnt, size=os.stat(
                os.path.join(seg_dir, f"{t[0]:012d}")).st_size) for t in chosen]
        return [SegmentRuns(run, mnt, mount.ship) for run in pack(ranges, max_bytes)], hi
    view = committed(mnt)
    if view is None:
        return [], (since or 1) - 1
    lo = view[0] if since is None else max(since, view[0])
    hi = view[1] if until is None else min(until, view[1])
    events = list(range(lo, hi + 1))
    k = per_partition
    return [EventFiles(events[i:i + k], mnt, mount.ship) for i in range(0, len(events), k)], hi


def _skip_deeds(fd: int, pos: int, count: int, size: int, path: str) -> int:
    """The byte offset ``count`` deeds after offset ``pos`` of the open segment ``fd``
    (``size`` bytes), reading only each deed's length word (the UIP layout's
    :meth:`~bookfs.formats.deeds.Deeds.skip`); a ValueError naming ``path`` if a deed
    is truncated or runs past the segment's end."""
    from bookfs.formats.deeds import UIP, BadDeed

    try:
        return UIP.skip(fd, pos, count, size)
    except BadDeed as e:
        raise ValueError(f"{path}: {e}") from None


#: ``madvise(2)`` advice that faults a mapping's pages in up front and reports a page that
#: cannot be read as an error instead of a SIGBUS at its first touch: Linux 5.14's
#: ``MADV_POPULATE_READ``, 22 in ``include/uapi/asm-generic/mman-common.h``;
#: ``mm/madvise.c``, ``madvise_populate()``: "case -EFAULT: /* VM_FAULT_SIGBUS or
#: VM_FAULT_SIGSEGV */ return -EFAULT".  Python 3.11's ``mmap`` module does not name it.
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


def populate(m: mmap.mmap, start: int, end: int, path: str) -> bool:
    """Fault in the pages of bytes ``start..end`` of the mapping ``m`` of ``path``: True, or
    False where the kernel has no :data:`MADV_POPULATE_READ` (EINVAL before Linux 5.14).
    A page that cannot be read (the file is shorter than the mapping, or the read fails)
    is an OSError naming the file and the bytes, never a SIGBUS later."""
    first = start - start % mmap.PAGESIZE
    try:
        m.madvise(MADV_POPULATE_READ, first, end - first)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS):
            return False
        raise OSError(e.errno, f"{path}: bytes {start}..{end} cannot be read "
                      f"({os.strerror(e.errno)})") from None
    return True


class SegmentBytes:
    """How one task gets the bytes of the segments it reads, one segment after the other.

    **Mapped** where the kernel can: the segment file is ``mmap``-ed through the mount and
    every page of the part read is faulted in at once (:data:`MADV_POPULATE_READ`), so the
    rows are made from the page cache's own pages, with no copy.  A page the daemon cannot
    serve is then an ``OSError`` here, not a SIGBUS in the row builder.  A segment
    shrinks under a mount only when its log is cut: by hand, or by a writer undoing a
    save the disk refused (deeds never acknowledged); cut while a task holds it mapped,
    it ends that worker by SIGBUS, a failed task that Spark reports and retries, never a
    wrong row.  **Read** otherwise (an empty segment, a
    kernel before 5.14, a file the mount will not map), into one buffer reused from
    segment to segment: a fresh 16 MiB ``bytearray`` a segment is zeroed and faulted in,
    then unmapped again, and cost more than its read.

    Why: on 2 cores, two tasks reading the 100,000-event sample's 242 MiB at once spent
    130 ms each copying into fresh buffers and 75 ms each mapped (``format("bookfs")``
    with ``event``+``size``).  Both ways are safe to reuse and release because no row keeps
    a view of the bytes: both row builders copy what they keep (the ``jam`` bytes, the
    decoded columns), and a segment's batches are all made before the next segment is
    opened (:func:`read_partition`)."""

    __slots__ = ("_buf",)

    def __init__(self):
        self._buf = bytearray()

    @contextmanager
    def view(self, fd: int, size: int, start: int, end: int, path: str):
        """Bytes ``start..end`` of the segment open at ``fd`` (``size`` bytes), as a
        memoryview valid inside the ``with`` (fewer bytes if the file is cut short)."""
        m = self._mapped(fd, size, start, end, path)
        if m is None:
            yield self._read(fd, start, end)
            return
        view = memoryview(m)[start:end]
        try:
            yield view
        finally:
            view.release()
            with suppress(BufferError):  # a view of it is still held: the mapping goes
                m.close()                # with the last of them

    @staticmethod
    def _mapped(fd: int, size: int, start: int, end: int, path: str):
        """The segment open at ``fd`` mapped with bytes ``start..end`` faulted in, or None
        where it cannot be (then it is read instead)."""
        if end <= start:
            return None
        try:
            m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        try:
            populated = populate(m, start, end, path)
        except BaseException:
            m.close()
            raise
        if not populated:
            m.close()
            return None
        return m

    def _read(self, fd: int, start: int, end: int) -> memoryview:
        if len(self._buf) < end - start:
            self._buf = bytearray(end - start)
        view = memoryview(self._buf)[:end - start]
        got = 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], start + got)
            if not n:
                break
            got += n
        return view[:got]


def _read_segment(p: SegmentRange, want=None, source: SegmentBytes | None = None):
    """Events ``p.lo..p.hi`` of one segment: only their bytes when the range is a part of
    the segment (the deeds before and after are skipped by their length words), the whole
    file otherwise, taken by ``source`` (:class:`SegmentBytes`; a new one when None).
    ``want``: the columns (:func:`_batches`); an event's mtime is looked up only for
    ``committed_at``, and only when it has no date
    (:class:`~bookfs.spark.rows.EventMtime`)."""
    if reads_sizes(want):
        try:
            yield from _sizes_batches(p)
            return
        except FileNotFoundError:  # a daemon from before segments/<K>.sizes (issue 34.5)
            pass
    path = os.path.join(p.mnt, "segments", f"{p.first:012d}")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        start = _skip_deeds(fd, 0, p.lo - p.first, size, path)
        end = size
        if p.hi < p.last:
            end = _skip_deeds(fd, start, p.hi - p.lo + 1, size, path)
        with (source or SegmentBytes()).view(fd, size, start, end, path) as view:
            yield from _segment_batches([(p.lo, view, p.first)], p.lo, p.hi,
                                        EventMtime(p.mnt), want)
    finally:
        os.close(fd)


def _sizes_batches(p: SegmentRange):
    """``event``, ``epoch`` (null) and ``size`` of events ``p.lo..p.hi`` from their
    segment's sizes file (``segments/<first>.sizes``: a little-endian u64 an event), one
    batch; only the words of those events are read.  FileNotFoundError where the mount
    has no sizes files."""
    import numpy as np
    import pyarrow as pa

    path = os.path.join(p.mnt, "segments", f"{p.first:012d}.sizes")
    count = p.hi - p.lo + 1
    buf = bytearray(8 * count)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = 0
        while got < len(buf):
            n = os.preadv(fd, [view[got:]], 8 * (p.lo - p.first) + got)
            if not n:
                break
            got += n
    finally:
        view.release()
        os.close(fd)
    if got != len(buf):
        raise ValueError(f"{path}: expected the sizes of events {p.lo}..{p.hi}, read "
                         f"{got // 8} (the mount's view changed under the read?)")
    sizes = np.frombuffer(buf, "<i8").astype(np.int64, copy=False)
    yield pa.RecordBatch.from_arrays(
        [pa.array(np.arange(p.lo, p.hi + 1, dtype=np.int64)), pa.nulls(count, pa.int64()),
         pa.array(sizes)], names=["event", "epoch", "size"])


def _event_files(mnt: str, events: list[int], read: bool = True):
    """``(event, payload, committed_us)`` of ``events/`` files; with ``read=False`` the
    payload is a stand-in of the file's size (a projection that needs no payload byte)."""
    for event in events:
        with open(os.path.join(mnt, "events", f"{event:012d}"), "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read() if read else _Size(st.st_size)
            yield event, data, st.st_mtime_ns // 1_000_000 * 1000


class _Size:
    """A payload of which only the length is used (:func:`_event_files`)."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


def _exactly(batches, lo: int, hi: int, what: str):
    """``batches``, checked to hold events ``lo..hi`` (each once, in order: the decoders
    yield them so), else ValueError: a partition never silently returns fewer rows."""
    n, last = 0, lo - 1
    for b in batches:
        if b.num_rows:
            events = b.column(0)
            if events[0].as_py() != last + 1:
                break
            last = events[b.num_rows - 1].as_py()
            n += b.num_rows
        yield b
    if n != hi - lo + 1 or last != hi:
        raise ValueError(f"{what}: expected events {lo}..{hi}, read {n} ending at {last} "
                         "(the mount's view changed under the read?)")


def _with_ship(batches, ship: str):
    import pyarrow as pa

    for b in batches:
        yield pa.RecordBatch.from_arrays(
            [*b.columns, pa.array([ship] * b.num_rows, pa.string())],
            names=[*b.schema.names, SHIP])


def read_partition(partition, columns: list[str] | None = None):
    """Arrow batches of one planned partition (the ``ship`` column added when it has
    one), of every column, or of ``columns`` only (:func:`~bookfs.spark.columns.projection`): then nothing is
    decoded unless one of :data:`bookfs.spark.rows.DECODED` is among them, and the
    payload bytes are not copied unless ``jam`` is.  Deeds' CRCs are checked whenever a
    segment is read; ``event`` and ``size`` alone read the segments' sizes files instead
    (:func:`_sizes_batches`: no payload byte, as on the ``events/`` path).
    With nothing planned Spark still runs one task, on a bare ``InputPartition``: it
    yields no rows."""
    if isinstance(partition, Packed):
        return (b for part in partition.parts for b in read_partition(part, columns))
    want = None if columns is None else set(columns)
    if isinstance(partition, SegmentRuns):
        p = partition
        source = SegmentBytes()
        batches = (b for r in p.ranges for b in _exactly(
            _read_segment(r, want, source), r.lo, r.hi, f"{r.mnt}/segments/{r.first:012d}"))
    elif isinstance(partition, EventFiles):
        p = partition
        read = want is None or bool(want & {"mug", "jam", *DECODED})
        batches = _exactly(_batches(_event_files(p.mnt, p.events, read), want),
                           p.events[0], p.events[-1], f"{p.mnt}/events")
    else:
        return iter(())
    if p.ship is not None and (want is None or SHIP in want):
        batches = _with_ship(batches, p.ship)
    return batches if columns is None else (b.select(columns) for b in batches)
