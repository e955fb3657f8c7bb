"""A read-write mount's read-only companion (issue 22.1, ``bookfs/fs/daemon/companion.py``),
through real mounts: what is bound where, what ``info`` says, unmounting (``bookfs
umount``, a plain ``fusermount3 -u``, SIGTERM), the companion dying under a served mount,
and ``-o single_connection``.  That a warm read costs no request, and an append is read
at once, is ``test_requests.py``'s."""

from __future__ import annotations

import os
import re
import signal
import subprocess

from mount_fixtures import mnt, small_src, wait_for  # noqa: F401 (fixtures)
from mounting import daemon_pid, in_mountinfo, mounted, noun, run_bookfs

BOUND = ("events", "pretty", "segments")


def mounts_under(path) -> dict[str, str]:
    """Mount point -> type of every mount strictly inside ``path``."""
    prefix = os.path.abspath(path) + "/"
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split()[4].startswith(prefix):
                out[left.split()[4]] = right.split()[0]
    return out


def companion_pid(mnt) -> int:
    with open(os.path.join(mnt, "info")) as f:
        reads = re.search(r"^reads: *(.*)$", f.read(), re.M)[1]
    return int(re.search(r"daemon pid (\d+)", reads)[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def append(mnt, data: bytes) -> int:
    with open(os.path.join(mnt, "info")) as f:
        n = int(re.search(r"^next: *(\d+)", f.read(), re.M)[1])
    with open(os.path.join(mnt, "new", str(n)), "wb") as f:
        f.write(noun(data))
    return n


def test_the_read_only_directories_are_bound_from_the_companion(small_src, mnt):
    with mounted(small_src, mnt):
        inside = mounts_under(mnt)
        assert inside == {os.path.join(os.path.abspath(mnt), d): "fuse.bookfs" for d in BOUND}
        pid = companion_pid(mnt)
        assert alive(pid) and pid != daemon_pid(mnt)
        # the same bytes and inodes either way; new/ and meta/ stay on the writer's mount
        assert os.stat(mnt / "events" / "3").st_ino == 2**63 + 3
        assert os.stat(mnt / "new").st_dev == os.stat(mnt).st_dev != os.stat(mnt / "events").st_dev
        n = append(mnt, b"fresh")
        assert open(mnt / "events" / str(n), "rb").read() == noun(b"fresh")
        assert f"{n:012d}" in os.listdir(mnt / "events")
        assert "event: " in open(mnt / "pretty" / str(n)).read()


def test_bookfs_umount_unbinds_then_unmounts_and_the_companion_exits(small_src, mnt):
    with mounted(small_src, mnt):
        pid = companion_pid(mnt)
        plain = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
        assert plain.returncode != 0 and "busy" in plain.stderr  # mounts inside: EBUSY
        assert mounts_under(mnt)  # nothing was taken away by the refusal
        res = run_bookfs("umount", str(mnt), check=False)
        assert res.returncode == 0, res.stderr
        assert not in_mountinfo(mnt) and not mounts_under(mnt)
        assert wait_for(lambda: not alive(pid), timeout=15)


def test_sigterm_to_the_daemon_takes_the_companion_along(small_src, mnt):
    with mounted(small_src, mnt):
        pid, companion = daemon_pid(mnt), companion_pid(mnt)
        os.kill(pid, signal.SIGTERM)
        assert wait_for(lambda: not alive(pid), timeout=15)
        assert wait_for(lambda: not in_mountinfo(mnt) and not mounts_under(mnt), timeout=15)
        assert wait_for(lambda: not alive(companion), timeout=15)


def test_a_companion_that_dies_leaves_reads_on_the_writers_connection(small_src, mnt):
    with mounted(small_src, mnt):
        before = open(mnt / "events" / "5", "rb").read()
        companion = companion_pid(mnt)
        os.kill(companion, signal.SIGKILL)
        assert wait_for(lambda: not mounts_under(mnt), timeout=15)
        assert wait_for(lambda: "exited" in open(mnt / "info").read(), timeout=15)
        assert open(mnt / "events" / "5", "rb").read() == before  # the writer's own events/
        n = append(mnt, b"after")
        assert open(mnt / "events" / str(n), "rb").read() == noun(b"after")
        assert run_bookfs("umount", str(mnt), check=False).returncode == 0
        assert not in_mountinfo(mnt)


def test_the_companion_is_told_of_commits_and_each_is_seen_at_once(small_src, mnt):
    """The companion runs ``-o ro,companion``: its follower looks at the log at most every
    ``COMPANION_LOOK_BURST`` between requests (``fs/watch.py``), since the read-write
    daemon drops the companion connection's attributes at each commit.  Every commit is
    still seen through the mount as soon as its close returns: the new event's bytes,
    ``events/``'s size (the event count) and its listing."""
    with mounted(small_src, mnt):
        with open(f"/proc/{companion_pid(mnt)}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert b"companion" in argv[argv.index(b"-o") + 1].split(b",")
        before = os.stat(mnt / "events").st_size
        for k in range(20):
            n = append(mnt, b"x%d" % k)
            assert os.stat(mnt / "events").st_size == before + k + 1
            assert f"{n:012d}" in os.listdir(mnt / "events")
            assert open(mnt / "events" / f"{n:012d}", "rb").read() == noun(b"x%d" % k)


def test_the_companion_option_is_read_only_and_given_by_a_read_write_mount():
    from bookfs.fs.daemon.options import OptionError, parse_options

    assert parse_options("ro,busy_poll=75").companion_options().split(",")[:2] == \
        ["ro", "companion"]
    assert parse_options("ro,companion").companion
    assert not parse_options("ro").companion
    for bad in ("companion", "rw,companion", "ro,companion=1"):
        try:
            parse_options(bad)
        except OptionError as e:
            assert "\n" not in str(e) and "companion" in str(e)
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_single_connection_binds_nothing(small_src, mnt):
    with mounted(small_src, mnt, "-o", "single_connection"):
        assert not mounts_under(mnt)
        assert "single_connection" in open(mnt / "info").read()
        n = append(mnt, b"one")
        assert open(mnt / "events" / str(n), "rb").read() == noun(b"one")
        plain = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
        assert plain.returncode == 0, plain.stderr  # no mounts inside: a plain unmount works


def test_a_read_only_mount_has_no_companion(small_src, mnt):
    with mounted(small_src, mnt, "-o", "ro"):
        assert not mounts_under(mnt)
        assert "reads:" not in open(mnt / "info").read()
