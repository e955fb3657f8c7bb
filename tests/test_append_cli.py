"""Refused appends a shell user can see: the refusal record in the mount's ``info`` file,
and ``bookfs append MNT FILE...``, on real mounts driven by bash and the real command."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import threading
import time

from bookfs.formats.book import Book
from mounting import BOOKFS
from mount_fixtures import (  # noqa: F401  (fixtures)
    engine_events,
    err_of,
    log_state,
    mnt,
    mounted,
    payload,
    run_bookfs,
    small_src,
)

LINE = re.compile(r"^  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} "  # local time, offset
                  r"(\S+) (\S+) pid (\S+): (.*)$")  # path, errno, pid, reason


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def refusals(m) -> list[tuple[str, str, str, str]]:
    """``(path, errno name, pid, reason)`` of each line of info's refusal record."""
    text = open(f"{m}/info").read()
    return [LINE.match(line).groups() for line in text.splitlines() if LINE.match(line)]


def info_value(m, key: str) -> str:
    for line in open(f"{m}/info").read().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise KeyError(key)


def files(tmp_path, **named: bytes) -> dict[str, str]:
    out = {}
    for name, data in named.items():
        (tmp_path / name).write_bytes(data)
        out[name] = str(tmp_path / name)
    return out


def assert_one_line_error(res: subprocess.CompletedProcess, code: int = 2) -> None:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_shell_refusals_show_in_info(small_src, mnt):
    """bash returns 0 for a refused `printf abc > new/N` and a wrong-size `> meta/life`
    (it ignores close()'s errno); info shows both, with the reason and bash's PID, and its
    size is never stale."""
    with mounted(small_src, mnt):
        assert info_value(mnt, "last refusals") == "none"
        assert info_value(mnt, "next") == "11"
        res = bash(f"printf abc > {mnt}/new/11; echo $?; echo $$")
        status, pid = res.stdout.split()
        assert status == "0", res.stderr  # the shell's view: nothing went wrong
        res = bash(f"printf xy > {mnt}/meta/life; echo $?; echo $$")
        status2, pid2 = res.stdout.split()
        assert status2 == "0", res.stderr
        assert not os.path.exists(f"{mnt}/events/11")
        text = open(f"{mnt}/info").read()
        assert os.stat(f"{mnt}/info").st_size == len(text.encode())
        assert "last refusals: 2 of 2 since the mount (newest last)" in text
        assert refusals(mnt) == [
            ("new/11", "EINVAL", pid, "3 bytes written, expected at least 4 "
                                      "(a 4-byte mug, then the jam)"),
            ("meta/life", "EINVAL", pid2, "2 bytes written, expected exactly 4; the field "
                                          "is unchanged"),
        ]
        # the lines the summary always had are still there, unchanged in form
        assert info_value(mnt, "last") == "10" and info_value(mnt, "events") == "10"
        # an open that fails is recorded too (the shell does report this one)
        res = bash(f"printf abcdef > {mnt}/new/5")
        assert res.returncode != 0 and "File exists" in res.stderr
        assert refusals(mnt)[-1][:2] == ("new/5", "EEXIST")
    with Book.open(small_src) as book:
        assert book.last == 10 and book.read_meta("life") == (5).to_bytes(4, "little")


def test_refusal_record_is_bounded(small_src, mnt):
    """25 refusals: info keeps the newest 20, oldest first, and counts all 25."""
    with mounted(small_src, mnt):
        res = bash(f"for i in $(seq 25); do printf \"$i\" > {mnt}/new/11; done")
        assert res.returncode == 0, res.stderr
        rec = refusals(mnt)
        assert len(rec) == 20
        assert "last refusals: 20 of 25 since the mount" in open(f"{mnt}/info").read()
        # each printed its own number: 1..9 are one byte, 10..25 two (all too short)
        sizes = [int(r[3].split()[0]) for r in rec]
        assert sizes == [len(str(i)) for i in range(6, 26)]


def test_append_files_and_stdin(small_src, mnt, tmp_path):
    f = files(tmp_path, a=payload(11, 1234), b=payload(12, 5))
    with mounted(small_src, mnt):
        res = run_bookfs("append", str(mnt), f["a"], f["b"], check=False)
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines() == [f"event 11 <- {f['a']} (1,234 bytes)",
                                           f"event 12 <- {f['b']} (5 bytes)"]
        res = subprocess.run([*BOOKFS, "append", str(mnt), "-"], input=payload(13, 77),
                             capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert res.stdout == b"event 13 <- stdin (77 bytes)\n"
        assert info_value(mnt, "next") == "14"
    events = engine_events(small_src)
    assert events[11] == payload(11, 1234) and events[12] == payload(12, 5)
    assert events[13] == payload(13, 77)


def test_append_stops_at_first_refusal(small_src, mnt, tmp_path):
    """The reason comes from the refusal record; later files are not appended, unless
    --keep-going, which gives the next file the refused one's number."""
    # the refused one is standard input: a FILE that is not a payload is refused before
    # anything is appended (bad usage: test_checked_appends.py); stdin only by the mount
    f = files(tmp_path, good=payload(11, 100), later=payload(12, 50))
    with mounted(small_src, mnt):
        res = run_bookfs("append", str(mnt), f["good"], "-", f["later"], check=False,
                         input="ab")
        assert res.returncode == 1
        assert res.stdout.splitlines() == [f"event 11 <- {f['good']} (100 bytes)"]
        assert res.stderr.splitlines() == [
            "stdin: refused: new/12: 2 bytes written, expected at least 4 "
            "(a 4-byte mug, then the jam) [EINVAL]"]
        assert not os.path.exists(f"{mnt}/events/12")
        assert refusals(mnt)[-1][:2] == ("new/12", "EINVAL")
        res = run_bookfs("append", "--keep-going", str(mnt), "-", f["later"],
                         check=False, input="ab")
        assert res.returncode == 1
        assert res.stderr.startswith("stdin: refused: new/12: 2 bytes written")
        assert res.stdout.splitlines() == [f"event 12 <- {f['later']} (50 bytes)"]
    assert sorted(engine_events(small_src)) == list(range(1, 13))


def test_append_at(small_src, mnt, tmp_path):
    f = files(tmp_path, a=payload(11, 30), b=payload(12, 40))
    with mounted(small_src, mnt):
        res = run_bookfs("append", "--at", "11", str(mnt), f["a"], f["b"], check=False)
        assert res.returncode == 0, res.stderr
        assert [ln.split(" <- ")[0] for ln in res.stdout.splitlines()] == ["event 11",
                                                                            "event 12"]
        res = run_bookfs("append", "--at", "12", str(mnt), f["a"], check=False)
        assert res.returncode == 1  # the log has moved on
        assert res.stderr.strip() == (f"{f['a']}: refused: new/12: event 12 is already "
                                      "committed or in flight; the next free number is 13 "
                                      "[EEXIST]")
        res = run_bookfs("append", "--at", "20", str(mnt), f["a"], check=False)
        assert res.returncode == 1
        assert res.stderr.strip() == (f"{f['a']}: refused: new/20: would leave a gap; "
                                      "expected event 13 [EINVAL]")
    assert sorted(engine_events(small_src)) == list(range(1, 13))


def test_append_usage_errors(small_src, mnt, tmp_path):
    """Exit 2, one line, no traceback, nothing appended: not a mount, a read-only mount,
    a missing file, a directory, '-' twice, a bad --at."""
    f = files(tmp_path, a=payload(11, 30))
    before = log_state(small_src)
    res = run_bookfs("append", str(tmp_path), f["a"], check=False)
    assert_one_line_error(res)
    assert "not a bookfs mount point" in res.stderr
    assert_one_line_error(run_bookfs("append", str(tmp_path / "nowhere"), f["a"],
                                     check=False))
    with mounted(small_src, mnt, "-o", "ro"):
        res = run_bookfs("append", str(mnt), f["a"], check=False)
        assert_one_line_error(res)
        assert "mounted read-only" in res.stderr
    with mounted(small_src, mnt):
        for args, says in (([f["a"], str(tmp_path / "missing")], "No such file"),
                           ([f["a"], str(tmp_path)], "is a directory"),
                           (["-", "-"], "only once"),
                           (["--at", "0", f["a"]], "--at 0")):
            res = run_bookfs("append", str(mnt), *args, check=False)
            assert_one_line_error(res)
            assert says in res.stderr and res.stderr.startswith("bookfs append: ")
            assert res.stdout == ""
        assert run_bookfs("append", "--help").stdout.startswith("usage: bookfs append")
    assert log_state(small_src) == before


def test_append_with_another_writer(small_src, mnt, tmp_path):
    """A number in flight is skipped (with --at it is refused); when the writer in flight
    fails, the commit it cancelled (ECANCELED) is sent again and goes in at its number.
    Two commands at once each get all their files in, in order."""
    f = files(tmp_path, a=payload(50, 300))
    with mounted(small_src, mnt):
        held = os.open(f"{mnt}/new/11", os.O_WRONLY | os.O_CREAT)  # in flight
        try:
            res = run_bookfs("append", "--at", "11", str(mnt), f["a"], check=False)
            assert res.returncode == 1
            assert "event 11 is already committed or in flight" in res.stderr
            assert "[EEXIST]" in res.stderr
            assert info_value(mnt, "next") == "12"
            # a writer that takes 12 waits for 11 (commits are in order) ...
            out = {}
            t = threading.Thread(target=lambda: out.update(
                res=run_bookfs("append", str(mnt), f["a"], check=False)))
            t.start()
            deadline = time.monotonic() + 10
            while info_value(mnt, "next") != "13" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert info_value(mnt, "next") == "13"  # 12 is reserved by bookfs append
            # still open for its writer, though the --at attempt's lookup of new/11 made
            # the kernel drop its entry (the flush of a fork's copy must not commit it)
            assert os.write(held, b"xy") == 2  # ... and 11 fails (too short)
        finally:
            closed = err_of(os.close, held)
        assert closed == errno.EINVAL
        t.join(30)
        res = out["res"]
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines() == [f"event 11 <- {f['a']} (300 bytes)"]
        rec = refusals(mnt)
        assert ("new/11", "EINVAL") in [r[:2] for r in rec]
        assert ("new/12", "ECANCELED") in [r[:2] for r in rec]
        # two commands at once: every file goes in once, in each command's order
        many = files(tmp_path, **{f"m{i}": payload(100 + i, 200 + i) for i in range(16)})
        names = sorted(many, key=lambda k: int(k[1:]))
        procs = [subprocess.Popen([*BOOKFS, "append", str(mnt), *[many[k] for k in part]],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for part in (names[:8], names[8:])]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
    events = engine_events(small_src)
    assert sorted(events) == list(range(1, 28))
    got = sorted(events[n] for n in range(12, 28))
    assert got == sorted(payload(100 + i, 200 + i) for i in range(16))
    for part, (stdout, _) in zip((names[:8], names[8:]), outs):
        numbers = [int(ln.split()[1]) for ln in stdout.splitlines()]
        assert numbers == sorted(numbers) and len(numbers) == 8
        assert [events[n] for n in numbers] == [payload(100 + int(k[1:]), 200 + int(k[1:]))
                                               for k in part]


def test_append_never_commits_part_of_a_file(small_src, mnt, tmp_path):
    """A read error half-way (/proc/self/mem fails with EIO) and a Ctrl-C while stdin
    is still streaming: nothing is committed, and each is one line on stderr."""
    f = files(tmp_path, a=payload(11, 64))
    with mounted(small_src, mnt):
        res = run_bookfs("append", str(mnt), f["a"], "/proc/self/mem", check=False)
        assert res.returncode == 1, res.stderr
        assert res.stdout.splitlines() == [f"event 11 <- {f['a']} (64 bytes)"]
        assert res.stderr.splitlines() == [
            "/proc/self/mem: Input/output error while reading it; nothing appended"]
        p = subprocess.Popen([*BOOKFS, "append", str(mnt), "-"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdin.write(payload(12, 300_000))
        p.stdin.flush()
        deadline = time.monotonic() + 20  # until the daemon holds new/12
        while info_value(mnt, "next") != "13" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert info_value(mnt, "next") == "13"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 130
        assert err.decode().splitlines() == [
            "bookfs append: interrupted; stdin and the files after it were not appended"]
        assert not os.path.exists(f"{mnt}/events/12")
        assert refusals(mnt)[-1][:2] == ("new/12", "EINVAL")
        assert refusals(mnt)[-1][3].startswith("0 bytes written")
    assert sorted(engine_events(small_src)) == list(range(1, 12))
