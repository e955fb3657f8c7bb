"""The summary of a log that ``bookfs info`` prints and the mount's ``info`` file holds."""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict

from bookfs.formats.eventlog import EventLog

DATE_SEARCH = 32  # events read from each end of the log to find the first and last @da
DATE_PEEK = 64 << 10  # payload bytes read to find an event's date (its head is tiny)
_DATE_CACHE_SIZE = 256  # dates kept per open log
#: A read-write mount's info file: the line with the next free event number, and the
#: section of the last refused appends and meta writes (``bookfs append`` reads both).
NEXT_KEY = "next"
REFUSALS_HEADER = "last refusals"
#: open log -> {(generation, event): date}; an entry goes with its log object
_date_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cached(log: EventLog, key, compute):
    """``compute()``, kept per open log object under ``key`` (the least recently used of
    more than :data:`_DATE_CACHE_SIZE` dropped): the entries go with the log object, so
    another open of the same directory (the log may have been replaced meanwhile: a
    fleet closes and reopens its ships) never sees this one's dates."""
    try:
        cache = _date_cache.setdefault(log, OrderedDict())
    except TypeError:  # a log that cannot be weakly referenced: nothing is cached
        return compute()
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = compute()
    if len(cache) > _DATE_CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _head_date(body) -> int | None:
    """The @da of an event whose payload after its mug is ``body``: all of a payload of
    at most :data:`DATE_PEEK` bytes, dated by the rule the mount's mtimes and the date
    column share (:func:`~bookfs.noun.eventdate.date_of`: checked, cued and its head
    read, compiled where built: about 2 µs, where decoding the head bit by bit in Python
    took 13); else the first :data:`DATE_PEEK` bytes of a larger one, whose head alone
    is decoded (:func:`~bookfs.noun.peek_event`), as ``date_of`` decodes a large
    payload's."""
    from bookfs.noun import peek_event
    from bookfs.noun.eventdate import date_of

    return date_of(body) if len(body) < DATE_PEEK else peek_event(body)[0]


def _event_date(log: EventLog, event: int) -> int | None:
    """The @da of a ship event (``[date ovum]``), None for any other (:func:`_head_date`).
    A payload of at most :data:`DATE_PEEK` bytes is read and checked whole.  A larger one
    has its first :data:`DATE_PEEK` bytes read first, and is checked (streamed, constant
    memory) only when they hold a date: a boot event (a pill of megabytes, with no date)
    is then never read whole just to learn that it has none.  So a date is only ever
    shown from a checked event; an event that is damaged gives None either way, as
    before (verify and fsck report it).  Cached (:func:`_cached`) by (generation,
    event): events do not change within a generation of one open; a damage found is not
    cached."""
    from bookfs.errors import BookError

    def date() -> int | None:
        if log.payload_size(event) <= 4 + DATE_PEEK:
            return _head_date(memoryview(log.read(event))[4:])
        found = _head_date(log.read_slice(event, 4, DATE_PEEK))
        if found is not None:
            log.verify_event(event)
        return found

    try:
        return _cached(log, (getattr(log, "generation", 0), event), date)
    except BookError:
        return None


def _newest_date(log: EventLog) -> int | None:
    """The @da of the newest dated event among the last :data:`DATE_SEARCH`, read from
    the log's end without the index's chain (a log with ``newest_heads``, the UIP Book:
    a read by number would first confirm the chain of deeds up to the last event, the
    whole log); None when the log has no such reader or none of those is dated (the
    caller then reads by number).  Each head is :data:`DATE_PEEK` bytes at most: a
    shorter one is its whole payload (:func:`_head_date`).  Cached (:func:`_cached`) by
    the log's published size."""
    from bookfs.errors import BookError

    heads = getattr(log, "newest_heads", None)
    if heads is None:
        return None

    def newest() -> int | None:
        try:
            return next((d for d in (_head_date(memoryview(h)[4:])
                                     for h in heads(DATE_SEARCH, 4 + DATE_PEEK))
                         if d is not None), None)
        except (BookError, OSError):
            return None

    return _cached(log, (getattr(log, "generation", 0), "newest", log.log_bytes), newest)


def date_range(log: EventLog) -> dict | None:
    """``{"first", "last"}`` (@da text) and ``{"first_utc", "last_utc"}`` (ISO 8601) of
    the first and last dated events, looking at most :data:`DATE_SEARCH` events in from
    each end (boot events carry no date); None if none of those is dated."""
    from bookfs.noun import da_to_datetime, format_da

    first, last = log.gulf()
    if not last:
        return None

    def search(events) -> int | None:
        return next((d for d in (_event_date(log, e) for e in events) if d is not None),
                    None)

    oldest = search(range(first, min(last, first + DATE_SEARCH - 1) + 1))
    newest = _newest_date(log)
    if newest is None:
        newest = search(range(last, max(first, last - DATE_SEARCH + 1) - 1, -1))
    if oldest is None or newest is None:
        return None
    return {"first": format_da(oldest), "last": format_da(newest),
            "first_utc": da_to_datetime(oldest).isoformat(),
            "last_utc": da_to_datetime(newest).isoformat()}


def loobean(byte: int) -> str:
    """A loobean as Urbit prints it: 0 is ``%.y`` (yes), 1 is ``%.n`` (no).  ``fake`` in
    ``meta.bin`` and LMDB's META is one: ``%.y`` is a fake ship, ``%.n`` a real one.  Any
    other value is shown as what it is, never guessed."""
    return {0: "%.y", 1: "%.n"}.get(byte, f"invalid loobean {byte}")


def summary(book: EventLog) -> dict:
    """Format, path, first/last event, count, bytes (exact), the time range the events
    cover (``dates``: :func:`date_range`, when the log has dated events) and the meta
    fields, decoded (``fake`` as a loobean, :func:`loobean`; ``meta: absent`` when a
    read-only open found no ``meta.bin``), then ``nouns``: :func:`with_core` of
    :func:`log_summary`."""
    return with_core(log_summary(book))


#: Callables giving more lines of this process's make-up (each a dict), registered by the
#: layers above, which this one does not import: Spark's row builder (``rows``), added by
#: the ``bookfs`` command at start-up (:func:`add_fields`), so ``bookfs info`` and a
#: mount's ``info`` file say the same.
_EXTRA_FIELDS: list = []


def add_fields(fields) -> None:
    """Have :func:`with_core` add ``fields()`` (a dict) after ``nouns``."""
    if fields not in _EXTRA_FIELDS:
        _EXTRA_FIELDS.append(fields)


def with_core(log_info: dict) -> dict:
    """``log_info`` (:func:`log_summary`), ``nouns``, this process's noun core
    (compiled, or pure and why), and ``framing``, its framing scan's walk (likewise), then the fields registered with :func:`add_fields`:
    :func:`summary`'s last lines, which say nothing of the log (a fleet mount keeps
    ``log_summary`` of a closed log and adds these when asked)."""
    from bookfs.formats.framing import framing_description
    from bookfs.noun import core_description

    info = {**log_info, "nouns": core_description(), "framing": framing_description()}
    for fields in _EXTRA_FIELDS:
        info.update(fields())
    return info


def log_summary(book: EventLog) -> dict:
    """:func:`summary` but its ``nouns`` line: what depends on the log (and its meta)
    alone, JSON-safe (every value a str, int, bool or dict of str)."""
    from bookfs.noun import patp

    from bookfs.errors import MetaAbsent

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
    dates = date_range(book)
    if dates is not None:
        info["dates"] = dates
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
            f"{e.name} {e.log.format.split(' ')[0]} "
            + (f"{e.log.first}..{e.log.last}" if e.log.count else "no events yet")
            for e in epochs)
    return info


def _utc(iso: str) -> str:
    return iso.replace("T", " ").split(".")[0].split("+")[0] + " UTC"


def render(info: dict, as_json: bool = False) -> str:
    """``info`` as aligned ``key: value`` lines (or JSON, with every number exact),
    newline-terminated.  In text, ``bytes`` is a human size with the exact count
    (:func:`~bookfs.noun.render.human_bytes`) and ``dates`` becomes two lines, ``since`` and
    ``until`` (@da, then UTC)."""
    from bookfs.noun.render import human_bytes

    if as_json:
        return json.dumps(info, indent=2) + "\n"
    lines: dict = {}
    for k, v in info.items():
        if k == "bytes":
            lines[k] = human_bytes(v) if isinstance(v, int) else v
        elif k == "dates":
            lines["since"] = f"{v['first']} ({_utc(v['first_utc'])})"
            lines["until"] = f"{v['last']} ({_utc(v['last_utc'])})"
        else:
            lines[k] = v
    width = max(len(k) for k in lines)
    return "".join(f"{k + ':':<{width + 1}} {v}\n" for k, v in lines.items())


def parse(text: str) -> dict[str, str]:
    """The ``key: value`` lines :func:`render` wrote (a mount's ``info`` file), as text;
    indented lines (a section's items, such as the refusal record) are skipped."""
    out = {}
    for line in text.splitlines():
        if line[:1].strip() and ":" in line:
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
    return out
