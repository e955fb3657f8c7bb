"""Copying tools into ``new/`` (issue 33, item 3): each either succeeds, with the event
committed exactly once, byte for byte, or fails with nothing committed.  Never a
non-zero exit for a committed event (a user who retries would append it twice), and a
retry of a tool that succeeded fails, with nothing committed twice.

What each tool does after its last write (``strace -f -e trace=%file,%desc``):
``install`` sets the mode (``fchmodat``) and, with ``-p``/``-o``, owner and times by name
after its close; ``rsync --inplace`` ``stat``s the name after its close and sets mode,
times (``-t``, ``-a``) and extended attributes (``-X``) by name; ``shutil.copy2`` sets
times, mode and extended attributes by name; ``cp -p``/``-a``, ``tar -x``, ``mv`` set
them on the descriptor before its close; ``dd``, ``tee`` and a redirection set nothing.
So a name in ``new/`` whose event this mount just committed stays for a while, to its
writer's process only, as that event (``nodes/new.py``, ``Recent``): setting its mode, owner, times or extended
attributes succeeds and keeps nothing, a write or truncate is refused.  ``rsync`` without
``--inplace`` writes a temporary name first (``.N.XXXXXX``), refused at its create, and
``tar --xattrs`` creates with ``mknod``, refused: both fail before anything is
committed.  Through a real (checked) mount, with the real tools."""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import stat
import subprocess
import sys

import pytest
from mount_fixtures import (  # noqa: F401
    info_text, module_cache, mounted, next_number, noun_payload)

from bookfs.formats.book import Book

LINE = re.compile(r"^  \S+ \S+ \S+ (\S+) (\S+) pid \S+: (.*)$")
PY = sys.executable

#: name -> (shell command: {src} the payload, {dst} MNT/new/N, {new} MNT/new, {n} N,
#: {tmp} a scratch directory; whether it must succeed)
TOOLS = {
    "cp": ("cp {src} {dst}", True),
    "cp -p": ("cp -p {src} {dst}", True),
    "cp -a": ("cp -a {src} {dst}", True),
    "cp --preserve=all": ("cp --preserve=all {src} {dst}", True),
    "cp --preserve=xattr (a user xattr)": ("cp --preserve=xattr {src} {dst}", True),
    "mv": ("cp -p {src} {tmp}/mv.bin && mv {tmp}/mv.bin {dst}", True),
    "install": ("install {src} {dst}", True),
    "install -m 0644": ("install -m 0644 {src} {dst}", True),
    "install -p -o 0 -g 0": ("install -p -o 0 -g 0 {src} {dst}", True),
    "rsync --inplace": ("rsync --inplace {src} {dst}", True),
    "rsync -t --inplace": ("rsync -t --inplace {src} {dst}", True),
    "rsync -a --inplace": ("rsync -a --inplace {src} {dst}", True),
    "rsync -aX --inplace (a user xattr)": ("rsync -aX --inplace {src} {dst}", True),
    "rsync (temporary name)": ("rsync {src} {dst}", False),
    "rsync -a (temporary name)": ("rsync -a {src} {dst}", False),
    "tar -x": (("cp {src} {tmp}/{n} && tar -C {tmp} -cf {tmp}/a.tar {n} && "
                "tar -xf {tmp}/a.tar -C {new}"), True),
    "tar -xp": (("cp -p {src} {tmp}/{n} && tar -C {tmp} -cf {tmp}/a.tar {n} && "
                 "tar -xpf {tmp}/a.tar -C {new}"), True),
    "tar -x --xattrs (mknod)": (("cp -a {src} {tmp}/{n} && tar -C {tmp} --xattrs -cf "
                                 "{tmp}/a.tar {n} && tar --xattrs -xf {tmp}/a.tar -C {new}"),
                                False),
    "dd of=": ("dd if={src} of={dst} status=none", True),
    "dd bs=7 conv=fsync": ("dd if={src} of={dst} bs=7 conv=fsync status=none", True),
    "tee": ("tee {dst} < {src} > /dev/null", True),
    "cat >": ("cat {src} > {dst}", True),
    "cat >>": ("cat {src} >> {dst}", True),
    "python shutil.copy": ((f"{PY} -c 'import shutil, sys; shutil.copy(*sys.argv[1:])' "
                            "{src} {dst}"), True),
    "python shutil.copy2": ((f"{PY} -c 'import shutil, sys; shutil.copy2(*sys.argv[1:])' "
                             "{src} {dst}"), True),
}


@pytest.fixture(scope="module")
def src(tmp_path_factory, module_cache):  # noqa: F811
    path = tmp_path_factory.mktemp("tools") / "log"
    with Book.open(path, writable=True, create=True) as book:
        book.save(1, [noun_payload(b"the first event")])
    return path


@pytest.fixture(scope="module")
def m(src, tmp_path_factory):
    with mounted(src, tmp_path_factory.mktemp("mnt") / "m") as mp:
        yield mp


info = info_text


def refusals(mp, n: int) -> list[tuple[str, str]]:
    found = [LINE.match(x).groups() for x in info(mp).splitlines() if LINE.match(x)]
    return [(e, why) for path, e, why in found if path == f"new/{n}"]


def events_equal_to(mp, data: bytes) -> list[int]:
    """The numbers of every event of the log whose bytes are ``data``."""
    out = []
    for k in range(1, next_number(mp)):
        with open(f"{mp}/events/{k}", "rb") as f:
            if f.read() == data:
                out.append(k)
    return out


def payload_file(tmp_path, n: int) -> tuple[str, bytes]:
    """A payload file (a noun of random bytes, unique to the test) with a user xattr."""
    data = noun_payload(random.Random(f"tools {n} {tmp_path}").randbytes(2500))
    path = tmp_path / "payload.bin"
    path.write_bytes(data)
    os.chmod(path, 0o640)
    os.setxattr(path, "user.origin", b"a test")
    return str(path), data


def run(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize("name", list(TOOLS))
def test_a_tool_succeeds_once_or_commits_nothing(m, tmp_path, name):
    if shutil.which(name.split()[0]) is None and not name.startswith("python"):
        pytest.skip(f"{name.split()[0]} is not installed")
    cmd, succeeds = TOOLS[name]
    n = next_number(m)
    path, data = payload_file(tmp_path, n)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    line = cmd.format(src=path, dst=f"{m}/new/{n}", new=f"{m}/new", n=n, tmp=scratch)
    res = run(line)
    if not succeeds:
        assert res.returncode != 0, line
        assert next_number(m) == n, f"{line}: committed, yet the tool failed"
        assert events_equal_to(m, data) == []
        return
    assert res.returncode == 0, f"{line}: exit {res.returncode}: {res.stderr}"
    assert next_number(m) == n + 1
    assert events_equal_to(m, data) == [n]  # once, byte for byte
    # a retry (at once, while the name still answers the writer's process as the
    # committed event) is another process: its create is refused (EEXIST), and nothing
    # is committed a second time
    again = run(line)
    assert again.returncode != 0, f"{line}: a retry succeeded"
    assert next_number(m) == n + 1
    assert events_equal_to(m, data) == [n]


def test_rsync_temporary_name_says_use_inplace(m, tmp_path):
    n = next_number(m)
    path, _ = payload_file(tmp_path, n)
    assert run(f"rsync {path} {m}/new/{n}").returncode != 0
    found = [LINE.match(x).groups() for x in info(m).splitlines() if LINE.match(x)]
    temp = [(e, why) for p, e, why in found if re.fullmatch(rf"new/\.{n}\.\w{{6}}", p)]
    assert temp and temp[-1][0] == "EINVAL" and "use rsync --inplace" in temp[-1][1], found
    assert next_number(m) == n


def test_a_name_just_committed_is_the_event_read_only(m, tmp_path):
    """After its close, ``new/N`` is event N for a while: readable, its mode, owner,
    times and extended attributes set by name as no-ops (the log's mode stays), a write,
    a truncate or the opt-out refused; ``new/`` still lists as empty; nothing more is
    committed."""
    n = next_number(m)
    _, data = payload_file(tmp_path, n)
    dst = f"{m}/new/{n}"
    with open(dst, "wb") as f:
        f.write(data)
    st = os.stat(dst)
    events = os.stat(f"{m}/events/{n}")
    assert stat.S_ISREG(st.st_mode) and st.st_size == len(data)
    assert stat.S_IMODE(st.st_mode) == stat.S_IMODE(events.st_mode)  # the log's
    os.chmod(dst, 0o600)
    os.chown(dst, 0, 0)
    os.utime(dst, (1, 1))
    os.setxattr(dst, "user.other", b"x")
    assert stat.S_IMODE(os.stat(dst).st_mode) == stat.S_IMODE(events.st_mode)
    assert os.stat(dst).st_mtime_ns == st.st_mtime_ns
    with open(dst, "rb") as f:
        assert f.read() == data
    assert os.listdir(f"{m}/new") == []
    with pytest.raises(OSError) as e:
        os.open(dst, os.O_WRONLY)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(OSError) as e:
        os.truncate(dst, 0)
    assert e.value.errno == errno.EPERM
    with pytest.raises(OSError) as e:
        os.setxattr(dst, "user.bookfs.unchecked", b"1")
    assert e.value.errno == errno.EBUSY
    assert [x[0] for x in refusals(m, n)] == ["EEXIST", "EPERM"]
    assert "already committed" in refusals(m, n)[0][1]
    assert next_number(m) == n + 1 and events_equal_to(m, data) == [n]
    # to any other process the name is not there: its create reaches the daemon, which
    # refuses it as a taken number and records why
    res = run(f"stat {dst}; printf x > {dst}")
    assert "No such file" in res.stderr
    assert refusals(m, n)[-1][0] == "EEXIST"
    assert "already committed or in flight" in refusals(m, n)[-1][1]
    # the next number is unaffected
    with open(f"{m}/new/{n + 1}", "wb") as f:
        f.write(noun_payload(b"the next one"))
    assert next_number(m) == n + 2


def test_the_names_kept_are_few_and_expire(monkeypatch):
    """``Recent``: at most COMMITTED_KEPT names, each for COMMITTED_FOR seconds."""
    from bookfs.fs.nodes import new

    now = [1000.0]
    monkeypatch.setattr(new.time, "monotonic", lambda: now[0])
    r = new.Recent()
    for k in range(new.COMMITTED_KEPT + 10):
        r.add(str(k).encode(), k, (1 << 48) + k)
    assert r.named(b"0") is None and r.of_inode((1 << 48) + 9) is None
    assert r.named(b"10").number == 10
    assert r.of_inode((1 << 48) + 10) == (b"10", r.named(b"10"))
    now[0] += new.COMMITTED_FOR + 0.001
    assert r.named(b"10") is None and r.of_inode((1 << 48) + 10) is None
    r.add(b"7", 7, 1 << 50)
    assert r.named(b"7").inode == 1 << 50
