"""``bookfs top`` (issue 35) against real writers appending sample events at a known pace:
through a read-write mount's ``new/``, into a log a read-only follower mount serves, and
into a ship of a fleet mount.  The snapshot holds a contiguous run of what was written
after ``top`` started, and its groups are exactly what the generator says those events
are (no wall-clock assertion: only which events were seen, and their bytes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest
from mount_fixtures import build_sample
from mounting import BOOKFS, mounted, run_bookfs, where_stuck

from bookfs.cli.sample import iter_sample_events
from bookfs.formats.book import Book

BASE = 400  # events in the log before the writer starts
WRITE = 60  # events the writer appends, one every PACE seconds
PACE = 0.02
EVENTS = list(iter_sample_events(BASE + WRITE))
#: top's waiter children end with their follow/ lookup, which the mount answers at the
#: latest after follow_timeout: short here, so that the unmount after each test is quick
QUICK = ("-o", "follow_timeout=1")


def _through_new(mnt):
    for n in range(BASE + 1, BASE + WRITE + 1):
        with open(os.path.join(mnt, "new", str(n)), "wb") as f:
            f.write(EVENTS[n - 1][0])
        time.sleep(PACE)


def _into_log(src):
    with Book.open(src, writable=True) as book:
        for n in range(BASE + 1, BASE + WRITE + 1):
            book.save(n, [EVENTS[n - 1][0]])
            time.sleep(PACE)


def _top(mnt, writer, target, seconds: float = 1.5) -> dict:
    """``top --once --json`` started, then the writer; the snapshot."""
    p = subprocess.Popen([*BOOKFS, "top", str(mnt), "--once", "--json", "--interval",
                          str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    time.sleep(0.8)  # top has read where the log ends (its interpreter start-up)
    t = threading.Thread(target=writer, args=(target,))
    t.start()
    out, err = p.communicate(timeout=120)
    t.join(120)
    assert p.returncode == 0, err
    return json.loads(out)


def _check(snap: dict) -> None:
    t = snap["total"]
    assert t["events"] > 0, snap
    first, last = t["first_event"], t["last_event"]
    assert BASE < first <= last <= BASE + WRITE and t["events"] == last - first + 1
    written = EVENTS[first - 1:last]
    assert t["bytes"] == sum(len(p) for p, _ in written)
    for key, field in (("vane", "vane"), ("card", "tag")):
        want = Counter(getattr(m, field) for _, m in written)
        assert {g["key"]: g["events"] for g in snap["by"][key]
                if g["key"] != "(other)"} == dict(want)
    assert sum(g["events"] for g in snap["groups"]) == t["events"]
    assert sum(g["bytes"] for g in snap["groups"]) == t["bytes"]
    assert t["events_per_s"] > 0 and t["bytes_per_s"] > 0


@pytest.fixture
def src(tmp_path):
    return build_sample(tmp_path / "log", BASE)


def test_top_on_a_read_write_mount(src, tmp_path):
    with mounted(src, tmp_path / "mnt", *QUICK) as mnt:
        _check(_top(mnt, _through_new, mnt))


def test_top_on_a_read_only_follower(src, tmp_path):
    with mounted(src, tmp_path / "mnt", "-o", "ro", *QUICK) as mnt:
        _check(_top(mnt, _into_log, src))


def test_top_on_a_fleet(tmp_path):
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    build_sample(fleet / "a", BASE)
    build_sample(fleet / "b", 50, seed=3)
    with mounted(fleet, tmp_path / "mnt", "--fleet", *QUICK) as mnt:
        snap = _top(mnt, _into_log, fleet / "a")
    _check(snap)


def test_top_live_view_and_ctrl_c(src, tmp_path):
    with mounted(src, tmp_path / "mnt", *QUICK) as mnt:
        p = subprocess.Popen([*BOOKFS, "top", mnt, "--interval", "0.5"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.8)
        _through_new(mnt)
        time.sleep(0.6)  # a refresh after the writes
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("bookfs top, or a child holding its output, still runs "
                                 f"60 s after its SIGINT:\n{where_stuck([p.pid], mnt)}"
                                 ) from None
    assert p.returncode == 0 and "Traceback" not in err, err
    assert "VANE" in out and "CARD" in out and "events/s" in out


@pytest.mark.parametrize("args,says", [
    (["--json"], "add --once"),
    (["--interval", "0"], "expected seconds"),
])
def test_top_bad_input(src, tmp_path, args, says):
    with mounted(src, tmp_path / "mnt", "-o", "ro") as mnt:
        r = run_bookfs("top", mnt, *args, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


def test_top_refuses_a_log_directory(src):
    r = run_bookfs("top", str(src), check=False)
    assert r.returncode == 2 and "not a bookfs mount" in r.stderr and r.stderr.count("\n") == 1
