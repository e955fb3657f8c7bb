"""Mounting like every other FUSE filesystem (issue 11): ``mount -t fuse.bookfs``, an fstab
line, mount.fuse3's calling form ``bookfs SRC MNT -o OPTS``, standard options passed to
FUSE or accepted, ``uid=``/``gid=``/``umask=``, ``bookfs umount -l``, and the index cache
(``--index-dir``, ``--no-index-cache``, pruning).

mount(8) strips PATH (and HOME, SHELL) from the helper's environment, so the
``/bin/sh -c 'bookfs ...'`` that mount.fuse3 runs searches only sh's default PATH
(``/usr/local/sbin:/usr/local/bin:...``).  The tests that go through mount(8) therefore
run in a private mount namespace (``unshare --mount``) in which a temp directory holding a
``bookfs`` wrapper is bind-mounted over ``/usr/local/sbin``: the real system is never
touched, and everything else (mount(8), mount.fuse3, /bin/sh, FUSE) is the real thing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bookfs.formats import index as index_mod
from bookfs.formats.book import Book
from bookfs.formats.lock import WriterLock, lock_path_for
from mount_fixtures import in_mountinfo, mnt, small_src, wait_for  # noqa: F401
from mounting import BOOKFS, daemon_pid, mounted, noun, proc_gone, run_bookfs

REPO = Path(__file__).resolve().parent.parent
EVENT1 = "events/000000000001"
TIMEOUT = 60


def one_line_error(res: subprocess.CompletedProcess, code: int) -> str:
    """Assert ``res`` failed with ``code`` and one stderr line, no traceback; return it."""
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def mountinfo_line(path) -> str:
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return next(line for line in f if line.split()[4] == path)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    return not proc_gone(pid)


def event_sha(src: Path, event: int) -> str:
    with Book.open(src) as book:
        return hashlib.sha256(book.read(event)).hexdigest()


@pytest.fixture
def open_dir() -> Path:
    """A temp directory every user can search (pytest's are 0700), for mount points that
    another uid must reach."""
    d = Path(tempfile.mkdtemp(prefix="bookfs-habits-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for sub in d.iterdir():
        if in_mountinfo(sub):
            subprocess.run(["fusermount3", "-u", "-z", str(sub)], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


# --- mount(8), mount.fuse3 and fstab, in a private mount namespace ---------------------------


def _default_path_dir() -> str | None:
    for d in ("/usr/local/sbin", "/usr/local/bin"):  # first in sh's default PATH
        if os.path.isdir(d):
            return d
    return None


@pytest.fixture
def in_namespace(tmp_path):
    """``run(script) -> CompletedProcess``: run a sh script in a private mount namespace
    where ``bookfs`` (a wrapper running this checkout with ``sys.executable``) is on sh's
    default PATH, as a symlink in /usr/local/bin would be for a real user."""
    target = _default_path_dir()
    if shutil.which("unshare") is None or target is None or subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare --mount (root) and /usr/local/{s,}bin")
    bindir = tmp_path / "venv" / "bin"  # shaped like a virtualenv, for BOOKFS_VENV
    bindir.mkdir(parents=True)
    wrapper = bindir / "bookfs"
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    wrapper.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH='{pythonpath}' BOOKFS_CACHE_DIR='{os.environ['BOOKFS_CACHE_DIR']}' "
        f"BOOKFS_LOG_DIR='{tmp_path / 'logs'}' exec '{sys.executable}' -m bookfs.cli \"$@\"\n")
    wrapper.chmod(0o755)

    def run(script: str, bind: bool = True) -> subprocess.CompletedProcess:
        """``bind=False``: the script puts ``bookfs`` in place itself."""
        setup = (f"mount --bind '{bindir}' '{target}'\nexport PATH='{target}':\"$PATH\"\n"
                 if bind else "")
        full = f"set -eu\n{setup}{script}\n"
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               full], capture_output=True, text=True, timeout=TIMEOUT)

    return run


def test_mount_t_fuse_bookfs_reads_an_event(in_namespace, small_src, tmp_path):
    """`mount -t fuse.bookfs SRC MNT -o ro` goes mount(8) -> /sbin/mount.fuse3 -> sh ->
    `bookfs SRC MNT -o ro,dev,suid`, mounts read-only, serves the event byte for byte,
    and `umount` (util-linux) unmounts it."""
    m = tmp_path / "m"
    m.mkdir()
    res = in_namespace(f"""
trap 'umount -l {m} 2>/dev/null || true' EXIT
mount -t fuse.bookfs {small_src} {m} -o ro
grep " {m} " /proc/self/mountinfo
sha256sum {m}/{EVENT1}
umount {m}
grep -q " {m} " /proc/self/mountinfo && echo still || echo gone
""")
    assert res.returncode == 0, res.stderr
    info, digest, gone = res.stdout.strip().splitlines()[-3:]
    assert " - fuse.bookfs bookfs:" + str(small_src) in info
    assert info.split()[5].split(",")[0] == "ro"
    assert digest.split()[0] == event_sha(small_src, 1)
    assert gone.endswith("gone")


def test_install_mount_helper_lets_mount_find_bookfs(in_namespace, small_src, tmp_path):
    """The documented set-up step, mount_scripts/install-mount-helper.sh, links the venv's
    bookfs into /usr/local/bin (here a private tmpfs), after which mount(8) finds it."""
    m = tmp_path / "m"
    m.mkdir()
    res = in_namespace(f"""
mount -t tmpfs none /usr/local/bin
trap 'umount -l {m} 2>/dev/null || true' EXIT
BOOKFS_VENV={tmp_path / "venv"} bash {REPO}/mount_scripts/install-mount-helper.sh
BOOKFS_VENV={tmp_path / "venv"} bash {REPO}/mount_scripts/install-mount-helper.sh
readlink /usr/local/bin/bookfs
mount -t fuse.bookfs {small_src} {m} -o ro,nodev
sha256sum {m}/{EVENT1}
umount {m}
""", bind=False)
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip().splitlines()
    script = f"{tmp_path}/venv/bin/bookfs"
    assert out[0] == out[1] == f"install-mount-helper: /usr/local/bin/bookfs -> {script}"
    assert out[2] == script
    assert out[-1].split()[0] == event_sha(small_src, 1)


def test_fstab_line_with_standard_options(in_namespace, small_src, open_dir):
    """An fstab line (util-linux's `mount -T FILE MNT`, so /etc/fstab is never touched)
    with fstab bookkeeping, kernel flags, allow_other and uid/gid/umask: the mount works,
    stat shows the chosen owner and 0777 & ~027 cut to read-only modes, the flags reach
    the kernel, and the kernel enforces the modes for other users (allow_other)."""
    m = open_dir / "m"
    m.mkdir()
    fstab = open_dir / "fstab"
    opts = ("ro,noauto,nodev,nosuid,noatime,_netdev,nofail,x-systemd.automount,"
            "uid=1234,gid=1234,umask=027,allow_other")
    fstab.write_text(f"# a test fstab\n{small_src} {m} fuse.bookfs {opts} 0 0\n")
    res = in_namespace(f"""
trap 'umount -l {m} 2>/dev/null || true' EXIT
mount -T {fstab} {m}
grep " {m} " /proc/self/mountinfo
stat -c '%u %g %a %n' {m} {m}/events {m}/{EVENT1} {m}/new {m}/meta/who
sha256sum {m}/{EVENT1}
setpriv --reuid=1234 --regid=1234 --clear-groups cat {m}/{EVENT1} | sha256sum
setpriv --reuid=4321 --regid=4321 --clear-groups cat {m}/{EVENT1} 2>&1 || echo refused
bookfs umount {m}
""")
    assert res.returncode == 0, res.stderr
    said, *out = res.stdout.strip().splitlines()
    assert said.startswith(f"bookfs: mounted {small_src} at {m} (read-only;")
    info = out[0]
    flags, super_opts = info.split()[5].split(","), info.split(" - ")[1].split()[2]
    assert {"ro", "nodev", "nosuid", "noatime"} <= set(flags)
    assert "allow_other" in super_opts
    modes = {line.split()[3]: line.split()[:3] for line in out[1:6]}
    assert modes[str(m)] == ["1234", "1234", "550"]
    assert modes[f"{m}/events"] == ["1234", "1234", "550"]
    assert modes[f"{m}/{EVENT1}"] == ["1234", "1234", "440"]
    assert modes[f"{m}/new"] == ["1234", "1234", "550"]  # read-only: no write bits
    assert modes[f"{m}/meta/who"] == ["1234", "1234", "440"]
    digest = event_sha(small_src, 1)
    assert out[6].split()[0] == digest
    assert out[7].split()[0] == digest  # the owner reads it
    assert "Permission denied" in out[8] and out[9] == "refused"  # others may not
    assert out[10].startswith("bookfs: unmounted")


# --- the calling form and options, directly ------------------------------------------------


def test_calling_form_without_subcommand(small_src, mnt):
    """`bookfs SRC MNT -o ro,dev,suid` (what mount.fuse3 runs) is `bookfs mount`."""
    res = run_bookfs(str(small_src), str(mnt), "-o", "ro,dev,suid", check=False)
    assert res.returncode == 0, res.stderr
    try:
        assert "read-only" in res.stdout
        assert hashlib.sha256((mnt / EVENT1).read_bytes()).hexdigest() == event_sha(small_src, 1)
        assert mountinfo_line(mnt).split()[5].startswith("ro")
    finally:
        res = run_bookfs("umount", str(mnt), check=False)
    assert res.returncode == 0, res.stderr


def test_calling_form_only_for_paths(small_src, tmp_path):
    """A mistyped subcommand is still argparse's usage error, not a mount attempt; a
    relative source that exists takes the calling form."""
    res = run_bookfs("infoo", str(small_src), check=False)
    assert res.returncode == 2 and "invalid choice: 'infoo'" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_bookfs("small", "no-such-mountpoint", cwd=small_src.parent, check=False)
    line = one_line_error(res, 2)
    assert line.startswith("bookfs mount: ") and "not a directory" in line


def test_standard_options_pass_through_or_are_accepted(small_src, mnt):
    """Kernel flags go to FUSE and show in mountinfo; fstab bookkeeping, nonempty and the
    atime variants libfuse lacks are accepted; -o may be repeated."""
    (mnt / "leftover").write_text("a non-empty mount point")
    opts = ("nodev,nosuid,noexec,noatime,sync,dirsync,nonempty,defaults,auto,users,_netdev,"
            "nofail,x-systemd.requires=foo,comment=x,relatime,nodiratime")
    with mounted(small_src, mnt, "-o", "ro", "-o", opts):
        info = mountinfo_line(mnt)
        flags = set(info.split()[5].split(","))
        assert {"ro", "nodev", "nosuid", "noexec", "noatime"} <= flags
        super_opts = info.split(" - ")[1].split()[2].split(",")
        assert {"sync", "dirsync"} <= set(super_opts)
        assert (mnt / EVENT1).stat().st_size > 0


def test_rw_mount_umask_gives_write_bits_only_where_allowed(small_src, mnt):
    """uid/gid/umask on a read-write mount: new/ and meta/ get the write bits the umask
    leaves, events stay read-only; names work for uid/gid."""
    with mounted(small_src, mnt, "-o", "uid=4242,gid=root,umask=007"):
        st = {p: os.stat(mnt / p) for p in ("", "new", "meta/life", EVENT1)}
        assert {(s.st_uid, s.st_gid) for s in st.values()} == {(4242, 0)}
        assert stat.S_IMODE(st[""].st_mode) == 0o550
        assert stat.S_IMODE(st["new"].st_mode) == 0o770
        assert stat.S_IMODE(st["meta/life"].st_mode) == 0o660
        assert stat.S_IMODE(st[EVENT1].st_mode) == 0o440


@pytest.mark.parametrize("opts, expected", [
    ("stall_timeout=abc", "stall_timeout='abc': expected a positive number of seconds"),
    ("stall_timeout", "needs a value"),
    ("stall_timeout=-1", "positive number"),
    ("segment_mb=0", "expected a positive number of MiB"),
    ("segment_mb=nan", "expected a positive number of MiB"),
    ("umask=999", "expected an octal mask"),
    ("uid=no-such-user-here", "expected a numeric uid or a user name"),
    ("gid=no-such-group-here", "expected a numeric gid or a group name"),
    ("uid=4294967295", "expected an id from 0 to 4294967294"),
    ("ro,rw", "contradict"),
    ("ro=1", "'ro' takes no value"),
    ("noindex_cache=yes", "takes no value"),
    ("noindex_cache,index_dir=/tmp/x", "contradict"),
    ("subtype=other", "always bookfs"),
    # issue 23.3: caught before the log is opened (FUSE refused them after, exit 1), and
    # max_read ended the mount at once (libfuse: "init() and fuse_session_new() requested
    # different maximum read size"), so it is refused
    ("max_read=abc", "'max_read=abc' is not supported"),
    ("max_read=65536", "'max_read=65536' is not supported"),
    ("blksize=big", "expected blksize=N, N a number of bytes"),
])
def test_bad_bookfs_option_is_one_line_usage_error(small_src, mnt, opts, expected):
    res = run_bookfs("mount", str(small_src), str(mnt), "-o", opts, check=False)
    line = one_line_error(res, 2)
    assert line.startswith("bookfs mount: ") and expected in line
    assert not in_mountinfo(mnt)


def test_option_fuse_refuses_is_named(small_src, mnt):
    """An option neither bookfs nor FUSE knows: one line naming it, not libfuse's
    'fuse_session_new failed'; nothing mounted."""
    res = run_bookfs(str(small_src), str(mnt), "-o", "ro,nodev,frobnicate,x-ok", check=False)
    line = one_line_error(res, 2)
    assert "FUSE does not accept the mount option(s) frobnicate;" in line
    assert "fuse_session_new" not in line
    assert not in_mountinfo(mnt)


def test_source_with_comma_keeps_its_fsname(tmp_path, small_src, mnt):
    """libfuse splits -o at commas: the fsname naming a source with a comma is escaped,
    and bookfs umount still finds the source (and waits for its lock)."""
    src = tmp_path / "a,b"
    shutil.copytree(small_src, src)
    with mounted(src, mnt):
        assert f" - fuse.bookfs bookfs:{src} " in mountinfo_line(mnt)
        res = run_bookfs("umount", str(mnt), check=False)
        assert res.returncode == 0, res.stderr
        assert not WriterLock.is_held(lock_path_for(str(src)))


# --- umount -l -------------------------------------------------------------------------------


HOLDER = """
import os, sys
os.chdir(sys.argv[1])
f = open(sys.argv[2], "rb")
print("ready", flush=True)
sys.stdin.readline()
print(len(f.read()), flush=True)
"""


@pytest.mark.parametrize("where,name", [("meta", "who"), ("events", "000000000001")])
def test_umount_lazy_detaches_busy_mount_then_daemon_exits(small_src, mnt, where, name):
    """A process with a file open and its cwd inside a read-write mount: plain umount is
    refused (one line, exit 1, naming the holder); umount -l detaches at once and the
    process reads on.  Held in meta/ (the read-write connection), the daemon keeps
    serving the open file and holding the writer lock until the process lets go.  Held in
    events/ (the read-only companion's, fs/daemon/companion.py), the companion serves it and the
    read-write daemon, with nothing of its own held, exits and frees the lock at once."""
    lock = lock_path_for(str(small_src))
    with mounted(small_src, mnt):
        pid = daemon_pid(mnt)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(mnt / where), name],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "ready"
            line = one_line_error(run_bookfs("umount", str(mnt), check=False), 1)
            assert "busy" in line and "bookfs umount -l" in line
            # issue 23.3: and who holds it (the holder's cwd, then its open file)
            assert f"held by pid {holder.pid} (python: working directory {where})" in line, line
            res = run_bookfs("umount", "-l", str(mnt), check=False)
            assert res.returncode == 0, res.stderr
            assert "detached" in res.stdout
            assert not in_mountinfo(mnt)
            time.sleep(0.3)
            if where == "meta":
                assert alive(pid) and WriterLock.is_held(lock)
            else:
                assert wait_for(lambda: not alive(pid), timeout=15)
                assert not WriterLock.is_held(lock)
            holder.stdin.write("read\n")
            holder.stdin.flush()
            with Book.open(small_src) as book:
                want = len(book.meta()["who"]) if where == "meta" else len(book.read(1))
                assert int(holder.stdout.readline()) == want
        finally:
            holder.stdin.close()
            holder.wait(timeout=10)
        assert wait_for(lambda: not alive(pid), timeout=15)
        assert not WriterLock.is_held(lock)
        with Book.open(small_src, writable=True) as book:  # the lock is really free
            assert book.count == 10


def test_umount_refuses_what_is_not_a_bookfs_mount(tmp_path):
    line = one_line_error(run_bookfs("umount", str(tmp_path), check=False), 2)
    assert "nothing is mounted there" in line
    line = one_line_error(run_bookfs("umount", "-l", "/proc", check=False), 2)
    assert "a proc mount, not bookfs" in line
    assert in_mountinfo("/proc")


def test_help_lists_option_classes_and_lazy():
    out = run_bookfs("mount", "--help").stdout
    for heading in ("bookfs's own:", "implemented by bookfs", "passed to FUSE as given",
                    "accepted and ignored", "stall_timeout", "umask", "noindex_cache"):
        assert heading in out
    assert "/tmp/bookfs-<pid>.log" not in out and "~/.local/state/bookfs/log" in out
    assert "--lazy" in run_bookfs("umount", "--help").stdout


# --- the index cache -------------------------------------------------------------------------


def fake_index(directory: Path, k: int, age_days: float, magic: bytes = b"BFSIDX02",
               size: int = 72) -> Path:
    """An index-shaped file of ``size`` bytes (sparse past its magic), used ``age_days``
    ago."""
    p = directory / (hashlib.sha256(str(k).encode()).hexdigest()[:40] + ".idx")
    p.write_bytes(magic + bytes(64))
    os.truncate(p, size)
    t = time.time() - age_days * 86400
    os.utime(p, (t, t))
    return p


def idx_files(d: Path) -> set[Path]:
    return set(d.glob("*.idx"))


def test_prune_keeps_newest_and_leaves_foreign_files(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    ours = [fake_index(d, k, age_days=k * 0.5) for k in range(index_mod.INDEX_KEEP + 6)]
    stale_recent = fake_index(d, 1000, age_days=index_mod.INDEX_MAX_AGE / 86400 + 1)
    old_v1 = fake_index(d, 1001, age_days=200, magic=b"BFSIDX01")
    lookalike = fake_index(d, 1002, age_days=200, magic=b"NOTOURS!")  # our name, not ours
    foreign = d / "notes.txt"
    foreign.write_text("mine")
    os.utime(foreign, (0, 0))
    outside = fake_index(tmp_path, 1003, age_days=300)
    link = d / ("f" * 40 + ".idx")
    link.symlink_to(outside)
    os.utime(link, (0, 0), follow_symlinks=False)
    deleted = set(map(Path, index_mod.prune_cache(str(d), budget=0)))
    # the newest INDEX_KEEP of ours survive, except those older than INDEX_MAX_AGE
    keep = {p for p in ours[: index_mod.INDEX_KEEP]}
    assert deleted == (set(ours) - keep) | {stale_recent, old_v1}
    assert idx_files(d) - {lookalike, link} == keep
    assert lookalike.exists() and foreign.exists() and link.is_symlink() and outside.exists()


def test_prune_removes_the_temporary_files_of_saves_cut_short_once_old(tmp_path):
    """A process killed mid-save (a fleet's card builder stopped at unmount, a daemon
    killed) leaves its temporary file: pruned once TEMP_MAX_AGE old, never a fresh one
    (a save in progress), nor a file not named as ours."""
    d = tmp_path / "cache"
    d.mkdir()
    names = [".tmp-ab3_9xyz", ".tmp-00000000", ".tmp-fresh123", ".tmp-short", "x.tmp-abcdefgh"]
    for name in names:
        (d / name).write_bytes(b"partial")
    old = time.time() - index_mod.TEMP_MAX_AGE - 60
    for name in (".tmp-ab3_9xyz", ".tmp-00000000", ".tmp-short", "x.tmp-abcdefgh"):
        os.utime(d / name, (old, old))
    index_mod.prune_cache(str(d))
    assert sorted(os.listdir(d)) == [".tmp-fresh123", ".tmp-short", "x.tmp-abcdefgh"]


def test_prune_keeps_small_indexes_within_the_budget(tmp_path):
    """Beyond the INDEX_KEEP newest, indexes stay while the directory is within
    INDEX_BUDGET bytes: a fleet's thousand small indexes survive another process's prune
    (they were cut to 64, and each ship's index was built again at its next open), and
    large ones beyond the budget go, oldest first."""
    d = tmp_path / "cache"
    d.mkdir()
    small = [fake_index(d, k, age_days=1 + k / 1000, size=20_000) for k in range(1000)]
    assert index_mod.prune_cache(str(d)) == []
    assert idx_files(d) == set(small)
    big = index_mod.INDEX_BUDGET // 8  # sparse: no disk used
    large = [fake_index(d, 5000 + k, age_days=k / 1000, size=big)
             for k in range(index_mod.INDEX_KEEP + 4)]
    deleted = set(map(Path, index_mod.prune_cache(str(d))))
    # the INDEX_KEEP newest (large) stay whatever their size; every older one, large or
    # small, is past the budget (the 8 newest large ones fill it)
    assert idx_files(d) == set(large[: index_mod.INDEX_KEEP])
    assert deleted == set(large[index_mod.INDEX_KEEP:]) | set(small)


def test_a_save_prunes_and_a_load_touches(make_book, tmp_path, cache_dir):
    src = make_book([40, 50, 60])  # its index is in cache_dir
    (idx,) = idx_files(cache_dir)
    os.utime(idx, (1, time.time() - 10 * 86400))
    d = tmp_path / "ix"
    d.mkdir()
    # large enough that INDEX_KEEP of them are past INDEX_BUDGET (sparse: no disk used)
    big = index_mod.INDEX_BUDGET // (index_mod.INDEX_KEEP - 1) + 1
    others = [fake_index(d, k, age_days=1 + k / 100, size=big)
              for k in range(index_mod.INDEX_KEEP + 3)]
    res = run_bookfs("info", str(src), "--index-dir", str(d), check=False)
    assert res.returncode == 0, res.stderr
    files = idx_files(d)
    assert len(files) == index_mod.INDEX_KEEP
    assert idx.name in {p.name for p in files}  # the new one, written there
    assert files - {d / idx.name} == set(others[: index_mod.INDEX_KEEP - 1])
    # a load from the default cache touches the file (the LRU clock)
    res = run_bookfs("info", str(src), check=False)
    assert res.returncode == 0, res.stderr
    assert time.time() - idx.stat().st_mtime < 60


def test_index_dir_writes_there_privately(make_book, tmp_path, cache_dir, mnt):
    src = make_book([10] * 20)
    before = sorted(os.listdir(cache_dir))
    d = tmp_path / "new" / "ix"
    res = run_bookfs("verify", str(src), "--index-dir", str(d), check=False)
    assert res.returncode == 0, res.stderr
    assert len(idx_files(d)) == 1 and stat.S_IMODE(d.stat().st_mode) == 0o700
    d2 = tmp_path / "ix2"
    with mounted(src, mnt, "-o", f"ro,index_dir={d2}"):
        assert (mnt / EVENT1).stat().st_size == 10
    assert len(idx_files(d2)) == 1
    assert sorted(os.listdir(cache_dir)) == before


def test_no_index_cache_writes_nothing(make_book, tmp_path, mnt):
    src = make_book([10] * 20)  # written while conftest's cache was on
    empty = tmp_path / "empty-cache"
    env = dict(os.environ, BOOKFS_CACHE_DIR=str(empty))
    for args in (["info", str(src), "--no-index-cache"],
                 ["verify", str(src), "--no-index-cache"]):
        res = subprocess.run([*BOOKFS, *args], capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
    res = subprocess.run([*BOOKFS, "mount", str(src), str(mnt), "-o", "noindex_cache"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    try:
        (mnt / "new" / "21").write_bytes(noun(b"\0\0\0\0abc"))
        assert (mnt / "events" / "000000000021").read_bytes() == noun(b"\0\0\0\0abc")
    finally:
        res = run_bookfs("umount", str(mnt), check=False)
    assert res.returncode == 0, res.stderr
    assert not empty.exists()


def test_bad_index_dir_is_one_line_usage_error(small_src, tmp_path, mnt):
    f = tmp_path / "a-file"
    f.write_text("x")
    line = one_line_error(run_bookfs("info", str(small_src), "--index-dir", str(f),
                                     check=False), 2)
    assert line.startswith("bookfs info: --index-dir ") and "expected" in line
    line = one_line_error(run_bookfs("mount", str(small_src), str(mnt), "-o",
                                     f"index_dir={f}/sub", check=False), 2)
    assert "index_dir=" in line and "expected" in line
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    line = one_line_error(run_bookfs("verify", str(small_src), "--index-dir", str(shared),
                                     check=False), 2)
    assert "not writable by others" in line
    res = run_bookfs("info", str(small_src), "--index-dir", "x", "--no-index-cache",
                     check=False)
    assert res.returncode == 2 and "not allowed with" in res.stderr


@pytest.mark.parametrize("what", ["file", "missing"])
def test_a_source_that_is_not_a_directory_is_a_usage_error(tmp_path, mnt, what):
    """Issue 23.3: a file, or nothing, given as the source is a command-line mistake:
    exit 2, one line saying what was found and what is expected (it was exit 1, "no such
    directory", even for a file)."""
    src = tmp_path / "src"
    if what == "file":
        src.write_bytes(b"not a log")
    res = run_bookfs("mount", str(src), str(mnt), check=False)
    line = one_line_error(res, 2)
    assert "expected" in line and ("a pier" in line or "a directory" in line)
    assert not in_mountinfo(mnt)


def test_busy_umount_names_a_process_by_its_open_file(small_src, mnt):
    """Issue 23.3: a busy mount's refusal names the process holding it, as the writer
    lock's does: here by the file it has open (its cwd is outside)."""
    with mounted(small_src, mnt, "-o", "ro"):
        holder = subprocess.Popen(
            [sys.executable, "-c", "import sys; f = open(sys.argv[1], 'rb'); "
             "print('ready', flush=True); sys.stdin.readline()",
             str(mnt / "events" / "000000000002")], cwd="/", stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "ready"
            line = one_line_error(run_bookfs("umount", str(mnt), check=False), 1)
            assert f"held by pid {holder.pid} (python" in line, line
            assert "events/000000000002 open)" in line, line
        finally:
            holder.stdin.close()
            holder.wait(timeout=10)


def test_a_bad_option_is_named_before_a_held_lock(small_src, mnt, tmp_path):
    """Issue 23.3: ``-o readonly`` (no such option) on a log another mount holds for
    writing: the bad option is the error (exit 2), not the lock (exit 1), as it is on a
    free log; libfuse parses the options before the log is opened."""
    with mounted(small_src, mnt):
        other = tmp_path / "other"
        other.mkdir()
        res = run_bookfs("mount", str(small_src), str(other), "-o", "readonly", check=False)
        line = one_line_error(res, 2)
        assert "FUSE does not accept the mount option(s) readonly" in line, line
        assert "locked" not in line
        assert not in_mountinfo(other)
