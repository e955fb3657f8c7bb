"""``bookfs fsck --salvage`` against every format (issue 19, items 2, 10 and 12).

* Item 2: a salvage copies only committed events.  A vere batch whose CRC fails (one
  flipped payload byte), deeds no header commits, damaged bytes and payloads under 4 bytes
  are kept byte for byte in ``salvage-left-out.bin``, never as events of the new log; the
  report counts ``past_committed_end`` and the summary line says what was left out and why.
* Item 10: a salvage is built beside OUT and renamed into place.  A salvage killed with
  SIGKILL at any point leaves OUT as it was (no valid-looking partial log), and running the
  same command again works.
* Item 12: a 0-byte payload in a batch the reference acknowledged is refused with one line,
  the log untouched (never rolled back); ``fsck --salvage`` keeps payloads under 4 bytes
  aside and records them.

Everything runs the real ``bookfs`` command on real files."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.formats.layout import META_SIZE
from bookfs.formats.vere import Slot, VereBook

BOOKFS = [sys.executable, "-m", "bookfs.cli"]
LEFT_OUT = "salvage-left-out.bin"


def bookfs(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*BOOKFS, *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kw)


def payload(i: int, size: int = 50) -> bytes:
    return i.to_bytes(4, "little") + bytes([i % 251]) * size


def tree_hash(d: Path) -> dict:
    """Every file's hash (the writer lock's empty ``book.lock`` aside)."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != "book.lock"}


def report(out: Path) -> dict:
    return json.loads((out / "salvage-report.json").read_text())


def summary(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("salvaged ")]
    assert len(lines) == 1, r.stdout + r.stderr
    return lines[0]


def raw_vere_log(d: Path, batches: list[list[bytes]], fir: int = 0) -> Path:
    """A vere-layout log written the way vere's C API writes it, payloads of any size
    (0 bytes included): each batch's deeds, then its header in the other slot."""
    d.mkdir(parents=True)
    head = bytearray(8192)
    slots = [Slot(0, fir, fir, 0, 0, 0), Slot(1, fir, fir, 0, 0, 0)]
    deeds = bytearray()
    las = fir
    for seq, batch in enumerate(batches, start=1):
        raw = b"".join(len(p).to_bytes(8, "little") + p + len(p).to_bytes(8, "little")
                       for p in batch)
        deeds += raw
        las += len(batch)
        which = seq % 2  # the first save goes to slot B, as VereBook's does
        slots[which] = Slot(which, fir, las, seq, len(batch), zlib.crc32(raw))
    for s in slots:
        head[s.offset : s.offset + 48] = s.pack()
    (d / "book.log").write_bytes(bytes(head) + bytes(deeds))
    (d / "meta.bin").write_bytes(bytes(META_SIZE))
    return d


# --- item 2: what was never committed is never an event of the salvaged log ----------------


def _vere_with_a_bad_newest_batch(d: Path) -> int:
    """4,000 committed events, then a batch of 500 whose CRC fails (one flipped payload
    byte).  Returns the offset where the committed events end."""
    with VereBook.open(d, writable=True, create=True, epoch=0) as b:
        b.save(1, [payload(i) for i in range(1, 4001)])
        end = b._view[2]
        b.save(4001, [payload(i) for i in range(4001, 4501)])
    log = d / "book.log"
    with open(log, "r+b") as f:
        f.seek(log.stat().st_size - 30)
        c = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([c[0] ^ 1]))
    return end


def test_salvage_of_a_vere_log_leaves_a_batch_that_fails_its_crc_out(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    end = _vere_with_a_bad_newest_batch(src)
    before = tree_hash(src)
    r = bookfs("fsck", src, "--salvage", out)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr
    line = summary(r)
    assert "salvaged 4000 events" in line and "500 deed(s) never committed" in line, line
    assert "never acknowledged" in line and str(out / LEFT_OUT) in line, line
    rep = report(out)
    assert (rep["recovered"], rep["last"], rep["past_committed_end"]) == (4000, 4000, 500)
    with VereBook.open(out) as b:
        assert b.gulf() == (1, 4000) and b.read(4000) == payload(4000)
    # the rolled-back batch is kept byte for byte beside the log, never as events
    raw = (src / "book.log").read_bytes()
    assert (out / LEFT_OUT).read_bytes() == raw[end:]
    (left,) = rep["left_out"]
    assert (left["kind"], left["source_offset"], left["deeds"]) == ("not-committed", end, 500)
    r = bookfs("verify", out)
    assert r.returncode == 0 and " 4000 events" in r.stdout, r.stdout + r.stderr
    assert tree_hash(src) == before  # the source is untouched


def test_salvage_of_a_pier_leaves_a_batch_that_fails_its_crc_out(tmp_path):
    from lmdb_fixtures import make_pier, payloads

    root = make_pier(tmp_path / "p", [("lmdb", payloads(1, 20)), ("vere", payloads(21, 30))])
    epoch = root / ".urb" / "log" / "0i20"
    with VereBook.open(epoch, writable=True) as b:
        b.save(51, [payload(i) for i in range(51, 151)])
    log = epoch / "book.log"
    with open(log, "r+b") as f:  # one flipped payload byte in the newest batch
        f.seek(log.stat().st_size - 20)
        c = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([c[0] ^ 0x40]))
    out = tmp_path / "out"
    r = bookfs("fsck", root, "--salvage", out)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr
    line = summary(r)
    assert "salvaged 50 events" in line and "100 deed(s) never committed" in line, line
    rep = report(out)
    assert rep["past_committed_end"] == 100 and rep["epochs"]["0i20"]["last"] == 50
    assert [x["epoch"] for x in rep["left_out"]] == ["0i20"]
    assert (out / "0i20" / LEFT_OUT).stat().st_size == 100 * (16 + 54)
    with VereBook.open(out / "0i20") as b:
        assert b.gulf() == (21, 50)


def test_salvage_leaves_deeds_no_header_commits_out(tmp_path):
    """Deeds appended with no header update (a save killed before its header)."""
    src, out = tmp_path / "src", tmp_path / "out"
    with VereBook.open(src, writable=True, create=True, epoch=0) as b:
        b.save(1, [payload(i) for i in range(1, 11)])
    extra = b"".join(len(p).to_bytes(8, "little") + p + len(p).to_bytes(8, "little")
                     for p in (payload(11), payload(12)))
    with open(src / "book.log", "ab") as f:
        f.write(extra)
    r = bookfs("fsck", src, "--salvage", out)
    assert "Traceback" not in r.stderr, r.stderr
    assert "2 deed(s) never committed" in summary(r)
    assert report(out)["past_committed_end"] == 2
    assert (out / LEFT_OUT).read_bytes() == extra
    with VereBook.open(out) as b:
        assert b.gulf() == (1, 10)


def test_salvage_past_damage_keeps_only_what_a_header_commits(tmp_path):
    """Damage inside acknowledged events: the deeds after it are copied up to the end of
    the batch whose CRC the header holds; an uncommitted batch after that is left out."""
    src, out = tmp_path / "src", tmp_path / "out"
    with VereBook.open(src, writable=True, create=True, epoch=0) as b:
        b.save(1, [payload(i) for i in range(1, 21)])
        offsets = list(b._index.offsets)
        b.save(21, [payload(i) for i in range(21, 31)])
        committed_end = b._view[2]
    extra = b"".join(len(p).to_bytes(8, "little") + p + len(p).to_bytes(8, "little")
                     for p in (payload(31), payload(32), payload(33)))
    with open(src / "book.log", "r+b") as f:
        f.seek(offsets[5])  # break the framing of event 6
        f.write(b"\xff" * 8)
        f.seek(0, 2)
        f.write(extra)  # three deeds no header commits
    r = bookfs("fsck", src, "--salvage", out)
    assert "Traceback" not in r.stderr, r.stderr
    rep = report(out)
    # events 1..5, then 7..30 (renumbered 6..29): event 6 is lost in the gap
    assert rep["recovered"] == 29 and rep["past_committed_end"] == 3, rep
    assert [g["events_lost"] for g in rep["gaps"]] == [1]
    with VereBook.open(out) as b:
        assert b.read(5) == payload(5) and b.read(6) == payload(7) and b.read(29) == payload(30)
    kinds = [(x["kind"], x.get("source_offset")) for x in rep["left_out"]]
    assert kinds == [("damaged", offsets[5]), ("not-committed", committed_end)], kinds
    assert "RENUMBERED" in r.stderr
    # issue 23.4: one count, said one way ("1 gap", never "gap(s)" twice with two numbers)
    assert "(1 gap;" in r.stdout and "lost in 1 gap before its last event" in r.stderr
    assert "gap(s)" not in r.stdout + r.stderr


def test_uip_salvage_keeps_damaged_deeds_aside(tmp_path):
    """The UIP layout: a deed whose CRC fails and a torn tail are never events of the
    salvaged log; their bytes are kept in salvage-left-out.bin."""
    src, out = tmp_path / "src", tmp_path / "out"
    with Book.open(src, writable=True, create=True) as b:
        b.save(1, [payload(i) for i in range(1, 21)])
        offsets = list(b.index.offsets)
    raw = (src / "book.log").read_bytes()
    with open(src / "book.log", "r+b") as f:
        f.seek(offsets[9] + 20)  # a payload byte of event 10
        f.write(b"\x00")
        f.seek(0, 2)
        f.write(b"\x40" + bytes(7) + b"torn")  # an incomplete final deed
    r = bookfs("fsck", src, "--salvage", out)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr
    assert "damaged byte(s)" in summary(r), summary(r)
    rep = report(out)
    assert rep["recovered"] == 19
    left = (out / LEFT_OUT).read_bytes()
    bad = (src / "book.log").read_bytes()[offsets[9]:offsets[10]]
    assert left == bad + b"\x40" + bytes(7) + b"torn" and len(bad) == offsets[10] - offsets[9]
    assert raw != (src / "book.log").read_bytes()
    with Book.open(out) as b:
        assert b.gulf() == (1, 19) and b.read(10) == payload(11)


# --- item 12: payloads under 4 bytes ------------------------------------------------------


def test_zero_byte_payload_the_reference_keeps_is_refused_untouched(tmp_path):
    """Event 2 has a 0-byte payload in a batch whose CRC holds: the reference keeps it.
    bookfs refuses the log with one line and changes nothing, never rolls it back."""
    src = raw_vere_log(tmp_path / "src", [[payload(1)], [b"", payload(3)]])
    before = tree_hash(src)
    for cmd in (("verify", src), ("info", src), ("fsck", src, "--repair")):
        r = bookfs(*cmd)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (cmd, r.stderr)
        err = [ln for ln in (r.stderr + r.stdout).splitlines() if "0-byte payload" in ln]
        assert err and "event 2 at offset" in err[0], (cmd, r.stdout + r.stderr)
        assert tree_hash(src) == before, cmd
    from bookfs.formats.vere import EmptyPayload

    with pytest.raises(EmptyPayload, match="event 2 at offset 8262 has a 0-byte payload"):
        VereBook.open(src, writable=True)
    assert tree_hash(src) == before
    # fsck reports it (and reads every event, as the reference does)
    r = bookfs("fsck", src)
    assert r.returncode == 4 and "event 2 at offset 8262 has a 0-byte payload" in r.stdout, \
        r.stdout + r.stderr
    assert "events 1..3 (3)" in r.stdout


def test_zero_byte_payload_in_an_older_batch_is_refused_too(tmp_path):
    """Later saves made the 0-byte payload's batch an older one: still no rollback."""
    src = raw_vere_log(tmp_path / "src", [[payload(1)], [b"", payload(3)], [payload(4)]])
    before = tree_hash(src)
    r = bookfs("verify", src)
    assert r.returncode != 0 and "event 2 at offset 8262 has a 0-byte payload" in r.stderr
    assert tree_hash(src) == before
    r = bookfs("fsck", src, "--salvage", tmp_path / "out")
    assert "Traceback" not in r.stderr and "event(s) 2" in summary(r), r.stdout + r.stderr
    with VereBook.open(tmp_path / "out") as b:
        assert [b.read(e) for e in (1, 2, 3)] == [payload(1), payload(3), payload(4)]


def test_a_follower_says_why_it_cannot_go_on_at_a_zero_byte_payload(tmp_path):
    """A read-only open following vere: the writer commits a batch holding a 0-byte
    payload.  ``refresh`` refuses with the one-line reason instead of waiting forever."""
    from bookfs.errors import BookError

    src = raw_vere_log(tmp_path / "src", [[payload(1)]])
    later = raw_vere_log(tmp_path / "later", [[payload(1)], [b"", payload(3)]])
    with VereBook.open(src) as b:
        assert b.gulf() == (1, 1)
        with open(src / "book.log", "r+b") as f:  # vere appends in place (same inode)
            f.write((later / "book.log").read_bytes())
        with pytest.raises(BookError, match="event 2 at offset 8262 has a 0-byte payload"):
            b.refresh()


def test_zeroed_bytes_inside_acknowledged_events_are_damage_not_empty_payloads(tmp_path):
    """16 zero bytes where a deed starts look like a 0-byte deed, but no batch CRC holds
    for them: that is damage, handled as before (no refusal)."""
    src = tmp_path / "src"
    with VereBook.open(src, writable=True, create=True, epoch=0) as b:
        for k in range(0, 30, 10):
            b.save(k + 1, [payload(i) for i in range(k + 1, k + 11)])
        off = b._index.offsets[4]
    with open(src / "book.log", "r+b") as f:
        f.seek(off)
        f.write(bytes(16))
    with VereBook.open(src) as b:
        assert b.gulf() == (1, 4) and b.recovery.rolled_back is not None


@pytest.mark.parametrize("short", [b"", b"\x01", b"\x01\x02\x03"])
def test_salvage_keeps_payloads_under_4_bytes_aside_and_says_so(tmp_path, short):
    src = raw_vere_log(tmp_path / "src", [[payload(1), payload(2)],
                                          [short, payload(4)], [payload(5)]])
    out = tmp_path / "out"
    r = bookfs("fsck", src, "--salvage", out)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stdout + r.stderr
    line = summary(r)
    assert "salvaged 4 events" in line and "1 payload(s) under 4 bytes" in line, line
    assert "event(s) 3" in line, line
    rep = report(out)
    (left,) = rep["left_out"]
    assert (left["kind"], left["original_event"], left["bytes"]) == (
        "short-payload", 3, len(short))
    assert rep["gaps"][0]["events_lost"] == 1 and rep["gaps"][0]["original_event"] == 3
    assert (out / LEFT_OUT).read_bytes() == short
    with VereBook.open(out) as b:
        assert [b.read(e) for e in range(1, 5)] == [payload(1), payload(2), payload(4),
                                                     payload(5)]
    assert "RENUMBERED" in r.stderr


def test_lmdb_salvage_keeps_short_values_aside(tmp_path):
    from lmdb_fixtures import make_lmdb_epoch

    d = tmp_path / "0i0"
    make_lmdb_epoch(d, 0, [payload(1), b"ab", payload(3)])
    out = tmp_path / "out"
    r = bookfs("fsck", d, "--salvage", out)
    assert "Traceback" not in r.stderr, r.stderr
    assert "1 payload(s) under 4 bytes" in summary(r), summary(r)
    rep = report(out)
    assert rep["recovered"] == 2 and rep["left_out"][0]["original_event"] == 2
    assert (out / LEFT_OUT).read_bytes() == b"ab"


# --- item 10: a killed salvage publishes nothing; the re-run works --------------------------


def _big_log(d: Path, kind: str) -> int:
    """About 48 MB of events, so a salvage takes several batches (a pier: one vere epoch
    ``0i0``)."""
    events = [payload(i, 8000) for i in range(1, 6001)]
    if kind == "pier":
        from lmdb_fixtures import make_pier

        make_pier(d, [("vere", events)])
    elif kind == "vere":
        with VereBook.open(d, writable=True, create=True, epoch=0) as b:
            for k in range(0, 6000, 1000):
                b.save(k + 1, events[k : k + 1000])
    else:
        with Book.open(d, writable=True, create=True) as b:
            for k in range(0, 6000, 1000):
                b.save(k + 1, events[k : k + 1000])
    return len(events)


def _salvaged_log_size(out: Path, inner: str) -> int:
    """The size of the log being written: inside the work directory beside OUT, or (old
    code) inside OUT itself."""
    work = Path(str(out) + ".salvage-partial") / out.name
    for p in (out / inner / "book.log", work / inner / "book.log"):
        try:
            return p.stat().st_size
        except FileNotFoundError:
            pass
    return 0


def _complete(out: Path, events: int) -> bool:
    return (out / "salvage-report.json").exists() and report(out)["recovered"] == events


@pytest.mark.parametrize("kind", ["vere", "uip", "pier"])
def test_a_killed_salvage_leaves_out_as_it_was_and_the_rerun_works(tmp_path, kind):
    src = tmp_path / "src"
    events = _big_log(src, kind)
    inner = "0i0" if kind == "pier" else ""
    total = (src / (".urb/log/0i0" if kind == "pier" else "") / "book.log").stat().st_size
    landed = 0
    for k, fraction in enumerate((0.0, 0.3, 0.7, 0.99)):
        out = tmp_path / f"out{k}"
        proc = subprocess.Popen([*BOOKFS, "fsck", str(src), "--salvage", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if _salvaged_log_size(out, inner) > 8192 + fraction * total:
                break
            time.sleep(0.0005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        if proc.returncode == -signal.SIGKILL and not _complete(out, events):
            landed += 1
            # no valid-looking partial log at OUT: nothing there, or an empty directory
            assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())
        r = bookfs("fsck", src, "--salvage", out)  # the same command again
        assert r.returncode == 0, r.stdout + r.stderr
        assert _complete(out, events) and not Path(str(out) + ".salvage-partial").exists()
        with (Book if kind == "uip" else VereBook).open(out / inner) as b:
            assert b.gulf() == (1, events) and b.read(events) == payload(events, 8000)
    assert landed >= 2, f"only {landed} kill(s) landed during a salvage"


def test_salvage_refuses_a_work_directory_that_is_not_its_own(tmp_path):
    src = raw_vere_log(tmp_path / "src", [[payload(1)]])
    out = tmp_path / "out"
    stray = Path(str(out) + ".salvage-partial")
    stray.mkdir()
    (stray / "precious").write_text("x")
    r = bookfs("fsck", src, "--salvage", out)
    assert r.returncode == 8 and "not an unfinished salvage's work directory" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    assert (stray / "precious").read_text() == "x"
