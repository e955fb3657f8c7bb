#!/usr/bin/env python3
"""One big event read cold and warm (issue 34.2), side by side in interleaved rounds.

The event: ``--mb`` MiB (default 256) of random bytes wrapped as a noun payload, the only
large event of a Book log.  Each round reads it, in turn, from:

  bookfs        a fresh ``bookfs mount -o ro`` (its readahead raised to 1 MiB:
                fs/daemon/readahead.py)
  bookfs-128k   the same with the mount's readahead set back to the kernel's 128 KiB
  bookfs-first  as bookfs, with no seal kept from an earlier read (formats/seals.py): the
                first read ever, which checks the whole deed before serving a byte
  bookfs-nopoll as bookfs, with ``-o busy_poll=0`` (the daemon sleeps as soon as no request
                is queued: fs/daemon/mainloop.py, main_options)
  local         the same bytes as one file on the local disk
  constfs       ``bench/constfs.py --count 1 --size N``: pyfuse3 serving N constant bytes
                from memory (the floor)

cold (after ``drop_caches``; a fresh mount) then warm, with ``dd bs=1M`` and with
``os.read`` of 128 KiB.  Prints min / median / max seconds and MB/s and the ratios within
each round, and the 1-minute load.  Needs root and /dev/fuse.  MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_mount import At, Proc, drop_caches, read_big, shell_time  # noqa: E402
from tests.mounting import mounted, noun_payload  # noqa: E402

from bookfs.formats.book import Book  # noqa: E402
from bookfs.fs.daemon.mountinfo import mount_at  # noqa: E402


def set_readahead(mnt: str, kb: int) -> None:
    dev = mount_at(mnt).device
    with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as f:
        f.write(str(kb))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--mb", type=int, default=256, help="the event's size, MiB (256)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", help="work directory (default: a new one under /tmp)")
    p.add_argument("--only", metavar="NAMES",
                   help="only these targets, comma-separated (default: all; the ratios need "
                        "bookfs, and name only targets that ran)")
    a = p.parse_args(argv)
    work = a.dir or tempfile.mkdtemp(prefix="bench_bigread.")
    os.makedirs(work, exist_ok=True)
    os.environ["BOOKFS_CACHE_DIR"] = os.path.join(work, "cache")
    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    log = os.path.join(work, "log")
    local = os.path.join(work, "event.bin")
    if not os.path.exists(local):
        payload = noun_payload(os.urandom(a.mb << 20))
        with Book.open(log, writable=True, create=True) as b:
            b.save(1, [noun_payload(b"first"), payload])
        with open(local, "wb") as f:
            f.write(payload)
        del payload
    with Book.open(log) as b:  # the seal a first read made (formats/seals.py), kept
        b.seal(2)
    size = os.path.getsize(local)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    ev = os.path.join(mnt, "events", f"{2:012d}")
    const = os.path.join(mnt, "events", f"{1:012d}")

    def bookfs(kb=None, first=False, opts="ro"):
        class Ctx:
            def __enter__(self):
                if first:  # no seal kept from an earlier read: the whole deed is checked
                    cache = os.environ["BOOKFS_CACHE_DIR"]
                    for name in os.listdir(cache) if os.path.isdir(cache) else ():
                        if name.endswith(".sums"):
                            os.unlink(os.path.join(cache, name))
                self.m = mounted(log, mnt, "-o", opts)
                self.m.__enter__()
                if kb is not None:
                    set_readahead(mnt, kb)
                return ev

            def __exit__(self, *exc):
                return self.m.__exit__(*exc)
        return Ctx()

    targets = {
        "bookfs": bookfs,
        "bookfs-128k": lambda: bookfs(128),
        "bookfs-first": lambda: bookfs(first=True),
        "bookfs-nopoll": lambda: bookfs(opts="ro,busy_poll=0"),
        "local": lambda: At(local),
        "constfs": lambda: At(const, Proc([sys.executable, os.path.join(HERE, "constfs.py"),
                                            mnt, "--count", "1", "--size", str(size)], mnt,
                                           os.path.join(work, "constfs.log"))),
    }
    if a.only:
        unknown = set(a.only.split(",")) - set(targets)
        if unknown or "bookfs" not in a.only.split(","):
            p.error(f"--only: expected bookfs and some of {','.join(targets)}")
        targets = {k: v for k, v in targets.items() if k in a.only.split(",")}
    ways = ("dd cold", "read cold", "dd warm", "read warm")
    t = {w: {k: [] for k in targets} for w in ways}
    load0 = os.getloadavg()[0]
    for r in range(a.rounds):
        order = list(targets.items())
        for name, make in order[r % len(order):] + order[:r % len(order)]:  # rotated: no
            # target always first after the last round's (the host's caches move too)
            for how in ("dd", "read"):
                with make() as path:
                    drop_caches()
                    cold = (shell_time(f"dd if={path} of=/dev/null bs=1M status=none")[0]
                            if how == "dd" else read_big(path)[0])
                    warm = (shell_time(f"dd if={path} of=/dev/null bs=1M status=none")[0]
                            if how == "dd" else read_big(path)[0])
                t[f"{how} cold"][name].append(cold)
                t[f"{how} warm"][name].append(warm)
        print(f"round {r + 1}: " + ", ".join(f"{w} {k} {t[w][k][-1]:.3f}s" for w in ways
                                             for k in targets), file=sys.stderr, flush=True)
    print(f"{size / 1e6:.0f} MB event, {a.rounds} rounds; 1-minute load {load0:.2f} at the "
          f"start, {os.getloadavg()[0]:.2f} at the end")
    for w in ways:
        print(f"{w}:")
        for k, v in t[w].items():
            print(f"  {k:12} {min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f} s  "
                  f"({size / 1e6 / statistics.median(v):,.0f} MB/s at the median)")
        for ref in ("local", "constfs", "bookfs-128k", "bookfs-first", "bookfs-nopoll"):
            if ref not in targets:
                continue
            r = [b and x / b for x, b in zip(t[w][ref], t[w]["bookfs"])]
            print(f"  bookfs speed / {ref:13} {min(r):.2f} / {statistics.median(r):.2f} / "
                  f"{max(r):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
