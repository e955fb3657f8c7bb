"""Bytes nobody wrote (issue 33, item 2): every byte of a committed event was written by
its writer.  A ``new/<N>`` file with a hole (a ``pwrite`` or ``lseek`` past the end, a gap
between writes, an ``ftruncate`` that extends it, glibc's ``posix_fallocate``) is refused
at its writer's last close, checked or not: EINVAL, one line naming the first hole's
offsets in ``info`` and the daemon's log, nothing committed, the number free again.
Writes in any order that cover every byte are accepted, overlapping ones too, and the
event is what was written last at each offset.

The written ranges are a small interval set (``staging.Written``): a write that would
leave more than ``MAX_RANGES`` separate pieces fails with EINVAL (the file is poisoned).

Tested as a class: a matrix of write patterns × {checked mount, ``-o unchecked_payloads``,
``user.bookfs.unchecked``}, the shell tools that leave holes, and hypothesis over random
write and truncate sequences, on the buffer and through a real mount."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mount_fixtures import (  # noqa: F401
    err_of, info_text, module_cache, mounted, next_number, noun_payload, sh)

from bookfs.formats.book import Book
from bookfs.formats.layout import MIN_PAYLOAD
from bookfs.fs.append import staging as staging_mod
from bookfs.fs.append.staging import Staging

SIZE = 3000  # the payload the patterns write
LINE = re.compile(r"^  \S+ \S+ \S+ (\S+) (\S+) pid \S+: (.*)$")
W = os.O_WRONLY | os.O_CREAT


# --- the interval set and the buffer, against a byte-by-byte model ----------------------------

class Model:
    """Which bytes were written, and the last byte written at each offset."""

    def __init__(self):
        self.data = bytearray()
        self.written: list[bool] = []

    def write(self, off: int, data: bytes) -> None:
        end = off + len(data)
        if end > len(self.data):
            self.written += [False] * (end - len(self.data))
            self.data += bytes(end - len(self.data))
        self.data[off:end] = data
        self.written[off:end] = [True] * len(data)

    def truncate(self, size: int) -> None:
        if size < len(self.data):
            del self.data[size:], self.written[size:]
        else:
            self.written += [False] * (size - len(self.data))
            self.data += bytes(size - len(self.data))

    def first_hole(self) -> tuple[int, int] | None:
        if all(self.written):
            return None
        a = self.written.index(False)
        b = a
        while b < len(self.written) and not self.written[b]:
            b += 1
        return a, b

    def holes(self) -> int:
        return sum(1 for i, w in enumerate(self.written)
                   if not w and (i == 0 or self.written[i - 1]))


#: (through the module, so that each test fails on its own where they are missing)
MAX_RANGES = getattr(staging_mod, "MAX_RANGES", 1024)

OPS = st.lists(st.one_of(
    st.tuples(st.just("w"), st.integers(0, 400), st.integers(1, 120), st.integers(0, 1 << 30)),
    st.tuples(st.just("t"), st.integers(0, 500))), max_size=14)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(1, 6))
def test_written_ranges_match_a_byte_model(ops, limit):
    """Staging (spilling to a file past 64 bytes) with a small range limit: holes, the
    hole count and the bytes agree with the model; a write refused as Fragmented
    changes nothing; the set never holds more than its limit."""
    s = Staging(1 << 20, spill=64)
    s.written.limit = limit
    m = Model()
    for op in ops:
        if op[0] == "w":
            _, off, n, seed = op
            data = random.Random(seed).randbytes(n)
            try:
                s.write(off, data)
            except staging_mod.Fragmented as e:
                assert e.errno == errno.EINVAL
                assert len(s.written) == limit
                continue
            m.write(off, data)
        else:
            s.truncate(op[1])
            m.truncate(op[1])
        assert len(s.written) <= limit
        assert len(s) == len(m.data)
        assert s.first_hole() == m.first_hole()
        assert s.written.holes(len(s)) == m.holes()
        assert s.getvalue() == bytes(m.data)  # written bytes as written, holes as zeros
    s.close()


def test_written_stays_one_range_for_an_ordered_writer():
    w = staging_mod.Written()
    for off in range(0, 1 << 30, 1 << 16):  # 16,384 writes of a 1 GiB file, in order
        w.add(off, off + (1 << 16))
    assert (w.starts, w.ends) == ([0], [1 << 30])
    for off in range(1 << 20, 0, -4096):  # backwards: each touches the one before
        w.add(off - 4096, off)
    assert len(w) == 1 and w.first_hole(1 << 30) is None


def test_written_refuses_the_range_past_its_limit():
    w = staging_mod.Written()
    for k in range(MAX_RANGES):
        w.add(2 * k, 2 * k + 1)
    with pytest.raises(staging_mod.Fragmented):
        w.add(2 * MAX_RANGES + 5, 2 * MAX_RANGES + 6)
    w.add(1, 2)  # filling a gap merges two ranges: always allowed
    assert len(w) == MAX_RANGES - 1
    w.add(0, 2 * MAX_RANGES)  # one write over everything: one range
    assert len(w) == 1


# --- a matrix of write patterns through real mounts -------------------------------------------

def _fallocate(fd: int, off: int, size: int) -> int:
    """``fallocate(2)`` itself (not glibc's emulation): 0 or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.fallocate(fd, 0, ctypes.c_long(off), ctypes.c_long(size))
    return 0 if r == 0 else ctypes.get_errno()


def _blocks(order):
    def run(fd, p):
        offs = list(range(0, len(p), 256))
        order(offs)
        for off in offs:
            os.pwrite(fd, p[off:off + 256], off)
    return run


def _rewrite_after_fallocate(fd, p):
    # the kernel answers EOPNOTSUPP for a FUSE server without FALLOCATE (pyfuse3 has
    # none: libfuse's _do_fallocate replies ENOSYS, and fs/fuse/file.c,
    # fuse_file_fallocate(), turns that into EOPNOTSUPP): nothing changes
    assert _fallocate(fd, 0, len(p)) == errno.EOPNOTSUPP
    os.write(fd, p)


def _lseek_past(fd, p):
    os.write(fd, p[:500])
    os.lseek(fd, 700, os.SEEK_SET)
    os.write(fd, p[700:])


def _seek_cur(fd, p):
    os.write(fd, p[:500])
    os.lseek(fd, 1, os.SEEK_CUR)
    os.write(fd, p[501:])


#: name -> (what the writer does with the payload p, the first hole or None)
#: (a hole's end None: any; glibc's posix_fallocate writes one zero byte per block)
PATTERNS = {
    "in order": (lambda fd, p: os.write(fd, p), None),
    "pwrite past the start": (lambda fd, p: os.pwrite(fd, p[100:], 100), (0, 100)),
    "pwrite past the mug": (lambda fd, p: os.pwrite(fd, p[4:], 4), (0, 4)),
    "gap between two writes": (lambda fd, p: (os.write(fd, p[:1000]),
                                              os.pwrite(fd, p[1200:], 1200)), (1000, 1200)),
    "ftruncate up, no write after": (lambda fd, p: (os.write(fd, p[:1000]),
                                                    os.ftruncate(fd, len(p))),
                                     (1000, SIZE)),
    "ftruncate up, a write after": (lambda fd, p: (os.ftruncate(fd, len(p)),
                                                   os.pwrite(fd, p[10:], 10)), (0, 10)),
    "ftruncate up, every byte after": (lambda fd, p: (os.ftruncate(fd, len(p)),
                                                      os.write(fd, p)), None),
    "one byte short, ftruncate up": (lambda fd, p: (os.write(fd, p[:-1]),
                                                    os.ftruncate(fd, len(p))),
                                     (SIZE - 1, SIZE)),
    "truncate down, then up": (lambda fd, p: (os.write(fd, p), os.ftruncate(fd, 100),
                                              os.ftruncate(fd, len(p))), (100, SIZE)),
    "truncate down, up, the rest again": (lambda fd, p: (
        os.write(fd, p), os.ftruncate(fd, 100), os.ftruncate(fd, len(p)),
        os.pwrite(fd, p[100:], 100)), None),
    "a write past the end, truncated off": (lambda fd, p: (
        os.write(fd, p), os.pwrite(fd, b"x" * 10, len(p) + 100),
        os.ftruncate(fd, len(p))), None),
    "lseek past the end, then write": (_lseek_past, (500, 700)),
    "lseek SEEK_CUR by one": (_seek_cur, (500, 501)),
    "posix_fallocate alone": (lambda fd, p: os.posix_fallocate(fd, 0, len(p)), (0, None)),
    "posix_fallocate, every byte after": (lambda fd, p: (
        os.posix_fallocate(fd, 0, len(p)), os.write(fd, p)), None),
    "fallocate(2), every byte after": (_rewrite_after_fallocate, None),
    "blocks in reverse": (_blocks(list.reverse), None),
    "blocks shuffled": (_blocks(random.Random(7).shuffle), None),
    "odd blocks, then even": (_blocks(lambda o: o.sort(key=lambda x: (x // 256) % 2 == 0)),
                              None),
    "overlapping writes": (lambda fd, p: (
        os.pwrite(fd, random.Random(3).randbytes(len(p)), 0), os.pwrite(fd, p[:2000], 0),
        os.pwrite(fd, p[1000:], 1000), os.pwrite(fd, p[1500:1600], 1500)), None),
}

MODES = ["checked", "unchecked mount", "unchecked xattr"]


@pytest.fixture(scope="module")
def mounts(tmp_path_factory, module_cache):  # noqa: F811
    """A checked and an ``-o unchecked_payloads`` mount, each of its own log, each with
    its daemon's log file."""
    base = tmp_path_factory.mktemp("holes")
    out = {}
    with contextlib.ExitStack() as stack:
        for mode, opts in (("checked", ()), ("unchecked", ("-o", "unchecked_payloads"))):
            src = base / f"{mode}-log"
            with Book.open(src, writable=True, create=True) as book:
                book.save(1, [noun_payload(b"first event")])
            logf = base / f"{mode}.log"
            mp = stack.enter_context(mounted(src, base / f"{mode}-mnt", *opts,
                                             log_file=str(logf)))
            out[mode] = (mp, logf)
        yield out


info = info_text


def read_event(mp, n: int) -> bytes:
    with open(f"{mp}/events/{n}", "rb") as f:
        return f.read()


def refusal(mp, n: int) -> tuple[str, str]:
    """(errno name, reason) of the newest refusal of ``new/<n>``."""
    found = [LINE.match(x).groups() for x in info(mp).splitlines() if LINE.match(x)]
    found = [(e, why) for path, e, why in found if path == f"new/{n}"]
    assert found, info(mp)
    return found[-1]


def abandon(fd: int) -> None:
    """Close ``fd`` (a ``new/`` file of a test that failed) so that it commits nothing
    and stalls no later append: emptied, it is refused at the close."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        os.close(fd)


def write_close(mp, n: int, pattern, p: bytes, unchecked: bool) -> int:
    """Create ``new/<n>``, run ``pattern(fd, p)``, close: 0 or the close's errno."""
    fd = os.open(f"{mp}/new/{n}", W)
    try:
        if unchecked:
            os.setxattr(fd, "user.bookfs.unchecked", b"1")
        pattern(fd, p)
    except BaseException:
        abandon(fd)
        raise
    return err_of(os.close, fd) or 0


def _setup(mounts, mode):
    mp, logf = mounts["checked" if mode != "unchecked mount" else "unchecked"]
    n = next_number(mp)
    data = random.Random(f"{mode}{n}").randbytes(SIZE)
    # a checked mount gets a noun; the others bytes that are not one
    p = noun_payload(data) if mode == "checked" else b"\xff\xff" + data[2:]
    return mp, logf, n, p


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(PATTERNS))
def test_every_byte_of_an_event_was_written(mounts, mode, name):
    mp, logf, n, p = _setup(mounts, mode)
    pattern, hole = PATTERNS[name]
    err = write_close(mp, n, pattern, p, unchecked=mode == "unchecked xattr")
    if hole is None:
        assert err == 0, refusal(mp, n)
        assert read_event(mp, n) == p  # what was written last at each offset
        assert next_number(mp) == n + 1
        return
    assert err == errno.EINVAL
    assert next_number(mp) == n  # nothing committed: the number is free
    assert not os.path.exists(f"{mp}/events/{n}")
    e, why = refusal(mp, n)
    a, b = hole
    want = rf"^bytes {a:,} to {b - 1:,} " if b is not None else rf"^bytes {a:,} to [\d,]+ "
    assert e == "EINVAL" and re.search(want, why), why
    assert "were never written" in why
    with open(logf) as f:  # one line in the daemon's log too
        assert any(f"new/{n}" in line and "were never written" in line for line in f)
    # the number is free: the same payload, written whole, is committed
    assert write_close(mp, n, lambda fd, q: os.write(fd, q), p,
                       unchecked=mode == "unchecked xattr") == 0
    assert read_event(mp, n) == p


def test_a_writer_scattering_pieces_is_refused_at_the_write(mounts):
    """More than MAX_RANGES separate pieces at once: that write fails (EINVAL), the file
    is poisoned, its close fails with the reason in info; nothing committed."""
    mp, _ = mounts["unchecked"]
    n = next_number(mp)
    fd = os.open(f"{mp}/new/{n}", W)
    try:
        for k in range(MAX_RANGES):
            os.pwrite(fd, b"x", 2 * k)
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"x", 2 * MAX_RANGES)
        assert e.value.errno == errno.EINVAL
        os.pwrite(fd, bytes(2 * MAX_RANGES + 1), 0)  # filling every gap does not save it
    except BaseException:
        abandon(fd)
        raise
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EINVAL
    assert next_number(mp) == n
    assert f"more than {MAX_RANGES:,} separate written ranges" in refusal(mp, n)[1]


def test_many_pieces_that_merge_are_accepted(mounts):
    """4,096 pieces of 16 bytes written backwards: never more than one range."""
    mp, _ = mounts["unchecked"]
    n = next_number(mp)
    p = random.Random(n).randbytes(4096 * 16)
    assert write_close(mp, n, lambda fd, q: [os.pwrite(fd, q[o:o + 16], o)
                                             for o in range(len(q) - 16, -1, -16)],
                       p, False) == 0
    assert read_event(mp, n) == p


# --- the shell tools that leave holes -----------------------------------------------------------

@pytest.fixture
def sparse(tmp_path):
    """A 1 MiB file with a 1 MiB hole between 100 bytes at each end (not a noun: for
    the unchecked mount)."""
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.write(b"\xff" + os.urandom(99))
        f.seek(1 << 20)
        f.write(os.urandom(100))
    return path


#: command (``{src}``, ``{dst}``) -> the first hole it leaves, or None (every byte written)
TOOLS = {
    "cp (sparse source: it seeks over the hole)": ("cp {src} {dst}", (4096, None)),
    "cp --sparse=never": ("cp --sparse=never {src} {dst}", None),
    "cat >": ("cat {src} > {dst}", None),
    "rsync --inplace": ("rsync --inplace {src} {dst}", None),
    "dd conv=sparse": ("dd if={src} of={dst} conv=sparse status=none", (512, None)),
    "dd seek=1": ("head -c 300 {src} | dd of={dst} bs=100 seek=1 status=none", (0, 100)),
    "truncate -s": ("truncate -s 300 {dst}", (0, 300)),
    "fallocate -l": ("fallocate -l 300 {dst}", "no file"),
}


@pytest.mark.parametrize("name", list(TOOLS))
def test_tools_that_leave_holes(mounts, sparse, name):
    mp, _ = mounts["unchecked"]
    n = next_number(mp)
    cmd, hole = TOOLS[name]
    res = sh(cmd.format(src=sparse, dst=f"{mp}/new/{n}"))
    if hole is None:
        assert res.returncode == 0, res.stderr
        assert read_event(mp, n) == sparse.read_bytes()
        return
    if hole == "no file":  # fallocate(1): EOPNOTSUPP before anything is written
        assert res.returncode != 0 and b"not supported" in res.stderr
        assert next_number(mp) == n
        return
    # a shell's redirection and truncate(1) ignore the close; the others report it
    assert next_number(mp) == n and not os.path.exists(f"{mp}/events/{n}")
    e, why = refusal(mp, n)
    assert e == "EINVAL" and "were never written" in why, why
    a = hole[0]
    if a is not None:
        assert why.startswith(f"bytes {a:,} to "), why
    if not name.startswith("truncate"):
        assert res.returncode != 0


# --- hypothesis through a real mount ---------------------------------------------------------

MOUNT_OPS = st.lists(st.one_of(
    st.tuples(st.just("w"), st.integers(0, 300), st.integers(1, 200), st.integers(0, 1 << 30)),
    st.tuples(st.just("t"), st.integers(0, 400))), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(ops=MOUNT_OPS)
def test_random_writes_commit_iff_every_byte_was_written(mounts, ops):
    """Random pwrites and ftruncates, then the close: committed iff the writes cover
    [0, size) (and size is an event's), and then byte for byte what was written last
    at each offset; else EINVAL and nothing committed."""
    mp, _ = mounts["unchecked"]
    n = next_number(mp)
    m = Model()
    fd = os.open(f"{mp}/new/{n}", W)
    try:
        for op in ops:
            if op[0] == "w":
                data = random.Random(op[3]).randbytes(op[2])
                assert os.pwrite(fd, data, op[1]) == len(data)
                m.write(op[1], data)
            else:
                os.ftruncate(fd, op[1])
                m.truncate(op[1])
    except BaseException:
        abandon(fd)
        raise
    try:
        os.close(fd)
        err = 0
    except OSError as e:
        err = e.errno
    if m.first_hole() is None and len(m.data) >= MIN_PAYLOAD:
        assert err == 0, refusal(mp, n)
        assert read_event(mp, n) == bytes(m.data)
        assert next_number(mp) == n + 1
    else:
        assert err == errno.EINVAL
        assert next_number(mp) == n
        if m.first_hole() is not None and len(m.data) >= MIN_PAYLOAD:
            a, b = m.first_hole()
            assert refusal(mp, n)[1].startswith(f"bytes {a:,} to {b - 1:,} ")


def test_a_meta_field_with_a_hole_is_refused(tmp_path):
    """``meta/<key>`` uses the same buffer: a field emptied (``O_TRUNC``) and written from
    offset 2 only (its first two bytes never written) is refused (EINVAL) and the field
    is unchanged; a whole write of it is saved.  (An open without ``O_TRUNC`` starts
    from the field's value, so a write into part of it patches it: no hole.)"""
    src = tmp_path / "log"
    with Book.open(src, writable=True, create=True) as b:
        b.save(1, [noun_payload(bytes(range(40)))])
        before = b.read_meta("life")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(src, mnt):
        fd = os.open(f"{mnt}/meta/life", os.O_WRONLY | os.O_TRUNC)
        try:
            os.pwrite(fd, b"\x07\x00", 2)
        finally:
            with pytest.raises(OSError) as e:
                os.close(fd)
        assert e.value.errno == errno.EINVAL
        assert "never written" in (mnt / "info").read_text()
        with open(f"{mnt}/meta/life", "wb") as f:
            f.write(b"\x09\x00\x00\x00")
    with Book.open(src) as b:
        assert before != b"\x09\x00\x00\x00" and b.read_meta("life") == b"\x09\x00\x00\x00"
