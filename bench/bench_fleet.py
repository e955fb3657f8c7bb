"""A fleet in one mount (issue 24): ``bookfs mount --fleet`` of ``--ships`` generated ships
of ``--events`` events each, against one read-only mount of a single log holding the
same bytes.

The data (``bench_ships.make_logs``, made once and reused): one ``bookfs sample`` log;
``--ships`` copies of it (``cp --reflink=auto``), each with its own ``who`` in
``meta.bin``, in one directory (the fleet); and one log of the same deeds repeated
``--ships`` times (the single log).

Each of ``--rounds`` interleaved rounds (at least 5 for numbers worth quoting):

1. ``bookfs mount --fleet DIR MNT``: seconds until the command returns (the daemon
   answers that it is ready only once it serves requests);
2. ``ls MNT`` and ``find MNT -maxdepth 2`` on the fresh mount;
3. ``spark.read.format("bookfs").load(MNT)`` into Spark's ``noop`` sink, every column,
   then the daemon's memory (VmRSS and the proportional set size, PSS, from
   ``/proc/PID/smaps_rollup``) once every ship has been read, per ship;
4. unmount; then ``format("bookfs").load([ONE])`` over the single log, the same way.

With ``--no-spark`` steps 3 and 4 are left out (the Spark part is most of a round's
25 minutes), and each round first mounts the fleet with an empty index cache of its own
(``$BOOKFS_CACHE_DIR``: no persisted index, no card) and times the *first-ever* ``find
MNT -maxdepth 2`` on it, then steps 1 and 2 on the fleet's own cache, where every ship
has its index and card (made once, before the first round, by one such find).  After each
find the fleet's marker file says how many logs it opened.

With ``--piers`` the fleet is of real-layout piers instead (:func:`make_piers`): each
ship a vere pier, ``.urb/log/`` with its top-level LMDB ``data.mdb`` (META) and two
epochs, ``0i0`` an LMDB epoch (``data.mdb``, ``epoc.txt`` 2) holding the first half of
the sample's events and ``0i<N>`` a Book epoch in vere's layout (``book.log``,
``meta.bin``, ``epoc.txt`` 3) holding the rest; made once from one template pier (copied
with ``cp -a --reflink=auto``, each copy's ``meta.bin`` given its own ``who``).  Such a
ship's card is kept in a card file of its own in the index cache (``formats/shipcard.py``).

With ``--floor`` (and ``--no-spark``; a fleet of UIP Book logs) each round also times,
for issue 34.7, what binds a first-ever ``find``: every log's bytes read with ``pread``
into a 4 MiB buffer (the copy that any reading of the framing through ``pread`` pays;
one core), one file created per ship in a fresh directory beside the index cache (what
keeping each ship's index and card costs in the file system), the framing scan of every
log (the UIP layout's ``Deeds.scan``, as an open does), and a first-ever ``find`` without ship readahead (``--ships-ahead 0``,
``fs/fleet/ahead.py``): the share of the cards built ahead.

The load average is noted at the start of each round.  Prints progress on stderr and a
Markdown table (min, median, max of each measure, with the issue's targets) on stdout,
and how many rounds met each target.

Usage: python bench/bench_fleet.py [--ships 1000] [--events 2000] [--rounds 5]
       [--dir /var/tmp/bench-fleet] [--master local[2]] [--no-spark] [--piers]
Check it on a tiny fleet first: --ships 20 --events 100 --rounds 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bookfs.formats.info import parse  # noqa: E402
from bookfs.formats.layout import LOG_NAME, META_FIELDS, META_NAME  # noqa: E402
from tests.mounting import BOOKFS, mounted, umount_quietly  # noqa: E402

import bench_ships  # noqa: E402


def say(msg: str) -> None:
    print(f"bench_fleet: {msg}", file=sys.stderr, flush=True)


def loadavg() -> float:
    return os.getloadavg()[0]


def memory_kib(pid: int) -> tuple[int, int]:
    """``(VmRSS, Pss)`` of process ``pid`` in KiB."""
    rss = pss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    return rss, pss


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def noop(spark, what):
    def go():
        spark.read.format("bookfs").load(what).write.format("noop").mode("overwrite").save()
    return go


def make_piers(directory: str, ships: int, events: int) -> str:
    """``DIR/piers<ships>x<events>``, a fleet of ``ships`` real-layout piers (module
    docstring), made once and reused; returns its directory."""
    from bookfs.formats.book import Book
    from tests.lmdb_fixtures import make_pier

    fleet = os.path.join(directory, f"piers{ships}x{events}")
    if os.path.exists(os.path.join(fleet, ".done")):
        return fleet
    base = bench_ships.make_base(directory, events)
    template = os.path.join(directory, f"pier-template{events}")
    shutil.rmtree(template, ignore_errors=True)
    with Book.open(base) as book:
        deeds = [book.read(e) for e in range(book.first, book.last + 1)]
        meta = {k: book.read_meta(k) for k in ("who", "version", "fake", "life")}
    half = len(deeds) // 2
    make_pier(template, [("lmdb", deeds[:half]), ("vere", deeds[half:])], meta=meta)
    who = int.from_bytes(meta["who"], "little")
    off, size = META_FIELDS["who"]
    os.makedirs(fleet, exist_ok=True)
    for i in range(ships):
        d = os.path.join(fleet, f"p{i:04d}")
        if os.path.exists(d):
            continue
        if i % 100 == 0:
            say(f"copying pier {i + 1}/{ships}")
        subprocess.run(["cp", "-a", "--reflink=auto", template, d + ".tmp"], check=True)
        meta_bin = os.path.join(d + ".tmp", ".urb", "log", f"0i{half}", META_NAME)
        with open(meta_bin, "r+b") as f:  # a ship of its own
            f.seek(off)
            f.write((who + 1 + i).to_bytes(size, "little"))
        os.rename(d + ".tmp", d)
    open(os.path.join(fleet, ".done"), "w").close()
    return fleet


def mount_fleet(fleet_dir: str, mnt: str, cache: str, *extra: str) -> tuple[float, int]:
    """``(seconds until ready, daemon pid)`` of ``bookfs mount --fleet`` with the index
    cache ``cache`` (and the options ``extra``)."""
    env = dict(os.environ, BOOKFS_CACHE_DIR=cache)
    t = time.perf_counter()
    res = subprocess.run([*BOOKFS, "mount", "--fleet", *extra, fleet_dir, mnt],
                         capture_output=True, text=True, env=env)
    took = time.perf_counter() - t
    if res.returncode:
        raise SystemExit(f"bench_fleet: mount --fleet failed: {res.stderr.strip()}")
    return took, int(res.stdout.split("daemon pid ")[1].split(";")[0])


def find(mnt: str) -> tuple[float, int]:
    """``(seconds, logs the fleet opened)`` of ``find MNT -maxdepth 2`` on a fresh mount."""
    took = timed(lambda: subprocess.run(["find", mnt, "-maxdepth", "2"], check=True,
                                        stdout=subprocess.DEVNULL))
    with open(os.path.join(mnt, ".bookfs-fleet")) as f:
        return took, int(parse(f.read())["opened"])


def fresh_dir(args, name: str) -> str:
    """A new, empty directory for one round's files (an index cache that must start
    empty, the ``create`` probe), under the bench's scratch directory, which is removed
    only when the bench ends (:func:`main`).  Not a directory emptied and made again:
    on ext4 without a journal (this VM's root file system), a new inode skips every inode
    of its block group freed within the last 60 s (``RECENTCY_MIN``; 360 s while the
    inode table's block is dirty), a buffer-cache lookup each (``fs/ext4/ialloc.c``,
    ``find_inode_bit()`` and ``recently_deleted()``, under ``s_journal == NULL``): the
    1,000 files deleted by the round before made each of the next round's creates cost
    0.4–0.9 ms of CPU instead of about 0.03 ms."""
    path = os.path.join(args.scratch, f"{name}-{len(os.listdir(args.scratch))}")
    os.makedirs(path, mode=0o700)
    return path


def first_find(args, fleet_dir: str, got: dict[str, float]) -> None:
    """The first-ever ``find`` (an empty index cache of its own), into ``got``."""
    mnt = os.path.join(args.dir, "mnt_fleet")
    mount_fleet(fleet_dir, mnt, fresh_dir(args, "cache-cold"))
    try:
        got["first-ever find s"], got["first-ever find: logs opened"] = find(mnt)
    finally:
        umount_quietly(mnt)


def floor_round(fleet_dir: str, args, got: dict[str, float]) -> None:
    """``--floor``'s measures (the docstring) into ``got``."""
    from bookfs.formats.deeds import UIP
    from bookfs.formats.index import OffsetIndex
    from bookfs.formats.layout import HEADER_SIZE

    ships = sorted(os.path.join(fleet_dir, d) for d in os.listdir(fleet_dir)
                   if not d.startswith("."))
    logs = [os.path.join(d, LOG_NAME) for d in ships]
    buf = bytearray(4 << 20)

    def read_all() -> None:
        for path in logs:
            fd = os.open(path, os.O_RDONLY)
            off = 0
            while n := os.preadv(fd, [buf], off):
                off += n
            os.close(fd)

    def scan_all() -> None:
        for path in logs:
            fd = os.open(path, os.O_RDONLY)
            UIP.scan(fd, OffsetIndex(first=1, end=HEADER_SIZE), os.fstat(fd).st_size)
            os.close(fd)

    def create_all() -> None:  # one index file per ship, as a first-ever find keeps
        probe = fresh_dir(args, "cache-probe")
        for i in range(len(logs)):
            os.close(os.open(os.path.join(probe, str(i)), os.O_CREAT | os.O_WRONLY, 0o600))

    got["floor: every log pread, s"] = timed(read_all)
    got["floor: a file created per ship beside the cache, s"] = timed(create_all)
    got["floor: every log's framing scanned, s"] = timed(scan_all)
    mnt = os.path.join(args.dir, "mnt_fleet")
    mount_fleet(fleet_dir, mnt, fresh_dir(args, "cache-cold"), "--ships-ahead", "0")
    try:
        got["first-ever find, no readahead (--ships-ahead 0), s"], got[
            "first-ever find, no readahead: logs opened"] = find(mnt)
    finally:
        umount_quietly(mnt)


def one_round(args, spark, fleet_dir: str, big_mnt: str, n: int) -> dict[str, float]:
    mnt = os.path.join(args.dir, "mnt_fleet")
    os.makedirs(mnt, exist_ok=True)
    got: dict[str, float] = {"load average": loadavg()}
    if spark is None:
        first_find(args, fleet_dir, got)
        if args.floor:
            floor_round(fleet_dir, args, got)
    got["mount ready s"], pid = mount_fleet(fleet_dir, mnt, args.cache)
    try:
        got["ls MNT s"] = timed(lambda: subprocess.run(["ls", mnt], check=True,
                                                       stdout=subprocess.DEVNULL))
        got["find -maxdepth 2 s"], got["find: logs opened"] = find(mnt)
        if spark is None:
            return got
        s = timed(noop(spark, mnt))
        got["fleet Spark s"] = s
        rss, pss = memory_kib(pid)
        got["daemon RSS MiB/ship"] = rss / 1024 / args.ships
        got["daemon PSS MiB/ship"] = pss / 1024 / args.ships
        got["daemon RSS MiB"] = rss / 1024
    finally:
        umount_quietly(mnt)
    s1 = timed(noop(spark, [big_mnt]))
    got["one log Spark s"] = s1
    got["fleet / one log speed"] = s1 / s
    return got


TARGETS = {"mount ready s": "≤ 5", "ls MNT s": "≤ 1", "find -maxdepth 2 s": "≤ 1",
           "daemon RSS MiB/ship": "≤ 2", "fleet / one log speed": "≥ 0.9"}
MET = {"≤": lambda v, t: v <= t, "≥": lambda v, t: v >= t}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ships", type=int, default=1000, help="how many ships in the fleet")
    p.add_argument("--events", type=int, default=2000, help="events per ship")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (≥ 5 to quote)")
    p.add_argument("--dir", default="/var/tmp/bench-fleet", help="scratch directory")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--no-spark", action="store_true",
                   help="leave Spark out; time the first-ever find instead (docstring)")
    p.add_argument("--piers", action="store_true",
                   help="a fleet of real-layout piers (LMDB + vere Book epochs); "
                        "needs --no-spark")
    p.add_argument("--floor", action="store_true",
                   help="with --no-spark: also time what binds a first-ever find "
                        "(docstring)")
    args = p.parse_args()
    if args.ships < 1 or args.events < 2 or args.rounds < 1:
        p.error("--ships and --rounds must be at least 1, --events at least 2")
    if args.piers and not args.no_spark:
        p.error("--piers: only with --no-spark")
    if args.floor and (args.piers or not args.no_spark):
        p.error("--floor: only with --no-spark, on a fleet of Book logs (no --piers)")
    n = args.ships * args.events
    if args.piers:
        fleet_dir = make_piers(args.dir, args.ships, args.events)
        print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, "
              f"Python {platform.python_version()}; a fleet of {args.ships} piers x "
              f"{args.events:,} events (epochs 0i0 LMDB and 0i{args.events // 2} vere "
              f"Book); {args.rounds} rounds", flush=True)
    else:
        data = argparse.Namespace(dir=os.path.join(args.dir, f"{args.ships}x{args.events}"),
                                  piers=args.ships, events=args.events)
        base, piers, big = bench_ships.make_logs(data)
        fleet_dir = os.path.dirname(piers[0])
        print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, "
              f"Python {platform.python_version()}; a fleet of {args.ships} ships x "
              f"{args.events:,} events ({os.path.getsize(os.path.join(base, LOG_NAME)):,} "
              f"bytes each) vs one log of {n:,} events "
              f"({os.path.getsize(os.path.join(big, LOG_NAME)):,} bytes); "
              f"{args.rounds} rounds", flush=True)
    # the fleet's own index cache: every ship's index and card made by one find
    args.cache = os.path.join(args.dir, "cache-warm")
    os.makedirs(args.cache, mode=0o700, exist_ok=True)
    mnt = os.path.join(args.dir, "mnt_fleet")
    os.makedirs(mnt, exist_ok=True)
    mount_fleet(fleet_dir, mnt, args.cache)
    try:
        say("warm-up: the fleet's indexes and cards, %.3f s, %d logs opened" % find(mnt))
    finally:
        umount_quietly(mnt)
    if args.no_spark and not args.piers:  # the first-ever finds read the logs from memory
        say("warm-up: every log read once")
        for ship in os.listdir(fleet_dir):
            with contextlib.suppress(OSError), open(os.path.join(fleet_dir, ship, LOG_NAME),
                                                    "rb") as f:
                while f.read(4 << 20):
                    pass
    args.scratch = os.path.join(args.dir, f"scratch-{os.getpid()}")
    os.makedirs(args.scratch, mode=0o700)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, args.scratch, ignore_errors=True)
        spark = big_mnt = None
        if not args.no_spark:
            from bookfs import spark as bs

            big_mnt = stack.enter_context(mounted(big, os.path.join(args.dir, "mnt_big"),
                                                  "-o", "ro"))
            spark = bs.register(bs.session(args.master, "bench_fleet"))
            stack.callback(spark.stop)
            say("warm-up: the single log")
            noop(spark, [big_mnt])()
        rounds = []
        for r in range(args.rounds):
            got = one_round(args, spark, fleet_dir, big_mnt, n)
            say(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in got.items()))
            rounds.append(got)
    print("\n| measure | min | median | max | target |\n|---|---:|---:|---:|---|")
    for key in rounds[0]:
        values = [g[key] for g in rounds]
        print(f"| {key} | {min(values):.3f} | {statistics.median(values):.3f} | "
              f"{max(values):.3f} | {TARGETS.get(key, '')} |")
    print()
    for key, target in TARGETS.items():
        if key in rounds[0]:
            op, bound = target.split()
            met = sum(MET[op](g[key], float(bound)) for g in rounds)
            print(f"{key} {target}: met in {met} of {len(rounds)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
