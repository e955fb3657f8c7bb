"""Issue 32's replacement matrix: a log replaced under a mount is a new log, whose bytes
(or an error) the mount serves, never the old log's bytes or the old ship's name.

DESIGN.md: "A log that is replaced or rewritten under a mount is a new log: the mount
serves the new bytes or an error (ESTALE, EIO), never bytes or names it cached from the
old one."  Checked through real FUSE mounts, for every cell of

* mount kind: a single ``-o ro`` mount, a ``--fleet`` mount;
* replacement: a ship directory renamed over another (fleet: ``mv pier pier.old; mv new
  pier``, as hosts move piers, the old directory kept in the fleet or moved out of it);
  another log renamed over the mounted source's ``book.log`` (single mount); ``book.log``
  rewritten in place with another log of the same size and mtime (only its ctime
  moves); ``data.mdb`` of an LMDB epoch, or of a pier's newest (LMDB) epoch, replaced by
  another (rename);
* ship state: open (its events were just read, so the kernel caches their pages and
  names) or closed (fleet: ``--idle-close 1`` closed it; the kernel may still cache its
  pages);
* log layout: a UIP Book directory, a vere-layout Book directory, a pier (an LMDB epoch,
  then a vere-layout Book epoch), an LMDB epoch, a pier of two LMDB epochs;
* for a rewrite in place, the two logs' tails: the same last two events (so the header
  and the last deeds, what a reader may keep as a stamp of what it published, are the
  same bytes: only the ctime tells) or every event different (a vere header's slots
  then have the same ``seq`` and ``las_d`` but another batch CRC).

The two logs' events differ (dates, data) but have the same sizes, so no size can tell
them apart; their ``info`` differs in the dates of the events that differ.  Each case
reads every event (``cat``), holds two of them open, replaces, then reads the same
paths again (then ``ls``, ``info``) for up to :data:`SETTLE` seconds and checks:

* a read gives the old log's bytes or the new log's, never a mix of the two, and, once a
  path gave the new bytes, never the old ones again (the mount noticed: nothing it or the
  kernel cached of the old log comes back);
* eventually every path gives the new log's bytes, ``info`` its dates, and a file opened
  before the replacement reads the new bytes or fails with ESTALE or EIO;
* on a fleet, a name never serves another ship's events (``MNT/<name>/info`` says
  ``ship: <name>``, and the old ship's name never serves the new ship's bytes); the new
  ship's name is listed, and the old one only while a directory of the fleet still holds
  that ship (then it serves that ship, from there).

The events are read alone until they all show the new log: no ``info`` or listing
(which may open a closed ship, or make a mount look at its log) helps the mount notice.
At the end, the engine checks the mounts rely on, without FUSE: a reader's ``refresh``
after a rewrite in place, and a closed fleet ship's ``identity()``/``continues()``.

Mounts are shared to keep the run short: one fleet mount per ship state holds every
fleet case's ship (each case its own ship; every replacement is made at once, then each
case checked in turn), and the single mounts are made once for all their cases.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bookfs.formats.info import parse
from bookfs.noun import cell, cord, datetime_to_da, jam, mug, patp, path as knots
from lmdb_fixtures import make_lmdb_epoch, make_pier, meta_values
from mount_fixtures import module_cache, mounted, wait_for  # noqa: F401  (a fixture)

#: data bits of each event's card (the sizes of both logs): small events, a medium one,
#: and one over the mount's small-event cache (``SMALL_EVENT``, 128 KiB), which is read
#: straight from the log file
DATA_BITS = [40, 300, 8 * 1500, 13, 8 * 200_000, 77, 8 * 4000, 250, 9, 8 * 700]
EVENTS = len(DATA_BITS)
SPLIT = 4  # a pier's first epoch holds events 1..SPLIT, its newest the rest
HELD = (2, 5)  # events held open across the replacement (a small one, the large one)
SETTLE = 8.0  # seconds the mount has to notice (inotify, or its 1 s poll) and show it
OLD, NEW = 1, 2  # the two logs' seeds


def _when(seed: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=300 * seed)


#: how the two logs' last events compare: ``same`` (the last two events are the same
#: bytes in both: a log's header and its last deed, which a reader may keep as a stamp
#: of what it published, then say nothing) or ``differs`` (every event differs)
TAILS = ("same", "differs")
SHARED = 0  # the seed of the events both logs share (``same`` tail)


def event(n: int, seed: int, tail: str = "same") -> bytes:
    """Event ``n`` of log ``seed``: ``mug ++ jam([date [wire [tag data]]])``, a dated
    ship event (``info`` shows its date), whose size depends on ``n`` alone."""
    if tail == "same" and n > EVENTS - 2:
        seed = SHARED
    date = datetime_to_da(_when(seed) + dt.timedelta(minutes=n))
    bits = DATA_BITS[n - 1]
    data = random.Random(seed * 1_000_003 + n).getrandbits(bits - 1) | (1 << (bits - 1))
    noun = cell(date, knots("/d/term/1"), cord("blit"), data)
    return mug(noun).to_bytes(4, "little") + jam(noun)


def events(seed: int, tail: str = "same") -> dict[int, bytes]:
    return {n: event(n, seed, tail) for n in range(1, EVENTS + 1)}


def _same_sizes() -> None:
    for tail in TAILS:
        old, new = events(OLD, tail), events(NEW, tail)
        assert {n: len(p) for n, p in old.items()} == {n: len(p) for n, p in new.items()}
        assert all((old[n] != new[n]) == (tail == "differs" or n <= EVENTS - 2)
                   for n in old)


# --- the logs -----------------------------------------------------------------------


#: layout -> what is replaced in it: ``book.log`` (a Book's) or ``data.mdb`` (LMDB's)
LAYOUTS = {"uip": "book.log", "vere": "book.log", "pier": "book.log", "lmdb": "data.mdb",
           "pier-lmdb": "data.mdb"}


def _book(cls, directory: Path, base: int, ev: list[bytes], meta: dict) -> Path:
    """A Book (``cls``: the UIP layout's or vere's) holding ``ev`` as events ``base +
    1, ...``, saved as a batch of all but the last two, then one save each for those: a
    vere header's two slots then describe only the last two events."""
    with cls.open(directory, writable=True, create=True) as book:
        for key, value in meta.items():
            book.save_meta(key, value)
        nxt = base + 1
        for batch in (ev[:-2], ev[-2:-1], ev[-1:]):
            book.save(nxt, batch, epoch=base)
            nxt += len(batch)
    return directory


def build(layout: str, root: Path, seed: int, who: int, tail: str = "same") -> Path:
    """A log of ``layout`` at ``root``: events 1..EVENTS of log ``seed``, ship ``who``."""
    from bookfs.formats.book import Book
    from bookfs.formats.vere import VereBook

    ev = [event(n, seed, tail) for n in range(1, EVENTS + 1)]
    meta = meta_values(who=who)
    if layout == "uip":
        _book(Book, root, 0, ev, meta)
    elif layout == "vere":
        _book(VereBook, root, 0, ev, meta)
    elif layout == "lmdb":
        make_lmdb_epoch(root, 0, ev, meta=meta)
    elif layout == "pier":  # an LMDB epoch, then a Book epoch in vere's layout
        make_pier(root, [("lmdb", ev[:SPLIT])], meta=meta)
        newest = _book(VereBook, root / ".urb" / "log" / f"0i{SPLIT}", SPLIT, ev[SPLIT:],
                       meta)
        (newest / "epoc.txt").write_text("3")
        (newest / "vere.txt").write_text("3.2")
    elif layout == "pier-lmdb":
        make_pier(root, [("lmdb", ev[:SPLIT]), ("lmdb", ev[SPLIT:])], meta=meta)
    else:
        raise ValueError(layout)
    return root


def replaced_file(layout: str, root: Path) -> Path:
    """The file a replacement of the log's content replaces: the newest epoch's for a
    pier."""
    if layout.startswith("pier"):
        return root / ".urb" / "log" / f"0i{SPLIT}" / LAYOUTS[layout]
    return root / LAYOUTS[layout]


def after_content(layout: str, tail: str) -> dict[int, bytes]:
    """The events of a log of ``layout`` whose replaceable file is the NEW log's: a
    pier's first epoch keeps the OLD log's events."""
    got = events(NEW, tail)
    if layout.startswith("pier"):
        old = events(OLD, tail)
        got.update({n: old[n] for n in range(1, SPLIT + 1)})
    return got


def rewrite_in_place(target: Path, source: Path) -> None:
    """``target`` rewritten in place with ``source``'s bytes (same size), then its
    mtime put back: only its ctime says it changed (``dd conv=notrunc`` does this)."""
    st = os.stat(target)
    data = source.read_bytes()
    assert len(data) == st.st_size, "the two logs must have the same size"
    fd = os.open(target, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))  # at once, as ``touch -r``
    finally:
        os.close(fd)
    after = os.stat(target)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        st.st_size, st.st_mtime_ns, st.st_ino)


# --- the cases ----------------------------------------------------------------------


@dataclass
class Case:
    """One cell of the matrix.  ``kind``: ``single`` or ``fleet``; ``state``: ``open``
    or ``closed``; ``how``: ``dir`` (fleet; ``aside``: ``kept`` in the fleet or ``gone``
    out of it), ``logrename`` (single), ``rewrite``, ``mdb``; ``tail``: :data:`TAILS`
    (a ship replaced by another shares no event with it)."""

    kind: str
    state: str
    how: str
    layout: str
    aside: str = ""
    tail: str = "same"
    # filled in by the scene
    src: Path | None = None  # the mounted source (single) or the ship's directory
    mnt: Path | None = None  # the mount
    who_old: int = 0
    who_new: int = 0
    held: dict = field(default_factory=dict)  # event -> fd opened before

    @property
    def id(self) -> str:
        tail = {"same": "tail_same", "differs": "all_differ"}[self.tail]
        return "-".join(x for x in (self.kind, self.state, self.how, self.layout,
                                    self.aside, tail if self.how == "rewrite" else "") if x)

    def root(self, who: int | None = None) -> Path:
        """The directory of the mount that shows this case's log (a fleet: the ship
        named ``who``, by default the one the case began with)."""
        if self.kind == "single":
            return self.mnt
        return self.mnt / patp(self.who_old if who is None else who)


def _cases() -> list[Case]:
    out = []
    for state in ("open", "closed"):
        for layout in ("uip", "pier"):
            for aside in ("kept", "gone"):
                out.append(Case("fleet", state, "dir", layout, aside, tail="differs"))
        for layout in ("uip", "vere", "pier"):
            for tail in TAILS:
                out.append(Case("fleet", state, "rewrite", layout, tail=tail))
        for layout in ("lmdb", "pier-lmdb"):
            out.append(Case("fleet", state, "mdb", layout))
    for layout in ("uip", "vere", "pier"):
        out.append(Case("single", "open", "logrename", layout))
        for tail in TAILS:
            out.append(Case("single", "open", "rewrite", layout, tail=tail))
    for layout in ("lmdb", "pier-lmdb"):
        out.append(Case("single", "open", "mdb", layout))
    return out


CASES = _cases()


# --- scenes: mounts shared by cases -------------------------------------------------


def _read(p: Path) -> bytes | int:
    """``cat p``: its bytes, or the errno it failed with."""
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError as e:
        return e.errno


def _marker(mnt: Path) -> dict[str, str]:
    return parse((mnt / ".bookfs-fleet").read_text())


def _event_path(root: Path, n: int) -> Path:
    return root / "events" / f"{n:012d}"


def _warm(case: Case) -> None:
    """Read every event of the case (the kernel caches their names and pages), its
    listing and ``info``, and hold two events open."""
    root = case.root()
    old = events(OLD, case.tail)
    for n in range(1, EVENTS + 1):
        assert _read(_event_path(root, n)) == old[n], (case.id, n)
    assert len(os.listdir(root / "events")) == EVENTS
    info = parse((root / "info").read_text())
    if case.kind == "fleet":
        assert info["ship"] == patp(case.who_old)
    for n in HELD:
        case.held[n] = os.open(_event_path(root, n), os.O_RDONLY)
        assert os.pread(case.held[n], len(old[n]), 0) == old[n]


def _replace(case: Case, staging: Path) -> None:
    """Make the case's replacement (its new log was built at ``staging``)."""
    src = case.src
    if case.how == "dir":
        aside = (src.parent / (src.name + ".old") if case.aside == "kept"
                 else staging.parent / (src.name + ".gone"))
        os.rename(src, aside)
        os.rename(staging, src)
    elif case.how == "rewrite":
        rewrite_in_place(replaced_file(case.layout, src),
                         replaced_file(case.layout, staging))
    elif case.how in ("logrename", "mdb"):
        os.rename(replaced_file(case.layout, staging), replaced_file(case.layout, src))
    else:
        raise ValueError(case.how)


class Scene:
    """The mounts of one (kind, state): every case's log built, mounted, warmed, then
    replaced, all before the first case is checked."""

    def __init__(self, kind: str, state: str, base: Path, stack: contextlib.ExitStack):
        self.cases = [c for c in CASES if (c.kind, c.state) == (kind, state)]
        staging = base / "staging"
        staging.mkdir(parents=True)
        fleet, single = base / "fleet", base / "src"
        fleet.mkdir()
        single.mkdir()
        for i, case in enumerate(self.cases):
            case.who_old = 0x1000 + 2 * i  # every ship of a fleet its own @p
            case.who_new = case.who_old + (1 if case.how == "dir" else 0)
            where = fleet if kind == "fleet" else single
            case.src = build(case.layout, where / f"c{i:02d}", OLD, case.who_old, case.tail)
            build(case.layout, staging / f"c{i:02d}", NEW, case.who_new, case.tail)
        time.sleep(0.05)  # past the racy margin of the files' ctimes
        if kind == "fleet":
            # open: no ship is closed while the module runs; closed: each is, once idle
            args = ["--fleet", "--idle-close", "1" if state == "closed" else "3600"]
            mnt = Path(stack.enter_context(mounted(fleet, base / "mnt", *args)))
            for case in self.cases:
                case.mnt = mnt
        else:
            for i, case in enumerate(self.cases):
                case.mnt = Path(stack.enter_context(
                    mounted(case.src, base / f"mnt{i:02d}", "-o", "ro")))
        for case in self.cases:
            stack.callback(_close_held, case)
            _warm(case)
        if state == "closed":
            assert wait_for(lambda: _marker(mnt)["open"] == "0", 15), _marker(mnt)
        for i, case in enumerate(self.cases):
            _replace(case, staging / f"c{i:02d}")


def _close_held(case: Case) -> None:
    for fd in case.held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    case.held.clear()


@pytest.fixture(scope="module")
def scenes(tmp_path_factory, module_cache):
    """``scenes(kind, state)``: the :class:`Scene`, made at its first use."""
    made: dict = {}
    with contextlib.ExitStack() as stack:
        def get(kind: str, state: str) -> Scene:
            if (kind, state) not in made:
                try:
                    made[kind, state] = Scene(
                        kind, state, tmp_path_factory.mktemp(f"{kind}-{state}"), stack)
                except BaseException as e:  # every case of the scene fails with it
                    made[kind, state] = e
                    raise
            got = made[kind, state]
            if isinstance(got, BaseException):
                pytest.fail(f"the {kind}-{state} scene could not be made: {got!r}")
            return got

        yield get


# --- the check ----------------------------------------------------------------------


def _classify(got, old: bytes, new: bytes) -> str:
    if isinstance(got, int):
        return f"errno {errno.errorcode.get(got, got)}"
    if got == new:
        return "new"
    if got == old:
        return "old"
    if len(got) == len(old) == len(new):  # which pages are whose
        pages = ["o" if got[k:k + 4096] == old[k:k + 4096] else
                 "n" if got[k:k + 4096] == new[k:k + 4096] else "?"
                 for k in range(0, len(got), 4096)]
        return f"neither: its 4 KiB pages {''.join(pages)} (o: old, n: new)"
    return f"neither ({len(got)} bytes)"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_replaced_log_is_never_served_from_the_old_one(case, scenes):
    """The case's paths (module docstring), read again and again after the replacement:
    never the old log's bytes once the new ones were served, never a mix, never another
    ship's bytes or name; within :data:`SETTLE` seconds the new bytes, the new ``info``,
    and the listing as the fleet directory now is."""
    _same_sizes()
    scene = scenes(case.kind, case.state)
    assert case in scene.cases
    old = events(OLD, case.tail)
    new = events(NEW, case.tail) if case.how == "dir" else after_content(case.layout,
                                                                          case.tail)
    differs = {n for n in old if old[n] != new[n]}
    assert differs
    # the info lines that tell the two logs apart: the first and last events' dates
    dated = [(key, _date_of(old[n]), _date_of(new[n])) for key, n in
             (("since", 1), ("until", EVENTS)) if old[n] != new[n]]
    fleet = case.kind == "fleet"
    # the names that show the case's logs after it: the new ship's (the same @p but for
    # a directory renamed over), and, while a directory still holds it, the old ship's
    renamed = case.how == "dir"
    new_root = case.root(case.who_new)
    old_root = case.root(case.who_old) if renamed else None
    seen_new: set = set()
    problems: list[str] = []
    last: dict = {}

    def look(full: bool) -> bool:
        """One pass over the event paths (and, once ``full``: the listing and ``info``);
        True once all of them show the new log."""
        done = True
        for n in range(1, EVENTS + 1):
            p = _event_path(new_root, n)
            what = _classify(_read(p), old[n], new[n])
            last[p] = what
            if what.startswith("neither"):
                problems.append(f"{p}: {what}: a mix of two logs, or another log")
            if what == "old" and n in differs and p in seen_new:
                problems.append(f"{p}: the old log's bytes after the new ones were served")
            if what == "new":
                seen_new.add(p)
            else:
                done = False
            if old_root is not None:  # the old ship's name: never the new ship's bytes
                q = _event_path(old_root, n)
                last[q] = _classify(_read(q), old[n], new[n])
                if last[q] == "new" and n in differs:
                    problems.append(f"{q}: the new ship's event under the old ship's name")
        if not full:
            return done
        info = _info(new_root)
        if not isinstance(info, dict):
            last["info"] = info
            done = False
        for key, was, now in dated:  # since/until, where the two logs' differ
            got = info.get(key, "") if isinstance(info, dict) else ""
            p = f"info {key}"
            last[p] = "old" if was in got else "new" if now in got else got
            if last[p] == "old" and p in seen_new:
                problems.append(f"{new_root}/info: the old log's {key} after the new one")
            elif last[p] == "new":
                seen_new.add(p)
            elif got and last[p] != "old":
                problems.append(f"{new_root}/info: {key} {got}: another log's")
            done = done and last[p] == "new"
        try:
            listed = len(os.listdir(new_root / "events"))
        except OSError as e:
            listed = f"errno {errno.errorcode.get(e.errno, e.errno)}"
        if listed != EVENTS:
            last["ls events"] = listed
            done = False
        if fleet:
            names = set(os.listdir(case.mnt))
            last["listing"] = sorted(names)
            listed = patp(case.who_new) in names
            if renamed:  # the old name: listed while the fleet still holds that ship
                listed = listed and (patp(case.who_old) in names) == (case.aside == "kept")
            done = done and listed
            for root in {new_root, old_root} - {None}:  # a name serves its own ship
                info = _info(root)
                if isinstance(info, dict) and info.get("ship") != root.name:
                    problems.append(f"{root}/info says ship {info.get('ship')}: a name "
                                    "serving another ship")
        return done

    def report() -> dict:
        return {str(k).replace(str(case.mnt), "MNT"): v for k, v in last.items()
                if v != "new"}

    deadline = time.monotonic() + SETTLE
    settled = False
    full = False  # the events first: nothing but their own reads make the mount look
    while time.monotonic() < deadline and not problems:
        if look(full):
            if full:
                settled = True
                break
            full = True
            continue
        time.sleep(0.1)
    assert not problems, f"{case.id}: {problems[:3]}"
    assert settled, f"{case.id}: not all the new log's after {SETTLE} s: {report()}"
    assert look(True) and not problems, f"{case.id}: {problems[:3]} {report()}"  # stays so

    if fleet:  # the name shows the ship its directory now holds
        info = parse((new_root / "info").read_text())
        assert info["ship"] == patp(case.who_new)
        assert info["path"] == str(case.src)
    if renamed and case.aside == "kept":  # the old ship is served from where it went
        info = parse((old_root / "info").read_text())
        assert info["path"] == str(case.src) + ".old"
        for n in range(1, EVENTS + 1):
            assert _read(_event_path(old_root, n)) == old[n]
    # a file opened before: the new bytes or ESTALE/EIO; for a ship replaced by another
    # directory, its own (old) bytes are also right, the new ship's never
    for n, fd in case.held.items():
        got, failed = b"", None
        while len(got) < len(new[n]):  # a read may return less than asked: read on
            try:
                chunk = os.pread(fd, len(new[n]) - len(got), len(got))
            except OSError as e:
                failed = e
                break
            if not chunk:
                break
            got += chunk
        if failed is not None:  # ESTALE or EIO, and no byte of another log before it
            assert failed.errno in (errno.ESTALE, errno.EIO), (case.id, n, failed)
            right = old[n] if renamed else new[n]
            assert got == right[: len(got)] or (not renamed and n not in differs), (
                case.id, n, _classify(got, old[n], new[n]))
            continue
        if renamed:
            assert got == old[n], (case.id, n, _classify(got, old[n], new[n]))
        else:
            assert got == new[n] or n not in differs, (
                case.id, n, _classify(got, old[n], new[n]))


def _info(root: Path) -> dict | str:
    """``root/info`` parsed, or the error reading it gave."""
    try:
        return parse((root / "info").read_text())
    except OSError as e:
        return f"errno {errno.errorcode.get(e.errno, e.errno)}"


def _date_of(payload: bytes) -> str:
    """The @da text ``info`` shows for a payload made by :func:`event`."""
    from bookfs.noun import format_da, peek_event

    return format_da(peek_event(payload[4:])[0])


# --- the engines alone: what the mounts above rely on ------------------------------


def _pair(tmp_path: Path, layout: str, tail: str) -> tuple[Path, Path]:
    src = build(layout, tmp_path / "src", OLD, 0x100, tail)
    other = build(layout, tmp_path / "other", NEW, 0x100, tail)
    time.sleep(0.05)  # past the racy margin of the files' ctimes
    return src, other


@pytest.mark.parametrize("layout,tail", [("uip", "same"), ("vere", "same"),
                                         ("vere", "differs")])
def test_a_reader_sees_its_log_rewritten_in_place(tmp_path, layout, tail):
    """A read-only open (what a single mount's and an open fleet ship's follower hold),
    after ``book.log`` was rewritten in place with another log of the same size and
    mtime: its next ``refresh`` takes it as a new log (``generation`` grows, so the
    mount drops every cache) and reads the new bytes.  ``same``: the header and last
    deeds are the same bytes in both (only the ctime tells); vere ``differs``: the header
    slots have the same ``seq`` and ``las_d`` but another batch CRC."""
    from bookfs.formats.pier import open_source

    src, other = _pair(tmp_path, layout, tail)
    new = events(NEW, tail)
    with open_source(src) as book:
        book.refresh()
        generation = book.generation
        rewrite_in_place(replaced_file(layout, src), replaced_file(layout, other))
        book.refresh()
        assert book.generation != generation, "the rewrite was taken for the same log"
        assert [book.read(n) for n in range(1, EVENTS + 1)] == list(new.values())


@pytest.mark.parametrize("layout", ["uip", "vere", "pier"])
@pytest.mark.parametrize("tail", TAILS)
def test_a_log_rewritten_while_closed_does_not_continue(tmp_path, layout, tail):
    """What a fleet keeps of a ship it closes (``identity()``) and asks of the log it
    opens again (``continues()``): a log rewritten in place meanwhile (same size and
    mtime; ``same``: its header and last deeds the same bytes too) is not the log the
    token named, so the kernel's cached pages and names of it are dropped."""
    from bookfs.formats.pier import open_source

    src, other = _pair(tmp_path, layout, tail)
    with open_source(src) as book:
        token = book.identity()
    rewrite_in_place(replaced_file(layout, src), replaced_file(layout, other))
    with open_source(src) as book:
        assert not book.continues(token), "a log rewritten in place taken for the old one"
