"""A mount never gives a user more than the source's own permissions give them (issue 33,
item 6): with ``-o allow_other``, along the whole path from ``/`` to each file a log is
read from, for every source kind (a Book log, a pier, an epoch of a pier, a fleet), with
a real second user (``nobody``), and while the source's modes change under the mount.

The rule (``fs/nodes/base.py``, ``surely`` and ``source_bits``; the README's
``allow_other`` paragraph) is also checked as a class against the kernel itself: random
owners, groups, modes and ACLs on a chain of directories, and for each of several users
(processes with those credentials) what the mount's modes would let them do must be
what the kernel lets them do on disk, or less; exactly that where every node has one
owner and group."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

from bookfs.formats.info import parse
from lmdb_fixtures import make_pier, payloads
from mount_fixtures import build_sample, force_unmount, mounted, small_src  # noqa: F401

NOBODY = 65534
EVENT1 = "events/000000000001"
_places = itertools.count()


@pytest.fixture
def place():
    """A directory every user can reach (pytest's own are root-only: 0700)."""
    d = Path(f"/tmp/bookfs-access-{os.getpid()}-{next(_places)}")
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    yield d
    for m in d.glob("**/mnt*"):
        force_unmount(m)
    shutil.rmtree(d, ignore_errors=True)


def open_up(root: Path) -> None:
    """Every directory under ``root`` 0755 and every file 0644, owned by root."""
    for dirpath, dirs, files in os.walk(root):
        os.chown(dirpath, 0, 0)
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chown(os.path.join(dirpath, f), 0, 0)
            os.chmod(os.path.join(dirpath, f), 0o644)


def nobody_reads(*paths) -> list[bool]:
    """Whether ``runuser -u nobody`` can read each of ``paths`` (a directory: list it)."""
    script = "".join(
        f"if {'ls' if p.endswith('/') else 'cat'} -- '{p}' >/dev/null 2>&1; "
        "then echo 1; else echo 0; fi\n" for p in map(str, paths))
    r = subprocess.run(["runuser", "-u", "nobody", "--", "/bin/bash", "-c", script],
                       capture_output=True, text=True, timeout=60, cwd="/", check=False)
    out = r.stdout.split()
    assert len(out) == len(paths), r.stderr
    return [x == "1" for x in out]


def through(mnt, *names) -> list[str]:
    """What a reader asks of a mount (or of a fleet's ship root): its root listed,
    an event, ``info`` and a meta field."""
    return [f"{mnt}/", f"{mnt}/{EVENT1}", f"{mnt}/info", f"{mnt}/meta/who", *names]


def wait_until(pred, timeout: float = 15.0) -> float | None:
    """Seconds until ``pred()`` held (None: not within ``timeout``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def set_acl(path, entries) -> None:
    """An access ACL on ``path``: ``entries`` of ``(tag, perm, id)`` (no setfacl here;
    the xattr as ``include/uapi/linux/posix_acl_xattr.h`` lays it out)."""
    raw = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    os.setxattr(path, "system.posix_acl_access", raw)


def acl_denying(path, uid: int) -> None:
    """``path`` keeps its 0755 for everyone but user ``uid``, who gets nothing."""
    set_acl(path, [(0x01, 7, 0xFFFFFFFF), (0x02, 0, uid), (0x04, 5, 0xFFFFFFFF),
                   (0x10, 5, 0xFFFFFFFF), (0x20, 5, 0xFFFFFFFF)])


# --- a Book log ----------------------------------------------------------------------------


def _chown_mod(path, uid, gid, mode):
    os.chown(path, uid, gid)
    os.chmod(path, mode)


#: how each case changes ``parent/src/{book.log, meta.bin}`` (all 0755/0644 of root before),
#: and whether nobody may then read through the mount
BOOK_CASES = {
    # the case: a readable log under a parent directory nobody cannot search
    "parent 0700": (lambda p, s: os.chmod(p, 0o700), False),
    "parent 0711 (search, no listing)": (lambda p, s: os.chmod(p, 0o711), True),
    "all readable": (lambda p, s: None, True),
    # nobody owns the parent, whose owner bits give nothing (others' would)
    "parent nobody's, 0075": (lambda p, s: _chown_mod(p, NOBODY, 0, 0o075), False),
    # nobody is in the parent's group, whose bits give nothing (others' would)
    "parent group nogroup, 0705": (lambda p, s: _chown_mod(p, 0, NOBODY, 0o705), False),
    # mode 0755, but an ACL entry that leaves nobody out
    "parent ACL user:nobody:---": (lambda p, s: acl_denying(p, NOBODY), False),
    # a directory of one uid holding a log of another
    "src root 0700, log nobody's": (lambda p, s: (os.chmod(s, 0o700), [
        _chown_mod(s / n, NOBODY, NOBODY, 0o600) for n in ("book.log", "meta.bin")]), False),
    "log nobody's 0600": (lambda p, s: [_chown_mod(s / n, NOBODY, NOBODY, 0o600)
                                        for n in ("book.log", "meta.bin")], True),
    "log 0600": (lambda p, s: os.chmod(s / "book.log", 0o600), False),
    # meta.bin feeds meta/ and info: unreadable on disk, nothing is read through the mount
    "meta.bin 0600": (lambda p, s: os.chmod(s / "meta.bin", 0o600), False),
}


@pytest.mark.parametrize("case", list(BOOK_CASES))
def test_a_book_log_is_read_through_the_mount_only_by_who_could_read_it(case, place,
                                                                         small_src):
    change, allowed = BOOK_CASES[case]
    parent, src = place / "parent", place / "parent" / "src"
    parent.mkdir()
    shutil.copytree(small_src, src)
    open_up(parent)
    change(parent, src)
    on_disk = nobody_reads(src / "book.log", src / "meta.bin")
    with mounted(src, place / "mnt", "-o", "allow_other") as mnt:
        seen = nobody_reads(*through(mnt))
        assert seen == [allowed] * 4, (case, seen)
        if allowed:
            assert all(on_disk)  # never more than on disk
        assert Path(mnt, EVENT1).read_bytes()  # root, as ever, reads
        if not allowed:  # the mount's root shows it: nothing for others
            assert stat.S_IMODE(os.stat(mnt).st_mode) & 0o007 == 0


def test_a_source_named_through_a_symlink_is_judged_where_it_lies(place, small_src):
    """``bookfs mount LINK MNT``, LINK in an open directory naming a log under a 0700
    one: the path that counts is the log's own (``/``, ..., the 0700 directory, ...)."""
    parent = place / "parent"
    parent.mkdir()
    shutil.copytree(small_src, parent / "src")
    open_up(parent)
    os.chmod(parent, 0o700)
    (place / "link").symlink_to(parent / "src")
    assert nobody_reads(place / "link" / "book.log") == [False]
    with mounted(place / "link", place / "mnt", "-o", "ro,allow_other") as mnt:
        assert nobody_reads(*through(mnt)) == [False] * 4
        assert Path(mnt, EVENT1).read_bytes()


def test_a_chmod_of_a_parent_while_mounted_is_followed(place, small_src):
    """A ``chmod`` (and back) of a directory above the log reaches the mount's users
    within about a second (``REFRESH`` plus the kernel's ``CHANGING`` attribute cache),
    also for a reader who looked at the files before (cached entries and attributes)."""
    parent, src = place / "parent", place / "parent" / "src"
    parent.mkdir()
    shutil.copytree(small_src, src)
    open_up(parent)
    with mounted(src, place / "mnt", "-o", "allow_other") as mnt:
        assert nobody_reads(*through(mnt)) == [True] * 4
        os.chmod(parent, 0o700)
        took = wait_until(lambda: nobody_reads(*through(mnt)) == [False] * 4)
        assert took is not None, "the mount still lets nobody read a log under a 0700 parent"
        assert nobody_reads(src / "book.log") == [False]
        os.chmod(parent, 0o755)
        assert wait_until(lambda: nobody_reads(*through(mnt)) == [True] * 4) is not None
        # a chown of the log to nobody, under a root-only directory: still nothing
        os.chmod(src, 0o700)
        for n in ("book.log", "meta.bin"):
            _chown_mod(src / n, NOBODY, NOBODY, 0o600)
        assert wait_until(lambda: nobody_reads(*through(mnt)) == [False] * 4) is not None


# --- a pier, and one of its epochs -----------------------------------------------------------


@pytest.fixture
def pier(place):
    root = make_pier(place / "pier", [("lmdb", payloads(1, 30)), ("book", payloads(31, 20))])
    open_up(place)
    return root


PIER_CASES = {
    "all readable": (None, True),
    ".urb 0700": (".urb", False),
    "the older epoch's directory 0700": (".urb/log/0i0", False),
    "the older epoch's data.mdb 0600": (".urb/log/0i0/data.mdb", False),
    "the newest epoch's book.log 0600": (".urb/log/0i30/book.log", False),
}


@pytest.mark.parametrize("case", list(PIER_CASES))
def test_a_pier_is_read_only_by_who_could_read_every_epoch(case, pier, place):
    closed, allowed = PIER_CASES[case]
    if closed is not None:
        os.chmod(pier / closed, 0o700 if (pier / closed).is_dir() else 0o600)
    with mounted(pier, place / "mnt", "-o", "allow_other") as mnt:
        assert nobody_reads(*through(mnt), f"{mnt}/epochs/0i30/events/31") == [allowed] * 5
        assert Path(mnt, EVENT1).read_bytes() == payloads(1, 1)[0]


@pytest.mark.parametrize("closed,allowed", [(None, True), (".urb", False),
                                            (".urb/log/0i30", False)])
def test_an_epoch_mounted_alone_follows_the_pier_path_above_it(closed, allowed, pier, place):
    if closed is not None:
        os.chmod(pier / closed, 0o700)
    epoch = pier / ".urb/log/0i30"
    with mounted(epoch, place / "mnt", "-o", "allow_other") as mnt:
        assert nobody_reads(f"{mnt}/", f"{mnt}/events/31", f"{mnt}/info") == [allowed] * 3
        assert nobody_reads(epoch / "book.log") == [allowed]


# --- a fleet ---------------------------------------------------------------------------------


def test_a_fleet_gives_each_ship_only_to_who_could_read_it(place):
    """The fleet's directory 0700 (its root shows nothing to others), then open: a ship
    readable on disk is readable; a ship directory 0700 of root holding nobody's files,
    a ship whose files are root's 0600, and a directory holding no log (an error file)
    under 0700 are not; then the fleet's directory 0700 again, followed."""
    fleet = place / "fleet"
    fleet.mkdir()
    for i in range(3):
        build_sample(fleet / f"s{i}", 5, seed=i)
    (fleet / "junk").mkdir()
    (fleet / "junk" / "notes.txt").write_text("a secret note\n")
    open_up(fleet)
    for n in ("book.log", "meta.bin"):
        _chown_mod(fleet / "s1" / n, NOBODY, NOBODY, 0o644)
    os.chmod(fleet / "s1", 0o700)
    for n in ("book.log", "meta.bin"):
        os.chmod(fleet / "s2" / n, 0o600)
    os.chmod(fleet / "junk", 0o700)
    os.chmod(fleet, 0o700)
    with mounted(fleet, place / "mnt", "--fleet", "-o", "allow_other") as mnt:
        names = {parse(Path(mnt, s, "info").read_text())["path"]: s
                 for s in os.listdir(mnt) if s != "junk"}
        ship = {Path(p).name: f"{mnt}/{s}" for p, s in names.items()}
        assert set(ship) == {"s0", "s1", "s2"}
        assert os.path.isfile(f"{mnt}/junk")
        every = [f"{mnt}/", f"{mnt}/.bookfs-fleet", f"{mnt}/junk",
                 *(p for s in ("s0", "s1", "s2") for p in through(ship[s]))]
        assert nobody_reads(*every) == [False] * len(every)
        assert stat.S_IMODE(os.stat(mnt).st_mode) & 0o007 == 0

        os.chmod(fleet, 0o755)
        want = [True, True, False, *[True] * 4, *[False] * 8]
        assert wait_until(lambda: nobody_reads(*every) == want) is not None, \
            nobody_reads(*every)
        for s in ("s0", "s1", "s2"):  # never more than on disk
            if nobody_reads(ship[s] + "/" + EVENT1)[0]:
                assert nobody_reads(fleet / s / "book.log", fleet / s / "meta.bin") == [True] * 2
        assert nobody_reads(fleet / "junk" / "notes.txt") == [False]

        os.chmod(fleet, 0o700)
        assert wait_until(lambda: nobody_reads(*every) == [False] * len(every)) is not None


# --- the rule as a class, against the kernel ---------------------------------------------------

_CHECKER = r"""
import os, sys
for line in sys.stdin:
    how, path = line.rstrip("\n").split(" ", 1)
    try:
        os.close(os.open(path, os.O_RDONLY if how == "r" else os.O_WRONLY))
        print(1, flush=True)
    except OSError:
        print(0, flush=True)
"""


#: a Python every user can run (this venv's may lie under root's private directory)
SYSTEM_PYTHON = "/usr/bin/python3"


class Checker:
    """A process with credentials ``(uid, gid, groups)`` that tries opens for us: the
    kernel's own answer for that user."""

    def __init__(self, uid: int, gid: int, groups: list[int]):
        self.uid, self.groups = uid, {gid, *groups}

        def drop():
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)

        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-I", "-c", _CHECKER], cwd="/",
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, preexec_fn=drop)

    def can(self, how: str, path) -> bool:
        self.proc.stdin.write(f"{how} {path}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip() == "1"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def _mount_lets(uid: int, gid: int, modes, who: Checker, what: str) -> bool:
    """What ``default_permissions`` lets ``who`` do to a file of the mount (``what``:
    ``r`` read an event, ``w`` write a meta field) given the owner, group and modes it
    shows: search on the root and its directory (``modes.dir``), then the file's bit
    (``fs/namei.c``, ``acl_permission_check``: owner, else group, else other)."""
    cls = 6 if who.uid == uid else 3 if gid in who.groups else 0
    bits, need = (modes.meta, 2) if what == "w" else (modes.read, 4)
    return bool((modes.dir >> cls) & 1 and (bits >> cls) & need)


def test_the_rule_never_gives_more_than_the_kernel(place):
    """200 random states of ``a/b/{book.log, meta.bin}`` (owners and groups among root,
    daemon and nobody; any mode; an ACL now and then): for users of every class
    (nobody, nobody with daemon's group, daemon, daemon with nogroup, a user of neither)
    the modes a mount of ``b`` would show (``modes_of``, read-write) let them read or
    write only what the kernel lets them on disk; exactly that where all four share one
    owner and group and have no ACL."""
    from bookfs.fs.nodes.base import modes_of

    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the other users")
    rng = random.Random(33)
    a, b = place / "a", place / "a" / "b"
    b.mkdir(parents=True)
    log, meta = b / "book.log", b / "meta.bin"
    log.write_bytes(b"x")
    meta.write_bytes(b"y")
    users = [Checker(NOBODY, NOBODY, []), Checker(NOBODY, NOBODY, [1]), Checker(1, 1, []),
             Checker(1, 1, [NOBODY]), Checker(4242, 4242, [])]
    exact = checked = 0
    try:
        for _ in range(200):
            ids = [0, 1, NOBODY]
            uniform = rng.random() < 0.3
            owner = (rng.choice(ids), rng.choice(ids))
            acl = False
            for path in (a, b, log, meta):
                uid, gid = owner if uniform else (rng.choice(ids), rng.choice(ids))
                bits = rng.randrange(0o1000)
                if path.is_dir() and rng.random() < 0.6:
                    bits |= 0o111  # mostly searchable, so that the files matter
                if not path.is_dir() and rng.random() < 0.6:
                    bits |= 0o444
                os.chown(path, uid, gid)
                os.chmod(path, bits)
                with_acl = not uniform and rng.random() < 0.15
                if with_acl:
                    mask = rng.randrange(8)
                    set_acl(path, [(0x01, bits >> 6 & 7, 0xFFFFFFFF),
                                   (0x02, rng.randrange(8), rng.choice([1, NOBODY])),
                                   (0x04, bits >> 3 & 7, 0xFFFFFFFF), (0x10, mask, 0xFFFFFFFF),
                                   (0x20, bits & 7, 0xFFFFFFFF)])
                    acl = True
            st = os.stat(log)
            uid, gid, modes, _ = modes_of(str(log), str(b), False)
            assert (uid, gid) == (st.st_uid, st.st_gid)
            for who in users:
                disk_read = who.can("r", log) and who.can("r", meta)
                disk_write = who.can("w", log)
                mount_read = _mount_lets(uid, gid, modes, who, "r")
                mount_write = _mount_lets(uid, gid, modes, who, "w")
                state = [(oct(os.stat(p).st_mode), os.stat(p).st_uid, os.stat(p).st_gid)
                         for p in (a, b, log, meta)]
                assert not mount_read or disk_read, (who.uid, who.groups, state, acl)
                assert not mount_write or disk_write, (who.uid, who.groups, state, acl)
                if uniform and not acl:  # (a class that cannot read reaches no file)
                    assert mount_read == disk_read, (who.uid, who.groups, state)
                    assert mount_write == (disk_write and disk_read), (who.uid, state)
                    exact += 1
                checked += 1
            for path in (a, b, log, meta):  # (no ACL left for the next state)
                try:
                    os.removexattr(path, "system.posix_acl_access")
                except OSError:
                    pass
    finally:
        for who in users:
            who.close()
    assert exact > 100 and checked == 1000
