"""Every row of DESIGN.md's error table, through a real mount, with exact errnos; and the
log is unchanged after every refusal."""

from __future__ import annotations

import errno
import os

import pytest

from bookfs.formats.book import Book
from mount_fixtures import err_of, log_state, mnt, mounted, noun, payload, run_bookfs, sh, small_src  # noqa: F401

W = os.O_WRONLY | os.O_CREAT
CHANGES_EXPECTED: set = set()  # logs a test deliberately appends to


def create_errno(path) -> int | None:
    try:
        fd = os.open(path, W, 0o644)
    except OSError as e:
        return e.errno
    os.close(fd)
    return None


@pytest.fixture
def rw(small_src, mnt, tmp_path):
    """The 10-event log mounted read-write; yields (mnt, src, log_file).  Asserts on exit
    that nothing changed the log."""
    logf = tmp_path / "daemon.log"
    before = log_state(small_src)
    with mounted(small_src, mnt, log_file=str(logf)):
        yield mnt, small_src, logf
    if small_src not in CHANGES_EXPECTED:
        assert log_state(small_src) == before


def test_create_not_a_number_einval(rw):
    m, _, logf = rw
    for name in ("abc", "12a", "-1", "1.0", "0x10", " 11"):
        assert create_errno(f"{m}/new/{name}") == errno.EINVAL, name
    assert "expected a decimal event number" in logf.read_text()


def test_create_committed_or_in_flight_eexist(rw):
    m, _, logf = rw
    for n in ("1", "5", "10", "000000000010"):
        assert create_errno(f"{m}/new/{n}") == errno.EEXIST, n
    fd = os.open(f"{m}/new/11", W)  # in flight
    try:
        assert create_errno(f"{m}/new/11") == errno.EEXIST
        assert create_errno(f"{m}/new/000000000011") == errno.EEXIST
    finally:
        assert err_of(os.close, fd) == errno.EINVAL  # 0 bytes written
    assert "already committed or in flight" in logf.read_text()


def test_close_of_empty_reservation_einval(rw):
    m, _, _ = rw
    fd = os.open(f"{m}/new/11", W)
    assert err_of(os.close, fd) == errno.EINVAL
    assert not os.path.exists(f"{m}/events/11")


def test_gap_einval_logs_expected(rw):
    m, _, logf = rw
    assert create_errno(f"{m}/new/13") == errno.EINVAL
    assert create_errno(f"{m}/new/99999") == errno.EINVAL
    lines = [ln for ln in logf.read_text().splitlines() if "new/13" in ln]
    assert len(lines) == 1 and "expected event 11" in lines[0], lines


def test_close_short_payload_einval(rw):
    m, _, logf = rw
    for k in (1, 2, 3):
        fd = os.open(f"{m}/new/11", W)
        os.write(fd, b"x" * k)
        assert err_of(os.close, fd) == errno.EINVAL
    assert "expected at least 4" in logf.read_text()
    assert not os.path.exists(f"{m}/events/11")
    # the number is free again: a proper payload commits (then the log changes: check it)
    before = (src := rw[1]).joinpath("book.log").read_bytes()
    CHANGES_EXPECTED.add(src)
    fd = os.open(f"{m}/new/11", W)
    os.write(fd, noun(b"abcd"))
    os.close(fd)
    assert open(f"{m}/events/11", "rb").read() == noun(b"abcd")
    after = src.joinpath("book.log").read_bytes()
    assert after[: len(before)] == before
    assert len(after) == len(before) + 20 + len(noun(b"abcd"))


def test_list_new_is_empty(rw):
    """DESIGN.md: new/ lists as empty (not an error), also while an append is open."""
    m, _, _ = rw
    assert os.listdir(f"{m}/new") == []
    fd = os.open(f"{m}/new/11", os.O_WRONLY | os.O_CREAT)
    try:
        assert os.listdir(f"{m}/new") == []
        r = sh(f"ls -la {m}/new")
        assert r.returncode == 0 and not r.stderr
    finally:
        os.write(fd, b"ab")
        with pytest.raises(OSError):  # too short: refused, the log is unchanged
            os.close(fd)


def test_events_are_immutable(rw):
    m, _, _ = rw
    e = f"{m}/events/000000000003"
    assert err_of(os.open, e, os.O_WRONLY) == errno.EROFS
    assert err_of(os.open, e, os.O_RDWR) == errno.EROFS
    assert err_of(os.open, e, os.O_WRONLY | os.O_APPEND) == errno.EROFS
    assert err_of(os.truncate, e, 0) == errno.EROFS
    assert err_of(os.unlink, e) in (errno.EPERM, errno.EROFS)
    assert err_of(os.rename, e, f"{m}/events/000000000099") in (errno.EPERM, errno.EROFS)
    # events/ is the read-only companion's mount (fs/daemon/companion.py): a rename from it
    # into new/ crosses mounts, EXDEV
    assert err_of(os.rename, e, f"{m}/new/11") in (errno.EPERM, errno.EROFS, errno.EXDEV)
    assert create_errno(f"{m}/events/11") == errno.EROFS
    assert err_of(os.mkdir, f"{m}/events/x") in (errno.EPERM, errno.EROFS)
    assert err_of(os.symlink, "x", f"{m}/events/y") in (errno.EPERM, errno.EROFS)
    assert err_of(os.link, e, f"{m}/events/z") in (errno.EPERM, errno.EROFS)
    assert err_of(os.chmod, e, 0o666) in (errno.EPERM, errno.EROFS)
    assert err_of(os.rmdir, f"{m}/events") in (errno.EPERM, errno.EROFS, errno.EBUSY)
    # shell tools
    assert sh(f"echo hi > {e}").returncode != 0
    assert sh(f"rm -f {e}").returncode != 0
    assert sh(f"truncate -s 0 {e}").returncode != 0
    assert os.path.getsize(e) == 4 + 37 * 3


def test_readonly_mount_erofs(small_src, mnt):
    before = log_state(small_src)
    with mounted(small_src, mnt, "-o", "ro"):
        m = mnt
        assert create_errno(f"{m}/new/11") == errno.EROFS
        assert create_errno(f"{m}/new/abc") == errno.EROFS
        assert err_of(os.open, f"{m}/meta/life", os.O_WRONLY) == errno.EROFS
        assert err_of(os.open, f"{m}/events/1", os.O_WRONLY) == errno.EROFS
        assert err_of(os.truncate, f"{m}/events/1", 0) == errno.EROFS
        assert err_of(os.unlink, f"{m}/events/1") == errno.EROFS
        assert err_of(os.rename, f"{m}/events/1", f"{m}/events/2") == errno.EROFS
        assert err_of(os.mkdir, f"{m}/x") == errno.EROFS
        assert sh(f"cp /etc/hostname {m}/new/11").returncode != 0
        assert open(f"{m}/events/1", "rb").read() == payload(1, 41)
    assert log_state(small_src) == before


def test_corrupt_event_eio_and_log_line(small_src, mnt, tmp_path):
    with Book.open(small_src) as book:
        off = book.index.offsets[5 - 1]  # event 5's deed
        good = book.read(4), book.read(6)
    with open(small_src / "book.log", "r+b") as f:
        f.seek(off + 8 + 10)  # a byte of event 5's payload
        b = f.read(1)
        f.seek(off + 8 + 10)
        f.write(bytes([b[0] ^ 0xFF]))
    before = log_state(small_src)
    logf = tmp_path / "d.log"
    with mounted(small_src, mnt, "-o", "ro", log_file=str(logf)):
        assert os.path.getsize(f"{mnt}/events/5") == 4 + 37 * 5  # size is from the index
        assert err_of(lambda: open(f"{mnt}/events/5", "rb").read()) == errno.EIO
        r = sh(f"cat {mnt}/events/5")
        assert r.returncode != 0 and r.stdout == b"" and b"Input/output error" in r.stderr
        assert sh(f"dd if={mnt}/events/5 bs=1 status=none").stdout == b""
        assert open(f"{mnt}/events/4", "rb").read() == good[0]
        assert open(f"{mnt}/events/6", "rb").read() == good[1]
        # issue 23.4: bookfs show says which event, and what to run (it said only
        # "Input/output error")
        r = run_bookfs("show", str(mnt), "4..6", check=False)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("bookfs show: event 5: ") and "Input/output error" in r.stderr
        assert f"bookfs verify {os.path.realpath(small_src)}" in r.stderr, r.stderr
        text = logf.read_text()
        assert f"event 5 at offset {off}" in text, text
    assert log_state(small_src) == before  # the read-only mount quarantined nothing


def test_meta_wrong_size_and_unknown_key(rw):
    m, src, logf = rw
    old = open(f"{m}/meta/life", "rb").read()
    for k in (0, 5, 9):  # (a partial write keeps the other bytes: test_adversarial_mount)
        fd = os.open(f"{m}/meta/life", os.O_WRONLY)
        os.write(fd, b"\x01" * k) if k else None
        if k:
            assert err_of(os.close, fd) == errno.EINVAL, k
        else:
            os.close(fd)  # opened and closed without writing: nothing to do
    fd = os.open(f"{m}/meta/life", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"\x01\x02")
    assert err_of(os.close, fd) == errno.EINVAL
    assert open(f"{m}/meta/life", "rb").read() == old
    assert err_of(os.open, f"{m}/meta/nope", os.O_WRONLY) == errno.ENOENT
    assert create_errno(f"{m}/meta/nope") == errno.ENOENT
    assert err_of(os.open, f"{m}/meta/nope", os.O_RDONLY) == errno.ENOENT
    assert "expected exactly 4" in logf.read_text()


def test_meta_write_right_size_is_durable(small_src, mnt):
    with mounted(small_src, mnt):
        fd = os.open(f"{mnt}/meta/life", os.O_WRONLY)
        os.write(fd, (77).to_bytes(4, "little"))
        os.close(fd)
        assert open(f"{mnt}/meta/life", "rb").read() == (77).to_bytes(4, "little")
        assert "life:     77" in open(f"{mnt}/info").read()
    with Book.open(small_src) as book:
        assert book.read_meta("life") == (77).to_bytes(4, "little")


def test_second_rw_mount_refused(small_src, mnt, tmp_path):
    from mounting import daemon_pid

    with mounted(small_src, mnt):
        pid = daemon_pid(str(mnt))
        other = tmp_path / "other"
        other.mkdir()
        r = run_bookfs("mount", str(small_src), str(other), check=False)
        assert r.returncode == 1
        assert f"pid {pid}" in r.stderr, r.stderr
        assert "-o ro" in r.stderr
        assert not os.path.ismount(other)
        # a read-only mount beside it is fine
        with mounted(small_src, other, "-o", "ro"):
            assert open(f"{other}/events/2", "rb").read() == payload(2, 4 + 74)


def test_unknown_mount_option(small_src, mnt):
    """An option neither bookfs nor FUSE knows is handed to FUSE, whose refusal names it
    (the option classes are tested in test_mount_habits.py)."""
    r = run_bookfs("mount", str(small_src), str(mnt), "-o", "ro,frobnicate=3", check=False)
    assert r.returncode == 2  # bad usage
    assert "FUSE does not accept the mount option(s) frobnicate=3" in r.stderr
    assert "bookfs mount --help" in r.stderr  # where the accepted ones are listed
    assert not os.path.ismount(mnt)
    r = run_bookfs("mount", str(small_src), str(mnt), "-o", "ro,rw", check=False)
    assert r.returncode == 2 and "contradict" in r.stderr
