"""Appends through new/ against their floor, side by side in one run (issues 12 and 18).

Four mounts, each on its own log file in the same directory (the same disk):

* **floor**: ``bench/constfs.py --log FILE``: pyfuse3 plus one ``fdatasync`` per append,
  done inline in the FLUSH handler (no ordering, no group commit, no last-close check);
* **group**: ``bench/constfs.py --log FILE --group-commit``: pyfuse3 plus bookfs's shape
  of a durable append and nothing else: one committer task, one ``writev`` and one
  ``fdatasync`` per group of closes on a worker thread (no ordering, no checks);
* **group-probe**: the same with ``--probe``: the commit rule's ``/proc`` probe of each
  closing task on that thread before the save (what a durable append that keeps the
  commit rule costs at the least on pyfuse3 and trio);
* **requests**: ``bench/constfs.py`` without ``--log``: the same requests answered at once
  with nothing saved, the ceiling pyfuse3 itself puts on appends (its daemon CPU per
  append is printed too);
* **bookfs**: ``bookfs mount`` of a Book log (this checkout), the full ``new/`` contract:
  contiguity, the commit rule (``fs/append/rule.py``), one ordered group commit;
* **bookfs-noprobe**: the same with ``BOOKFS_BENCH_SKIP_PROBE=1``: the writer's closes
  commit without the rule's ``/proc`` probe (a benchmark-only setting), so the difference
  to **bookfs** is what the rule costs (issue 18: at most 5 % of the floor's rate);
* **bookfs-frozen**: **bookfs** with its read-only companion stopped (``SIGSTOP``) while
  the appends are timed: what the companion's work costs the writers on shared CPUs
  (it serves no request of an append; its CPU is then left out);
* **direct**: the same 1 KB events written to files of a plain directory with
  ``fsync`` (what the disk does without FUSE; context only).

Each round runs 1 writer, then ``--writers`` writers (threads of this process, each
``open(O_CREAT|O_EXCL)``, ``write``, ``close`` of ``new/<next>``), against each mount in
turn; ``--rounds`` rounds alternate the order.  Medians are printed as a Markdown table
with the ratios the issue names: bookfs 1 writer / floor 1 writer, bookfs N writers /
bookfs 1 writer.

    python bench/bench_append.py --seconds 3 --rounds 5

Needs root and /dev/fuse.  Figures: docs/benchmarks.md, "Appends at the floor (item 2)".
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_mount import Proc, appends  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from bookfs.noun import jam  # noqa: E402

#: 1 KiB: a 4-byte mug, then the jam of one 8,133-bit atom (1,020 bytes), so that the
#: mount's payload check (issue 21) accepts it
PAYLOAD = b"\0\0\0\0" + jam((1 << 8132) | int.from_bytes(bytes(range(256)) * 3 + bytes(248), "little"))
assert len(PAYLOAD) == 1024


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of every thread of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(pids: tuple[int, ...], mnt: str, first: int, seconds: float, threads: int
          ) -> tuple[float, float | None]:
    """(appends/s, daemons' CPU µs per append) of one run of :func:`appends`: the CPU of
    every process in ``pids`` (a read-write bookfs mount's daemon and its read-only
    companion, which follows each commit: ``fs/daemon/companion.py``)."""
    before = list(map(cpu_seconds, pids))
    calls: dict = {}
    done, t = appends(mnt, first, seconds, threads, PAYLOAD, fsync=not pids, calls=calls)
    parts = [(cpu_seconds(p) - b) * 1e6 / done for p, b in zip(pids, before)]
    if len(parts) > 1:
        print(f"  daemon CPU per append: {' + '.join(f'{x:,.0f}' for x in parts)} µs "
              "(the read-write daemon + its companion)", file=sys.stderr)
    if threads == 1 and calls.get("close"):
        print("  the writer's calls, medians: " + ", ".join(
            f"{name} {statistics.median(ns) / 1000:,.0f}" for name, ns in calls.items())
            + " µs", file=sys.stderr)
    return done / t, sum(parts) if pids else None


def companion_pid(mnt: Path) -> int | None:
    """The read-only companion daemon of the mount at ``mnt``, from its ``info`` file's
    ``reads:`` line (None while there is none)."""
    for _ in range(100):  # the mount reports ready just before it names its companion
        info = (mnt / "info").read_text()
        found = re.search(r"companion connection \(daemon pid (\d+)\)", info)
        if found or "companion is starting" not in info:
            return int(found.group(1)) if found else None
        time.sleep(0.01)
    return None


#: what the bookfs sources mount: ``log`` (a UIP Book directory), or ``pier`` (``--epochs``)
SOURCE = "log"


def make_pier_source(work: Path, epochs: int) -> None:
    """``work/pier``: a pier of ``epochs`` epochs in vere's layout, five events each
    (``--epochs``; appends go to the newest)."""
    from tests.lmdb_fixtures import make_pier

    if not (work / "pier").exists():
        make_pier(work / "pier", [("vere", [PAYLOAD] * 5)] * epochs)


def run_bookfs(work: Path, seconds: float, threads: int, *options: str,
               freeze: bool = False):
    from bookfs.formats.pier import open_source

    src, mnt = work / SOURCE, work / "mnt-bookfs"
    with open_source(src) as b:
        first = b.last + 1
    out = subprocess.run([sys.executable, "-m", "bookfs.cli", "mount", str(src), str(mnt),
                          *options], cwd=ROOT, check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    pid = int(re.search(r"daemon pid (\d+)", out.stdout + out.stderr).group(1))
    companion = companion_pid(mnt)
    try:
        if freeze and companion:
            os.kill(companion, signal.SIGSTOP)
            return timed((pid,), f"{mnt}/new", first, seconds, threads)
        pids = (pid, companion)
        return timed(tuple(p for p in pids if p), f"{mnt}/new", first, seconds, threads)
    finally:
        if freeze and companion:
            os.kill(companion, signal.SIGCONT)
        subprocess.run([sys.executable, "-m", "bookfs.cli", "umount", str(mnt)], cwd=ROOT,
                       check=True, capture_output=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))


def run_bookfs_frozen(work: Path, seconds: float, threads: int):
    """The same mount, its companion stopped while the appends are timed."""
    return run_bookfs(work, seconds, threads, freeze=True)


def run_bookfs_unchecked(work: Path, seconds: float, threads: int):
    """The same mount without the payload check (issue 21): the check's cost."""
    return run_bookfs(work, seconds, threads, "-o", "unchecked_payloads")


def run_bookfs_nopoll(work: Path, seconds: float, threads: int):
    """The same mount with ``-o busy_poll=0``: the daemon sleeps as soon as no request is
    queued (``fs/daemon/mainloop.py``, ``main_options``): what the busy poll gives."""
    return run_bookfs(work, seconds, threads, "-o", "busy_poll=0")


def run_bookfs_noprobe(work: Path, seconds: float, threads: int):
    os.environ["BOOKFS_BENCH_SKIP_PROBE"] = "1"  # the daemon inherits it
    try:
        return run_bookfs(work, seconds, threads)
    finally:
        os.environ.pop("BOOKFS_BENCH_SKIP_PROBE", None)


def run_constfs(work: Path, seconds: float, threads: int, *args: str):
    mnt = work / "mnt-constfs"
    cmd = [sys.executable, str(HERE / "constfs.py"), str(mnt), "--count", "0", *args]
    proc = Proc(cmd, str(mnt), str(work / "constfs.out"))
    with proc:
        return timed((proc.pid,), f"{mnt}/new", 1, seconds, threads)


def run_floor(work: Path, seconds: float, threads: int):
    return run_constfs(work, seconds, threads, "--log", str(work / "floor.log"))


def run_group(work: Path, seconds: float, threads: int):
    return run_constfs(work, seconds, threads, "--log", str(work / "group.log"),
                       "--group-commit")


def run_group_probe(work: Path, seconds: float, threads: int):
    return run_constfs(work, seconds, threads, "--log", str(work / "group.log"),
                       "--group-commit", "--probe")


def run_requests(work: Path, seconds: float, threads: int):
    return run_constfs(work, seconds, threads)


def run_direct(work: Path, seconds: float, threads: int):
    d = work / "direct"
    if d.exists():
        subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir()
    return timed((), str(d), 1, seconds, threads)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per run (default 3)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--writers", type=int, default=8, help="concurrent writers (default 8)")
    p.add_argument("--dir", help="work directory (default: a new one under $TMPDIR)")
    p.add_argument("--profile", type=int, metavar="WRITERS", nargs="?", const=1,
                   help="then one more run of bookfs with WRITERS writers (default 1) under "
                        "cProfile (BOOKFS_PROFILE): each daemon's CPU per append, by function")
    p.add_argument("--epochs", type=int, default=0, metavar="E",
                   help="the bookfs sources mount a pier of E epochs (vere's layout, five "
                        "events each; appends go to the newest) instead of a Book directory")
    p.add_argument("--only", metavar="NAMES",
                   help="run only these sources, comma-separated (default: every one: "
                        "floor,bookfs,bookfs-unchecked,bookfs-noprobe,bookfs-frozen,"
                        "bookfs-nopoll,group,group-probe,requests,direct)")
    a = p.parse_args()
    work = Path(a.dir or tempfile.mkdtemp(prefix="bookfs-bench-append-"))
    work.mkdir(parents=True, exist_ok=True)
    with Book.open(work / "log", writable=True, create=True) as b:
        b.save(1, [PAYLOAD])
    if a.epochs > 0:
        global SOURCE
        SOURCE = "pier"
        make_pier_source(work, a.epochs)
    (work / "mnt-bookfs").mkdir(exist_ok=True)
    runners = {"floor": run_floor, "bookfs": run_bookfs, "bookfs-unchecked": run_bookfs_unchecked,
               "bookfs-noprobe": run_bookfs_noprobe,
               "bookfs-frozen": run_bookfs_frozen, "bookfs-nopoll": run_bookfs_nopoll,
               "group": run_group, "group-probe": run_group_probe, "requests": run_requests,
               "direct": run_direct}
    if a.only:
        unknown = set(a.only.split(",")) - set(runners)
        if unknown:
            p.error(f"--only: unknown source(s) {', '.join(sorted(unknown))}; expected some of "
                    f"{','.join(runners)}")
        runners = {k: v for k, v in runners.items() if k in a.only.split(",")}
    rates: dict[tuple[str, int], list[float]] = {}
    cpus: dict[tuple[str, int], list[float]] = {}
    load_before = os.getloadavg()
    for i in range(a.rounds):
        order = list(runners) if i % 2 == 0 else list(reversed(runners))
        for threads in (1, a.writers):
            for name in order:
                rate, cpu = runners[name](work, a.seconds, threads)
                rates.setdefault((name, threads), []).append(rate)
                if cpu is not None:
                    cpus.setdefault((name, threads), []).append(cpu)
                print(f"round {i + 1}: {name:16} {threads} writer(s): {rate:8,.0f}/s"
                      + (f", daemon CPU {cpu:,.0f} µs per append" if cpu else ""),
                      file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    n = a.writers
    print(f"| appends of 1 KiB (median of {a.rounds}) | 1 writer | {n} writers | {n} / 1 "
          f"| daemon CPU per append, 1 / {n} writers |")
    print("|---|---|---|---|---|")
    for name, label in (("floor", "floor: pyfuse3 + fdatasync per append"),
                        ("bookfs", "bookfs new/ (the commit rule, payloads checked)"),
                        ("bookfs-unchecked", "bookfs new/, -o unchecked_payloads"),
                        ("bookfs-noprobe", "bookfs new/, the rule's /proc probe skipped"),
                        ("bookfs-frozen", "bookfs new/, its companion stopped (SIGSTOP)"),
                        ("bookfs-nopoll", "bookfs new/, -o busy_poll=0"),
                        ("group", "group commit on pyfuse3: writev + fdatasync a group"),
                        ("group-probe", "the same, each close probed as the rule does"),
                        ("requests", "pyfuse3 answering the same requests, no I/O"),
                        ("direct", "plain files + fsync, no FUSE")):
        if name not in runners:
            continue
        one, many = med[(name, 1)], med[(name, n)]
        c = (f"{cpu[(name, 1)]:,.0f} / {cpu[(name, n)]:,.0f} µs" if (name, 1) in cpu
             else "–")
        spread = [f"{min(rates[(name, t)]):,.0f}–{max(rates[(name, t)]):,.0f}" for t in (1, n)]
        print(f"| {label} | {one:,.0f}/s ({spread[0]}) | {many:,.0f}/s ({spread[1]}) "
              f"| {many / one:.2f}× | {c} |")
    print()
    print(f"medians of {a.rounds} interleaved rounds (min–max in brackets); 1-minute load "
          f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    def have(*names: str) -> bool:
        return all(x in runners for x in names)

    if have("bookfs", "bookfs-unchecked"):
        for t in (1, n):
            print(f"the payload check costs {1 - med[('bookfs', t)] / med[('bookfs-unchecked', t)]:+.1%}"
                  f" of bookfs's rate with {t} writer(s) (checked over -o unchecked_payloads)")
    if have("bookfs", "bookfs-noprobe", "floor"):
        for t in (1, n):
            cost = (med[("bookfs-noprobe", t)] - med[("bookfs", t)]) / med[("floor", t)]
            print(f"the commit rule's probe costs {cost:+.1%} of the floor's rate with {t} "
                  f"writer(s) (bookfs without the probe minus bookfs, over the floor)")
    if have("bookfs", "floor"):
        print(f"bookfs 1 writer / floor 1 writer: {med[('bookfs', 1)] / med[('floor', 1)]:.2f}×; "
              f"bookfs {n} writers / floor {n} writers: "
              f"{med[('bookfs', n)] / med[('floor', n)]:.2f}×")
        for t in (1, n):  # within each round: bookfs and the floor ran minutes apart at most
            per = [b / f for b, f in zip(rates[("bookfs", t)], rates[("floor", t)])]
            print(f"bookfs / floor with {t} writer(s), within each round: "
                  + ", ".join(f"{x:.2f}" for x in per)
                  + f"; >= 0.9x in {sum(x >= 0.9 for x in per)} of {len(per)} rounds")
    if have("bookfs", "requests"):  # issue 34, item 4
        per = [b / r for b, r in zip(rates[("bookfs", n)], rates[("requests", n)])]
        cper = [b / r for b, r in zip(cpus[("bookfs", n)], cpus[("requests", n)])]
        print(f"bookfs {n} writers / requests {n} writers, within each round: "
              + ", ".join(f"{x:.2f}" for x in per) + f"; median {statistics.median(per):.2f}×"
              f" (target >= 0.8x); daemon CPU per append, bookfs / requests: "
              + ", ".join(f"{x:.2f}" for x in cper) + f"; median {statistics.median(cper):.2f}×"
              " (target <= 1.5x)")
    for name in ("group", "group-probe"):  # issue 34, item 4: what binds it
        if have(name, "requests"):
            per = [g / r for g, r in zip(rates[(name, n)], rates[("requests", n)])]
            cper = [g / r for g, r in zip(cpus[(name, n)], cpus[("requests", n)])]
            print(f"{name} / requests with {n} writers: rate {statistics.median(per):.2f}× "
                  f"({min(per):.2f}–{max(per):.2f}), daemon CPU per append "
                  f"{statistics.median(cper):.2f}× ({min(cper):.2f}–{max(cper):.2f})")
    if a.profile is not None:
        profile(work, a.seconds, a.profile)
    return 0


def _layer(file: str, name: str) -> str:
    """Which layer a profiled function belongs to (for the profile's summary)."""
    if file == "~":  # a builtin: by what it is
        if "epoll" in name or "recv" in name or "socket" in name:
            return "trio (event loop, I/O waits' bookkeeping)"
        if "SimpleQueue" in name or "_thread" in name:
            return "bookfs (hand-off to the commit thread)"
        return "builtins called from anywhere"
    for key, layer in (("/trio/", "trio (event loop, I/O waits' bookkeeping)"),
                       ("outcome", "trio (event loop, I/O waits' bookkeeping)"),
                       ("pyfuse3", "pyfuse3 (request decoding and replies)"),
                       ("/bookfs/", "bookfs (handlers, staging, check, commit queue)")):
        if key in file:
            return layer
    return "other Python (stdlib)"


def profile(work: Path, seconds: float, writers: int, top: int = 25) -> None:
    """One more run of bookfs with ``BOOKFS_PROFILE``: where each daemon's event loop
    spends its CPU (the read-write daemon's, then its read-only companion's), in µs per
    append (cProfile's own overhead included, so the totals are above the unprofiled
    daemon CPU; the shares are what to read)."""
    from bookfs.formats.pier import open_source

    path = work / "daemon.prof"
    with open_source(work / SOURCE) as b:
        before = b.last
    os.environ["BOOKFS_PROFILE"] = str(path)
    try:
        run_bookfs(work, seconds, writers)
    finally:
        os.environ.pop("BOOKFS_PROFILE", None)
    with open_source(work / SOURCE) as b:
        done = b.last - before
    print(f"\nprofile: {done} appends, {writers} writer(s) (thread CPU time of each event "
          "loop; the commit thread's pwrite and fdatasync are not in it)")
    for name, file in (("the read-write daemon", path), ("its read-only companion",
                                                         Path(f"{path}.ro"))):
        if file.exists():
            _print_profile(name, file, done, top)


def _print_profile(name: str, path: Path, done: int, top: int) -> None:
    import pstats

    st = pstats.Stats(str(path))
    print(f"\n{name}: the event loop's CPU under cProfile {st.total_tt * 1e6 / done:,.0f} µs "
          "per append")
    groups: dict[str, float] = {}
    for (file, line, fn), (cc, nc, tt, ct, callers) in st.stats.items():
        groups[_layer(file, fn)] = groups.get(_layer(file, fn), 0.0) + tt
    print("| layer | µs per append | share |\n|---|---:|---:|")
    for layer, tt in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"| {layer} | {tt * 1e6 / done:,.1f} | {tt / st.total_tt:.1%} |")
    print()
    print("| µs per append (own time) | share | function |\n|---:|---:|---|")
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, fn), (cc, nc, tt, ct, callers) in rows:
        where = f"{Path(file).name}:{line}" if file != "~" else "builtin"
        print(f"| {tt * 1e6 / done:,.1f} | {tt / st.total_tt:.1%} | {fn} ({where}) |")

if __name__ == "__main__":
    sys.exit(main())
