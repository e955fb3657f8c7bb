"""What runs inside a card builder (``builders.py`` starts them, ``ahead.py`` feeds
them): its set-up, its loop, and its job, :func:`build_cards`.

A builder is a fresh interpreter (``spawn``), so everything it imports is paid again at
each start, while the walk that wants its cards goes on without them (the fleet opens
those ships itself).  This module is all that a builder's start unpickles
(``multiprocessing``'s ``spawn`` imports the module of each function it is handed), and
it imports neither the event loop's modules (``trio``: about 55 ms here) nor the fleet's
operations.  ``tests/test_fleet_ahead.py`` holds it to that.
"""

from __future__ import annotations

from typing import Callable, Sequence

#: a ship this many places or fewer past the walk's is left to the walk: it would reach
#: the ship before a builder's open of it ends, and open it itself (``ahead.py``)
LEAD = 2
_walk_at = None  # the walk's listing position, shared with the daemon (``start``)

#: what :func:`~bookfs.formats.pier.identify` calls the logs that keep a card
#: (``formats/shipcard.py``: a single vere-layout Book directory or LMDB epoch keeps none)
CARD_KINDS = ("uip", "pier")


def serve(conn, start: Callable[[], object], job: Callable) -> None:
    """A builder's life: ``start()``, then answer each job (what it read) with
    ``job(it)``, until its pipe ends.  (``start`` and ``job`` are pickled by name.)"""
    start()
    while True:
        try:
            work = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(job(work))
        except OSError:  # the daemon is gone
            return


def start(cache: tuple[str | None, bool, int], walk_at=None) -> None:
    """A builder's set-up: the daemon's index cache (its directory, on or off, how many
    indexes its prune keeps), where the walk is (``walk_at``: a shared integer the
    daemon keeps at the listing position of the ship root the walk reached last), and
    the modules its jobs need, loaded now rather than during its first job."""
    global _walk_at
    from bookfs.formats import index as X
    from bookfs.formats import book, info, pier, shipcard  # noqa: F401 - loaded here

    _walk_at = walk_at
    directory, enabled, keep = cache
    X.configure_cache(directory, enabled=enabled)
    X.keep_at_least(keep)


def build_cards(ships: Sequence) -> list[str]:
    """In a builder: give each log directory of ``ships`` (paths, or ``(listing
    position, path)`` pairs) a card that holds (its log opened read-only and closed,
    unless a card already holds); the paths done.  Left out, silently: a ship the walk
    has reached or will reach before the open would end (at most :data:`LEAD` places
    past it: the fleet opens that one itself, and two opens of one log were one for
    nothing), a log of a kind that keeps no card (opening it would be for nothing), and
    one that cannot be opened (the fleet's own open reports it)."""
    from bookfs.formats.pier import identify
    from bookfs.formats.shipcard import Card, open_keeping_card, read_card

    done = []
    for ship in ships:
        pos, path = ship if isinstance(ship, tuple) else (None, ship)
        if pos is not None and _walk_at is not None and pos <= _walk_at.value + LEAD:
            continue
        try:
            if not isinstance(read_card(path)[1], Card):
                identified = identify(path)
                if identified[0] not in CARD_KINDS:
                    continue
                open_keeping_card(path, identified, missing=True).close()
            done.append(path)
        except Exception:  # noqa: BLE001 - the walk's own open says why
            continue
    return done
