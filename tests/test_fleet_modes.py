"""A fleet keeps each closed ship's modes (what every user of a class could do on disk,
``fs/nodes/base.py``) past ``REFRESH`` while the ship's witnesses pin them
(``fs/fleet/ship.py``, ``ShipFaces.modes``): a ``find`` over a fleet then computes them
once a ship, not once at the fleet's listing and again at the ship's.

The class is checked against a fresh computation: random changes to every node the modes
depend on (each file a ship's log is read from, its directories, the fleet's directory;
``chmod``, ``chown``, an ACL, a file added, a file replaced by a symbolic link), on a
Book directory, a pier and a ship reached through a symbolic link, with ``REFRESH`` at 0
so that only a pin can keep them.  The operations are driven directly, as the mount
calls them."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bookfs.formats.shipcard import looked, source_file
from bookfs.fs.fleet import ship as S
from bookfs.fs.fleet.ops import FleetOperations
from bookfs.fs.nodes import base
from lmdb_fixtures import make_pier, payloads
from mount_fixtures import build_sample

NOBODY = 65534
SETTLE = 0.03  # past the racy margin of a change (index.racy_margin: 20 ms)


def _fleet(root: Path) -> Path:
    """A fleet of a Book directory, a pier, and a ship that is a symbolic link to a Book
    directory outside the fleet; every node 0755/0644 of root."""
    fleet = root / "fleet"
    fleet.mkdir(parents=True)
    build_sample(fleet / "book", 5)
    make_pier(fleet / "pier", [("lmdb", payloads(1, 10)), ("book", payloads(11, 5))])
    build_sample(root / "elsewhere", 4, seed=1)
    (fleet / "linked").symlink_to("../elsewhere")  # (relative: a copy links to its own)
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return fleet


def _acl_denying(path: str, uid: int) -> None:
    raw = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in [
        (0x01, 7, 0xFFFFFFFF), (0x02, 0, uid), (0x04, 5, 0xFFFFFFFF),
        (0x10, 5, 0xFFFFFFFF), (0x20, 5, 0xFFFFFFFF)])
    os.setxattr(path, "system.posix_acl_access", raw)


def _change(fleet: Path, ship: str, how: str, pick: int, mode: int) -> None:
    """One change to the fleet on disk, of kind ``how`` (the node: ``pick``)."""
    path = fleet / ship
    nodes = [p for p in [fleet, path, *sorted(path.rglob("*"))]
             if not p.name.endswith(".lock") and ".bookfs" not in p.name]
    target = nodes[pick % len(nodes)]
    if how == "chmod":  # (a symbolic link: the file it names)
        os.chmod(target.resolve(), (mode | 0o700) if target.is_dir() else mode)
    elif how == "chown":
        os.chown(target, NOBODY, NOBODY, follow_symlinks=False)
    elif how == "acl" and not target.is_symlink():
        _acl_denying(str(target), NOBODY)
    elif how == "add":  # a file the modes are then read from, unreadable to others
        extra = (path / ".urb/log/data.mdb") if ship == "pier" else (path / "data.mdb")
        if not extra.exists():
            extra.write_bytes(b"")
        os.chmod(extra, 0o600)
    elif how == "symlink":  # meta.bin replaced by a link to a copy of another mode
        meta = next((p for p in nodes if p.name == "meta.bin" and not p.is_symlink()), None)
        if meta is not None:
            copy = fleet.parent / f"meta-{time.monotonic_ns()}.bin"
            shutil.copy(meta, copy)
            os.chmod(copy, mode)
            meta.unlink()
            meta.symlink_to(copy)


def _want(ops: FleetOperations, ship) -> tuple:
    """The modes computed afresh, nothing kept."""
    uid, gid, modes, _ = base.modes_of(source_file(ship.path), ship.path, True,
                                       owner=ops.owner, umask=ops.umask)
    return uid, gid, modes


CHANGES = st.lists(st.tuples(st.sampled_from(["book", "pier", "linked"]),
                             st.sampled_from(["chmod", "chown", "acl", "add", "symlink"]),
                             st.integers(0, 40), st.sampled_from([0o600, 0o640, 0o644, 0o604,
                                                                  0o700, 0o711, 0o755])),
                   min_size=1, max_size=6)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """One fleet, copied for each example (building one takes longer than copying it)."""
    root = tmp_path_factory.mktemp("modes")
    _fleet(root)
    return root


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=CHANGES)
@example(changes=[("book", "add", 0, 0o600), ("book", "chmod", 3, 0o644)])  # not witnessed
@example(changes=[("linked", "add", 0, 0o600)])  # in a directory reached through a link
@example(changes=[("book", "symlink", 0, 0o644), ("book", "chmod", 3, 0o600)])
def test_pinned_modes_always_equal_modes_computed_afresh(monkeypatch, template, changes):
    monkeypatch.setattr(S, "REFRESH", 0.0)  # only a pin keeps the modes
    monkeypatch.setattr(base, "REFRESH", 0.0)  # and every directory is looked at anew
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        shutil.copytree(template, root, symlinks=True, dirs_exist_ok=True)
        fleet = Path(root) / "fleet"
        ops = FleetOperations(str(fleet), str(Path(root) / "mnt"))
        ships = {s.name: s for s in ops._order}
        time.sleep(SETTLE)
        for s in ships.values():  # computed, and pinned
            assert ops.faces.modes(s, looked(s.path))[:3] == _want(ops, s)
        for name, how, pick, mode in changes:
            _change(fleet, name, how, pick, mode)
            for s in ships.values():  # at once: the change is never hidden by a pin
                assert ops.faces.modes(s, looked(s.path))[:3] == _want(ops, s), (name, how)
            time.sleep(SETTLE)
            for s in ships.values():  # settled: pinned anew, and still right
                assert ops.faces.modes(s, looked(s.path))[:3] == _want(ops, s), (name, how)


def test_a_walk_computes_a_ships_modes_once(tmp_path, monkeypatch):
    """The fleet's listing gives each ship root's modes; the ship's own listing, more
    than ``REFRESH`` later (a ``find`` of 1,000 ships takes about a second), uses them
    again while the witnesses pin them.  The old code computed them twice."""
    fleet = _fleet(tmp_path)
    ops = FleetOperations(str(fleet), str(tmp_path / "mnt"))
    time.sleep(SETTLE)
    calls = []
    real = S.modes_of
    monkeypatch.setattr(S, "modes_of", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    for s in ops._order:
        ops.faces.root(s)
    monkeypatch.setattr(S, "REFRESH", 0.0)  # "later": past REFRESH
    for s in ops._order:
        assert [name for name, _ in ops.faces.listing(s)]
    linked = str(fleet / "linked")  # a link among its witnesses: nothing pins it
    once = sorted(s.path for s in ops._order)
    assert sorted(calls) == sorted([*once, linked])
    os.chmod(fleet / "book" / "meta.bin", 0o600)  # a change: computed again, that ship only
    for s in ops._order:
        ops.faces.listing(s)
    assert sorted(calls) == sorted([*once, linked, str(fleet / "book"), linked])


def test_a_change_in_the_clock_tick_of_the_last_is_never_hidden(tmp_path, monkeypatch):
    """On a filesystem whose ctime is coarse, a ``chown`` in the same tick as the change
    before it leaves every witness as it was (a ``chown`` changes no mode bit).  Modes
    computed from witnesses that had not settled are never pinned by them.  Simulated:
    the witnesses' ctimes cut to 10 ms (this kernel's are finer)."""
    fleet = _fleet(tmp_path)
    meta = fleet / "book" / "meta.bin"
    os.chmod(meta, 0o600)  # the owner alone reads it: who owns it matters
    monkeypatch.setattr(S, "REFRESH", 0.0)
    monkeypatch.setattr(base, "REFRESH", 0.0)
    real, tick = S.looked, 10_000_000

    def coarse(path):
        seen, taken = real(path)
        if seen is not None:
            seen = tuple(None if w is None else (*w[:5], w[5] // tick * tick) for w in seen)
        return seen, taken

    monkeypatch.setattr(S, "looked", coarse)
    ops = FleetOperations(str(fleet), str(tmp_path / "mnt"))
    ship = next(s for s in ops._order if s.path.endswith("/book"))
    time.sleep(SETTLE)
    for _ in range(50):
        os.chown(meta, NOBODY, NOBODY)
        first = os.stat(meta).st_ctime_ns
        ops.faces.modes(ship, look=True)  # computed now, from unsettled witnesses
        os.chown(meta, 0, 0)
        if os.stat(meta).st_ctime_ns // tick == first // tick:  # within one tick
            break
    else:
        pytest.skip("no two changes fell within one 10 ms tick")
    assert ops.faces.modes(ship, look=True)[:3] == _want(ops, ship)
