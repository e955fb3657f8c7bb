"""``Looks`` (``fs/nodes/base.py``): the directories a fleet's ships share are looked at
once per ``REFRESH`` for all of them, and what it answers is what a fresh look answers
once ``REFRESH`` has passed (a ``chmod``, a link retargeted), so the fleet's modes follow
the disk as a single mount's do (``tests/test_access.py`` holds that through a mount)."""

from __future__ import annotations

import os

import pytest

from bookfs.fs.nodes import base as B


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(B.time, "monotonic", c)
    return c


def test_a_directory_is_looked_at_once_a_refresh_and_again_after(tmp_path, clock,
                                                                  monkeypatch):
    looks = B.Looks()
    d = tmp_path / "fleet"
    d.mkdir(mode=0o755)
    calls = []
    real_node = B.node
    monkeypatch.setattr(B, "node", lambda p: (calls.append(p), real_node(p))[1])
    first = looks.node(str(d))
    assert first == real_node(str(d)) and calls == [str(d)]
    os.chmod(d, 0o700)
    clock.now += B.REFRESH / 2
    assert looks.node(str(d)) == first and len(calls) == 1  # kept
    clock.now += B.REFRESH
    assert looks.node(str(d)) == real_node(str(d)) != first  # looked at again
    assert len(calls) == 2


def test_paths_resolve_as_realpath_does_links_retargeted_after_a_refresh(tmp_path, clock):
    looks = B.Looks()
    (tmp_path / "a" / "ship").mkdir(parents=True)
    (tmp_path / "b" / "ship").mkdir(parents=True)
    (tmp_path / "b" / "other").mkdir()
    os.symlink(tmp_path / "a", tmp_path / "fleet")
    os.symlink("other", tmp_path / "b" / "linked")
    for p in [tmp_path / "fleet" / "ship", tmp_path / "a" / "ship", tmp_path,
              tmp_path / "fleet", tmp_path / "b" / "linked", tmp_path / "b" / ".."]:
        assert looks.realpath(str(p)) == os.path.realpath(p), p
    os.unlink(tmp_path / "fleet")
    os.symlink(tmp_path / "b", tmp_path / "fleet")
    path = str(tmp_path / "fleet" / "ship")
    assert looks.realpath(path) == str(tmp_path / "a" / "ship")  # the parent's, kept
    clock.now += B.REFRESH
    assert looks.realpath(path) == os.path.realpath(path) == str(tmp_path / "b" / "ship")
    # the name itself is looked at every time
    os.symlink("other", tmp_path / "b" / "ship2")
    assert looks.realpath(str(tmp_path / "fleet" / "ship2")) == str(tmp_path / "b" / "other")


def test_many_logs_under_one_directory_share_its_looks(tmp_path, monkeypatch):
    from mount_fixtures import build_sample

    fleet = tmp_path / "fleet"
    for i in range(5):
        build_sample(fleet / f"s{i}", 3, seed=i)
    dirs = [str(fleet / f"s{i}") for i in range(5)]
    owners = [os.stat(os.path.join(d, "book.log")) for d in dirs]
    want = [B.source_bits(d, st.st_uid, st.st_gid) for d, st in zip(dirs, owners)]
    looks = B.Looks()
    calls: list[str] = []
    real_node = B.node
    monkeypatch.setattr(B, "node", lambda p: (calls.append(p), real_node(p))[1])
    assert [B.source_bits(d, st.st_uid, st.st_gid, looks=looks)
            for d, st in zip(dirs, owners)] == want
    shared = [c for c in calls if not c.startswith(str(fleet) + "/")]
    assert sorted(shared) == sorted({str(p) for p in [fleet, *fleet.parents]})  # once each
