"""A save that fails is never served (issue 32: "readers see only what is committed";
DESIGN.md: committed means durable and acknowledged by the writer's save).

``strace`` fails one ``fdatasync`` of a read-write mount's daemon with EIO or ENOSPC
(``-e inject=fdatasync:error=...:when=K``: the K-th after it attached, the first two
appends' syncs succeeding) and holds the failed call at its exit (``delay_exit``) while
reader threads poll every reader path: the read-write mount's ``events/``, ``pretty/`` and
``segments/`` (its read-only companion's), a separate read-only mount's ``events/``,
``follow/N`` and ``info``'s ``last:`` on both.  The append's deed is in the log file all
that time, and the save then fails: the engine cuts it back, and the close of ``new/N``
returns the errno.  The same number is then appended again with other bytes (another
size), and that close returns 0.  Checked:

* the failed append's close returns the injected errno;
* no reader path ever served the undone bytes, nor named the event (a listing,
  ``pretty/N``, ``last:``) before the second append began;
* right after the second close returned, the companion's ``events/N`` holds the new bytes
  (no ENOENT), and soon every path serves them and nothing else for that number;
* the log holds the new bytes.

The code before issue 32 served the deed while the sync was in flight (the companion and
the read-only mount read it from the file), so its readers served bytes that were then
undone, and kept serving them (cached) after the number was taken again.

The hold lasts only until every reader has polled a few times (``strace`` is detached,
which lets the held call return its error), so the test does not depend on the machine's
speed.  One more test reads the read-only mount with Spark (``format("bookfs")``) during
the failed save: no row for the undone event.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import faults
import pytest
from faults import (
    Readers,
    Served,
    Strace,
    add_mount_readers,
    append,
    env_number,
    skip_reason,
    wait_held,
)
from mount_fixtures import payload, wait_for
from mounting import daemon_pid, mounted

from bookfs.formats.pier import open_source

pytestmark = [
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
    pytest.mark.timeout(300),
]

START = 40  # events in the log before the mount
K = 3  # the fdatasync that fails: the third after strace attached
HOLD = env_number("BOOKFS_COMMIT_FAILURE_HOLD", 0.2)  # at least, with the call held
BYTE_KINDS = ("rw events/", "ro events/", "rw follow/", "ro follow/", "rw segments/")


def size_of(n: int) -> int:
    return 20 + (n * 37) % 200


def build_log(where: Path, layout: str) -> Path:
    """A small log of :data:`START` events in ``layout`` (``faults.build_log``)."""
    return faults.build_log(where, layout, [size_of(n) for n in range(1, START + 1)],
                            batches=1)


def read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def fail_one_save(pid: int, rw: str, n: int, data: bytes, err: str, log: Path,
                  while_held=lambda: None) -> OSError | None:
    """With ``strace`` failing the K-th ``fdatasync`` of daemon ``pid``: append events
    up to ``n - 1`` (each must succeed), then ``n`` with ``data`` in a thread; once its
    save's failed call is held, run ``while_held()``, then let the call return.  The
    error the close of ``new/n`` returned (None if it returned 0)."""
    acks: dict = {}
    writer = threading.Thread(target=append, args=(rw, n, data, acks))
    with Strace(pid, f"fdatasync:error={err}:delay_exit=120s:when={K}", log) as st:
        for m in range(n - K + 1, n):
            append(rw, m, payload(m, size_of(m)), acks)
            assert acks[m] is None, f"append {m} (before the failing one): {acks[m]}"
        writer.start()
        st.wait_injected()
        wait_held(pid, injected_error=True)
        while_held()
        assert n not in acks, "the failing save returned while strace held it"
    writer.join(120)
    assert n in acks, "the failing append did not return"
    assert "INJECTED" in st.output(), st.output()
    return acks[n]


@pytest.mark.parametrize("err", ["EIO", "ENOSPC"])
@pytest.mark.parametrize("layout", ["uip", "vere"])
def test_a_failed_save_is_never_served(tmp_path, layout, err):
    """The module docstring's checks, for each layout and errno."""
    src = build_log(tmp_path, layout)
    rw, ro = str(tmp_path / "rw"), str(tmp_path / "ro")
    n = START + K  # the number whose first save fails
    undone, redone = payload(n, 77), payload(n + 1000, 131)  # other bytes, other size
    served = Served()
    with mounted(src, rw, "-o", "follow_timeout=2"), \
            mounted(src, ro, "-o", "ro,follow_timeout=2"), \
            Readers(served, recheck=[n]) as readers:
        pid = daemon_pid(rw)
        add_mount_readers(readers, rw, ro, first=1, follow_from=START,
                          segments=layout == "uip")
        readers.wait_rounds(2)

        def hold():  # every reader looks at the log while the failed save is in flight
            readers.wait_rounds(3)
            time.sleep(HOLD)

        failed = fail_one_save(pid, rw, n, undone, err, tmp_path / "strace.out", hold)
        assert isinstance(failed, OSError) and failed.errno == getattr(errno, err), (
            f"the close of new/{n} whose save failed with {err} returned {failed!r}")
        readers.wait_rounds(3)  # and after the undo

        retry_began = time.monotonic()
        acks: dict = {}
        append(rw, n, redone, acks)
        assert acks[n] is None, f"the append of {n} again failed: {acks[n]}"
        got = read(f"{rw}/events/{n}")  # at once: the companion knows it (no ENOENT)
        assert got == redone, f"the companion's events/{n}: " + (
            "ENOENT" if got is None else f"{got[:16]!r}..., not the new bytes")
        for path in (f"{ro}/events/{n}", f"{rw}/follow/{n}", f"{ro}/follow/{n}"):
            assert wait_for(lambda p=path: read(p) == redone, timeout=30), (
                f"{path}: {read(path)!r} is not the new bytes")
        assert wait_for(lambda: os.path.exists(f"{rw}/pretty/{n}"), timeout=30)
        assert wait_for(lambda: all(k in served.first_last_at_least(n)
                                    for k in ("rw info", "ro info")), timeout=30)
        readers.wait_rounds(3)
        readers.stop()

    seen = served.of(n)
    problems = []
    for kind, values in sorted(seen.items()):
        if undone in values:
            problems.append(f"{kind} served the undone bytes of event {n}")
        other = [v for v in values if v not in (undone, redone, None)]
        if other:
            problems.append(f"{kind} served other bytes for event {n}: {other[0][:16]!r}...")
        if None in values and values[None] < retry_began:
            problems.append(f"{kind} named event {n} before it was appended again")
    for kind, when in served.first_last_at_least(n).items():
        if when < retry_began:
            problems.append(f"{kind} said last: {n} or more before it was appended again")
    for kind in BYTE_KINDS:
        if kind == "rw segments/" and layout != "uip":
            continue
        if redone not in seen.get(kind, {}):
            problems.append(f"{kind} never served the new bytes of event {n}")
    problems += [f"{kind} failed with {errno.errorcode.get(e, e)} (event {event})"
                 for kind, event, e in served.errors]
    assert not problems, "\n".join(problems)
    with open_source(src) as log:
        assert log.last == n and log.read(n) == redone


@pytest.mark.spark
@pytest.mark.xdist_group("spark-b")  # the Spark modules' worker: one JVM
def test_spark_reads_no_row_of_a_failed_save(tmp_path, spark):
    """``format("bookfs")`` over a read-only mount, read while a save fails (held): no
    row for the undone event; the rows are the committed events."""
    src = build_log(tmp_path, "uip")
    rw, ro = str(tmp_path / "rw"), str(tmp_path / "ro")
    n = START + K
    rows: list = []
    with mounted(src, rw), mounted(src, ro, "-o", "ro"):
        def spark_read():
            rows.extend(r[0] for r in spark.read.format("bookfs").load(ro).collect())

        failed = fail_one_save(daemon_pid(rw), rw, n, payload(n, 77), "EIO",
                               tmp_path / "strace.out", spark_read)
    assert isinstance(failed, OSError) and failed.errno == errno.EIO, failed
    assert n not in rows, f"Spark read a row for event {n}, whose save failed"
    assert sorted(rows) == list(range(1, n)), rows[-5:]
