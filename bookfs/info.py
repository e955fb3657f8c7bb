"""The summary of a log that ``bookfs info`` prints and the mount's ``info`` file holds."""

from __future__ import annotations

import json

from .eventlog import EventLog


def loobean(byte: int) -> str:
    """A loobean as Urbit prints it: 0 is ``%.y`` (yes), 1 is ``%.n`` (no).  ``fake`` in
    ``meta.bin`` and LMDB's META is one: ``%.y`` is a fake ship, ``%.n`` a real one.  Any
    other value is shown as what it is, never guessed."""
    return {0: "%.y", 1: "%.n"}.get(byte, f"invalid loobean {byte}")


def summary(book: EventLog) -> dict:
    """Format, path, first/last event, count, bytes and the meta fields, decoded (``fake``
    as a loobean, :func:`loobean`; ``meta: absent`` when a read-only open found no
    ``meta.bin``)."""
    from .noun import patp

    from .errors import MetaAbsent

    first, last = book.gulf()
    info = {
        "format": book.format,
        "path": book.directory,
        "writable": book.writable,
        "first": first,
        "last": last,
        "events": book.count,
        "bytes": book.log_bytes,
    }
    try:
        meta = book.meta()
    except MetaAbsent:
        info["meta"] = "absent (no meta.bin)"
    else:
        who = int.from_bytes(meta["who"], "little")
        info.update({
            "ship": patp(who),
            "who": who,
            "fake": loobean(meta["fake"][0]),
            "life": int.from_bytes(meta["life"], "little"),
            "version": int.from_bytes(meta["version"], "little"),
        })
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
