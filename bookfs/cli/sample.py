"""Deterministic sample event payloads that look like a real Urbit ship's event log.

Pure functions, no file I/O, except :func:`write_sample` at the end (what ``bookfs
sample`` runs), which writes them to a Book directory, resumably.  A payload is what a
Book deed or an LMDB value holds: ``mug (u32 LE) ++ jam(job)`` (reference-formats.md section 4).

:func:`iter_sample_payloads` yields, for a given ``(events, seed)``:

* events ``1 .. SAMPLE_LIFE``: lifecycle nouns of a pill (the lifecycle formula
  ``[2 [0 3] 0 2]``, then kernel-sized parts, one of them over 1 MB; under 2 MB in
  all), each with mug 0;
* every later event: ``jam([now ovum])`` with ``ovum = [wire card]``, and its true mug
  (``noun.mug`` of ``[now ovum]``, as ``bookfs verify --mugs`` checks it), ``now`` an ``@da`` that starts at ``SAMPLE_EPOCH`` plus a seed-dependent
  offset below ``SAMPLE_MAX_START_OFFSET`` and advances by ``SAMPLE_MIN_STEP`` ..
  ``SAMPLE_MAX_STEP`` per event (at vere's 2^-16 s resolution); ``wire`` is a list of
  knots such as ``/d/term/1``, and ``card = [tag data]`` with ``tag`` one of
  ``SAMPLE_TAGS``.

Sizes are heavy-tailed.  Every non-lifecycle payload falls in one of three ranges:
``SMALL_PAYLOAD`` (most events), ``MEDIUM_PAYLOAD`` (each event with probability
``MEDIUM_RATE``) and ``LARGE_PAYLOAD`` (exactly one event at a random place in each
block of ``LARGE_EVERY`` event numbers, so at least one once ``events >=
LARGE_EVERY``).  The bulk bytes are an atom inside the card.

The output is a pure function of ``(events, seed)``, and the payloads for ``events=n``
are a prefix of those for any larger ``events``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import os
import random
from typing import Callable, Iterator, NamedTuple

from bookfs.noun import (
    DA_UNIX_EPOCH,
    Noun,
    cell,
    cord,
    from_list,
    jam,
    mug,
    patp,
    path,
    tape,
)

__all__ = [
    "SAMPLE_LIFE",
    "SAMPLE_EPOCH",
    "SAMPLE_MAX_START_OFFSET",
    "SAMPLE_MIN_STEP",
    "SAMPLE_MAX_STEP",
    "SAMPLE_TAGS",
    "SMALL_PAYLOAD",
    "MEDIUM_PAYLOAD",
    "LARGE_PAYLOAD",
    "MEDIUM_RATE",
    "LARGE_EVERY",
    "iter_sample_payloads",
    "iter_sample_events",
    "SampleEvent",
    "sample_meta",
    "SAMPLE_MARK",
    "SampleWritten",
    "write_sample",
]

SAMPLE_LIFE = 5
"""Number of lifecycle (boot) events at the start of every sample log."""

SAMPLE_EPOCH = _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)
SAMPLE_MAX_START_OFFSET = _dt.timedelta(days=30)
SAMPLE_MIN_STEP = _dt.timedelta(milliseconds=1)
SAMPLE_MAX_STEP = _dt.timedelta(seconds=10)

SAMPLE_TAGS = frozenset(
    {"belt", "wake", "hear", "request", "plea", "boon", "send", "born", "crud", "trim"}
)
"""Every card tag that sample events use."""

# Inclusive (min, max) payload sizes in bytes, mug included, and how often each occurs.
SMALL_PAYLOAD = (50, 2 * 1024)
MEDIUM_PAYLOAD = (10 * 1024, 100 * 1024)
LARGE_PAYLOAD = (1024 * 1024, 4 * 1024 * 1024)
MEDIUM_RATE = 0.025
LARGE_EVERY = 2000

_TICKS = 1 << 16  # vere stamps events with 16 bits of sub-second precision
_MIN_STEP_TICKS = -(-_TICKS // 1000)  # 1 ms, rounded up
_MAX_STEP_TICKS = 10 * _TICKS
_MEAN_STEP_S = 0.4
_BULK_MARGIN = 512  # bytes of noun around a bulk atom, at most
_PEERS = 24


def _rng(seed: int, stream: str) -> random.Random:
    """An independent, reproducible random stream for ``seed`` (str seeds hash with
    SHA-512, so the result does not depend on PYTHONHASHSEED)."""
    return random.Random(f"bookfs.cli.sample:{seed}:{stream}")


def _blob(rng: random.Random, size: int) -> int:
    """A random atom of exactly ``size`` bytes (top byte nonzero)."""
    if size <= 0:
        return 0
    return int.from_bytes(rng.randbytes(size - 1) + bytes([rng.randrange(1, 256)]), "little")


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An int in ``[low, high]``, uniform in log scale: mostly near ``low``, with a
    long tail up to ``high``."""
    return min(high, int(low * (high / low) ** rng.random()))


_B32 = "0123456789abcdefghijklmnopqrstuv"


def _uv(rng: random.Random, bits: int = 64) -> str:
    """A random @uv knot like ``0v1.2q3u4.h7n9c``, as wires use for duct ids."""
    n = rng.getrandbits(bits) | 1
    digits = []
    while n:
        digits.append(_B32[n & 31])
        n >>= 5
    text = "".join(reversed(digits))
    head = len(text) % 5 or 5
    groups = [text[:head]] + [text[i:i + 5] for i in range(head, len(text), 5)]
    return "0v" + ".".join(groups)


def _ipv4(rng: random.Random) -> int:
    """A loopback, private or public IPv4 address."""
    kind = rng.randrange(3)
    if kind == 0:
        return 0x7F000001
    if kind == 1:
        return 0x0A000000 | rng.getrandbits(24)
    return rng.getrandbits(32)


def _lane(rng: random.Random, peers: list[int]) -> Noun:
    """An ames lane: ``[%.y ship]`` or ``[%.n ip-and-port]``."""
    if rng.random() < 0.5:
        return (0, rng.choice(peers))
    return (1, _ipv4(rng) | (rng.randrange(1024, 65536) << 32))


_DOJO_LINES = (
    "+vats %base",
    "|commit %base",
    "(add 2 2)",
    ":hood +hood/mass",
    "=dir /=base=",
    "+tree /===/app",
    "|install ~zod %landscape",
    "-build-file %/lib/strandio/hoon",
    "(turn (gulf 1 10) mul)",
)


def _tang(rng: random.Random) -> Noun:
    lines = ["bail: exit", "/sys/vane/gall/hoon:<[1.623 9].[1.623 29]>", "crash!", "%trap"]
    return from_list(cell(cord("leaf"), tape(rng.choice(lines))) for _ in range(rng.randint(1, 4)))


NO_AGENT = "(none)"


class SampleEvent(NamedTuple):
    """What one sample event is, as written: its wire (``/a/newt/0v1.2q3u4``), its card's
    tag, the vane Arvo routes it to (``bookfs.noun.route``: the wire's first segment
    through ``+grow``; ``%crud`` and ``/arvo`` stay in ``arvo``) and the Gall agent it
    names (a ``%boon`` on ``/g/use/<app>``, a ``%plea`` to ``%g`` on ``/ge/<app>``), else
    ``(none)``."""

    wire: str
    tag: str
    vane: str
    agent: str = NO_AGENT


class _Ship:
    """Random ovum generation for one sample ship."""

    def __init__(self, seed: int) -> None:
        peer_rng = _rng(seed, "peers")
        self.peers = [peer_rng.randrange(0x10000, 1 << 32) for _ in range(_PEERS)]
        self.peer_names = [patp(p) for p in self.peers]
        self.apps = ["hood", "groups", "chat", "landscape", "dm", "channels", "docket"]
        self.small: list[tuple[float, Callable[[random.Random], Noun]]] = [
            (0.20, self._belt),
            (0.20, self._wake),
            (0.25, lambda rng: self._hear(rng, _log_uniform(rng, 60, 1400))),
            (0.05, lambda rng: self._request(rng, _log_uniform(rng, 16, 1200))),
            (0.09, lambda rng: self._plea(rng, _log_uniform(rng, 20, 1200))),
            (0.09, lambda rng: self._boon(rng, _log_uniform(rng, 20, 1200))),
            (0.06, lambda rng: self._send(rng, _log_uniform(rng, 60, 1400))),
            (0.02, self._born),
            (0.02, self._crud),
            (0.02, self._trim),
        ]
        self.bulky: list[Callable[[random.Random, int], Noun]] = [
            self._request,
            self._plea,
            self._boon,
        ]

    def small_ovum(self, rng: random.Random) -> Noun:
        pick = rng.random()
        for weight, make in self.small:
            pick -= weight
            if pick < 0:
                return make(rng)
        return self.small[0][1](rng)

    def bulky_ovum(self, rng: random.Random, size: int) -> Noun:
        """An ovum carrying ``size`` bytes of bulk data, plus under _BULK_MARGIN more."""
        return rng.choice(self.bulky)(rng, size)

    # -- one method per card kind: each returns [wire card] --

    def _belt(self, rng: random.Random) -> Noun:
        text = rng.choice(_DOJO_LINES)
        self.made = SampleEvent("/d/term/1", "belt", "dill")
        return cell(path("/d/term/1"), cord("belt"), cord("txt"), from_list(map(ord, text)))

    def _wake(self, rng: random.Random) -> Noun:
        wire = f"/b/behn/{_uv(rng)}"
        self.made = SampleEvent(wire, "wake", "behn")
        return cell(path(wire), cord("wake"), 0)

    def _hear(self, rng: random.Random, size: int) -> Noun:
        lane = _lane(rng, self.peers)
        wire = f"/a/newt/{_uv(rng)}"
        self.made = SampleEvent(wire, "hear", "ames")
        return cell(path(wire), cord("hear"), lane, _blob(rng, size))

    def _send(self, rng: random.Random, size: int) -> Noun:
        self.made = SampleEvent("/a/newt/0v0", "send", "ames")
        return cell(path("/a/newt/0v0"), cord("send"), _lane(rng, self.peers), _blob(rng, size))

    def _request(self, rng: random.Random, size: int) -> Noun:
        app = rng.choice(self.apps)
        headers = from_list(
            [
                (cord("content-type"), cord("application/json")),
                (cord("cookie"), cord(f"urbauth-{rng.choice(self.peer_names)}={_uv(rng)}")),
            ]
        )
        body = (0, (size, _blob(rng, size)))  # (unit octs)
        url = cord(f"/~/channel/{app}-{rng.getrandbits(32)}")
        request = cell(cord("POST"), url, headers, body)
        address = (cord("ipv4"), _ipv4(rng))
        wire = f"/e/http-server/{_uv(rng)}"
        self.made = SampleEvent(wire, "request", "eyre")  # a channel's body names no app
        return cell(path(wire), cord("request"), rng.getrandbits(1), address, request)

    def _plea(self, rng: random.Random, size: int) -> Noun:
        peer = rng.randrange(_PEERS)
        vane = rng.choice(["g", "c", "j"])
        app = rng.choice(self.apps)
        payload = cell(cord(vane), path(f"/ge/{app}"), _blob(rng, size))
        wire = f"/a/bone/{self.peer_names[peer]}/0/{rng.randrange(1, 4096) * 4}"
        self.made = SampleEvent(wire, "plea", "ames", app if vane == "g" else NO_AGENT)
        return cell(path(wire), cord("plea"), self.peers[peer], payload)

    def _boon(self, rng: random.Random, size: int) -> Noun:
        app = rng.choice(self.apps)
        ship = rng.choice(self.peer_names)
        wire = f"/g/use/{app}/{_uv(rng, 32)}/out/{ship}/{app}/watch"
        self.made = SampleEvent(wire, "boon", "gall", app)
        return cell(path(wire), cord("boon"), _blob(rng, size))

    def _born(self, rng: random.Random) -> Noun:
        wire = f"/e/http-server/{_uv(rng)}"
        self.made = SampleEvent(wire, "born", "eyre")
        return cell(path(wire), cord("born"), 0)

    def _crud(self, rng: random.Random) -> Noun:
        # [%crud mote tang]: no [mote tang] goof and ovum, so Arvo keeps it (route.py)
        self.made = SampleEvent("/d/term/1", "crud", "arvo")
        return cell(path("/d/term/1"), cord("crud"), cord("exit"), _tang(rng))

    def _trim(self, rng: random.Random) -> Noun:
        wire = f"/arvo/trim/{_uv(rng)}"
        self.made = SampleEvent(wire, "trim", "arvo")  # +grow leaves %arvo as it is
        return cell(path(wire), cord("trim"), rng.randint(0, 4))


def _lifecycle(seed: int) -> list[Noun]:
    """SAMPLE_LIFE pill-like lifecycle nouns: the lifecycle formula, then kernel parts
    (a random formula-shaped tree with shared subtrees, and bulk atoms)."""
    rng = _rng(seed, "boot")
    leaves: list[Noun] = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, cord("hoon"), cord("arvo")]
    nodes: list[Noun] = []
    for _ in range(3000):
        pool = nodes if nodes and rng.random() < 0.6 else leaves
        nodes.append((rng.choice(pool), rng.choice(nodes or leaves)))
    formula = nodes[-1]
    return [
        cell(2, (0, 3), 0, 2),
        cell(cord("hoon"), formula, _blob(rng, rng.randint(1024 * 1024 + 1, 1200 * 1024))),
        cell(cord("arvo"), cord("kernel"), _blob(rng, rng.randint(200 * 1024, 300 * 1024))),
        cell(cord("lull"), _blob(rng, rng.randint(40 * 1024, 80 * 1024))),
        cell(cord("zuse"), _blob(rng, rng.randint(100 * 1024, 200 * 1024))),
    ][:SAMPLE_LIFE]


def _large_positions(seed: int) -> Iterator[int]:
    """The 0-based event numbers of the large events, one per LARGE_EVERY block."""
    rng = _rng(seed, "large")
    block = 0
    while True:
        low = max(SAMPLE_LIFE, block * LARGE_EVERY)
        yield rng.randrange(low, (block + 1) * LARGE_EVERY)
        block += 1


def _bulk_size(rng: random.Random, limits: tuple[int, int]) -> int:
    """Bulk atom size giving a payload inside ``limits`` whatever the framing."""
    return _log_uniform(rng, limits[0], limits[1] - _BULK_MARGIN)


def iter_sample_payloads(events: int, seed: int = 0) -> Iterator[bytes]:
    """Yield ``events`` sample payloads (``mug (4 B LE) ++ jam(job)``), in event order.

    See the module docstring for the contract: lifecycle events first (mug 0), then
    ``[now [wire card]]`` events carrying their true mugs, heavy-tailed sizes, strictly
    increasing dates.  Deterministic in ``(events, seed)``, prefix-stable in
    ``events``.
    """
    return (payload for payload, _ in iter_sample_events(events, seed))


def iter_sample_events(events: int, seed: int = 0
                       ) -> Iterator[tuple[bytes, SampleEvent | None]]:
    """:func:`iter_sample_payloads`' payloads, each with what the generator wrote into
    it (:class:`SampleEvent`, from the parameters it built the event from, never
    decoded from the bytes); None for a lifecycle event."""
    if events < 0:
        raise ValueError("events must be >= 0")
    zero_mug = bytes(4)
    for number, noun in enumerate(_lifecycle(seed)):
        if number >= events:
            return
        yield zero_mug + jam(noun), None

    ship = _Ship(seed)
    rng = _rng(seed, "events")
    large = _large_positions(seed)
    next_large = next(large)
    # Time in units of 2^-16 s since the @da epoch, as vere's clock reads it.
    ticks = (int(SAMPLE_EPOCH.timestamp()) + DA_UNIX_EPOCH) * _TICKS
    ticks += rng.randrange(int(SAMPLE_MAX_START_OFFSET.total_seconds()) * _TICKS)
    for number in range(SAMPLE_LIFE, events):
        step = int(rng.expovariate(1 / _MEAN_STEP_S) * _TICKS)
        ticks += min(_MAX_STEP_TICKS, max(_MIN_STEP_TICKS, step))
        now = ticks << 48  # 64-bit seconds . 16-bit fraction . 48 zero bits
        if number == next_large:
            ovum = ship.bulky_ovum(rng, _bulk_size(rng, LARGE_PAYLOAD))
            next_large = next(large)
        elif rng.random() < MEDIUM_RATE:
            ovum = ship.bulky_ovum(rng, _bulk_size(rng, MEDIUM_PAYLOAD))
        else:
            ovum = ship.small_ovum(rng)
        job = (now, ovum)
        yield mug(job).to_bytes(4, "little") + jam(job), ship.made


def sample_meta(seed: int = 0) -> dict[str, bytes]:
    """The pier metadata matching :func:`iter_sample_payloads` for ``seed``.

    Keys and encodings as in ``meta.bin``: ``who`` (16 B LE, a planet),
    ``version`` (4 B LE, 1), ``fake`` (1 B, a loobean: 1 = ``%.n``, a real ship), ``life`` (4 B LE, ``SAMPLE_LIFE``).
    """
    who = _rng(seed, "who").randrange(0x10000, 1 << 32)
    return {
        "who": who.to_bytes(16, "little"),
        "version": (1).to_bytes(4, "little"),
        "fake": b"\x01",  # loobean %.n: not fake
        "life": SAMPLE_LIFE.to_bytes(4, "little"),
    }


# --- writing a sample log (``bookfs sample``) ----------------------------------------------

SAMPLE_MARK = ".bookfs-sample"
"""The file in a sample directory that says ``bookfs sample`` made it: JSON ``{"seed": S,
"events": N}`` (the seed and the event count last asked for).  Written before the first
event, so an interrupted run leaves it too."""

#: A batch is saved (one ``Book.save``, one fdatasync) at this many events or bytes.
_SAVE_EVENTS = 1000
_SAVE_BYTES = 16 << 20

#: Files that a Book directory may hold before its log exists (an interrupted first run).
_EMPTY_LEFTOVERS = frozenset({SAMPLE_MARK, "book.lock", "meta.bin"})


class SampleWritten:
    """What :func:`write_sample` did: the log now holds events ``1..last``;
    ``resumed`` of them were already there (a run that was interrupted), ``replaced`` is
    true when ``force`` removed a different sample first, ``interrupted`` when ``stop()``
    ended the run early, ``log_bytes`` the log's size."""

    def __init__(self, path: str, last: int, resumed: int, replaced: bool, interrupted: bool,
                 log_bytes: int):
        self.path, self.last, self.resumed = path, last, resumed
        self.replaced, self.interrupted, self.log_bytes = replaced, interrupted, log_bytes


def _read_mark(path: str) -> dict | None:
    import json

    try:
        with open(os.path.join(path, SAMPLE_MARK)) as f:
            mark = json.load(f)
        return mark if isinstance(mark, dict) and isinstance(mark.get("seed"), int) else None
    except (OSError, ValueError):
        return None


def _write_mark(path: str, seed: int, events: int) -> None:
    import json

    tmp = os.path.join(path, SAMPLE_MARK + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"seed": seed, "events": events}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, SAMPLE_MARK))


def _meta_or_zeros(book) -> dict[str, bytes]:
    """The log's meta; all zeros when a read-only open finds no ``meta.bin`` (a first run
    interrupted between creating ``book.log`` and ``meta.bin``)."""
    from bookfs.errors import MetaAbsent

    try:
        return book.meta()
    except MetaAbsent:
        return {k: bytes(len(v)) for k, v in sample_meta(0).items()}


def _matching_prefix(book, payloads: Iterator[bytes], seed: int
                     ) -> tuple[str | None, int, bytes | None]:
    """Whether ``book`` is the beginning of the sample for ``seed``: ``(why_not, done,
    next_payload)``.  ``done`` counts its events equal to the sample's from event 1
    (stopping at the first that differs, or when ``payloads`` runs out); ``next_payload``
    is the sample's first payload not in the log (None if ``payloads`` ran out).
    ``why_not`` is None when every event matched and the meta is the sample's or all
    zeros (a run that stopped before writing it), else what differs, in words."""
    meta = _meta_or_zeros(book)
    if meta != sample_meta(seed) and any(any(v) for v in meta.values()):
        return "its meta.bin (ship) differs", 0, None
    if book.count and book.first != 1:
        return f"it starts at event {book.first}", 0, None
    for event in range(1, book.count + 1):
        want = next(payloads, None)
        if want is None:
            return f"it holds {book.count} events", event - 1, None
        if book.read(event) != want:
            return f"event {event} differs", event - 1, None
    return None, book.count, next(payloads, None)


def write_sample(path: str, events: int, seed: int = 0, *, force: bool = False,
                 progress: Callable[[int], None] | None = None,
                 stop: Callable[[], bool] | None = None) -> SampleWritten:
    """Write the sample log for ``(events, seed)`` into the Book directory ``path``.

    * A new path, or an empty directory: the log is created and filled.
    * A directory holding the beginning of this very sample (an interrupted run; checked
      event by event against the generator): the run resumes after its last event.  If it
      already holds all ``events``, nothing is written.
    * A directory holding a different sample (another seed, fewer events asked for than it
      holds, or events that differ): refused, unless ``force`` and it carries
      ``SAMPLE_MARK`` (``bookfs sample`` made it): then its ``book.log`` and ``meta.bin``
      are removed and the sample is written afresh.
    * Anything else (other files, a log ``bookfs sample`` did not write) is refused, with or
      without ``force``; nothing is created or touched.

    Refusals raise :class:`bookfs.errors.UsageError` (one line).  The writer lock is held
    throughout.  ``stop()`` is polled between events: when it returns true the events
    generated so far are saved and the function returns with ``interrupted`` set (the log
    is then a prefix of the sample, which a later call resumes).  ``progress(n)`` is called
    with event counts as they are saved (resumed ones first).
    """
    from bookfs.formats.book import Book
    from bookfs.errors import BookError, UsageError
    from bookfs.formats.index import discard_index
    from bookfs.formats.layout import LOG_NAME, META_NAME
    from bookfs.formats.lock import WriterLock, lock_path_for

    log_path = os.path.join(path, LOG_NAME)
    if os.path.isdir(path) and not os.path.lexists(log_path):
        others = sorted(set(os.listdir(path)) - _EMPTY_LEFTOVERS)
        if others:
            raise UsageError(f"{path}: holds other files ({', '.join(others[:3])}"
                             f"{', ...' if len(others) > 3 else ''}) and no {LOG_NAME}; "
                             "expected a new or empty directory")
    elif os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"{path}: expected a directory, found a file")
    # Decide from a read-only look (no lock taken, nothing written), then act.
    replaced = False
    payloads = iter_sample_payloads(events, seed)
    nxt: bytes | None = None
    done = 0
    if os.path.lexists(log_path):
        with Book.open(path) as old:
            held, mark = old.count, _read_mark(path)
            why_not, done, nxt = _matching_prefix(old, payloads, seed)
            # made by bookfs sample: marked, or this seed's meta and events
            ours = mark is not None or (_meta_or_zeros(old) == sample_meta(seed)
                                        and done == min(held, events))
        if why_not is not None:  # else: this sample's beginning, or empty: resume it
            if not force or not ours:
                differs = (f"holds {held} events, more than --events {events}"
                           if done == events and held > events else
                           f"holds a log that is not the sample for --seed {seed} "
                           f"({why_not})")
                raise UsageError(
                    f"{path}: {differs}; " + (
                        "--force replaces it" if ours else
                        f"nothing marks it as a bookfs sample ({SAMPLE_MARK}), so it "
                        "is left alone even with --force: choose another directory"))
            replaced = True  # ours, and --force: start it again
            payloads, nxt, done = iter_sample_payloads(events, seed), None, 0
    os.makedirs(path, exist_ok=True)
    with WriterLock(lock_path_for(path)):
        if replaced:
            fd = os.open(log_path, os.O_RDONLY)
            try:
                discard_index(log_path, fd)
            finally:
                os.close(fd)
            for name in (LOG_NAME, META_NAME):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(path, name))
        _write_mark(path, seed, events)
        with Book.open(path, writable=True, create=True, lock=False) as book:
            if book.count != done:
                raise BookError(f"{path}: changed while it was being checked (it now holds "
                                f"{book.count} events, not {done}); run the command again")
            want_meta = sample_meta(seed)
            for key, value in want_meta.items():
                if book.read_meta(key) != value:
                    book.save_meta(key, value)
            if progress and done:
                progress(done)
            interrupted = False
            batch: list[bytes] = []
            batch_bytes, first = 0, done + 1
            for payload in itertools.chain([nxt] if nxt is not None else [], payloads):
                if stop is not None and stop():
                    interrupted = True
                    break
                batch.append(payload)
                batch_bytes += len(payload)
                if len(batch) >= _SAVE_EVENTS or batch_bytes >= _SAVE_BYTES:
                    book.save(first, batch)
                    first += len(batch)
                    if progress:
                        progress(len(batch))
                    batch, batch_bytes = [], 0
            if batch:
                book.save(first, batch)
                if progress:
                    progress(len(batch))
            return SampleWritten(path, book.last if book.count else 0, done, replaced,
                                 interrupted, book.log_bytes)
