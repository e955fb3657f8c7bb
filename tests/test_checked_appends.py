"""Appends are checked (issue 21, item 2): ``new/<N>`` and ``bookfs append`` accept a
payload only if it is a 4-byte mug and a jam that cues completely and exactly (or vere's
ram encoding), whatever the mug; anything else is refused at the writer's
last close (EINVAL, nothing saved) with the byte where parsing failed in ``info``.
``-o unchecked_payloads`` and ``bookfs append --unchecked`` turn the check off.  Through
real mounts, the shell and the real ``bookfs`` command."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import re
import subprocess

import pytest

from bookfs.formats.book import Book
from bookfs.noun import cord, from_list, jam, mug, scan
from mounting import BOOKFS
from mount_fixtures import (  # noqa: F401
    err_of, info_text, log_state, module_cache, mounted, next_number, run_bookfs)

MIB = 1 << 20
LINE = re.compile(r"^  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} (\S+) (\S+) pid (\S+): (.*)$")


def event(noun, stored=None) -> bytes:
    """``mug ++ jam`` of ``noun``: its true mug, or ``stored``."""
    m = mug(noun) if stored is None else stored
    return m.to_bytes(4, "little") + jam(noun)


SMALL = cord("a checked append")
GOOD = event(SMALL)


@pytest.fixture(scope="module")
def src(tmp_path_factory, module_cache):  # noqa: F811
    path = tmp_path_factory.mktemp("checked") / "log"
    with Book.open(path, writable=True, create=True) as book:
        book.save(1, [event(cord("first")), event(from_list([1, 2, 3]), 0)])
    return path


@pytest.fixture(scope="module")
def m(src, tmp_path_factory):
    """A read-write mount, shared by the tests of this module (each appends at the
    mount's ``next:``)."""
    with mounted(src, tmp_path_factory.mktemp("mnt") / "m") as mp:
        yield mp


info = info_text


def refusals(mp) -> list[tuple[str, str, str, str]]:
    return [LINE.match(x).groups() for x in info(mp).splitlines() if LINE.match(x)]


def append(mp, n: int, data: bytes, chunk: int = MIB, unchecked: bool = False) -> int:
    """Write ``data`` into ``new/<n>`` in ``chunk``-byte writes and close it: 0, or the
    errno the close failed with."""
    fd = os.open(f"{mp}/new/{n}", os.O_WRONLY | os.O_CREAT)
    try:
        if unchecked:
            os.setxattr(fd, "user.bookfs.unchecked", b"1")
        view = memoryview(data)
        for i in range(0, len(data), chunk):
            os.write(fd, view[i:i + chunk])
    except BaseException:
        os.close(fd)
        raise
    return err_of(os.close, fd) or 0


def read_event(mp, n: int) -> bytes:
    with open(f"{mp}/events/{n}", "rb") as f:
        return f.read()


def assert_refused(mp, src, n: int, data: bytes, at: int, what: str, chunk: int = MIB):
    """``data`` at ``new/<n>``: the close fails with EINVAL, nothing is saved, ``n`` stays
    free, and the newest refusal names ``new/<n>``, ``byte <at>`` and ``what``."""
    before = log_state(src)
    assert append(mp, n, data, chunk) == errno.EINVAL
    assert not os.path.exists(f"{mp}/events/{n}")
    assert next_number(mp) == n
    assert log_state(src) == before
    path, name, _, reason = refusals(mp)[-1]
    assert (path, name) == (f"new/{n}", "EINVAL"), refusals(mp)[-1]
    assert f"byte {at}" in reason and what in reason, reason
    return reason


def test_printf_zzzz_is_refused_and_the_number_stays_free(m, src):
    n = next_number(m)
    before = log_state(src)
    res = subprocess.run(["bash", "-c", f"printf zzzz > {m}/new/{n}"], capture_output=True)
    assert res.returncode == 0  # a shell ignores close()'s errno: info says why
    assert not os.path.exists(f"{m}/events/{n}")
    assert log_state(src) == before
    path, name, _, reason = refusals(m)[-1]
    assert (path, name) == (f"new/{n}", "EINVAL")
    assert "byte 4" in reason and "empty" in reason, reason
    # the close itself fails, for a program that looks
    assert_refused(m, src, n, b"zzzz", 4, "empty")
    assert append(m, n, GOOD) == 0  # the next append at n works
    assert read_event(m, n) == GOOD


def test_random_bytes_are_refused(m, src):
    n = next_number(m)
    data = random.Random(21).randbytes(3 * MIB + 17)
    bad = scan(data[4:])
    assert not bad.ok
    assert_refused(m, src, n, data, 4 + bad.byte, bad.message)


def test_a_truncated_jam_is_refused_then_the_whole_one_accepted(m, src):
    n = next_number(m)
    noun = from_list([cord("x" * k) for k in range(1, 60)])
    whole = event(noun)
    cut = whole[:-3]
    bad = scan(cut[4:])
    assert bad.reason == "truncated"
    assert_refused(m, src, n, cut, 4 + bad.byte, "truncated")
    assert append(m, n, whole) == 0
    assert read_event(m, n) == whole


def test_trailing_garbage_is_refused(m, src):
    n = next_number(m)
    assert_refused(m, src, n, GOOD + b"\0", 4 + scan(GOOD[4:] + b"\0").byte, "trailing")
    # a non-zero bit after the noun in its own last byte is trailing data too
    j = jam(0)  # 0b10: one byte, six bits spare
    assert_refused(m, src, n, b"\0\0\0\0" + bytes([j[0] | 0x80]), 4, "trailing")


def test_any_stored_mug_is_accepted(m, src):
    """The stored mug is the mug of Arvo's state after the event (reference-formats.md §4;
    vere's mars.c sets it from u3r_mug(u3A->roc)), so it is not compared with the event
    noun's: a real ship's event, whose mug differs from its noun's, is accepted, as are
    0 (boot events) and the noun's own."""
    for stored in ((mug(SMALL) ^ 1).to_bytes(4, "little"), b"\0\0\0\0", b"\xff\xff\xff\x7f"):
        n = next_number(m)
        payload = stored + jam(SMALL)
        assert append(m, n, payload) == 0
        assert read_event(m, n) == payload


def test_a_valid_noun_is_accepted_with_its_mug(m, src):
    n = next_number(m)
    noun = (cord("poke"), (from_list(list(range(300))), (1 << 200) + 5))
    data = event(noun)
    assert_refused(m, src, n, data[:-1], 4 + scan(data[4:-1]).byte, "truncated")
    assert append(m, n, data, chunk=7) == 0  # written in small pieces
    assert read_event(m, n) == data


def test_writes_out_of_order_and_over_each_other_are_checked_whole(m, src):
    n = next_number(m)
    data = event(from_list([int.from_bytes(os.urandom(100), "little") for _ in range(2000)]))
    half = len(data) // 2
    # the second half first, then the first: nothing streams until the close
    fd = os.open(f"{m}/new/{n}", os.O_WRONLY | os.O_CREAT)
    os.pwrite(fd, data[half:], half)
    os.pwrite(fd, data[:half], 0)
    os.close(fd)
    assert read_event(m, n) == data
    # a valid payload streamed, then a byte inside it overwritten: checked again
    n += 1
    fd = os.open(f"{m}/new/{n}", os.O_WRONLY | os.O_CREAT)
    os.write(fd, data)
    # the jam's last byte, which holds the list's last bit (a 1: ~ is jammed 0b10), zeroed
    os.pwrite(fd, b"\0", len(data) - 1)
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EINVAL
    assert not os.path.exists(f"{m}/events/{n}")
    assert refusals(m)[-1][0] == f"new/{n}"


def big_noun(megabytes: int):
    """A list of 1,000-byte atoms, ``megabytes`` MB of jam."""
    rng = random.Random(megabytes)
    return from_list([int.from_bytes(rng.randbytes(1000), "little") | 1 << 7999
                      for _ in range(megabytes * 1000)])


def test_a_large_event_is_checked_as_it_streams(m, src):
    n = next_number(m)
    noun = big_noun(50)
    data = event(noun)
    assert len(data) > 50_000_000
    # refused with the offset: cut short, and then with a byte after it
    cut = data[:-1000]
    bad = scan(cut[4:])
    assert bad.reason == "truncated"
    assert_refused(m, src, n, cut, 4 + bad.byte, "truncated")
    assert_refused(m, src, n, data + b"\xff", 4 + scan(data[4:] + b"\xff").byte,
                   "trailing")
    noise = random.Random(7).randbytes(len(data))
    assert_refused(m, src, n, noise, 4 + scan(noise[4:]).byte, "not a mug and a jam")
    # the whole one, in 1 MiB writes, is accepted
    assert append(m, n, data) == 0
    h = hashlib.sha256()
    with open(f"{m}/events/{n}", "rb") as f:
        while block := f.read(MIB):
            h.update(block)
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_ram_payload_is_checked(m, src):
    ram = pytest.importorskip("bookfs.noun.ram")
    n = next_number(m)
    noun = (cord("ram"), from_list(list(range(50))))
    body = ram.ram_encode(noun)
    assert body[:5] == b"RAM\x00\x01"
    with pytest.raises(ram.CueError) as e:
        ram.ram_decode(body[:-2], exact=True)
    bit = int(re.search(r"\bbit (\d+)", str(e.value)).group(1))  # after the 5-byte header
    reason = assert_refused(m, src, n, b"\0\0\0\0" + body[:-2], 4 + 5 + bit // 8, "ram")
    assert "not a mug and a ram encoding" in reason
    good = mug(noun).to_bytes(4, "little") + body
    assert append(m, n, good) == 0
    assert read_event(m, n) == good


def test_setting_another_xattr_does_not_stop_the_opt_out(m, src):
    with pytest.raises(OSError) as e:
        os.setxattr(f"{m}/events/1", "user.other", b"1")
    # EROFS: events/ is the read-only companion's mount (fs/daemon/companion.py)
    assert e.value.errno in (errno.EOPNOTSUPP, errno.EROFS)
    n = next_number(m)
    fd = os.open(f"{m}/new/{n}", os.O_WRONLY | os.O_CREAT)
    try:
        # accepted and not kept, like the file's mode (issue 33, item 3: cp
        # --preserve=xattr, rsync -X): the only one a new/ file has is ours
        os.setxattr(fd, "user.other", b"1")
        os.setxattr(fd, "user.bookfs.unchecked", b"1")
        os.write(fd, b"anything at all")
    except BaseException:
        os.ftruncate(fd, 0)  # refused at the close: no stalled number for the next tests
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    os.close(fd)
    assert read_event(m, n) == b"anything at all"


def test_bookfs_append_refuses_a_non_payload_before_appending_anything(m, src, tmp_path):
    good, junk = tmp_path / "good.bin", tmp_path / "junk.bin"
    good.write_bytes(GOOD)
    junk.write_bytes(GOOD[:4] + jam(SMALL)[:-2])
    n, record, before = next_number(m), refusals(m), log_state(src)
    res = run_bookfs("append", str(m), str(good), str(junk), check=False)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    bad = scan(junk.read_bytes()[4:])
    assert str(junk) in lines[0] and f"byte {4 + bad.byte}" in lines[0], lines[0]
    assert "--unchecked" in lines[0]
    # nothing written: the number, the log and the mount's record are as they were
    assert next_number(m) == n and log_state(src) == before and refusals(m) == record
    # the same command with only good files appends them
    res = run_bookfs("append", str(m), str(good), check=False)
    assert res.returncode == 0, res.stderr
    assert read_event(m, n) == GOOD


def test_bookfs_append_of_stdin_is_checked_by_the_mount(m, src):
    n = next_number(m)
    res = subprocess.run([*BOOKFS, "append", str(m), "-"],
                         input=b"zzzz", capture_output=True)
    assert res.returncode == 1, res
    err = res.stderr.decode()
    assert f"new/{n}" in err and "byte 4" in err and "[EINVAL]" in err, err
    assert not os.path.exists(f"{m}/events/{n}")


def test_bookfs_append_unchecked_appends_junk_on_a_checked_mount(m, src, tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"zzzz")
    n = next_number(m)
    res = run_bookfs("append", "--unchecked", str(m), str(junk), "-", check=False,
                     input="not a noun either")
    assert res.returncode == 0, res.stderr
    assert read_event(m, n) == b"zzzz"
    assert read_event(m, n + 1) == b"not a noun either"
    # the opt-out was for those files only
    assert append(m, n + 2, b"zzzz") == errno.EINVAL


def test_mount_option_unchecked_payloads_accepts_junk(tmp_path):
    assert "unchecked_payloads" in run_bookfs("mount", "--help").stdout
    with Book.open(tmp_path / "log", writable=True, create=True) as book:
        book.save(1, [GOOD])
    with mounted(tmp_path / "log", tmp_path / "u", "-o", "unchecked_payloads") as mp:
        n = next_number(mp)
        res = subprocess.run(["bash", "-c", f"printf zzzz > {mp}/new/{n}"])
        assert res.returncode == 0
        assert read_event(mp, n) == b"zzzz"
        junk = random.Random(3).randbytes(2 * MIB)
        assert append(mp, n + 1, junk) == 0
        assert read_event(mp, n + 1) == junk
        assert append(mp, n + 2, b"abc") == errno.EINVAL  # still at least a mug
        with open(f"{mp}/info") as f:  # the mount says it does not check
            assert re.search(r"^payloads: +unchecked \(-o unchecked_payloads\)", f.read(), re.M)
    with mounted(tmp_path / "log", tmp_path / "c") as mp:
        with open(f"{mp}/info") as f:  # and a default mount that it does
            assert re.search(r"^payloads: +checked: a 4-byte mug, then a jam", f.read(), re.M)


def test_the_check_is_fed_as_the_writes_arrive_not_at_the_close():
    """``PayloadStream`` (driven directly, as the write handler does): sequential writes
    are scanned as they come, the large ones on the worker thread, so the close only
    finishes the scan; a write elsewhere is read back at the close."""
    import trio

    from bookfs.fs.append.commit_queue import WorkerThread
    from bookfs.fs.append.check import PayloadStream
    from bookfs.fs.append.staging import Staging

    data = event(big_noun(8))
    reads = []

    class Watched(Staging):
        def read(self, off, size):
            reads.append((off, size))
            return super().read(off, size)

    async def main():
        worker = WorkerThread("test-check")
        try:
            # in order, 1 MiB at a time: everything is fed before the close
            s, ps = Watched(1 << 32), PayloadStream(worker)
            for i in range(0, len(data), MIB):
                s.write(i, data[i:i + MIB])
                await ps.wrote(i, data[i:i + MIB])
            assert ps.fed == len(data) and ps.threaded
            assert await ps.verdict(s) is None
            assert reads == []  # the close read nothing back
            assert ps.check.size == len(data)
            # the same bytes out of order: fed up to the gap, the rest read at the close
            s, ps = Watched(1 << 32), PayloadStream(worker)
            half = len(data) // 2
            for off, part in ((0, data[:1000]), (half, data[half:]), (1000, data[1000:half])):
                s.write(off, part)
                await ps.wrote(off, part)
            assert ps.fed == half
            assert await ps.verdict(s) is None
            assert reads and reads[0][0] == half
            # small writes stay on the event loop; one byte rewritten: checked again
            s, ps = Watched(1 << 32), PayloadStream(worker)
            small = GOOD
            for i in range(len(small)):
                s.write(i, small[i:i + 1])
                await ps.wrote(i, small[i:i + 1])
            assert not ps.threaded and ps.fed == len(small)
            s.write(len(small) - 1, b"\xff")
            await ps.wrote(len(small) - 1, b"\xff")
            assert ps.stale
            assert (await ps.verdict(s)).offset == 4 + scan(small[4:-1] + b"\xff").byte
        finally:
            worker.close()

    trio.run(main)
