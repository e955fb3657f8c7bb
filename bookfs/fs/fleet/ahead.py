"""Ship readahead: the cards of a fleet's next ships, built ahead of a walk through it.

Without a card, the first ``stat`` inside a ship opens its log (``fs/fleet/ops.py``:
its framing scanned, its index and card saved; about 2 ms for a ship of 8 MB here), and
``find MNT -maxdepth 2`` asks for one ship at a time, so a first-ever walk of 1,000 ships
pays 1,000 such opens one after another on one core.  As the kernel reads a file ahead
once its reads run in sequence, the fleet builds cards ahead once a walk runs through
the ships in listing order (``ls MNT``'s order, by name):

* **Only a walk in sequence starts it.**  A request that opens a closed ship's log at
  listing position ``k`` just after one that opened ship ``k - 1`` starts it
  (:meth:`CardsAhead.opened`); while it runs, each ship root the walk reaches
  (:meth:`CardsAhead.reached`, at ``opendir``) within the ships already read ahead keeps
  it going and doubles the window, from :data:`INITIAL` ships up to ``max_ships``
  (``bookfs mount --fleet --ships-ahead``; 0 turns it off), and to at most
  :data:`MAX_BYTES` of logs sent ahead of the walk (one ship at least: a walk stopped
  half way leaves at most that much read for nothing).  A ship reached out of order
  stops it.  So looking at one ship, or at a few in any order, of a fleet of
  gigabyte logs never reads the others.
* **Built by separate processes** (``builder.py``'s
  :func:`~bookfs.fs.fleet.builder.build_cards`, run by ``builders.py``): fresh
  interpreters (``spawn``, not forks of the threaded daemon; no GIL shared with the event
  loop), one per CPU, each fed down a pipe of its own and read by the event loop.  They
  are started at the first listing of the fleet's root since the mount when its first
  or last ship has no card (a walk lists the root before it enters any ship:
  :meth:`CardsAhead.root_listed`), or else at the first readahead; stopped when
  ``idle_close`` seconds pass without a job sent or done (:meth:`CardsAhead.idle`; ten
  times that if a job never came back) and at unmount (``builders.py``: SIGTERM, then
  SIGKILL).  They run at the daemon's priority: at ``nice`` 10 they starved while the
  walk's own requests kept both cores busy, and the walk met half as many cards
  (``docs/benchmarks.md``).  None is started while the index cache is off
  (``--no-index-cache``: no card could be kept).  A builder opens the log read-only as
  the fleet does (:func:`~bookfs.formats.shipcard.open_keeping_card`), so it saves the
  ship's index and card in the fleet's index cache, and closes it.  It leaves a ship at
  most ``builder.LEAD`` places past the walk's (a shared integer the event loop keeps
  at the walk's place) to the walk, which would reach it before the builder's open
  ended and open it again.
* **Only a cache is written.**  A card is believed only while the log's files are as its
  witnesses say (``formats/shipcard.py``), whoever built it.  A builder that cannot open
  a log drops it: the walk's own open meets the error and shows it as any open does.
* **The event loop never waits for a builder.**  A request for a ship whose card is not
  there yet opens the log itself, as without readahead; the builder that then reaches
  that ship finds its card and moves on.  :attr:`CardsAhead.built` names the ships a
  builder finished, so that the fleet reads their card again rather than trusting a
  "missing" it read before (``fs/fleet/ship.py``, ``ShipFaces.card``).

Memory: the builders are processes of their own (about 40 MB each while they run); in
the daemon, a set of the paths built and not yet looked at again.  Everything here runs
in the event loop (but :meth:`CardsAhead.stop`, also called once it has ended).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from functools import partial
from typing import Callable, Sequence

from bookfs.fs.fleet import builder
from bookfs.fs.fleet.builders import Builders

log = logging.getLogger(__name__)

INITIAL = 4  # ships read ahead at the start of a walk in sequence (then doubled)
MAX_SHIPS = 64  # the window's default bound (``--ships-ahead``)
MAX_BYTES = 1 << 30  # and at most this many bytes of logs sent ahead of the walk
BATCH = 4  # ships per job handed to a builder


def _log_bytes(path: str) -> int:
    """The size of the file a ship's log is read from (its newest epoch's, for a pier:
    :func:`~bookfs.formats.shipcard.source_file`); 0 if it cannot be looked at."""
    from bookfs.formats.shipcard import source_file

    try:
        return os.stat(source_file(path)).st_size
    except OSError:
        return 0


def _cache_on() -> bool:
    from bookfs.formats import index as X

    return X.cache_enabled()


class CardsAhead:
    """The fleet's readahead of ships (module docstring).  Called from the event loop
    only."""

    def __init__(self, max_ships: int = MAX_SHIPS, *, workers: int | None = None):
        self.max_ships = max(0, max_ships)
        self.workers = workers or os.cpu_count() or 1
        self.keep = 0  # indexes a builder's prune keeps, at least (the fleet's bound)
        self.built: set[str] = set()  # paths a builder finished, not yet looked at again
        self.ships_sent = 0  # ships handed to builders (for the fleet's marker file)
        self.ships_built = 0  # ships whose card a builder kept or found (likewise)
        self._builders: Builders | None = None
        self._walk_at = None  # the walk's position, shared with the builders (``_tell``)
        self._jobs = 0  # jobs in flight
        self._used = time.monotonic()
        self._opened_at = -2  # listing position of the last closed ship opened
        self._at = -2  # of the last ship root reached
        self._window = 0  # 0: no walk in sequence
        self._root_seen = False  # the fleet's root listed since the mount
        self._horizon = -1  # the last position handed to the builders
        self.max_bytes = MAX_BYTES
        self._sizes: dict[int, int] = {}  # position -> bytes, of the ships sent ahead
        self._ahead_bytes = 0  # their sum
        self.size_of: Callable[[str], int] = _log_bytes

    # --- what the walk does ------------------------------------------------------------

    def opened(self, pos: int, order: Sequence, has_card: Callable) -> None:
        """A request opened the closed ship at listing position ``pos`` of ``order``
        (the ships sorted by name; ``has_card(ship)``: the fleet holds its card)."""
        if self.max_ships and not self._window and pos == self._opened_at + 1 \
                and _cache_on():
            self._window = INITIAL
            self._horizon = pos
            self._sizes.clear()
            self._ahead_bytes = 0
            self._tell(pos)
            self._send(pos, order, has_card)
        self._opened_at = pos

    def reached(self, pos: int, order: Sequence, has_card: Callable) -> None:
        """A request reached the root of the ship at ``pos`` (``opendir``)."""
        before, self._at = self._at, pos
        if pos == before or not self._window:
            return
        if not before < pos <= self._horizon + 1:
            self._window = 0  # out of order: the walk is not a walk in sequence
            self._sizes.clear()
            self._ahead_bytes = 0
            return
        self._window = min(self.max_ships, 2 * self._window)
        self._tell(pos)
        self._send(pos, order, has_card)

    def _tell(self, pos: int) -> None:
        """Let the builders know the walk is at ``pos``: a ship it is about to reach is
        left to it (``builder.py``, ``LEAD``)."""
        if self._walk_at is not None:
            self._walk_at.value = pos

    def _send(self, pos: int, order: Sequence, has_card: Callable) -> None:
        for k in [k for k in self._sizes if k <= pos]:  # reached: no longer ahead
            self._ahead_bytes -= self._sizes.pop(k)
        end = min(len(order), pos + 1 + self._window)
        paths, k = [], max(self._horizon + 1, pos + 1)
        while k < end:
            ship = order[k]
            if not has_card(ship):
                size = self.size_of(ship.path)
                if self._ahead_bytes and self._ahead_bytes + size > self.max_bytes:
                    break
                self._sizes[k] = size
                self._ahead_bytes += size
                paths.append((k, ship.path))
            k += 1
        self._horizon = max(self._horizon, k - 1)
        for i in range(0, len(paths), BATCH):
            self._submit(paths[i:i + BATCH])

    def root_listed(self, order: Sequence, card_of: Callable) -> None:
        """The fleet's root is being listed (``order``: its ships by name;
        ``card_of(ship)``: the ship's card if one holds now, looked at).  The first time
        since the mount, start the builders now, with no job yet, if the first or the
        last ship has no card that holds (a walk would then open logs), unless readahead
        is off (``--ships-ahead 0``, no index cache) or the fleet has no more ships than
        one window's start (:data:`INITIAL`).  A walk lists the root before it goes into
        any ship, and that listing keeps one core busy for about 0.1 s per 1,000 ships
        (each ship root's modes) while the other waits; builders started then are ready
        when the walk reaches its first ships, instead of some 100 ships later.
        Builders that get no job stop after ``idle_close`` seconds (:meth:`idle`)."""
        if self._root_seen:
            return
        self._root_seen = True
        if self.max_ships and len(order) > INITIAL and not self.running and _cache_on() \
                and (card_of(order[0]) is None or card_of(order[-1]) is None):
            self._guarded(lambda: None)

    def _submit(self, paths: list) -> None:
        def send() -> None:
            self._builders.submit(paths)
            self._jobs += 1
            self.ships_sent += len(paths)

        self._guarded(send)

    def _guarded(self, then: Callable[[], None]) -> None:
        """``then()``, the builders started first if they are not running; builders that
        cannot start turn readahead off."""
        try:
            if self._builders is None or not self._builders.running:
                from bookfs.formats import index as X

                on = X.cache_enabled()
                cache = (X.cache_dir() if on else None, on, max(self.keep, X.INDEX_KEEP))
                self._walk_at = multiprocessing.get_context("spawn").RawValue(
                    "q", max(self._at, self._opened_at))
                self._builders = Builders(self.workers,
                                          partial(builder.start, cache, self._walk_at),
                                          builder.build_cards, self._done, self._lost)
                self._builders.start()
                log.info("ship readahead: %d card builders started", self.workers)
            then()
            self._used = time.monotonic()
        except Exception as e:  # builders that cannot start: no readahead, as with 0
            log.warning("ship readahead off: %s", e)
            self._jobs = 0
            self.max_ships = self._window = 0
            self.stop()

    def _done(self, paths: list[str]) -> None:
        self.built.update(paths)
        self.ships_built += len(paths)
        self._jobs -= 1
        self._used = time.monotonic()

    def _lost(self, jobs: int) -> None:
        self._jobs -= jobs
        self._used = time.monotonic()

    # --- what the fleet asks -----------------------------------------------------------

    def rebuilt(self, path: str) -> bool:
        """True once after a builder finished the ship at ``path``: a "missing" card read
        before then is to be read again."""
        if path in self.built:
            self.built.discard(path)
            return True
        return False

    @property
    def running(self) -> bool:
        return self._builders is not None

    def idle(self, now: float, idle_close: float) -> None:
        """Stop the builders once no job was sent or done for ``idle_close`` seconds and
        none is in flight, or for ten times that (a job lost with its builder, killed)
        (called every second by the fleet's loop)."""
        quiet = now - self._used
        if self._builders is not None and (quiet > idle_close and not self._jobs
                                           or quiet > 10 * idle_close):
            self.stop()
            self._jobs = 0

    def stop(self) -> None:
        """End the builders (``builders.py``: a job in flight is abandoned; an unmount
        never waits for them for good)."""
        builders, self._builders = self._builders, None
        if builders is not None:
            builders.stop()
