"""``bookfs info MNT`` on a fleet mount (``bookfs mount --fleet``): the fleet in one
summary (ships, ships that cannot be read, events, bytes) and one line per ship (its
events, bytes, newest event and that event's date), read through the mount: each ship's
``info`` file (which opens its log in the daemon, within the daemon's bound on open
logs), or the error file of a ship that cannot be opened."""

from __future__ import annotations

import json
import os
import re

from bookfs.formats.fleet import FLEET_MARKER
from bookfs.formats.info import parse
from bookfs.noun.render import human_bytes

_EXACT = re.compile(r"\(([\d,]+) bytes\)|^(\d+) bytes$")


def is_fleet_mount(path: str) -> bool:
    return os.path.isfile(os.path.join(path, FLEET_MARKER))


def _bytes(text: str) -> int:
    m = _EXACT.search(text)
    return int((m.group(1) or m.group(2)).replace(",", "")) if m else 0


def _error_file(where: str, wait: float = 3.0) -> str | None:
    """The one line of a ship's error file; a failed open turns the directory into one
    as soon as the kernel drops its entry (the daemon tells it in a worker thread)."""
    import time

    deadline = time.monotonic() + wait
    while True:
        try:
            with open(where) as f:
                return f.read(4096).strip()
        except IsADirectoryError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        except OSError:
            return None


def fleet_summary(mnt: str, progress=None) -> dict:
    """``{"fleet", "ships", "errors", "events", "bytes", "per_ship": [...]}``; each ship
    ``{"ship", "events", "bytes", "last", "until"}``, or ``{"ship", "error"}``.
    ``progress`` is called with 1 per ship read."""
    daemon = parse(open(os.path.join(mnt, FLEET_MARKER)).read())
    per_ship = []
    for name in sorted(os.listdir(mnt)):
        where = os.path.join(mnt, name)
        try:
            if os.path.isdir(where):
                with open(os.path.join(where, "info")) as f:
                    info = parse(f.read())
            else:
                raise OSError(0, "")
        except OSError as e:
            said = _error_file(where) or e.strerror or str(e)
            per_ship.append({"ship": name, "error": said})
        else:
            per_ship.append({"ship": name, "events": int(info.get("events", 0)),
                             "bytes": _bytes(info.get("bytes", "")),
                             "last": int(info.get("last", 0)),
                             "until": info.get("until", "")})
        if progress is not None:
            progress(1)
    ok = [s for s in per_ship if "error" not in s]
    return {"fleet": daemon.get("fleet", ""), "ships": len(per_ship),
            "errors": len(per_ship) - len(ok), "events": sum(s["events"] for s in ok),
            "bytes": sum(s["bytes"] for s in ok), "per_ship": per_ship}


def render_fleet(summary: dict, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(summary, indent=2) + "\n"
    head = {"fleet": summary["fleet"], "ships": summary["ships"],
            "errors": summary["errors"], "events": summary["events"],
            "bytes": human_bytes(summary["bytes"])}
    width = max(map(len, head))
    out = [f"{k + ':':<{width + 1}} {v}" for k, v in head.items()]
    rows = summary["per_ship"]
    if rows:
        ship_w = max(len("ship"), *(len(s["ship"]) for s in rows))
        out.append("")
        out.append(f"{'ship':<{ship_w}}  {'events':>10}  {'bytes':>14}  {'last':>10}  newest")
        for s in rows:
            if "error" in s:
                out.append(f"{s['ship']:<{ship_w}}  error: {s['error']}")
            else:
                out.append(f"{s['ship']:<{ship_w}}  {s['events']:>10,}  {s['bytes']:>14,}  "
                           f"{s['last']:>10}  {s['until']}")
    return "\n".join(out) + "\n"
