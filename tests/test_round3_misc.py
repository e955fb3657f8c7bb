"""Issue 19, items 8, 9 and 11, through real mounts and the real ``bookfs`` command:

* 8: a crafted jam (chains of back-references) renders in bounded time through
  ``pretty/N`` and ``bookfs show``; every rendering has a CPU budget and says where it
  stopped; each event is rendered once, whatever name it is opened by;
* 9: ``bookfs append`` whose daemon is SIGKILLed after the whole deed was written says
  the outcome is unknown (not "refused"), says how to check, and stops, ``--keep-going``
  or not;
* 11: pruning the daemon logs never deletes the log of a live daemon.

(Item 5, Spark after a filtered query, is tested in test_spark_source.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import pytest

from bookfs.formats.book import Book
from bookfs.fs.daemon.mount import LOG_KEEP
from bookfs.noun import jam
from bookfs.noun.event import event_text
from mounting import BOOKFS, daemon_pid, force_unmount, mounted, proc_stat, run_bookfs

MUG = b"\0\0\0\0"  # an unset mug: the payload is 4 bytes of mug, then the jam


# --- crafted jams --------------------------------------------------------------------------


class Bits:
    """A jam writer (bits least significant first), for jams ``jam`` never writes."""

    def __init__(self):
        self.out: list[str] = []
        self.n = 0

    def bits(self, value: int, width: int) -> None:
        if width:
            self.out.append(format(value & ((1 << width) - 1), f"0{width}b")[::-1])
            self.n += width

    def mat(self, a: int) -> None:
        if a == 0:
            self.bits(1, 1)
            return
        b = a.bit_length()
        c = b.bit_length()
        self.bits(0, c)
        self.bits(1, 1)
        self.bits(b & ((1 << (c - 1)) - 1), c - 1)
        self.bits(a, b)

    def atom(self, a: int) -> int:
        p = self.n
        self.bits(0, 1)
        self.mat(a)
        return p

    def cell(self) -> int:
        p = self.n
        self.bits(1, 2)  # 1, then 0
        return p

    def ref(self, pos: int) -> int:
        p = self.n
        self.bits(3, 2)
        self.mat(pos)
        return p

    def bytes(self) -> bytes:
        return int("".join(self.out)[::-1], 2).to_bytes((self.n + 7) // 8, "little")


def chain_jam(n: int = 20_000, groups: int = 16, per: int = 80) -> bytes:
    """``[L M]``: L a list of ``n`` elements, each a back-reference to the one before it (a
    chain, which ``cue`` refuses), M ``groups`` lists of ``per`` back-references to the
    chain's last element.  Followed hop by hop, each of M's references costs ``n`` hops:
    minutes of CPU for ~86 KB."""
    w = Bits()
    w.cell()
    prev = None
    for _ in range(n):
        w.cell()
        prev = w.atom(7) if prev is None else w.ref(prev)
    w.atom(0)
    for _ in range(groups):
        w.cell()
        for _ in range(per):
            w.cell()
            w.ref(prev)
        w.atom(0)
    w.atom(0)
    return w.bytes()


def wide_jam(groups: int = 16, depth: int = 2, per: int = 80, size: int = 4096) -> bytes:
    """A valid jam that is costly to render: a 4 KiB atom, then lists of lists of
    back-references to it (every element of a list is read whole to tell text)."""
    w = Bits()
    w.cell()
    a = w.atom(int.from_bytes(b"x" * (size - 1) + b"\xff", "little"))

    def lists(d: int) -> None:
        if d == 0:
            for _ in range(per):
                w.cell()
                w.ref(a)
        else:
            for _ in range(groups):
                w.cell()
                lists(d - 1)
        w.atom(0)

    lists(depth)
    return w.bytes()


def doubling(levels: int):
    """``a(k) = [a(k-1) a(k-1)]``: a tree of 2^levels leaves, a few bytes as a jam."""
    noun = 1
    for _ in range(levels):
        noun = (noun, noun)
    return noun


def make_log(path, payloads: list[bytes]):
    with Book.open(path, writable=True, create=True) as book:
        book.save(1, payloads)
    return path


def daemon_cpu(pid: int) -> float:
    """User + system CPU seconds of the daemon (all its threads)."""
    fields = proc_stat(pid)
    assert fields is not None, f"the daemon {pid} is gone"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- 8: renderings bounded in time, once per event ---------------------------------------


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    root = tmp_path_factory.mktemp("crafted")
    wide = MUG + wide_jam()
    return make_log(root / "log", [MUG + chain_jam(), wide, wide,
                                   MUG + jam(doubling(60))])


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_crafted_back_reference_chains_render_quickly_through_the_mount(crafted, tmp_path):
    with mounted(crafted, tmp_path / "mnt", "-o", "ro") as mnt:
        t = time.monotonic()
        got = subprocess.run(["cat", f"{mnt}/pretty/1"], capture_output=True, text=True,
                             timeout=60).stdout
        took = time.monotonic() - t
        assert took < 10, took  # 235 s of CPU at 196 KB before
        assert got.startswith("event: 1\n")
        # as cue says: a back-reference to a back-reference names no noun
        assert ("error: event 1 is not a noun: parsing failed at byte " in got
                and ": jam: back-reference at bit" in got)
        # the mount still answers, and the other events render
        assert open(f"{mnt}/pretty/2").read().startswith("event: 2\n")


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_crafted_back_reference_chains_through_bookfs_show(crafted):
    for extra in ([], ["--full"], ["--json"]):
        t = time.monotonic()
        r = subprocess.run([*BOOKFS, "show", str(crafted), "1", *extra], capture_output=True,
                           text=True, timeout=60)
        took = time.monotonic() - t
        assert r.returncode == 0, r.stderr
        assert took < 10, (extra, took)
        assert "event 1 is not a noun: parsing failed at byte" in r.stdout, extra
        assert "jam: back-reference at bit" in r.stdout, extra


def test_every_rendering_has_a_cpu_budget_and_says_where_it_stopped(crafted):
    """A valid jam that takes most of a second to render, given 0.05 s of CPU: it stops
    within the budget and its last line says which limit stopped it, after how many nodes,
    at which bit of the jam."""
    data = Book.open(crafted).read(2)
    t = time.thread_time()
    text = "".join(event_text(2, len(data), lambda off, n: data[off:off + n], cpu=0.05))
    assert time.thread_time() - t < 0.5
    last = text.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(r"stopped: the rendering's 0.05 s of CPU ran out after [\d,]+ nodes? "
                        r"\(at bit [\d,]+ of the jam\); what follows is shown as \.\.\.",
                        last), last
    assert "\nnoun:  " in text and "..." in text
    # the default budget (1 s) is enough for it: the size limit stops it, and says so
    full = "".join(event_text(2, len(data), lambda off, n: data[off:off + n]))
    assert "stopped: the rendering's limit of 2,000 nodes after 2,000 nodes" in full


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_show_full_of_a_shared_tree_is_bounded_in_time(crafted, monkeypatch, capsys):
    """--full cues the whole event (a few bytes here) and shows everything: 2^60 leaves
    as a tree.  It stops at its CPU budget (render.FULL_RENDER_CPU, 10 s; 2 s here, in
    this process, so the serial pass waits 2 s for it, not 10) and says so."""
    from bookfs.cli.commands import main
    from bookfs.noun import event as event_mod, render

    for module in (render, event_mod):
        monkeypatch.setattr(module, "FULL_RENDER_CPU", 2.0)
    t = time.monotonic()
    code = main(["show", str(crafted), "4", "--full"])
    took = time.monotonic() - t
    out, err = capsys.readouterr()
    assert code == 0, err
    assert took < 20, took
    last = out.rstrip("\n").splitlines()[-1]
    assert last.startswith("stopped: the rendering's "), last[:300]
    assert "nodes; what follows is shown as ..." in last


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_each_event_is_rendered_once_whatever_its_name(crafted, tmp_path):
    """pretty/3, pretty/03, pretty/003 and pretty/0003 opened at once: one rendering (the
    daemon's CPU grows by about one rendering's cost, not four).  Read-only, so the
    daemon measured is the one rendering (a read-write mount's pretty/ is its read-only
    companion's, fs/daemon/companion.py)."""
    with mounted(crafted, tmp_path / "mnt", "-o", "ro") as mnt:
        pid = daemon_pid(mnt)
        before = daemon_cpu(pid)
        alone = open(f"{mnt}/pretty/2").read()
        one = daemon_cpu(pid) - before
        assert one > 0.2, one  # a rendering that costs something measurable
        names = ["3", "03", "003", "0003"]
        got: dict[str, str] = {}
        start = threading.Barrier(len(names))

        def read(name: str) -> None:
            start.wait()
            with open(f"{mnt}/pretty/{name}") as f:
                got[name] = f.read()

        before = daemon_cpu(pid)
        threads = [threading.Thread(target=read, args=(n,)) for n in names]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        spent = daemon_cpu(pid) - before
        assert len(set(got.values())) == 1 and len(got) == 4
        assert got["3"] == alone.replace("event: 2\n", "event: 3\n", 1)
        assert spent < 2 * one + 0.3, (spent, one)  # four renderings: about 4 * one
        # and again, by yet another name: from the cache
        before = daemon_cpu(pid)
        assert open(f"{mnt}/pretty/00003").read() == got["3"]
        assert daemon_cpu(pid) - before < one / 2 + 0.05


# --- 9: an append whose outcome is unknown ---------------------------------------------


def test_append_with_its_daemon_killed_after_the_deed_is_written_is_unknown(tmp_path):
    """The daemon is SIGKILLed once the whole deed is in book.log, while ``bookfs append``
    waits in close(): the close fails (ECONNABORTED / ENOTCONN), and the event may well
    be durable.  The command says the outcome is unknown and how to check, exits 3, and
    stops: with --keep-going the next file is not tried.  After a remount the file is in
    the log at most once, and the next file not at all."""
    from bookfs.formats.layout import DEED_OVERHEAD

    src = make_log(tmp_path / "log", [MUG + jam(n) for n in range(1, 4)])
    big = MUG + jam(int.from_bytes(os.urandom(64 << 20), "little"))  # a mug and a noun
    (tmp_path / "big.bin").write_bytes(big)
    (tmp_path / "small.bin").write_bytes(MUG + jam(99))
    log = src / "book.log"
    for attempt in range(6):
        mnt = tmp_path / f"mnt{attempt}"
        with mounted(src, mnt) as m:
            pid = daemon_pid(m)
            target = os.stat(log).st_size + len(big) + DEED_OVERHEAD
            p = subprocess.Popen([*BOOKFS, "append", "--keep-going", m,
                                  str(tmp_path / "big.bin"), str(tmp_path / "small.bin")],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 60
            while os.stat(log).st_size < target and p.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.0002)
            os.kill(pid, signal.SIGKILL)
            out, err = p.communicate(timeout=60)
        force_unmount(mnt)
        if p.returncode == 0 and not err:  # answered before the kill: try again
            continue
        break
    assert "refused" not in err, err
    assert p.returncode == 3, (p.returncode, out, err)
    lines = err.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'big.bin'}: outcome unknown: new/4: the close "
                               "failed with "), err
    assert re.search(r"\[(ECONNABORTED|ENOTCONN)\]", lines[0]), err
    assert "read 'next:' in" in lines[0] and "do not append it again before checking" in lines[0]
    assert lines[1] == ("bookfs append: stopped after an unknown outcome; not tried: "
                        f"{tmp_path / 'small.bin'}"), err
    with mounted(src, tmp_path / "after", "-o", "ro") as m:
        info = open(f"{m}/info").read()
        nxt = int(re.search(r"^next:\s*(\d+)", info, re.M).group(1)) if "next:" in info \
            else None
        events = [open(f"{m}/events/{n}", "rb").read() for n in range(1, len(os.listdir(
            f"{m}/events")) + 1)]
    assert events.count(big) <= 1
    assert MUG + jam(99) not in events
    assert nxt in (None, len(events) + 1)


# --- 11: log pruning never deletes a live daemon's log ------------------------------------


def _log_of(said: str) -> str:
    """The daemon's log file, from what ``bookfs mount`` printed ("...; log PATH)" or
    "...; log PATH; fuse fd N)")."""
    return re.search(r"; log ([^;)\s]+)[;)]", said).group(1)


def test_log_pruning_keeps_the_log_of_a_live_daemon(tmp_path, monkeypatch):
    """One read-only mount stays up while the log directory is full (LOG_KEEP - 1 logs of
    daemons that are gone, newer than it) and other mounts come and go (one per ship,
    say): its log (the oldest) is still there, the same file, and still written to; the
    dead daemons' logs are pruned to LOG_KEEP, those of the mounts that came and went as
    well.  (The full directory was once made by LOG_KEEP + 1 real mounts, 30 s.)"""
    logs = tmp_path / "logs"
    monkeypatch.setenv("BOOKFS_LOG_DIR", str(logs))
    src = make_log(tmp_path / "log", [MUG + jam(n) for n in range(1, 4)])
    live = tmp_path / "live"
    live.mkdir()
    res = run_bookfs("mount", str(src), str(live), "-o", "ro")
    path = _log_of(res.stdout)
    pid = int(res.stdout.split("daemon pid ")[1].split(";")[0])
    try:
        ino = os.stat(path).st_ino
        # dated an hour ahead: newer than the live log and than the logs of the mounts
        # below, so each mount below prunes one log, never the live one (the oldest),
        # first one of these, then the log of the mount before it
        ahead = time.time() + 3600
        for k in range(LOG_KEEP - 1):
            gone = logs / f"bookfs-20000101-000000-{k + 1}.log"
            gone.write_text("a daemon that is gone\n")
            os.utime(gone, (ahead + k, ahead + k))
        other = tmp_path / "other"
        other.mkdir()
        theirs = []
        for k in range(2):
            res = run_bookfs("mount", str(src), str(other), "-o", "ro")
            theirs.append(_log_of(res.stdout))
            gone_pid = int(res.stdout.split("daemon pid ")[1].split(";")[0])
            run_bookfs("umount", str(other))
            deadline = time.monotonic() + 30  # its lock is released when it exits
            while k == 0 and os.path.exists(f"/proc/{gone_pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
        names = [n for n in os.listdir(logs) if n.startswith("bookfs-")]
        assert len(names) <= LOG_KEEP
        assert [os.path.exists(p) for p in theirs] == [False, True]
        assert os.path.exists(path) and os.stat(path).st_ino == ino
        size = os.stat(path).st_size
        assert not lockable(path)  # the daemon holds it (the parent that forked it is gone)
    finally:
        run_bookfs("umount", str(live), check=False)
        force_unmount(live)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    # the daemon wrote to the same file to its end
    assert os.stat(path).st_size > size
    assert "unmounted" in open(path).read().splitlines()[-1]
    # and no other process (its watchdog, say) kept the lock: the log may now be pruned
    assert lockable(path)


def lockable(path: str) -> bool:
    """Whether an exclusive flock on ``path`` can be taken now (no live daemon holds it)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
