"""The summary of a log that ``bookfs info`` prints and the mount's ``info`` file holds."""

from __future__ import annotations

import json

from .eventlog import EventLog


def summary(book: EventLog) -> dict:
    """Format, path, first/last event, count, bytes and the meta fields, decoded."""
    from .noun import patp

    first, last = book.gulf()
    meta = book.meta()
    who = int.from_bytes(meta["who"], "little")
    fake = meta["fake"][0]
    info = {
        "format": book.format,
        "path": book.directory,
        "writable": book.writable,
        "first": first,
        "last": last,
        "events": book.count,
        "bytes": book.log_bytes,
        "ship": patp(who),
        "who": who,
        "fake": bool(fake),
        "life": int.from_bytes(meta["life"], "little"),
        "version": int.from_bytes(meta["version"], "little"),
    }
    epochs = getattr(book, "epochs", None)
    if epochs:
        info["epochs"] = "; ".join(
            f"{e.name} {e.log.format.split(' ')[0]} {e.log.first}..{e.log.last}"
            for e in epochs)
    return info


def render(info: dict, as_json: bool = False) -> str:
    """``info`` as aligned ``key: value`` lines (or JSON), newline-terminated."""
    if as_json:
        return json.dumps(info, indent=2) + "\n"
    width = max(len(k) for k in info)
    return "".join(f"{k + ':':<{width + 1}} {v}\n" for k, v in info.items())
