"""How ``format("bookfs")`` cuts a read into tasks and how a task gets its segments' bytes
(bookfs.spark.partitions), through a real read-only mount, without Spark: the tasks are
run in this process as a Spark worker runs them (``read_partition``)."""

from __future__ import annotations

import mmap
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from bookfs.spark import partitions as P  # noqa: E402
from bookfs.spark import rows as R  # noqa: E402
from tests.mounting import mounted, run_bookfs  # noqa: E402

EVENTS = 1200
MIB = 1 << 20


# --- balanced runs ------------------------------------------------------------------------


def greedy(sizes: list[int], most: int) -> int:
    """How many runs packing greedily up to ``most`` makes (the packing before)."""
    runs, total = 0, None
    for size in sizes:
        if total is not None and total + size <= most:
            total += size
        else:
            runs, total = runs + 1, size
    return runs


@settings(max_examples=800, deadline=2000)
@given(st.lists(st.integers(0, 40 * MIB), max_size=60), st.integers(1, 200 * MIB),
       st.integers(1, 64))
def test_balanced_runs_are_few_even_and_in_order(sizes, most, cores) -> None:
    k = P.task_count(sum(sizes), most, cores)
    runs = P.balanced(list(enumerate(sizes)), lambda x: x[1], k)
    assert [x for run in runs for x in run] == list(enumerate(sizes))  # all, in order, once
    assert all(runs) and len(runs) <= k
    total = sum(sizes)
    for run in runs:  # near total / k: past it by at most half of each end item
        got = sum(s for _, s in run)
        assert got <= total / k + (run[0][1] + run[-1][1]) / 2 + 1, (got, total / k)


@settings(max_examples=800, deadline=None)
@given(st.integers(0, 1 << 44), st.integers(1, 1 << 40), st.integers(1, 256))
def test_task_count(total, most, cores) -> None:
    """At least ``ceil(total / maxPartitionBytes)`` tasks; more only to fill the cores'
    last wave, and never below MIN_TASK_BYTES a task for that."""
    k = P.task_count(total, most, cores)
    at_least = max(1, -(-total // most))
    assert k >= at_least
    wave_full = -(-at_least // cores) * cores
    most = total // P.MIN_TASK_BYTES  # tasks that keep MIN_TASK_BYTES each
    if k > at_least:  # the last wave filled, up to what keeps MIN_TASK_BYTES a task
        assert k == min(wave_full, most) and total // k >= P.MIN_TASK_BYTES
    else:  # the last wave was full, or more tasks would be too small
        assert at_least == wave_full or most <= at_least


def test_balanced_leaves_no_small_last_task() -> None:
    """The 100,000-event sample's shape (~17 MiB segments, 128 MiB tasks): greedy packing
    made 3 tasks, the last a small one; balanced runs make 2 of about equal bytes, and a
    read of it on 2 cores is 2 tasks whatever the limit above 121 MiB."""
    sizes = [17 * MIB] * 14 + [12 * MIB]
    assert greedy(sizes, 128 * MIB) == 3  # 119, 119 and 12 MiB
    assert P.task_count(sum(sizes), 128 * MIB, 2) == 2
    assert P.task_count(sum(sizes), P.MAX_PARTITION_BYTES, 2) == 2
    assert P.task_count(sum(sizes), P.MAX_PARTITION_BYTES, 1) == 1
    runs = P.balanced(sizes, lambda s: s, 2)
    assert sorted(len(r) for r in runs) == [7, 8]
    assert max(map(sum, runs)) - min(map(sum, runs)) <= 17 * MIB
    # the 1,000,000-event sample's 2,366 MiB on 2 cores: 6 tasks of 512 MiB or less, not 5
    assert P.task_count(2366 * MIB, 512 * MIB, 2) == 6


def test_balanced_plans_no_more_than_one_run_an_item() -> None:
    """One byte a task (``maxPartitionBytes`` 1) over gigabytes: one run a segment,
    planned without a run per byte."""
    sizes = [1 << 34] * 3
    runs = P.balanced(sizes, lambda s: s, P.task_count(sum(sizes), 1, 2))
    assert runs == [[1 << 34]] * 3


# --- a task's segment bytes: mapped or read ---------------------------------------------


@pytest.fixture(scope="module", params=["ro", "rw", "rw,single_connection"])
def mnt(request, tmp_path_factory):
    """The sample log mounted read-only, read-write (segments/ served by its read-only
    companion connection) and read-write on one connection: each is mapped."""
    root = tmp_path_factory.mktemp("partitions")
    run_bookfs("sample", str(root / "log"), "--events", str(EVENTS))
    # quarter-MiB segments: a task reads several, and ranges start mid-segment
    with mounted(root / "log", root / "mnt", "-o", f"{request.param},segment_mb=0.25") as m:
        yield str(m)


def reference(mnt: str, since: int, until: int, want) -> list[dict]:
    """The rows of ``since..until`` by the pure builder over each segment read whole into
    its own fresh ``bytes``."""
    lo, hi, chosen = R.plan_segments(mnt, since, until)
    out = []
    for first, _last, a, b in chosen:
        with open(os.path.join(mnt, "segments", f"{first:012d}"), "rb") as f:
            seg = memoryview(f.read())
        for batch in R._pure_segment_batches([(first, seg)], a, b, R.EventMtime(mnt), want):
            out.extend(batch.to_pylist())
    return out


@pytest.mark.parametrize("columns", [None, ["event", "size"],
                                     ["event", "jam", "wire", "card", "error"]],
                         ids=["every", "event+size", "decoded"])
@pytest.mark.parametrize("builder", ["compiled", "pure"])
@pytest.mark.parametrize("source", ["mapped", "read"])
def test_tasks_rows_are_the_segments_rows(mnt, monkeypatch, source, builder, columns):
    """Every task's rows, held until all tasks are done, equal the rows made from each
    segment's own copy: whether the bytes were mapped or read into the task's one reused
    buffer, no row keeps a view of them (the class of bug a reused buffer would make:
    earlier rows changed by later reads)."""
    if builder == "pure":
        monkeypatch.setattr(R, "_impl", None)
    elif R._impl is None:
        pytest.skip("the compiled row builder did not build")
    taken = {"mapped": 0, "read": 0}
    real_mapped, real_read = P.SegmentBytes._mapped, P.SegmentBytes._read

    def mapped(*a):
        m = real_mapped(*a) if source == "mapped" else None
        taken["mapped"] += m is not None
        return m

    def read(self, *a):
        taken["read"] += 1
        return real_read(self, *a)

    monkeypatch.setattr(P.SegmentBytes, "_mapped", staticmethod(mapped))
    monkeypatch.setattr(P.SegmentBytes, "_read", read)
    since, until = 37, EVENTS - 41  # both ends inside a segment
    parts, hi = P.plan(P.Mount(mnt), since, until, 500, max_bytes=MIB)
    assert hi == until and len(parts) > 1
    assert all(len(p.ranges) > 1 for p in parts)  # several segments a task
    held = [b for p in parts for b in P.read_partition(p, columns)]
    got = [row for b in held for row in b.to_pylist()]
    assert got == reference(mnt, since, until, None if columns is None else set(columns))
    assert [r["event"] for r in got] == list(range(since, until + 1))
    segments = sum(len(p.ranges) for p in parts)
    if columns == ["event", "size"]:  # from segments/<K>.sizes: no segment taken
        assert taken == {"mapped": 0, "read": 0}
    else:
        assert taken == ({"mapped": segments, "read": 0} if source == "mapped"
                         else {"mapped": 0, "read": segments})


def test_a_page_that_cannot_be_read_is_an_error_not_a_sigbus(tmp_path) -> None:
    """A mapping of a file cut short under it: ``populate`` says which bytes cannot be
    read (EFAULT, the kernel's answer instead of a SIGBUS at first touch)."""
    path = tmp_path / "seg"
    path.write_bytes(b"x" * (3 * mmap.PAGESIZE))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 3 * mmap.PAGESIZE, prot=mmap.PROT_READ)
    try:
        assert P.populate(m, 10, 3 * mmap.PAGESIZE, str(path))
        os.truncate(path, mmap.PAGESIZE)
        with pytest.raises(OSError, match=rf"{path}: bytes 10\.\.{3 * mmap.PAGESIZE} "
                                          "cannot be read"):
            P.populate(m, 10, 3 * mmap.PAGESIZE, str(path))
        assert m[:4] == b"xxxx"  # the page still in the file is mapped
    finally:
        m.close()


def test_an_empty_range_is_read_not_mapped(mnt) -> None:
    """Zero bytes cannot be mapped: they come from the read path, as an empty view."""
    fd = os.open(os.path.join(mnt, "segments", sorted(os.listdir(
        os.path.join(mnt, "segments")))[0]), os.O_RDONLY)
    try:
        with P.SegmentBytes().view(fd, os.fstat(fd).st_size, 5, 5, "seg") as view:
            assert len(view) == 0
    finally:
        os.close(fd)


def test_task_count_counts_the_cpus_the_planner_may_use(monkeypatch) -> None:
    """By default the cores are the planner's affinity mask (what ``local[*]`` counts),
    not the host's CPUs: on 1 allowed CPU the 242 MiB sample is 1 task, on 4 it is 4."""
    for allowed, tasks in (({0}, 1), ({0, 1}, 2), ({0, 1, 2, 3}, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, a=allowed: set(a))
        monkeypatch.setattr(os, "cpu_count", lambda: 64)
        assert P.task_count(242 * MIB, P.MAX_PARTITION_BYTES) == tasks


def test_a_read_of_event_and_size_is_planned_by_the_bytes_it_reads(mnt):
    """``event`` and ``size`` read 8 bytes an event (``segments/<K>.sizes``), so they are
    planned by those bytes: one task where the segments themselves make several."""
    whole, _ = P.plan(P.Mount(mnt), None, None, 500, max_bytes=MIB)
    sizes, _ = P.plan(P.Mount(mnt), None, None, 500, max_bytes=MIB,
                      columns=["size", "event"])
    assert len(whole) > 1 and len(sizes) == 1
    assert sum(r.size for r in sizes[0].ranges) == 8 * EVENTS
    rows = [r for b in P.read_partition(sizes[0], ["event", "size"]) for r in b.to_pylist()]
    assert rows == [{"event": r["event"], "size": r["size"]}
                    for r in reference(mnt, 1, EVENTS, {"event", "size"})]
    three = ["size", "epoch", "event"]  # epoch: null on the segments/ path, from sizes too
    assert P.reads_sizes(three) and not P.reads_sizes(["event", "mug"])
    rows = [r for b in P.read_partition(sizes[0], three) for r in b.to_pylist()]
    assert rows == [{c: r[c] for c in three}
                    for r in reference(mnt, 1, EVENTS, {"event", "epoch", "size"})]
