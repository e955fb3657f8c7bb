#!/usr/bin/env python3
"""Benchmark a bookfs mount (issue 3) side by side with three references, in one run, on
the same events (the ``bookfs sample`` log, default 100,000 events):

  (a) bookfs     ``bookfs mount`` of the sample log
  (b) local      the same events extracted as files on the local disk
  (c) ratarmount ``ratarmount`` (the venv's CLI) over an uncompressed tar of those files
  (d) constfs    ``bench/constfs.py``: pyfuse3 serving files of the same sizes, constant
                 bytes from memory, bookfs's caching choices (fixed entries and directory
                 attributes cached, getxattr answered ENOSYS): the pyfuse3 floor
  (e) (extra, small reads only) constfs ``--untuned``: no directory caching, getxattr
                 answered ENODATA, to show what those choices buy

Measured:
 1. open+read+close of R random small events (<= 16 KiB) from this process with
    os.open/os.read/os.close: cold (fresh mount, then ``echo 3 > drop_caches``) and
    warm (the same list again).
 2. ``ls -l MNT/events > /dev/null`` cold (fresh mount + drop_caches); ``find MNT -type f
    | wc -l`` cold.
 3. a 256 MB event appended through ``new/`` with dd from /dev/urandom, then read cold
    after a remount with ``dd bs=1M`` and with os.read 128 KiB (cold and warm).  (b) and
    (c) hold a copy of it, (d) serves a 256 MB constant file.
 4. ``bookfs mount`` until events/1 is stat'ed and read, on a 1M-event log of small events
    whose index is persisted (warm); default (rw) and ``-o ro``; median of 3.
 5. daemon RSS (psutil) after 4 and after 3.
 6. appends through ``new/`` of 1 KB events: one writer, then 8 threads sharing a counter
    (the creation is done under the lock so creation order follows number order).

``--quick`` shrinks everything for a smoke run.  MB = 10^6 bytes.  The work directory is
deleted at the end unless ``--keep``.  Needs root (drop_caches) and /dev/fuse.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import psutil  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from bookfs.noun import jam  # noqa: E402
from tests.mounting import daemon_pid, mounted  # noqa: E402

MB = 1e6
SMALL = 16 << 10
NAME_DIGITS = 12

# targets (issue 3)
T_COLD_VS_D = 0.8
T_COLD_VS_C = 2.0
T_WARM_VS_D = 0.9
T_LS = 1.0
T_BIG_VS_D = 0.8
T_MOUNT = 1.0
T_RSS_BASE, T_RSS_PER_EVENT = 100e6, 8
T_APPEND = 800
T_APPEND_PAR = 3.0


def name(k: int) -> str:
    return "%0*d" % (NAME_DIGITS, k)


def say(*a):
    print(*a, file=sys.stderr, flush=True)


# --- caches and mounts ----------------------------------------------------------------------

CAN_DROP = None


def drop_caches() -> bool:
    global CAN_DROP
    if CAN_DROP is False:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        CAN_DROP = True
    except OSError:
        CAN_DROP = False
    return CAN_DROP


def wait_mounted(mnt: str, proc: subprocess.Popen | None = None, timeout=600.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mnt):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args}: exited with {proc.returncode} before mounting")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{mnt}: not mounted after {timeout} s")
        time.sleep(0.01)


def fuse_unmount(mnt: str, proc: subprocess.Popen | None) -> None:
    subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
    if proc is not None:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(10)
    for _ in range(200):
        if not os.path.ismount(mnt):
            return
        time.sleep(0.05)
    subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)


class Proc:
    """A FUSE daemon run in the foreground by this process (constfs, ratarmount)."""

    def __init__(self, cmd: list[str], mnt: str, log: str):
        self.cmd, self.mnt, self.log = cmd, mnt, log
        self.proc = None

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        wait_mounted(self.mnt, self.proc)
        return self.mnt

    def __exit__(self, *exc):
        fuse_unmount(self.mnt, self.proc)
        self.logf.close()

    @property
    def pid(self):
        return self.proc.pid


class At:
    """A context that gives a root to read from: ``root``, made ready by ``ctx`` (a mount,
    a FUSE daemon) if there is one, and ended with it."""

    def __init__(self, root, ctx=None):
        self.root, self.ctx = root, ctx

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()
        return self.root

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc) if self.ctx is not None else False


# --- measurements ---------------------------------------------------------------------------


def read_files(paths: list[str], sizes: list[int]) -> float:
    """Seconds to open+read+close every path (one os.read per file: all are small)."""
    t = time.perf_counter()
    for p, n in zip(paths, sizes):
        fd = os.open(p, os.O_RDONLY)
        got = len(os.read(fd, 1 << 18))
        os.close(fd)
        if got != n:
            raise RuntimeError(f"{p}: read {got} bytes, expected {n}")
    return time.perf_counter() - t


def shell_time(cmd: str) -> tuple[float, str]:
    t = time.perf_counter()
    res = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return time.perf_counter() - t, res.stdout.strip()


def read_big(path: str, bufsize=128 << 10) -> tuple[float, int]:
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    total = 0
    while True:
        n = len(os.read(fd, bufsize))
        if not n:
            break
        total += n
    os.close(fd)
    return time.perf_counter() - t, total


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def appends(mnt: str, first: int, seconds: float, threads: int, payload: bytes,
            fsync: bool = False, calls: dict | None = None) -> tuple[int, float]:
    """Append 1 KB events to ``mnt``/new/ (or a plain directory) for ``seconds``;
    returns (events, elapsed).  With several threads, the next number is taken and the
    file created under one lock; write and close happen outside it.  ``calls``: with
    one thread, filled with each call's duration in ns (``open``, ``write``, ``close``:
    lists), where the writer's time goes."""
    lock = threading.Lock()
    state = {"next": first, "done": 0, "err": None}
    stop = time.perf_counter() + seconds
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL
    clock = time.perf_counter_ns
    if calls is not None:
        calls.update(open=[], write=[], close=[])

    def one():
        try:
            while time.perf_counter() < stop:
                with lock:
                    n = state["next"]
                    state["next"] = n + 1
                    t0 = clock()
                    fd = os.open(f"{mnt}/{n}", flags, 0o644)
                t1 = clock()
                os.write(fd, payload)
                if fsync:
                    os.fsync(fd)
                t2 = clock()
                os.close(fd)
                t3 = clock()
                if calls is not None and threads == 1:
                    calls["open"].append(t1 - t0)
                    calls["write"].append(t2 - t1)
                    calls["close"].append(t3 - t2)
                with lock:
                    state["done"] += 1
        except BaseException as e:  # report the first failure
            state["err"] = state["err"] or e

    t = time.perf_counter()
    if threads == 1:
        one()
    else:
        ts = [threading.Thread(target=one) for _ in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    elapsed = time.perf_counter() - t
    if state["err"]:
        raise RuntimeError(f"append failed: {state['err']!r}")
    return state["done"], elapsed


# --- setup ----------------------------------------------------------------------------------


def make_sample(work: str, events: int) -> str:
    src = os.path.join(work, "sample")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bookfs.cli", "sample", src, "--events", str(events)],
                   check=True, capture_output=True)
    say(f"sample log of {events} events: {time.perf_counter() - t:.1f} s")
    return src


def extract(src: str, work: str) -> tuple[str, list[int], str, str]:
    """Events as files (work/local/events/<N>), a tar of them, and a sizes file."""
    local = os.path.join(work, "local")
    ev = os.path.join(local, "events")
    os.makedirs(ev)
    sizes = []
    with Book.open(src) as book:
        first, last = book.gulf()
        assert first == 1
        for e in range(first, last + 1):
            data = book.read(e)
            sizes.append(len(data))
            with open(os.path.join(ev, name(e)), "wb") as f:
                f.write(data)
    tar_path = os.path.join(work, "events.tar")
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(ev, arcname="events")
    sizes_path = os.path.join(work, "sizes.u64")
    with open(sizes_path, "wb") as f:
        a = array("Q", sizes)
        if sys.byteorder != "little":
            a.byteswap()
        f.write(a.tobytes())
    return local, sizes, tar_path, sizes_path


def make_million(path: str, count: int) -> None:
    """A ``count``-event log of small (36..100-byte) events, saved in batches, with its
    index persisted by one writable open."""
    rnd = random.Random(1)
    blob = os.urandom(1 << 20)
    with Book.open(path, writable=True, create=True) as book:
        first, batch = 1, 20_000
        while first <= count:
            n = min(batch, count - first + 1)
            payloads = []
            for _ in range(n):
                k = rnd.randrange(32, 97)
                o = rnd.randrange(0, len(blob) - k)
                payloads.append(b"\x00\x00\x00\x01" + blob[o:o + k])
            book.save(first, payloads)
            first += n
    with Book.open(path, writable=True):
        pass
    with Book.open(path):
        pass


# --- machine --------------------------------------------------------------------------------


def machine(work: str) -> dict:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    fs = "?"
    best = ""
    rp = os.path.realpath(work)
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mp, typ = line.split()[:3]
            if (rp == mp or rp.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                best, fs = mp, f"{typ} on {dev} (mounted at {mp})"
    import pyfuse3
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": psutil.virtual_memory().total / 1e9,
            "fs": fs, "kernel": platform.release(), "python": platform.python_version(),
            "pyfuse3": getattr(pyfuse3, "__version__", "?")}


# --- main -----------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--events", type=int, default=100_000, help="sample events (100000)")
    p.add_argument("--reads", type=int, default=20_000, help="random small events read (20000)")
    p.add_argument("--big-mb", type=int, default=256, help="size of the big event, MiB (256)")
    p.add_argument("--million", type=int, default=1_000_000,
                   help="events of the mount-time log (1000000)")
    p.add_argument("--append-seconds", type=float, default=5.0)
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    p.add_argument("--dir", help="work directory (default: a new one under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", metavar="FILE",
                   help="also write the figures as JSON to FILE ({\"results\": ...}: "
                        "bench/bench_rounds.py runs it several times)")
    a = p.parse_args(argv)
    if a.quick:
        a.events, a.reads, a.big_mb, a.million, a.append_seconds = 10_000, 2_000, 32, 100_000, 1.5

    work = a.dir or tempfile.mkdtemp(prefix="bench_mount.")
    os.makedirs(work, exist_ok=True)
    os.environ["BOOKFS_CACHE_DIR"] = os.path.join(work, "cache")
    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    ratar = os.path.join(os.path.dirname(sys.executable), "ratarmount")
    if not os.path.exists(ratar):
        ratar = shutil.which("ratarmount") or "ratarmount"
    constfs = [sys.executable, os.path.join(HERE, "constfs.py")]
    m = {k: os.path.join(work, "mnt_" + k) for k in "acd"}
    for d in m.values():
        os.makedirs(d, exist_ok=True)
    res: dict = {"machine": machine(work)}
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    blog = os.path.join(logs, "bookfs.log")

    def bookfs(src, mnt, *opts):
        return mounted(src, mnt, *opts, log_file=blog)

    def ratarmount(tar):
        return Proc([ratar, "-f", tar, m["c"]], m["c"], os.path.join(logs, "ratarmount.log"))

    def const(*args):
        return Proc([*constfs, m["d"], *args], m["d"], os.path.join(logs, "constfs.log"))

    try:
        src = make_sample(work, a.events)
        t = time.perf_counter()
        local, sizes, tar, sizes_path = extract(src, work)
        say(f"extracted {len(sizes)} files + tar: {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        with ratarmount(tar):
            pass
        say(f"ratarmount first mount (builds its index): {time.perf_counter() - t:.1f} s")
        res["ratar_index_s"] = time.perf_counter() - t

        # 1. small events, cold and warm ------------------------------------------------
        rnd = random.Random(3)
        small = [e for e, n in enumerate(sizes, 1) if n <= SMALL]
        pick = rnd.sample(small, min(a.reads, len(small)))
        psz = [sizes[e - 1] for e in pick]
        res["reads"] = len(pick)
        res["small_share"] = len(small) / len(sizes)

        def small_pass(root):
            paths = [f"{root}/events/{name(e)}" for e in pick]
            drop_caches()
            cold = read_files(paths, psz)
            warm = read_files(paths, psz)
            return len(paths) / cold, len(paths) / warm

        res["small"] = {}
        with bookfs(src, m["a"], "-o", "ro"):
            res["small"]["a"] = small_pass(m["a"])
        res["small"]["b"] = small_pass(local)
        with ratarmount(tar):
            res["small"]["c"] = small_pass(m["c"])
        with const("--sizes", sizes_path):
            res["small"]["d"] = small_pass(m["d"])
        with const("--sizes", sizes_path, "--untuned"):
            res["small"]["e"] = small_pass(m["d"])
        res["drop_caches"] = CAN_DROP
        say("small reads:", res["small"])

        # 2. ls -l and find ----------------------------------------------------------------
        res["ls"], res["find"] = {}, {}

        def listing(root, key):
            drop_caches()
            res["ls"][key] = shell_time(f"ls -l {root}/events > /dev/null")[0]

        def finding(root, key):
            drop_caches()
            res["find"][key] = shell_time(f"find {root} -type f 2>/dev/null | wc -l")

        for key, ctx, root in (("a", lambda: bookfs(src, m["a"], "-o", "ro"), m["a"]),
                               ("b", None, local),
                               ("c", lambda: ratarmount(tar), m["c"]),
                               ("d", lambda: const("--sizes", sizes_path), m["d"])):
            for fn in (listing, finding):
                if ctx is None:
                    fn(root, key)
                else:
                    with ctx():
                        fn(root, key)
        say("ls:", res["ls"], "find:", res["find"])

        # 4 + 5. mount time and RSS on the 1M-event log ---------------------------------
        big_log = os.path.join(work, "million")
        t = time.perf_counter()
        make_million(big_log, a.million)
        say(f"{a.million}-event log built: {time.perf_counter() - t:.1f} s")
        res["million"] = a.million
        res["mount"] = {}
        for label, opts in (("rw", ()), ("ro", ("-o", "ro"))):
            runs = []
            for _ in range(3):
                drop_caches()
                t = time.perf_counter()
                with bookfs(big_log, m["a"], *opts):
                    st = os.stat(f"{m['a']}/events/{name(1)}")
                    with open(f"{m['a']}/events/{name(1)}", "rb") as f:
                        assert len(f.read()) == st.st_size
                    runs.append(time.perf_counter() - t)
                    res.setdefault("rss_million", rss(daemon_pid(m["a"])))
            res["mount"][label] = statistics.median(runs)
        say("mount:", res["mount"], "rss:", res["rss_million"])

        # 3 + 5. the big event ------------------------------------------------------------
        big_n = len(sizes) + 1
        big_bytes = a.big_mb << 20
        with bookfs(src, m["a"]):
            drop_caches()
            big_file = os.path.join(work, "big.payload")  # random bits as one atom: a noun
            with open(big_file, "wb") as f:
                f.write(b"\0\0\0\0" + jam(int.from_bytes(os.urandom(big_bytes - 16), "little")
                                          | 1 << (8 * (big_bytes - 16))))
            big_bytes = os.path.getsize(big_file)  # the mug and the jam: a few bytes less
            t, _ = shell_time(f"dd if={big_file} of={m['a']}/new/{big_n} bs=1M status=none")
            res["big_append_mbs"] = big_bytes / t / MB
        big_local = os.path.join(work, "big", "events", name(1))
        os.makedirs(os.path.dirname(big_local))
        with bookfs(src, m["a"], "-o", "ro"):
            shutil.copyfile(f"{m['a']}/events/{name(big_n)}", big_local)
        assert os.path.getsize(big_local) == big_bytes
        big_tar = os.path.join(work, "big.tar")
        with tarfile.open(big_tar, "w", format=tarfile.GNU_FORMAT) as tf:
            tf.add(os.path.dirname(big_local), arcname="events")
        with ratarmount(big_tar):
            pass  # index it
        res["big"] = {}

        def big_pass(mount_ctx, path, key):
            out = {}
            with mount_ctx() as _:
                drop_caches()
                out["dd"] = big_bytes / shell_time(f"dd if={path} of=/dev/null bs=1M status=none")[0] / MB
            with mount_ctx() as _:
                drop_caches()
                t, n = read_big(path)
                assert n == big_bytes, (path, n)
                out["cold"] = big_bytes / t / MB
                out["warm"] = big_bytes / read_big(path)[0] / MB
                if key == "a":
                    res["rss_big"] = rss(daemon_pid(m["a"]))
            res["big"][key] = out

        import contextlib
        big_pass(lambda: bookfs(src, m["a"], "-o", "ro"), f"{m['a']}/events/{name(big_n)}", "a")
        big_pass(contextlib.nullcontext, big_local, "b")
        big_pass(lambda: ratarmount(big_tar), f"{m['c']}/events/{name(1)}", "c")
        big_pass(lambda: const("--count", "1", "--size", str(big_bytes)),
                 f"{m['d']}/events/{name(1)}", "d")
        res["big_events"] = len(sizes) + 1
        say("big:", res["big"], "rss:", res.get("rss_big"))

        # 6. appends -------------------------------------------------------------------------
        payload = b"\x00\x00\x00\x01" + jam(int.from_bytes(os.urandom(1019), "little") | 1 << 8151)
        app_log = os.path.join(work, "appends")
        Book.open(app_log, writable=True, create=True).close()
        res["append"] = {}
        with bookfs(app_log, m["a"]):
            n1, t1 = appends(f"{m['a']}/new", 1, a.append_seconds, 1, payload)
            n8, t8 = appends(f"{m['a']}/new", n1 + 1, a.append_seconds, a.writers, payload)
        with Book.open(app_log) as book:
            assert book.count == n1 + n8, (book.count, n1, n8)
        res["append"]["a"] = (n1 / t1, n8 / t8)
        with const("--count", "0"):
            n1, t1 = appends(f"{m['d']}/new", 1, a.append_seconds, 1, payload)
            n8, t8 = appends(f"{m['d']}/new", n1 + 1, a.append_seconds, a.writers, payload)
        res["append"]["d"] = (n1 / t1, n8 / t8)
        loc = os.path.join(work, "local_appends")
        os.makedirs(loc)
        n1, t1 = appends(loc, 1, a.append_seconds, 1, payload, fsync=True)
        n8, t8 = appends(loc, n1 + 1, a.append_seconds, a.writers, payload, fsync=True)
        res["append"]["b"] = (n1 / t1, n8 / t8)
        say("append:", res["append"])
    finally:
        for k, d in m.items():
            if os.path.ismount(d):
                subprocess.run(["fusermount3", "-u", "-z", d], capture_output=True)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"work directory kept: {work}")

    report(res, a)
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump({"results": res}, f, indent=1, default=str)
    return 0


def report(r: dict, a) -> None:
    mc = r["machine"]
    out = []
    w = out.append
    w(f"machine: {mc['cpu']}, {mc['cores']} cores, {mc['ram_gb']:.1f} GB RAM; work dir fs: "
      f"{mc['fs']}; Linux {mc['kernel']}; Python {mc['python']}; pyfuse3 {mc['pyfuse3']}")
    w(f"events: {a.events} (sample log), {r['reads']} random small (<= 16 KiB) reads; "
      f"drop_caches: {'yes' if r['drop_caches'] else 'NO (cold = fresh mount only)'}")
    w("")
    verdicts = []

    def check(label, ok):
        verdicts.append((label, ok))
        return "PASS" if ok else "FAIL"

    s = r["small"]
    w(f"{'measure':44} {'(a) bookfs':>11} {'(b) local':>11} {'(c) ratar':>11} "
      f"{'(d) constfs':>11}  a/c    a/d")
    w(f"{'small open+read+close, cold (files/s)':44} " + " ".join(
        f"{s[k][0]:11,.0f}" for k in "abcd") +
      f"  {s['a'][0] / s['c'][0]:5.2f}  {s['a'][0] / s['d'][0]:5.2f}")
    w(f"{'small open+read+close, warm (files/s)':44} " + " ".join(
        f"{s[k][1]:11,.0f}" for k in "abcd") +
      f"  {s['a'][1] / s['c'][1]:5.2f}  {s['a'][1] / s['d'][1]:5.2f}")
    ls, fd = r["ls"], r["find"]
    w(f"{'ls -l events/ cold (s)':44} " + " ".join(f"{ls[k]:11.3f}" for k in "abcd") +
      f"  {ls['a'] / ls['c']:5.2f}  {ls['a'] / ls['d']:5.2f}")
    w(f"{'find -type f | wc -l cold (s)':44} " + " ".join(f"{fd[k][0]:11.3f}" for k in "abcd") +
      f"  {fd['a'][0] / fd['c'][0]:5.2f}  {fd['a'][0] / fd['d'][0]:5.2f}")
    w(f"{'  (files found)':44} " + " ".join(f"{fd[k][1]:>11}" for k in "abcd"))
    w(f"  (e) constfs --untuned (no directory caching, getxattr ENODATA): small cold "
      f"{s['e'][0]:,.0f}/s, warm {s['e'][1]:,.0f}/s")
    b = r["big"]
    for key, lab in (("dd", f"{a.big_mb} MiB event, dd bs=1M cold (MB/s)"),
                     ("cold", f"{a.big_mb} MiB event, os.read 128K cold (MB/s)"),
                     ("warm", f"{a.big_mb} MiB event, os.read 128K warm (MB/s)")):
        w(f"{lab:44} " + " ".join(f"{b[k][key]:11,.0f}" for k in "abcd") +
          f"  {b['a'][key] / b['c'][key]:5.2f}  {b['a'][key] / b['d'][key]:5.2f}")
    ap = r["append"]
    w(f"{'append 1 KB, 1 writer (events/s)':44} {ap['a'][0]:11,.0f} {ap['b'][0]:11,.0f} "
      f"{'-':>11} {ap['d'][0]:11,.0f}  {'':5}  {ap['a'][0] / ap['d'][0]:5.2f}")
    w(f"{'append 1 KB, ' + str(a.writers) + ' writers (events/s)':44} {ap['a'][1]:11,.0f} "
      f"{ap['b'][1]:11,.0f} {'-':>11} {ap['d'][1]:11,.0f}  {'':5}  "
      f"{ap['a'][1] / ap['d'][1]:5.2f}")
    w("  (b) appends: create+write+fsync+close of a file in a local directory")
    w("")
    w(f"bookfs only: append of the {a.big_mb} MiB event through new/ with dd: "
      f"{r['big_append_mbs']:,.0f} MB/s")
    w(f"bookfs only: `bookfs mount` -> events/1 stat+read, {r['million']:,}-event log, warm "
      f"index: rw {r['mount']['rw']:.3f} s, ro {r['mount']['ro']:.3f} s (median of 3)")
    lim_m = T_RSS_BASE + T_RSS_PER_EVENT * r["million"]
    lim_b = T_RSS_BASE + T_RSS_PER_EVENT * r["big_events"]
    w(f"bookfs only: daemon RSS after mounting {r['million']:,} events: "
      f"{r['rss_million'] / MB:.1f} MB (limit {lim_m / MB:.1f}); after reading the big "
      f"event: {r['rss_big'] / MB:.1f} MB (limit {lim_b / MB:.1f})")
    w("")
    w("targets:")
    rows = [
        (f"small cold >= {T_COLD_VS_D}x (d)", s["a"][0] / s["d"][0], s["a"][0] / s["d"][0] >= T_COLD_VS_D),
        (f"small cold >= {T_COLD_VS_C}x (c)", s["a"][0] / s["c"][0], s["a"][0] / s["c"][0] >= T_COLD_VS_C),
        (f"small warm >= {T_WARM_VS_D}x (d)", s["a"][1] / s["d"][1], s["a"][1] / s["d"][1] >= T_WARM_VS_D),
        (f"ls -l events/ <= {T_LS} s", ls["a"], ls["a"] <= T_LS),
        (f"big read (os.read cold) >= {T_BIG_VS_D}x (d)", b["a"]["cold"] / b["d"]["cold"],
         b["a"]["cold"] / b["d"]["cold"] >= T_BIG_VS_D),
        (f"big read (dd cold) >= {T_BIG_VS_D}x (d)", b["a"]["dd"] / b["d"]["dd"],
         b["a"]["dd"] / b["d"]["dd"] >= T_BIG_VS_D),
        (f"mount to events/1 (rw) <= {T_MOUNT} s", r["mount"]["rw"], r["mount"]["rw"] <= T_MOUNT),
        (f"mount to events/1 (ro) <= {T_MOUNT} s", r["mount"]["ro"], r["mount"]["ro"] <= T_MOUNT),
        ("RSS after 1M mount <= 100 MB + 8 B/event", r["rss_million"] / MB, r["rss_million"] <= lim_m),
        ("RSS after big read <= 100 MB + 8 B/event", r["rss_big"] / MB, r["rss_big"] <= lim_b),
        (f"append 1 writer >= {T_APPEND}/s", ap["a"][0], ap["a"][0] >= T_APPEND),
        (f"append {a.writers} writers >= {T_APPEND_PAR}x 1 writer", ap["a"][1] / ap["a"][0],
         ap["a"][1] / ap["a"][0] >= T_APPEND_PAR),
    ]
    for lab, val, ok in rows:
        w(f"  {lab:44} {val:10.3f}  {check(lab, ok)}")
    print("\n".join(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
