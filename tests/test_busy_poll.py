"""The daemon polls ``/dev/fuse`` for a short, adaptive window before its event loop
sleeps (``-o busy_poll=US``; ``fs/daemon/mainloop.py``, ``main_options``; the patched
pyfuse3's ``busy_poll``), and only then.

- the option: its default, ``0``, bad values refused in one line, and a read-write mount's
  read-only companion given the same;
- a pyfuse3 without the feature is never asked to poll;
- through real mounts of every daemon kind (a read-only UIP Book, a read-only pier, a
  read-write Book appended to through ``new/`` and read through its companion, a fleet;
  the read-write daemon itself, which answers appends, never polls): requests that
  follow each other are taken by the poll, or, when other tasks want the CPUs (a loaded
  machine), the poll gives way to them (the daemon's counts, logged at unmount); every
  byte read is the log's; and ``busy_poll=0`` polls never;
- a mount left idle after a burst of reads spends (next to) no CPU: the window shrinks
  away while nothing comes.

How much the poll gives is a benchmark (``bench/bench_smallread.py --poll``,
``docs/benchmarks.md``), not a test.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.fs.daemon import mainloop as M
from bookfs.fs.daemon.options import DEFAULT_BUSY_POLL_US, OptionError, parse_options
from lmdb_fixtures import make_pier
from mount_fixtures import build_sample, payload, wait_for
from mounting import mounted

READS = 400  # events read one after another: each a LOOKUP and a READ


# --- the option ------------------------------------------------------------------------------


def test_the_option_defaults_to_polling_and_takes_microseconds():
    assert parse_options(None).busy_poll == DEFAULT_BUSY_POLL_US > 0
    assert parse_options("ro,busy_poll=0").busy_poll == 0
    assert parse_options("busy_poll=50").busy_poll == 50


@pytest.mark.parametrize("bad", ["busy_poll", "busy_poll=", "busy_poll=-1", "busy_poll=1.5",
                                 "busy_poll=x", "busy_poll=1000001"])
def test_a_bad_value_is_refused_in_one_line(bad):
    with pytest.raises(OptionError) as e:
        parse_options(bad)
    msg = str(e.value)
    assert "\n" not in msg and "busy_poll" in msg


def test_the_companion_polls_as_its_mount_does():
    for value in (0, 75):
        opts = parse_options(f"busy_poll={value}").companion_options()
        assert parse_options(opts).busy_poll == value


def test_a_pyfuse3_without_the_feature_is_not_asked_to_poll(monkeypatch):
    from bookfs.fs import ops

    monkeypatch.setattr(ops, "FEATURES", frozenset({"read_inode"}))
    assert M.main_options(200) == {"max_tasks": M.max_tasks()}
    monkeypatch.setattr(ops, "FEATURES", frozenset({"busy_poll"}))
    assert M.main_options(200) == {"max_tasks": M.max_tasks(), "busy_poll_us": 200}


# --- through real mounts ---------------------------------------------------------------------


def _polls(log_file: Path) -> list[tuple[int, int, int]]:
    """The ``(tries, hits, gave_way)`` of each daemon that logged its polls at unmount."""
    text = log_file.read_text() if log_file.exists() else ""
    return [tuple(map(int, m)) for m in
            re.findall(r"busy poll: tries (\d+), hits (\d+), gave_way (\d+)", text)]


def _logged_polls(log_file: Path, daemons: int) -> list[tuple[int, int, int]]:
    assert wait_for(lambda: len(_polls(log_file)) >= daemons, timeout=30)
    return _polls(log_file)


def _polled(tries: int, hits: int, gave_way: int) -> bool:
    """The poll ran and did what it is for: it found requests, or, on a machine whose
    CPUs other tasks wanted meanwhile (a loaded CI host), it gave way to them."""
    return hits + gave_way <= tries and (hits > 0 or gave_way > 0)


def _read_one_after_another(events: Path, expect: dict[int, bytes]) -> None:
    for n, data in expect.items():
        with open(events / f"{n:012d}", "rb") as f:
            assert f.read() == data


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> tuple[Path, dict[int, bytes]]:
    d = tmp_path_factory.mktemp("poll") / "book"
    data = {n: payload(n, 100 + n % 700) for n in range(1, READS + 1)}
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, list(data.values()))
    return d, data


@pytest.mark.parametrize("busy_poll", [DEFAULT_BUSY_POLL_US, 0])
def test_a_read_only_mount_takes_the_next_request_by_polling(book, tmp_path, busy_poll):
    src, data = book
    log_file = tmp_path / "daemon.log"
    with mounted(src, tmp_path / "mnt", "-o", f"ro,busy_poll={busy_poll}",
                 log_file=str(log_file)) as mnt:
        _read_one_after_another(Path(mnt) / "events", data)
    if busy_poll:
        [(tries, hits, gave_way)] = _logged_polls(log_file, 1)
        assert _polled(tries, hits, gave_way)
    else:
        assert wait_for(lambda: "busy poll: off" in log_file.read_text(), timeout=30)
        assert _polls(log_file) == []


def test_a_pier_mount_polls(tmp_path):
    src = make_pier(tmp_path / "pier", [("lmdb", [payload(n, 40) for n in range(1, 51)]),
                                        ("book", [payload(n, 60) for n in range(51, 301)])])
    log_file = tmp_path / "daemon.log"
    with mounted(src, tmp_path / "mnt", "-o", "ro", log_file=str(log_file)) as mnt:
        _read_one_after_another(Path(mnt) / "events",
                                {n: payload(n, 40 if n <= 50 else 60) for n in range(1, 301)})
    [polls] = _logged_polls(log_file, 1)
    assert _polled(*polls)


def test_a_read_write_mount_polls_in_its_companion_only(tmp_path):
    """The read-write daemon answers the appends (each waits on a commit: no poll); its
    read-only companion answers the reads, and polls."""
    src = tmp_path / "book"
    with Book.open(src, writable=True, create=True) as b:
        b.save(1, [payload(1, 50)])
    log_file = tmp_path / "daemon.log"
    with mounted(src, tmp_path / "mnt", log_file=str(log_file)) as mnt:
        root = Path(mnt)
        for n in range(2, 152):  # one writer: each append six requests, its close a commit
            (root / "new" / str(n)).write_bytes(payload(n, 50))
        _read_one_after_another(root / "events", {n: payload(n, 50) for n in range(1, 152)})
    [polls] = _logged_polls(log_file, 1)  # the companion
    assert _polled(*polls)
    assert wait_for(lambda: "busy poll: off" in log_file.read_text(), timeout=30)
    with Book.open(src) as b:
        assert b.count == 151 and b.read(151) == payload(151, 50)


def test_a_fleet_mount_polls(tmp_path):
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    for i in range(2):
        build_sample(fleet / f"s{i}", 150, seed=i)
    log_file = tmp_path / "daemon.log"
    with mounted(fleet, tmp_path / "mnt", "--fleet", log_file=str(log_file)) as mnt:
        for ship in sorted(os.listdir(mnt)):
            events = Path(mnt) / ship / "events"
            for name in sorted(os.listdir(events)):
                assert (events / name).stat().st_size == len((events / name).read_bytes())
    [polls] = _logged_polls(log_file, 1)
    assert _polled(*polls)


def test_an_idle_mount_stops_polling(book, tmp_path):
    """After a burst of reads (the window at its widest), 2 s of idleness cost the daemon
    under 0.1 s of CPU: the poll is bounded by its window, and the window halves on
    every sleep longer than the most it may poll."""
    src, data = book
    with mounted(src, tmp_path / "mnt", "-o", "ro") as mnt:
        _read_one_after_another(Path(mnt) / "events", data)
        pid = _daemon_pid(mnt)
        time.sleep(0.2)
        before = _cpu_seconds(pid)
        time.sleep(2.0)
        assert _cpu_seconds(pid) - before < 0.1


def _daemon_pid(mnt) -> int:
    from mounting import _PIDS

    return _PIDS[os.path.abspath(mnt)]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
