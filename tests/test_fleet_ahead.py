"""Ship readahead (``fs/fleet/ahead.py``, issue 34 item 7): once a walk opens a fleet's
ships in listing order, builder processes keep the cards of the next ships, so the walk
meets cards instead of opening logs; one ship, or ships taken out of order, start
nothing; a card built ahead is believed only while its log is as it was; builders that
die cost time, never a wrong answer; and none outlives its mount.  Through real FUSE
mounts, with the window's rule also held directly."""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from bookfs.formats import index as X
from bookfs.formats.book import Book
from bookfs.formats.info import parse
from bookfs.formats.shipcard import Card, open_keeping_card, read_card
from bookfs.fs.fleet import ahead as A
from bookfs.fs.fleet import builder
from bookfs.noun import patp
from mount_fixtures import build_sample, daemon_pid, mounted, payload, wait_for

EVENTS = 20
N = 24


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ahead") / "fleet"
    d.mkdir()
    for i in range(N):
        build_sample(d / f"s{i:02d}", EVENTS + i, seed=i)
    return d


def _ships(fleet: Path) -> tuple[list[str], dict[str, int]]:
    """The ships' names (their @p) in listing order, and each one's event count."""
    counts = {_name(fleet / f"s{i:02d}"): EVENTS + i for i in range(N)}
    return sorted(counts), counts


def _name(path: Path) -> str:
    with Book.open(path) as b:
        return patp(int.from_bytes(b.meta()["who"], "little"))


def _marker(mnt) -> dict[str, int]:
    got = parse((Path(mnt) / ".bookfs-fleet").read_text())
    return {k: int(v) for k, v in got.items() if v.strip().isdigit()}


def _children(pid: int) -> set[int]:
    """The card builders among the child processes of ``pid`` (every thread's):
    multiprocessing's spawned workers (not its resource tracker, which stays with the
    daemon, nor the mount's own helpers)."""
    out: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out |= {int(c) for c in open(f"/proc/{pid}/task/{tid}/children").read().split()}
        except FileNotFoundError:
            continue
    return {c for c in out if _alive(c) and b"spawn_main" in _cmdline(c)}


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except FileNotFoundError:
        return b""


def _alive(pid: int) -> bool:
    """``pid`` runs (neither gone nor a zombie)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _walk(mnt, name: str) -> int:
    """What a walk does at a ship: list its root, stat its ``events/``."""
    os.listdir(Path(mnt) / name)
    return os.stat(Path(mnt) / name / "events").st_size


def test_a_walk_in_order_meets_cards_built_ahead_that_say_what_the_logs_hold(fleet, tmp_path):
    names, counts = _ships(fleet)
    fleet = Path(shutil.copytree(fleet, tmp_path / "fleet"))  # one ship grows below
    lead = builder.LEAD  # ships just past the walk's are left to it
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        pid = daemon_pid(mnt)
        assert _walk(mnt, names[0]) == counts[names[0]]
        assert _marker(mnt)["ships_read_ahead"] == 0  # one ship opened: nothing ahead
        assert _walk(mnt, names[1]) == counts[names[1]]  # two in order: ships 2..5 ahead
        m = _marker(mnt)
        assert m["ships_read_ahead"] == A.INITIAL and m["opened"] == 2
        assert wait_for(lambda: _marker(mnt)["ships_built_ahead"] >= A.INITIAL - lead, 120)
        assert _children(pid)  # the builders
        # one built ahead, grown since: its card no longer holds; opened and shown as it is
        grown = next(p for p in fleet.iterdir() if _name(p) == names[1 + A.INITIAL])
        with Book.open(grown, writable=True) as b:
            b.save(b.count + 1, [payload(b.count + 1, 64)])
        counts[names[1 + A.INITIAL]] += 1
        for k in range(2, 2 + A.INITIAL):
            assert _walk(mnt, names[k]) == counts[names[k]]
        m = _marker(mnt)
        assert m["opened"] == 2 + lead + 1, m  # those left to the walk, and the grown one
        assert m["cards_read"] >= A.INITIAL - lead - 1  # the others from their cards
        assert m["ships_read_ahead"] > A.INITIAL  # the walk went on: the window grew
        for name in names[2 + A.INITIAL:]:  # the rest of the walk: right, built or not
            assert _walk(mnt, name) == counts[name]
        info = {n: parse((Path(mnt) / n / "info").read_text()) for n in names}
        assert all(int(info[n]["events"]) == counts[n] for n in names)
        builders = _children(pid)
    assert builders and wait_for(lambda: not any(_alive(c) for c in builders), 30)


@pytest.mark.parametrize("order", [[5], [5, 2, 9, 14], [7, 3]])
def test_one_ship_or_ships_out_of_order_read_nothing_ahead(fleet, tmp_path, order):
    names, counts = _ships(fleet)
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        for k in order:
            assert _walk(mnt, names[k]) == counts[names[k]]
        m = _marker(mnt)
        assert m["opened"] == len(order) and m["ships_read_ahead"] == 0
        assert not _children(daemon_pid(mnt))


def test_no_builder_without_an_index_cache(fleet, tmp_path):
    names, counts = _ships(fleet)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--no-index-cache") as mnt:
        for name in names[:6]:
            assert _walk(mnt, name) == counts[name]
        assert _marker(mnt)["ships_read_ahead"] == 0
        assert not _children(daemon_pid(mnt))


def test_builders_killed_mid_walk_cost_time_never_a_wrong_answer(fleet, tmp_path):
    names, counts = _ships(fleet)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--idle-close", "1") as mnt:
        pid = daemon_pid(mnt)
        for name in names[:3]:
            assert _walk(mnt, name) == counts[name]
        assert wait_for(lambda: len(_children(pid)) > 0, 60)
        for child in _children(pid):
            os.kill(child, signal.SIGKILL)
        for name in names[3:]:
            assert _walk(mnt, name) == counts[name]
        assert {n: int(parse((Path(mnt) / n / "info").read_text())["events"])
                for n in names} == counts
        # idle: the builders (the pool's replacements too) are stopped, within ten
        # times --idle-close when a killed builder's job never came back
        assert wait_for(lambda: not _children(pid), 60)


def test_the_daemon_exits_at_unmount_whatever_its_builders_are_doing(fleet, tmp_path,
                                                                    cache_dir):
    """A seeded soak: unmount at random moments of a walk being read ahead (builders
    starting, busy, or waiting on the pool's queue): the daemon exits every time, and no
    builder outlives it.  (Builders with a SIGTERM handler that raised SystemExit once
    left one waiting on the queue for good, the daemon's unmount waiting for it.)"""
    names, _ = _ships(fleet)
    rng = random.Random(34)
    for n in range(6):
        for f in os.listdir(cache_dir):  # no card yet: the builders have work
            os.unlink(os.path.join(cache_dir, f))
        with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
            pid = daemon_pid(mnt)
            for name in names[:2 + rng.randrange(5)]:
                _walk(mnt, name)
            time.sleep(rng.choice([0, 0.02, 0.1, 0.3]))
            builders = _children(pid)
        assert wait_for(lambda: not _alive(pid), 60), f"round {n}: the daemon is still up"
        assert not any(_alive(c) for c in builders), f"round {n}"


def test_builders_stop_when_idle(fleet, tmp_path):
    names, counts = _ships(fleet)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--idle-close", "1") as mnt:
        pid = daemon_pid(mnt)
        for name in names[:2]:
            _walk(mnt, name)
        assert wait_for(lambda: _marker(mnt)["ships_built_ahead"]
                        >= A.INITIAL - builder.LEAD, 120)
        assert wait_for(lambda: not _children(pid), 30)
        for name in names[2:]:  # and start again for a walk that goes on
            assert _walk(mnt, name) == counts[name]


def test_the_first_listing_of_the_root_starts_the_builders_with_no_job(fleet, tmp_path):
    """A walk lists the fleet's root before it enters any ship, and that listing keeps
    one core busy while the other waits: the builders start then, so that they are ready
    when the walk reaches its first ships.  They get no job until a walk in sequence
    starts, stop when idle, and a later listing of the root does not start them again."""
    names, counts = _ships(fleet)
    with mounted(fleet, tmp_path / "mnt", "--fleet", "--idle-close", "1") as mnt:
        pid = daemon_pid(mnt)
        assert not _children(pid)
        assert sorted(n for n in os.listdir(mnt) if not n.startswith(".")) == names
        assert len(_children(pid)) == os.cpu_count()  # started by the opendir itself
        assert _marker(mnt)["ships_read_ahead"] == 0
        assert wait_for(lambda: not _children(pid), 30)  # idle: stopped
        os.listdir(mnt)
        assert not _children(pid)  # once a mount
        for name in names[:4]:  # a walk in sequence starts them as before
            assert _walk(mnt, name) == counts[name]
        assert _marker(mnt)["ships_read_ahead"] > 0


def test_a_listing_of_a_fleet_whose_cards_hold_starts_no_builder(fleet, tmp_path):
    """The cards kept by a first walk hold at the next mount: listing the root then
    starts no builder (nothing for one to do)."""
    names, counts = _ships(fleet)
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        for name in names:
            assert _walk(mnt, name) == counts[name]
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        assert len(os.listdir(mnt)) >= N
        assert not _children(daemon_pid(mnt))
        assert _walk(mnt, names[0]) == counts[names[0]] and _marker(mnt)["opened"] == 0


@pytest.mark.parametrize("how", [["--ships-ahead", "0"], ["--no-index-cache"]])
def test_a_listing_of_the_root_starts_no_builder_when_readahead_is_off(fleet, tmp_path, how):
    with mounted(fleet, tmp_path / "mnt", "--fleet", *how) as mnt:
        assert len(os.listdir(mnt)) >= N
        assert not _children(daemon_pid(mnt))


def _deaf_builder() -> None:  # (a builder's start, in the spawned process)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _pid_then_busy(paths: list[str]) -> list[str]:  # (its job)
    """Its pid for the first job; the next one never ends."""
    if paths == ["pid"]:
        return [str(os.getpid())]
    time.sleep(300)
    return []


def test_a_builder_that_outlives_sigterm_is_killed_rather_than_waited_for(monkeypatch):
    import multiprocessing

    import trio

    from bookfs.fs.fleet import builders as B

    monkeypatch.setattr(B, "STOP_WAIT", 1.0)
    done: list[list[str]] = []

    async def main() -> float:
        builders = B.Builders(1, _deaf_builder, _pid_then_busy, done.append, lambda n: None)
        builders.start()
        builders.submit(["pid"])
        with trio.fail_after(60):
            while not done:
                await trio.sleep(0.02)
        builders.submit(["/ships/0"])  # busy, and deaf to SIGTERM
        await trio.sleep(0.5)
        t = time.monotonic()
        builders.stop()
        return time.monotonic() - t

    took = trio.run(main)
    assert took < 30  # (a hang bound: SIGTERM alone would wait for good)
    assert not _alive(int(done[0][0])) and not multiprocessing.active_children()


def test_the_builders_answers_are_read_by_the_event_loop_without_helper_threads(tmp_path):
    """No thread of the daemon waits on the builders: ``multiprocessing.Pool``'s worker
    handler went round its loop while an answer waited to be read, under the event
    loop's GIL (``builders.py``).  Jobs go to the builder with the fewest in flight, and
    every answer comes back to the loop."""
    import threading

    import trio

    from bookfs.fs.fleet import builders as B

    ships = []
    for i in range(6):
        build_sample(tmp_path / f"s{i}", 12 + i, seed=i)
        ships.append(str(tmp_path / f"s{i}"))
    done: list[str] = []
    threads: set[str] = set()

    async def main() -> None:
        builders = B.Builders(2, functools.partial(builder.start, (X.cache_dir(), True, 64)),
                              builder.build_cards, done.extend, lambda n: None)
        before = set(threading.enumerate())
        builders.start()
        for k in range(0, 6, 2):
            builders.submit(ships[k:k + 2])
        with trio.fail_after(120):
            while len(done) < 6:
                threads.update(t.name for t in set(threading.enumerate()) - before)
                await trio.sleep(0.01)
        assert sorted(b.jobs for b in builders._running) == [0, 0]
        builders.stop()

    trio.run(main)
    assert sorted(done) == ships and not threads, threads
    for i, path in enumerate(ships):  # each card kept, and it says what the log holds
        card = read_card(path)[1]
        assert isinstance(card, Card) and card.count == 12 + i, path


# --- the window's rule, held directly ----------------------------------------------------


class _Ship:
    def __init__(self, i: int):
        self.path = f"/ships/{i}"


def _sent(monkeypatch, steps) -> list[list[int]]:
    """The positions handed to builders after each step of ``steps`` (("opened" or
    "reached", position)), over 200 ships none of which has a card."""
    ahead = A.CardsAhead(16)
    batches: list[str] = []
    monkeypatch.setattr(ahead, "_submit", lambda ships: batches.extend(p for _, p in ships))
    order = [_Ship(i) for i in range(200)]
    out = []
    for what, pos in steps:
        getattr(ahead, what)(pos, order, lambda s: False)
        out.append(sorted(int(p.rsplit("/", 1)[1]) for p in batches))
        batches.clear()
    return out


def test_the_window_starts_at_two_opens_in_order_and_doubles_to_its_bound(monkeypatch):
    got = _sent(monkeypatch, [("opened", 10), ("opened", 11), ("reached", 12),
                              ("reached", 13), ("reached", 14), ("reached", 15)])
    assert got == [[], list(range(12, 16)), list(range(16, 21)), list(range(21, 30)),
                   [30], [31]]  # 4, then 8, then 16 ahead (the bound): one more a step


def test_a_step_out_of_order_stops_it_and_two_opens_in_order_start_it_again(monkeypatch):
    got = _sent(monkeypatch, [("opened", 0), ("opened", 1), ("reached", 2),
                              ("reached", 40), ("reached", 41), ("opened", 41),
                              ("opened", 42), ("reached", 43)])
    assert got[3:6] == [[], [], []]  # stopped by the jump; opens alone start nothing
    assert got[6] == list(range(43, 47)) and got[7] == list(range(47, 52))


def test_ships_whose_card_the_fleet_holds_are_not_sent(monkeypatch):
    ahead = A.CardsAhead(16)
    sent: list[str] = []
    monkeypatch.setattr(ahead, "_submit", lambda ships: sent.extend(p for _, p in ships))
    order = [_Ship(i) for i in range(20)]
    for pos in (0, 1):
        ahead.opened(pos, order, lambda s: s.path.endswith(("/3", "/4")))
    assert sent == ["/ships/2", "/ships/5"]


@pytest.mark.parametrize("size, sent", [(400 << 20, [[2, 3], [4], [5]]),
                                        (5 << 30, [[2], [3], [4]])])
def test_at_most_max_bytes_of_logs_are_ahead_of_the_walk_and_one_ship_at_least(
        monkeypatch, size, sent):
    ahead = A.CardsAhead(16)
    ahead.size_of = lambda path: size
    got: list[int] = []
    monkeypatch.setattr(ahead, "_submit", lambda ships: got.extend(k for k, _ in ships))
    order = [_Ship(i) for i in range(50)]
    out = []
    for what, pos in [("opened", 0), ("opened", 1), ("reached", 2), ("reached", 3)]:
        getattr(ahead, what)(pos, order, lambda s: False)
        if got or what == "reached":
            out.append(sorted(got))
            got.clear()
    assert ahead.max_bytes == 1 << 30 and out == sent


@pytest.mark.parametrize("ships, cards, starts", [
    (A.INITIAL, set(), False),  # no more ships than a window's start: not worth it
    (A.INITIAL + 1, set(), True),
    (40, {0, 39}, False),  # the first and the last ship have their cards: a warm cache
    (40, {0}, True), (40, {39}, True)])
def test_the_root_listing_starts_builders_when_a_walk_would_open_logs(monkeypatch, ships,
                                                                       cards, starts):
    started = []
    ahead = A.CardsAhead(16)
    monkeypatch.setattr(ahead, "_guarded", started.append)
    order = [_Ship(i) for i in range(ships)]
    card_of = lambda s: "card" if int(s.path.rsplit("/", 1)[1]) in cards else None  # noqa: E731
    ahead.root_listed(order, card_of)
    ahead.root_listed(order, lambda s: None)  # (the first listing is past: nothing more)
    assert len(started) == starts


def test_off_sends_nothing(monkeypatch):
    ahead = A.CardsAhead(0)
    monkeypatch.setattr(ahead, "_submit", pytest.fail)
    order = [_Ship(i) for i in range(20)]
    for pos in range(10):
        ahead.opened(pos, order, lambda s: False)
        ahead.reached(pos, order, lambda s: False)


# --- what a builder does -------------------------------------------------------------------


def test_a_builder_keeps_the_card_the_fleet_would_and_skips_one_that_holds(tmp_path):
    ship = build_sample(tmp_path / "s", 40)
    assert builder.build_cards([str(ship), str(tmp_path / "nothing")]) == [str(ship)]
    _, card = read_card(str(ship))
    assert isinstance(card, Card) and card.count == 40
    before = sorted(os.listdir(X.cache_dir()))
    assert builder.build_cards([str(ship)]) == [str(ship)]  # held: nothing written again
    assert sorted(os.listdir(X.cache_dir())) == before


def test_a_builder_reads_a_ships_card_once(tmp_path, monkeypatch):
    """A builder has just found no card that holds when it opens a log: keeping the
    card does not read it again (the old code read every card twice)."""
    from bookfs.formats import shipcard

    ship = str(build_sample(tmp_path / "s", 30))
    reads = []
    real = shipcard.read_card
    monkeypatch.setattr(shipcard, "read_card", lambda p: reads.append(p) or real(p))
    assert builder.build_cards([ship]) == [ship]
    assert reads == [ship]
    assert real(ship)[1].count == 30


def test_a_builder_keeps_no_card_for_a_log_changed_since_it_looked(tmp_path, monkeypatch):
    """Without reading the card again, the card's figures are held to the witnesses
    looked at before the open: a log that grew in between keeps no card, and the next
    look finds none that holds rather than one that says too little."""
    from bookfs.formats import shipcard

    ship = build_sample(tmp_path / "s", 30)
    real = shipcard.looked

    def then_grow(path):
        seen = real(path)
        with Book.open(ship, writable=True) as b:
            b.save(31, [payload(31, 64)])
        return seen

    monkeypatch.setattr(shipcard, "looked", then_grow)
    assert builder.build_cards([str(ship)]) == [str(ship)]
    assert not isinstance(read_card(str(ship))[1], Card)
    monkeypatch.setattr(shipcard, "looked", real)
    assert builder.build_cards([str(ship)]) == [str(ship)]
    assert read_card(str(ship))[1].count == 31


def test_a_builder_leaves_the_ships_just_past_the_walk_to_it(tmp_path, monkeypatch):
    """A ship at most ``LEAD`` places past where the walk is would be reached before a
    builder's open of it ended, and opened again by the walk: two opens of one log, one
    for nothing (a first-ever find of 1,000 ships made 20 to 50 such).  A builder skips
    it; the ones further on it builds, and a plain path (no place) it always builds."""
    import types

    ships = [str(build_sample(tmp_path / f"s{i}", 10 + i, seed=i)) for i in range(6)]
    walk = types.SimpleNamespace(value=1)
    monkeypatch.setattr(builder, "_walk_at", walk)
    got = builder.build_cards([(k, p) for k, p in enumerate(ships)])
    assert got == ships[2 + builder.LEAD:]
    assert not isinstance(read_card(ships[1 + builder.LEAD])[1], Card)
    walk.value = -1 - builder.LEAD  # no walk yet
    assert builder.build_cards([(0, ships[0]), ships[1]]) == ships[:2]
    assert read_card(ships[0])[1].count == 10


def test_a_builder_opens_no_log_of_a_kind_that_keeps_no_card(tmp_path):
    """A single vere-layout Book directory or LMDB epoch keeps no card: a builder leaves
    it (the fleet opens it itself when asked), rather than open it for nothing."""
    from lmdb_fixtures import make_lmdb_epoch, make_vere_epoch

    vere = make_vere_epoch(tmp_path / "vere", 0, [payload(e, 40) for e in range(1, 30)])
    lmdb = make_lmdb_epoch(tmp_path / "lmdb", 0, [payload(e, 40) for e in range(1, 30)])
    assert builder.build_cards([str(vere), str(lmdb)]) == []
    assert os.listdir(X.cache_dir()) == [] if os.path.isdir(X.cache_dir()) else True


def test_an_open_keeping_its_card_saves_the_index_once(tmp_path, monkeypatch):
    ship = build_sample(tmp_path / "s", 40)
    saves = []
    real = X._replace
    monkeypatch.setattr(X, "_replace", lambda path, chunks: (saves.append(path),
                                                             real(path, chunks)))
    open_keeping_card(str(ship)).close()
    assert len(saves) == 1  # the index and its card in one save (the old open: two)
    _, card = read_card(str(ship))
    assert isinstance(card, Card) and card.count == 40
    saves.clear()
    open_keeping_card(str(ship)).close()  # the index and card hold: nothing saved
    assert saves == []


def test_a_fleet_of_piers_of_every_layout_is_read_ahead_and_shown_as_it_is(tmp_path):
    """Real-layout piers (LMDB, vere and UIP Book epochs, several a pier): a builder
    keeps a pier's card in its card file, and the walk meets it."""
    from test_fleet_piercards import MIXED, _count, _fleet

    fleet = _fleet(tmp_path, MIXED * 2)
    counts = {}
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        names = sorted(os.listdir(mnt))
        paths: dict[str, str] = {}
        for name in names[:2]:  # two in order: the next ones ahead
            _walk(mnt, name)
        assert wait_for(lambda: _marker(mnt)["ships_built_ahead"]
                        >= A.INITIAL - builder.LEAD, 120)
        for name in names:
            counts[name] = _walk(mnt, name)
        m = _marker(mnt)
        assert m["opened"] < len(names) and m["cards_read"] >= A.INITIAL - builder.LEAD, m
        for name in names:  # each as its pier holds it
            path = parse((Path(mnt) / name / "info").read_text())["path"]
            paths[path] = name
            assert counts[name] == _count(Path(path))
    assert len(paths) == len(MIXED) * 2


def test_a_builder_starts_without_the_event_loops_modules(tmp_path):
    """A builder is a fresh interpreter: what its start imports is paid again each time,
    while the walk goes on without its cards.  It loads the formats its jobs need, and
    neither ``trio`` (about 55 ms; the old builders unpickled ``builders._serve``, whose
    module imports it) nor the fleet's operations."""
    import trio

    from bookfs.fs.fleet import builders as B

    import builder_probe

    answers: list[list[str]] = []

    async def main() -> None:
        builders = B.Builders(1, functools.partial(builder.start, (X.cache_dir(), True, 64)),
                              builder_probe.loaded, answers.append, lambda n: None)
        builders.start()
        builders.submit([])
        with trio.fail_after(120):
            while not answers:
                await trio.sleep(0.01)
        builders.stop()

    trio.run(main)
    modules = set(answers[0])
    assert {"bookfs.formats.shipcard", "bookfs.formats.book", "bookfs.formats.info"} <= modules
    unwanted = sorted(m for m in modules if m.split(".")[0] in ("trio", "pyfuse3")
                      or m.startswith(("bookfs.fs.fleet.ahead", "bookfs.fs.fleet.builders",
                                       "bookfs.fs.fleet.ops", "bookfs.fs.ops")))
    assert not unwanted, unwanted
