"""``bookfs top MNT``: what is being appended right now, like ``top``: events per second
and bytes per second by vane, wire and card over the last ``--interval`` seconds,
refreshed every ``--interval`` seconds, until Ctrl-C (exit 0).

MNT is a bookfs mount, read-write or read-only (a follower of a running ship), or a fleet
mount (every ship).  ``top`` starts after the newest committed event of each ship and
reads only what is committed from then on, each event once (``events/N``: its size and
the first bytes, for the head; :mod:`bookfs.cli.heads`), so it never reads the log from
its start.  It waits for commits the way ``show --follow`` does: a lookup of
``follow/N``, which the mount answers as soon as event N is committed, made in a child
process (the kernel lets no signal end a lookup the mount is serving, so Ctrl-C ends
``top`` at once and the child ends with its lookup), one per ship for at most
:data:`MAX_WAITERS` ships; the ships past those are looked at every :data:`POLL`
seconds.  The interval and the rates are timed by when ``top`` saw each event commit.

``--once --interval S`` waits S seconds and prints one snapshot (``--json``: the shape of
``bookfs report --by``, ``{"key", "total", "groups"}``, each with ``events_per_s`` and
``bytes_per_s``, plus ``"by"``: the same groups for vane, wire and card).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import sys
import time

from bookfs.cli.breakdown import Breakdown, key_function
from bookfs.errors import UsageError
from bookfs.noun.render import human_size

MAX_WAITERS = 32
POLL = 0.25
VIEWS = ("vane", "wire", "card")


def _waiter(path: str) -> tuple[int, int]:
    """A child that looks ``path`` (``follow/N``) up and exits: ``(pid, read end of a
    pipe that reaches EOF when it has)``."""
    import signal

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no Python cleanup, no output
        try:
            os.close(r)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                os.stat(path)
            except OSError:
                pass
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


class Follower:
    """One ship's committed events from where ``top`` started (module docstring)."""

    def __init__(self, ship):
        self.ship = ship
        self.next = (ship.range[1] or ship.range[0] or 0) + 1
        self.wait: tuple[int, int] | None = None

    def drain(self, decode, sink, most: int = 10_000) -> int:
        """Read every event committed since the last call (at most ``most``)."""
        n = 0
        while n < most:
            try:
                size, data = self.ship.read_head(self.next)
            except FileNotFoundError:
                break
            date, wire, tag, extras = decode(data, size)
            sink(self.ship, self.next, size, date, wire, tag, extras)
            self.next += 1
            n += 1
        return n

    def arm(self) -> int | None:
        """The fd that becomes readable when the next event commits (a waiter child)."""
        if self.wait is None:
            self.wait = _waiter(os.path.join(self.ship.path, "follow", str(self.next)))
        return self.wait[1]

    def woke(self) -> None:
        pid, fd = self.wait
        os.close(fd)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        self.wait = None

    def close(self) -> None:
        if self.wait is not None:
            os.close(self.wait[1])  # the child ends with its lookup; nobody waits for it
            self.wait = None


class Window:
    """The events seen in the last ``seconds`` seconds, with when they were seen."""

    def __init__(self, seconds: float, depth: int):
        self.seconds, self.depth = seconds, depth
        self.seen: collections.deque = collections.deque()
        self.keys = {k: key_function(k, depth) for k in VIEWS}

    def add(self, ship, event, size, date, wire, tag, extras) -> None:
        from bookfs.cli.heads import Head

        h = Head(event, size, date, wire, tag, None, extras)
        self.seen.append((time.monotonic(), ship.name, h,
                          {k: f(h, ship.name) for k, f in self.keys.items()}))

    def trim(self, now: float) -> None:
        while self.seen and self.seen[0][0] < now - self.seconds:
            self.seen.popleft()

    def snapshot(self, key: str, top: int | None, span: float) -> dict:
        span = max(span, 1e-9)
        views = {}
        for k in {key, *VIEWS}:
            bd = Breakdown(k, self.depth)
            for _, ship, h, keys in self.seen:
                bd.add(keys[k] if k in keys else key_function(k, self.depth)(h, ship),
                       h.size, h.date, h.event, ship)
            r = bd.result(top)
            for g in (r["total"], *r["groups"]):
                g["events_per_s"] = round(g["events"] / span, 3)
                g["bytes_per_s"] = round(g["bytes"] / span, 1)
            views[k] = r
        out = dict(views[key])
        out["interval"] = round(span, 3)
        out["by"] = {k: views[k]["groups"] for k in VIEWS}
        return out


def _screen(snap: dict, mnt: str, ships: int) -> str:
    t = snap["total"]
    lines = [f"bookfs top {mnt}  {time.strftime('%H:%M:%S')}  "
             f"{ships} ship{'s' if ships != 1 else ''}  last {snap['interval']:.1f} s: "
             f"{t['events_per_s']:,.1f} events/s  {human_size(int(t['bytes_per_s']))}/s"
             + (f"  (events {t['first_event']}..{t['last_event']})" if t["events"] else ""),
             ""]
    for k in VIEWS:
        rows = snap["by"][k]
        width = max([len(k)] + [len(g["key"]) for g in rows])
        lines.append(f"{k.upper():<{width}}  {'EVENTS/S':>9}  {'BYTES/S':>10}  {'SHARE':>6}")
        for g in rows:
            lines.append(f"{g['key']:<{width}}  {g['events_per_s']:>9,.1f}  "
                         f"{human_size(int(g['bytes_per_s'])) + '/s':>10}  "
                         f"{100 * g['share']:>5.1f}%")
        if not rows:
            lines.append("(nothing appended)")
        lines.append("")
    return "\n".join(lines)


def run(args) -> int:
    from bookfs.cli.fleetinfo import is_fleet_mount
    from bookfs.cli.heads import Decoder, MountShip, fleet_ships
    from bookfs.cli.show import is_mount

    mnt = args.mount
    if not (is_mount(mnt) or is_fleet_mount(mnt)) or not (
            is_fleet_mount(mnt) or os.path.isdir(os.path.join(mnt, "follow"))):
        raise UsageError(f"{mnt}: not a bookfs mount or fleet mount (top follows a mount's "
                         "follow/); mount the log first: bookfs mount -o ro LOG MNT")
    if args.json and not args.once:
        raise UsageError("--json prints one snapshot: add --once")
    ships = fleet_ships(mnt) if is_fleet_mount(mnt) else [MountShip(mnt)]
    followers = [Follower(s) for s in ships]
    decode = Decoder(agent=False, crud=True)
    window = Window(args.interval, args.depth)
    started = time.monotonic()
    tty = sys.stdout.isatty() and not args.once
    try:
        while True:
            deadline = time.monotonic() + args.interval
            while True:
                for f in followers:
                    f.drain(decode, window.add)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                waiting = {f.arm(): f for f in followers[:MAX_WAITERS]}
                timeout = min(left, POLL) if len(followers) > MAX_WAITERS else left
                ready, _, _ = select.select(list(waiting), [], [], timeout)
                for fd in ready:
                    waiting[fd].woke()
            now = time.monotonic()
            window.trim(now)
            snap = window.snapshot(args.by, args.top, min(args.interval, now - started))
            if args.once:
                if args.json:
                    json.dump(snap, sys.stdout, indent=1)
                    sys.stdout.write("\n")
                else:
                    sys.stdout.write(_screen(snap, mnt, len(ships)))
                return 0
            sys.stdout.write(("\x1b[H\x1b[2J" if tty else "") + _screen(snap, mnt, len(ships))
                             + ("" if tty else "\n"))
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        for f in followers:
            f.close()


def register(sub) -> None:
    from bookfs.cli.args import count

    def seconds(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = -1
        if not 0.1 <= v <= 86400:
            raise argparse.ArgumentTypeError(f"expected seconds between 0.1 and 86400, got "
                                             f"{text!r}")
        return v

    s = sub.add_parser("top", help="live: events/s and bytes/s being appended, by vane, "
                       "wire and card", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("mount", help="a bookfs mount (read-write or read-only) or a fleet mount")
    s.add_argument("--interval", type=seconds, default=2.0, metavar="S",
                   help="refresh every S seconds, rates over the last S seconds (default 2)")
    s.add_argument("--once", action="store_true",
                   help="wait --interval seconds, print one snapshot and exit")
    s.add_argument("--json", action="store_true",
                   help="with --once: the snapshot as JSON ({key, total, groups, by})")
    s.add_argument("--by", choices=VIEWS, default="vane",
                   help="the key of --json's total/groups (default vane; 'by' has all three)")
    s.add_argument("--depth", type=count(1), default=2, metavar="K",
                   help="wires by their first K segments (default 2)")
    s.add_argument("--top", type=count(1), default=10, metavar="N",
                   help="rows per table (the rest as (other); default 10)")
    s.set_defaults(func=run)
