#!/usr/bin/env python3
"""Benchmark the bookfs storage engine (``bookfs.formats.book.Book``) against LMDB.

Everything runs side by side in one invocation, on the same events: 1 KB random payloads
(a 4-byte "mug" followed by 1020 random bytes), event numbers 1..N.

1. append: durable batches of 100 events.  bookfs: one ``Book.save`` per batch (one
   ``pwritev`` + ``fdatasync``).  LMDB (python ``lmdb``): one write transaction per batch,
   default ``sync=True``/``metasync=True`` so every commit is durable, named db ``EVENTS``
   with ``integerkey=True``, key = event number as a native-endian u64.
2. open an N-event log: cold (persisted index deleted from ``$BOOKFS_CACHE_DIR``) read-only
   and writable (a writable cold open also checks every CRC), warm (persisted index
   present) read-only and writable.  Median of ``--open-runs`` runs.  The log is in the
   page cache (it was just written); dropping the page cache is not attempted.
3. random reads by event number: uniform over the first 1 %, the last 1 % and the whole
   log; bookfs ``Book.read`` (CRC-checked) beside LMDB ``txn.get`` on the same keys.
4. full CRC verification (``Book.verify``): GB/s of log bytes.
5. memory: index bytes per event and process RSS before/after opening the log, measured
   in a fresh subprocess.

Run ``python bench/bench_engine.py --help`` for the options.  MB and GB are 10^6 and 10^9
bytes.  The bench directory is deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

PAYLOAD = 1024  # 4-byte mug + 1020 bytes
BATCH = 100
MB = 1e6
GB = 1e9

# targets (issue 2)
T_APPEND_RATIO = 2.0
T_OPEN_COLD = 1.5
T_OPEN_WARM = 0.2
T_READS = 100_000
T_VERIFY_GBPS = 1.0


# --- helpers -------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/status (VmRSS)."""
    return _status_field("VmRSS")


def _status_field(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    return 0


def fs_of(path: str) -> dict:
    """Filesystem type, source device and mount point holding ``path``."""
    path = os.path.realpath(path)
    best = ("", "", "", "")
    with open("/proc/self/mounts") as f:
        for line in f:
            src, mnt, fstype, opts = line.split()[:4]
            mnt = mnt.replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
                best = (src, mnt, fstype, opts)
    st = os.statvfs(path)
    return {"source": best[0], "mount": best[1], "fstype": best[2], "options": best[3],
            "free_gb": round(st.f_bavail * st.f_frsize / GB, 1)}


def machine_info(bench_dir: str) -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    try:
        import psutil
        phys = psutil.cpu_count(logical=False)
    except ImportError:
        phys = None
    try:
        import lmdb
        lmdb_v = "python-lmdb %s (LMDB %s)" % (lmdb.__version__, ".".join(map(str, lmdb.version())))
    except ImportError:
        lmdb_v = "not installed"
    from bookfs.formats import layout
    crc_impl = layout._crc32.__module__
    try:  # which engine code was measured
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "bookfs"],
                               capture_output=True, text=True, check=True).stdout.strip()
        rev += " (bookfs/ has uncommitted changes)" if dirty else " (bookfs/ clean)"
    except (OSError, subprocess.CalledProcessError):
        rev = "unknown"
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "physical_cores": phys,
        "ram_gb": round(mem / 2**30, 1),
        "bench_dir_fs": fs_of(bench_dir),
        "python": platform.python_version() + " (" + platform.python_implementation() + ")",
        "kernel": platform.release(),
        "lmdb": lmdb_v,
        "crc32": crc_impl,
        "bookfs_commit": rev,
    }


class Payloads:
    """Event ``e`` (1-based) carries ``blob[(e-1)*1024 : e*1024]``: deterministic random bytes."""

    def __init__(self, n: int, seed: int):
        t = time.perf_counter()
        rng = random.Random(seed)
        chunk = 1 << 24  # randbytes cannot make more than 2^31 bits at once
        total = n * PAYLOAD
        self.blob = b"".join(rng.randbytes(min(chunk, total - i)) for i in range(0, total, chunk))
        self.n = n
        self.gen_s = time.perf_counter() - t

    def get(self, e: int) -> bytes:
        return self.blob[(e - 1) * PAYLOAD : e * PAYLOAD]

    def batch(self, first: int, count: int) -> list[bytes]:
        b = self.blob
        return [b[(e - 1) * PAYLOAD : e * PAYLOAD] for e in range(first, first + count)]


def key(e: int) -> bytes:
    return struct.pack("=Q", e)  # native-endian u64, as LMDB's integerkey requires


def lmdb_open(path: str, map_size: int):
    import lmdb
    env = lmdb.open(path, map_size=map_size, max_dbs=2, subdir=True)  # sync/metasync default True
    db = env.open_db(b"EVENTS", integerkey=True)
    return env, db


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "**"), recursive=True)
               if os.path.isfile(p))


def clear_index_cache(cache: str) -> int:
    n = 0
    for p in glob.glob(os.path.join(cache, "*.idx")):
        os.unlink(p)
        n += 1
    return n


def warm_page_cache(*paths: str) -> None:
    """Read each file once so it is in the page cache (this VM, like some hosts, may evict
    page-cache pages that have not been touched for a while)."""
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            off = 0
            while True:
                got = os.preadv(fd, [view], off)
                if not got:
                    break
                off += got
        finally:
            os.close(fd)


def cached_fraction(path: str) -> float | None:
    """Share of ``path`` resident in the page cache, from util-linux ``fincore``; None if
    that is not available."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]) / max(1, os.path.getsize(path))
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the benchmarks ------------------------------------------------------------------------


def bench_append(root: str, pl: Payloads, n: int, repeats: int) -> dict:
    """Durable batches of 100: bookfs Book.save vs one LMDB write txn per batch."""
    from bookfs.formats.book import Book

    batches = [(f, pl.batch(f, min(BATCH, n - f + 1))) for f in range(1, n + 1, BATCH)]
    keyed = [[(key(f + k), p) for k, p in enumerate(b)] for f, b in batches]
    res = {"events": n, "batch": BATCH, "repeats": repeats, "bookfs_s": [], "lmdb_s": [],
           "lmdb_put_s": [], "raw_s": []}
    lat = {"bookfs": [], "lmdb": []}  # per-batch commit latency, all runs
    clock = time.perf_counter
    for r in range(repeats):
        # bookfs
        d = os.path.join(root, f"append-book-{r}")
        book = Book.open(d, writable=True, create=True)
        t = t1 = clock()
        for f, b in batches:
            book.save(f, b)
            t2 = clock()
            lat["bookfs"].append(t2 - t1)
            t1 = t2
        res["bookfs_s"].append(time.perf_counter() - t)
        assert book.count == n
        book.close()
        res["bookfs_disk_bytes"] = dir_bytes(d)
        shutil.rmtree(d)
        # LMDB, cursor.putmulti(append=True): its fastest path for ascending keys
        d = os.path.join(root, f"append-lmdb-{r}")
        env, db = lmdb_open(d, map_size=max(1 << 30, n * PAYLOAD * 4))
        t = t1 = clock()
        for items in keyed:
            with env.begin(write=True, db=db) as txn:
                txn.cursor().putmulti(items, append=True)
            t2 = clock()
            lat["lmdb"].append(t2 - t1)
            t1 = t2
        res["lmdb_s"].append(time.perf_counter() - t)
        with env.begin(db=db) as txn:
            assert txn.stat(db)["entries"] == n
        env.close()
        res["lmdb_disk_bytes"] = dir_bytes(d)
        shutil.rmtree(d)
        # LMDB, plain txn.put per event (the obvious way)
        d = os.path.join(root, f"append-lmdbput-{r}")
        env, db = lmdb_open(d, map_size=max(1 << 30, n * PAYLOAD * 4))
        t = time.perf_counter()
        for items in keyed:
            with env.begin(write=True, db=db) as txn:
                for k, v in items:
                    txn.put(k, v)
        res["lmdb_put_s"].append(time.perf_counter() - t)
        env.close()
        shutil.rmtree(d)
        # raw floor: the same bytes per batch with pwrite + fdatasync, no engine at all
        d = os.path.join(root, f"append-raw-{r}")
        os.makedirs(d)
        fd = os.open(os.path.join(d, "raw"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        size = BATCH * (PAYLOAD + 20)
        buf = pl.blob[:size]
        off = 0
        t = clock()
        for _ in batches:
            os.pwrite(fd, buf, off)
            off += size
            os.fdatasync(fd)
        res["raw_s"].append(clock() - t)
        os.close(fd)
        shutil.rmtree(d)
        log(f"  append run {r + 1}/{repeats}: bookfs {res['bookfs_s'][-1]:.3f}s, "
            f"lmdb putmulti {res['lmdb_s'][-1]:.3f}s, lmdb put {res['lmdb_put_s'][-1]:.3f}s, "
            f"raw {res['raw_s'][-1]:.3f}s")
    for k in ("bookfs", "lmdb", "lmdb_put", "raw"):
        s = statistics.median(res[k + "_s"])
        res[k + "_eps"] = n / s
        res[k + "_mbps"] = n * PAYLOAD / s / MB
    for k, v in lat.items():
        q = statistics.quantiles(v, n=100)
        res[k + "_batch_ms"] = {"p50": q[49] * 1e3, "p99": q[98] * 1e3, "max": max(v) * 1e3}
    res["ratio"] = res["bookfs_eps"] / res["lmdb_eps"]
    res["ratio_vs_put"] = res["bookfs_eps"] / res["lmdb_put_eps"]
    res["ratio_runs"] = [lm / bk for bk, lm in zip(res["bookfs_s"], res["lmdb_s"])]
    return res


def build_logs(root: str, pl: Payloads, n: int) -> dict:
    """The N-event bookfs log and LMDB database the other tests use (bulk: big batches)."""
    from bookfs.formats.book import Book

    big = 10_000
    res = {}
    d = os.path.join(root, "book")
    t = time.perf_counter()
    book = Book.open(d, writable=True, create=True)
    for f in range(1, n + 1, big):
        book.save(f, pl.batch(f, min(big, n - f + 1)))
    book.close()
    res["bookfs_build_s"] = time.perf_counter() - t
    res["bookfs_log_bytes"] = os.path.getsize(os.path.join(d, "book.log"))
    d = os.path.join(root, "lmdb")
    env, db = lmdb_open(d, map_size=max(1 << 30, n * PAYLOAD * 4))
    t = time.perf_counter()
    for f in range(1, n + 1, big):
        with env.begin(write=True, db=db) as txn:
            txn.cursor().putmulti(((key(e), pl.get(e)) for e in range(f, min(f + big, n + 1))),
                                  append=True)
    env.close()
    res["lmdb_build_s"] = time.perf_counter() - t
    res["lmdb_bytes"] = dir_bytes(d)
    return res


def bench_open(book_dir: str, cache: str, runs: int) -> dict:
    from bookfs.formats.book import Book

    def timed(writable: bool, cold: bool) -> float:
        if cold:
            clear_index_cache(cache)
        t = time.perf_counter()
        b = Book.open(book_dir, writable=writable)
        dt = time.perf_counter() - t
        b.close()
        return dt

    res = {}
    for name, writable, cold in (("cold_ro", False, True), ("cold_rw", True, True)):
        res[name] = [timed(writable, cold) for _ in range(runs)]
    # make the persisted index one a writer wrote (every CRC known good), then warm opens
    clear_index_cache(cache)
    Book.open(book_dir, writable=True).close()
    for name, writable in (("warm_ro", False), ("warm_rw", True)):
        res[name] = [timed(writable, False) for _ in range(runs)]
    return {k: {"runs": v, "median_s": statistics.median(v)} for k, v in res.items()}


def bench_reads(book_dir: str, lmdb_dir: str, pl: Payloads, n: int, reads: int, seed: int) -> dict:
    from bookfs.formats.book import Book

    rng = random.Random(seed + 1)
    pct = max(1, n // 100)
    dists = {
        "first_1pct": [rng.randint(1, pct) for _ in range(reads)],
        "last_1pct": [rng.randint(n - pct + 1, n) for _ in range(reads)],
        "uniform": [rng.randint(1, n) for _ in range(reads)],
    }
    book = Book.open(book_dir, writable=False)
    env, db = lmdb_open(lmdb_dir, map_size=max(1 << 30, n * PAYLOAD * 4))
    # correctness spot check
    for e in (1, n // 2, n):
        assert book.read(e) == pl.get(e)
        with env.begin(db=db) as txn:
            assert txn.get(key(e)) == pl.get(e)
    res = {"reads_per_dist": reads}
    read = book.read
    for name, evs in dists.items():
        keys = [key(e) for e in evs]  # packed outside the timing (favours LMDB)
        # one untimed warm-up pass over a slice of each
        for e in evs[:1000]:
            read(e)
        t = time.perf_counter()
        for e in evs:
            read(e)
        bt = time.perf_counter() - t
        with env.begin(db=db) as txn:
            get = txn.get
            for k in keys[:1000]:
                get(k)
            t = time.perf_counter()
            for k in keys:
                get(k)
            lt = time.perf_counter() - t
        res[name] = {"bookfs_rps": reads / bt, "lmdb_rps": reads / lt, "ratio": lt / bt}
        log(f"  reads {name}: bookfs {reads / bt:,.0f}/s, lmdb {reads / lt:,.0f}/s")
    book.close()
    env.close()
    return res


def bench_verify(book_dir: str, runs: int) -> dict:
    from bookfs.formats.book import Book

    book = Book.open(book_dir, writable=False)
    size = book.log_bytes
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        bad = book.verify()
        times.append(time.perf_counter() - t)
        assert bad == [], bad
    book.close()
    med = statistics.median(times)
    return {"runs": times, "median_s": med, "log_bytes": size, "gbps": size / med / GB}


def bench_memory(book_dir: str, cache: str) -> dict:
    """RSS before/after opening the log, each in a fresh interpreter."""
    res = {}
    for mode in ("warm", "cold"):
        if mode == "cold":
            clear_index_cache(cache)
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--_memory-child", book_dir],
            check=True, capture_output=True, text=True, env=dict(os.environ, BOOKFS_CACHE_DIR=cache),
        ).stdout
        res[mode] = json.loads(out.strip().splitlines()[-1])
    return res


def memory_child(book_dir: str) -> None:
    import gc
    from bookfs.formats.book import Book  # imports (isal, etc.) happen before the "before" sample

    gc.collect()
    before = rss_bytes()
    book = Book.open(book_dir, writable=False)
    gc.collect()
    after = rss_bytes()
    hwm = _status_field("VmHWM")
    try:  # give freed heap back to the OS, so RSS shows what is still referenced
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = rss_bytes()
    except (OSError, AttributeError):
        trimmed = after
    out = {
        "rss_before": before,
        "rss_after": after,
        "rss_after_trim": trimmed,
        "rss_delta_trim": trimmed - before,
        "rss_delta": after - before,
        "vm_hwm": hwm,
        "count": book.count,
        "index_bytes": book.index.memory_bytes(),
        "index_bytes_per_event": book.index.memory_bytes() / book.count,
    }
    book.close()
    print(json.dumps(out))


# --- reporting -----------------------------------------------------------------------------


def pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(m: dict, p: dict, r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    a = r["append"]
    rows.append((f"append {a['events']:,} x 1 KB, durable batches of {BATCH}: bookfs",
                 f"{a['bookfs_eps']:,.0f} ev/s, {a['bookfs_mbps']:.1f} MB/s", "", ""))
    rows.append(("append: LMDB (txn per batch, cursor.putmulti append=True)",
                 f"{a['lmdb_eps']:,.0f} ev/s, {a['lmdb_mbps']:.1f} MB/s", "", ""))
    bl, ll = a["bookfs_batch_ms"], a["lmdb_batch_ms"]
    rows.append(("append: per-batch commit latency p50 / p99, bookfs vs LMDB",
                 f"{bl['p50']:.2f} / {bl['p99']:.2f} ms vs {ll['p50']:.2f} / {ll['p99']:.2f} ms",
                 "", "info"))
    rows.append(("append: bookfs / LMDB", f"{a['ratio']:.2f}x (runs {min(a['ratio_runs']):.2f}-"
                 f"{max(a['ratio_runs']):.2f}x)", f">= {T_APPEND_RATIO:.0f}x",
                 pf(a["ratio"] >= T_APPEND_RATIO)))
    rows.append(("append: LMDB (txn per batch, txn.put per event)",
                 f"{a['lmdb_put_eps']:,.0f} ev/s, {a['lmdb_put_mbps']:.1f} MB/s "
                 f"(bookfs {a['ratio_vs_put']:.2f}x)", "", "info"))
    rows.append(("append: raw pwrite+fdatasync per batch, no engine (ceiling)",
                 f"{a['raw_eps']:,.0f} ev/s, {a['raw_mbps']:.1f} MB/s", "", "info"))
    o = r["open"]
    n = p["events"]
    rows.append((f"open {n:,}-event log, cold, read-only", f"{o['cold_ro']['median_s']:.3f} s",
                 f"<= {T_OPEN_COLD} s", pf(o["cold_ro"]["median_s"] <= T_OPEN_COLD)))
    rows.append((f"open {n:,}-event log, cold, writable (+ every CRC)",
                 f"{o['cold_rw']['median_s']:.3f} s", f"<= {T_OPEN_COLD} s",
                 pf(o["cold_rw"]["median_s"] <= T_OPEN_COLD)))
    rows.append((f"open {n:,}-event log, warm, read-only", f"{o['warm_ro']['median_s']:.3f} s",
                 f"<= {T_OPEN_WARM} s", pf(o["warm_ro"]["median_s"] <= T_OPEN_WARM)))
    rows.append((f"open {n:,}-event log, warm, writable", f"{o['warm_rw']['median_s']:.3f} s",
                 f"<= {T_OPEN_WARM} s", pf(o["warm_rw"]["median_s"] <= T_OPEN_WARM)))
    rd = r["reads"]
    for name, label, target in (("first_1pct", "first 1%", True), ("last_1pct", "last 1%", True),
                                ("uniform", "uniform", False)):
        x = rd[name]
        rows.append((f"random read 1 KB, {label}: bookfs / LMDB",
                     f"{x['bookfs_rps']:,.0f} / {x['lmdb_rps']:,.0f} reads/s ({x['ratio']:.2f}x)",
                     f">= {T_READS:,}/s" if target else "",
                     pf(x["bookfs_rps"] >= T_READS) if target else "info"))
    v = r["verify"]
    rows.append((f"verify every CRC ({v['log_bytes'] / GB:.2f} GB)",
                 f"{v['gbps']:.2f} GB/s ({v['median_s']:.3f} s)", f">= {T_VERIFY_GBPS:.0f} GB/s",
                 pf(v["gbps"] >= T_VERIFY_GBPS)))
    mem = r["memory"]
    w, c = mem["warm"], mem["cold"]
    rows.append(("index bytes per event", f"{w['index_bytes_per_event']:.2f} B", "", "info"))
    for label, x in (("warm", w), ("cold", c)):
        rows.append((f"RSS before -> after open, {label} (fresh process)",
                     f"{x['rss_before'] / 2**20:.1f} -> {x['rss_after'] / 2**20:.1f} MiB "
                     f"(+{x['rss_delta'] / 2**20:.1f}; +{x['rss_delta_trim'] / 2**20:.1f} after "
                     f"malloc_trim; peak {x['vm_hwm'] / 2**20:.1f})", "", "info"))
    return rows


def print_table(rows) -> None:
    w = [max(len(r[i]) for r in rows + [("test", "result", "target", "")]) for i in range(4)]
    head = ("test", "result", "target", "")
    print("  ".join(h.ljust(w[i]) for i, h in enumerate(head)))
    print("  ".join("-" * w[i] for i in range(4)))
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))


# --- main ----------------------------------------------------------------------------------


def default_parent() -> str:
    for cand in ("/var/tmp", "/work"):
        if os.path.isdir(cand) and os.access(cand, os.W_OK) and fs_of(cand)["fstype"] not in (
                "tmpfs", "ramfs"):
            return cand
    return tempfile.gettempdir()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Benchmark the bookfs engine against LMDB (append, open, random read, "
                    "verify, memory) on the same 1 KB events.")
    ap.add_argument("--events", type=int, default=1_000_000,
                    help="events in the log used for open/read/verify/memory (default 1,000,000)")
    ap.add_argument("--append-events", type=int, default=100_000,
                    help="events appended in the append comparison (default 100,000)")
    ap.add_argument("--append-repeats", type=int, default=5,
                    help="append runs per engine, interleaved; the median is reported (default 5)")
    ap.add_argument("--reads", type=int, default=200_000,
                    help="random reads per distribution (default 200,000)")
    ap.add_argument("--open-runs", type=int, default=3, help="runs per open/verify case (default 3)")
    ap.add_argument("--quick", action="store_true",
                    help="100k-event log, 20k appended events, 50k reads")
    ap.add_argument("--dir", help="parent directory for the bench data, on a real disk "
                    "(default: a fresh temp dir under /var/tmp); deleted afterwards")
    ap.add_argument("--keep", action="store_true", help="keep the bench directory")
    ap.add_argument("--seed", type=int, default=2, help="random seed (default 2)")
    ap.add_argument("--json", metavar="FILE", help="also write all results as JSON to FILE")
    ap.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_child:
        memory_child(args.memory_child)
        return 0
    if args.quick:
        args.events = 100_000
        args.append_events = min(args.append_events, 20_000)
        args.reads = min(args.reads, 50_000)
    if args.append_events > args.events:
        ap.error("--append-events must not exceed --events")

    parent = args.dir or default_parent()
    os.makedirs(parent, exist_ok=True)
    root = tempfile.mkdtemp(prefix="bookfs-bench-", dir=parent)
    cache = os.path.join(root, "index-cache")
    os.environ["BOOKFS_CACHE_DIR"] = cache
    t_all = time.perf_counter()
    try:
        m = machine_info(root)
        fsi = m["bench_dir_fs"]
        print("bookfs engine benchmark")
        print(f"  CPU     {m['cpu']}; {m['logical_cpus']} logical CPUs"
              f" ({m['physical_cores']} physical cores)")
        print(f"  RAM     {m['ram_gb']} GiB")
        print(f"  disk    {root} on {fsi['fstype']} ({fsi['source']} at {fsi['mount']}, "
              f"{fsi['options']}; {fsi['free_gb']} GB free)")
        print(f"  Python  {m['python']}; kernel {m['kernel']}; {m['lmdb']}; crc32 from {m['crc32']}")
        if fsi["fstype"] in ("tmpfs", "ramfs"):
            print("  WARNING: the bench directory is in RAM; fdatasync costs nothing there")
        print(f"  bookfs  commit {m['bookfs_commit']}")
        print(f"  load    1-min load average {loadavg():.2f} at start")
        print(f"  events  log {args.events:,}, append {args.append_events:,} "
              f"(x{args.append_repeats}), reads {args.reads:,} per distribution, "
              f"payload {PAYLOAD} B, seed {args.seed}")
        print(flush=True)
        params = {"events": args.events, "append_events": args.append_events,
                  "append_repeats": args.append_repeats, "reads": args.reads,
                  "open_runs": args.open_runs, "payload": PAYLOAD, "batch": BATCH,
                  "seed": args.seed, "dir": root, "argv": sys.argv}
        r = {"loadavg_start": loadavg()}
        log(f"generating {args.events:,} payloads ...")
        pl = Payloads(args.events, args.seed)
        log(f"append comparison ({args.append_events:,} events x{args.append_repeats}) ...")
        r["append"] = bench_append(root, pl, args.append_events, args.append_repeats)
        log(f"building the {args.events:,}-event bookfs log and LMDB database ...")
        r["build"] = build_logs(root, pl, args.events)
        book_dir = os.path.join(root, "book")
        book_log = os.path.join(book_dir, "book.log")
        lmdb_data = os.path.join(root, "lmdb", "data.mdb")
        cached = r["page_cache"] = {}

        def warm(phase: str, *paths: str) -> None:
            warm_page_cache(*paths)
            cached[phase] = {os.path.relpath(p, root): cached_fraction(p) for p in paths}

        log("open ...")
        warm("open", book_log)
        r["open"] = bench_open(book_dir, cache, args.open_runs)
        log("random reads ...")
        warm("reads", book_log, lmdb_data)
        r["reads"] = bench_reads(book_dir, os.path.join(root, "lmdb"), pl, args.events,
                                 args.reads, args.seed)
        log("verify ...")
        warm("verify", book_log)
        r["verify"] = bench_verify(book_dir, args.open_runs)
        cached["after verify"] = {"book/book.log": cached_fraction(book_log)}
        log("memory (fresh subprocesses) ...")
        r["memory"] = bench_memory(book_dir, cache)
        del pl
        rows = report(m, params, r)
        print_table(rows)
        b = r["build"]
        print()
        print(f"bulk build of the {args.events:,}-event log (batches of 10,000, not a target): "
              f"bookfs {b['bookfs_build_s']:.2f} s ({b['bookfs_log_bytes'] / GB:.3f} GB), "
              f"LMDB {b['lmdb_build_s']:.2f} s ({b['lmdb_bytes'] / GB:.3f} GB)")
        def pct(x):
            return "n/a" if x is None else f"{100 * x:.0f}%"
        print("Every open/read/verify figure is with the files in the page cache (each is read "
              "once just before); cold means only that the persisted index was deleted.")
        print("  resident in the page cache: " + "; ".join(
            f"{phase}: " + ", ".join(f"{k} {pct(v)}" for k, v in d.items())
            for phase, d in cached.items()))
        r["loadavg_end"] = loadavg()
        print(f"load average (1 min) at start {r['loadavg_start']:.2f}, at end "
              f"{r['loadavg_end']:.2f}, on {os.cpu_count()} logical CPUs")
        if max(r["loadavg_start"], r["loadavg_end"]) > (os.cpu_count() or 1):
            print("WARNING: the machine was busy with other work; the figures are not reliable")
        total = time.perf_counter() - t_all
        print(f"total {total:.1f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": m, "params": params, "results": r,
                           "table": [dict(zip(("test", "result", "target", "status"), x))
                                     for x in rows], "total_s": total}, f, indent=2)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
