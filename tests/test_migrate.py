"""bookfs migrate: LMDB epochs and piers to Book logs, verified, restartable, streaming."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from bookfs.formats.book import Book
from bookfs.formats.vere import VereBook
from bookfs.errors import BookError, FormatError, LockHeld
from bookfs.cli.migrate import CRASH_ENV, migrate, register
from bookfs.formats.pier import Pier, open_source
from lmdb_fixtures import make_lmdb_epoch, make_pier, meta_values, payloads
from test_pier import _HOLD_LOCK

try:
    import bookfs.formats.vere  # noqa: F401
    HAVE_VERE = True
except ImportError:
    HAVE_VERE = False

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_single_epoch_round_trip(tmp_path):
    events = payloads(1, 400)
    meta = meta_values(who=0x1234, version=3, fake=0, life=4)
    src = make_lmdb_epoch(tmp_path / "0i0", 0, events, meta=meta)
    dest = tmp_path / "out"
    seen = []
    report = migrate(src, dest, layout="uip", progress=seen.append)
    assert sum(seen) == 400
    assert report.events == 400 and report.resumed == 0
    assert sorted(os.listdir(tmp_path)) == ["0i0", "out"]  # no .partial left
    with Book.open(dest) as book:
        assert book.gulf() == (1, 400)
        assert list(book.walk()) == list(enumerate(events, start=1))
        assert book.meta() == meta
        assert book.verify() == []
    assert (dest / "meta.bin").read_bytes()[:16] == (0x1234).to_bytes(16, "little")


def test_single_epoch_keeps_its_numbering(tmp_path):
    events = payloads(51, 30)
    src = make_lmdb_epoch(tmp_path / "0i50", 50, events)
    migrate(src, tmp_path / "book", layout="uip")
    with Book.open(tmp_path / "book") as book:
        assert book.gulf() == (51, 80) and book.read(80) == events[-1]


def test_pier_round_trip_and_swap_in(tmp_path):
    a, b, c = payloads(1, 300, size=12), payloads(301, 50), payloads(351, 5)
    meta = meta_values(who=7, life=2)
    pier = make_pier(tmp_path / "pier", [("lmdb", a), ("lmdb", b), ("vere", c)], meta=meta)
    dest = tmp_path / "epochs"
    report = migrate(pier, dest)
    assert [(e.name, e.first, e.last) for e in report.epochs] == [("0i0", 1, 300),
                                                                  ("0i300", 301, 350)]
    assert sorted(os.listdir(dest)) == [".bookfs-migrated", "0i0", "0i300"]
    for name, evs, first in (("0i0", a, 1), ("0i300", b, 301)):
        d = dest / name
        assert (d / "epoc.txt").read_text() == "3"
        assert (d / "vere.txt").read_text() == "3.2"
        with VereBook.open(d) as book:  # the default layout for a pier: what vere reads
            assert list(book.walk()) == list(enumerate(evs, start=first))
            assert book.meta() == meta
    # swap the Book epochs into the pier: it reads the same, now all Book
    log_dir = pier / ".urb" / "log"
    for name in ("0i0", "0i300"):
        shutil.rmtree(log_dir / name)
        shutil.copytree(dest / name, log_dir / name)
    with Pier.open(pier) as p:
        assert p.format == "pier (3 epochs: vere-book, vere-book, vere-book)"
        assert list(p.walk()) == list(enumerate(a + b + c, start=1))


def test_pier_without_lmdb_epochs(tmp_path):
    pier = make_pier(tmp_path / "p", [("vere", payloads(1, 3))])
    with pytest.raises(BookError, match="already in the vere layout; nothing to migrate"):
        migrate(pier, tmp_path / "out")


def test_refuses_to_overwrite(tmp_path):
    src = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 10))
    migrate(src, tmp_path / "out")
    before = (tmp_path / "out" / "book.log").read_bytes()
    # the same migration again: complete already, nothing written (issue 23.3)
    again = migrate(src, tmp_path / "out")
    assert again.already and again.events == 10
    assert (tmp_path / "out" / "book.log").read_bytes() == before
    with pytest.raises(BookError, match=r"out: already holds a migration of another source, "
                                        r"layout or event range; refusing to overwrite it"):
        migrate(src, tmp_path / "out", layout="uip")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(BookError, match=r"other: already exists and is not empty; refusing "
                                        r"to overwrite it"):
        migrate(src, tmp_path / "other")
    assert (tmp_path / "out" / "book.log").read_bytes() == before
    (tmp_path / "file").write_text("x")
    with pytest.raises(BookError, match="refusing to overwrite"):
        migrate(src, tmp_path / "file")
    (tmp_path / "empty").mkdir()  # an empty directory is fine
    migrate(src, tmp_path / "empty", layout="uip")
    with Book.open(tmp_path / "empty") as book:
        assert book.count == 10


def test_bad_sources(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(FormatError, match="not a pier"):
        migrate(tmp_path / "plain", tmp_path / "out")
    src = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 3))
    with pytest.raises(BookError, match="inside the source"):
        migrate(src, src / "out")
    with pytest.raises(ValueError):
        migrate(src, tmp_path / "x", layout="nope")


def test_refuses_a_running_ship(tmp_path):
    pier = make_pier(tmp_path / "p", [("lmdb", payloads(1, 3)), ("book", payloads(4, 2))])
    ship = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(pier / ".vere.lock")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert ship.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld, match="stop the ship before migrating"):
            migrate(pier, tmp_path / "out")
        with pytest.raises(LockHeld):
            migrate(pier / ".urb" / "log" / "0i0", tmp_path / "out")
    finally:
        ship.stdin.close()
        ship.wait(timeout=10)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    migrate(pier, tmp_path / "out")


@pytest.mark.parametrize("torn", [False, True])
def test_restart_after_crash(tmp_path, monkeypatch, torn):
    monkeypatch.setattr("bookfs.cli.migrate.BATCH_EVENTS", 100)
    events = payloads(1, 1000)
    src = make_lmdb_epoch(tmp_path / "0i0", 0, events, meta=meta_values(life=6))
    dest = tmp_path / "out"
    # a process that dies right after a save, before verifying it (batches of 100 events)
    r = _run_migrate_batched(src, dest, crash_after=300, batch=100)
    assert r.returncode == 75, r.stderr
    assert not dest.exists()
    partial = tmp_path / "out.partial" / "out"
    with Book.open(partial) as book:
        assert book.gulf() == (1, 300)
    if torn:  # the crash also tore a deed in half
        with open(partial / "book.log", "ab") as f:
            f.write((500).to_bytes(8, "little") + b"half a deed")
    report = migrate(src, dest, layout="uip")
    assert report.resumed == 300 and report.events == 1000
    assert not (tmp_path / "out.partial").exists()
    with Book.open(dest) as book:
        assert list(book.walk()) == list(enumerate(events, start=1))
        assert book.read_meta("life") == (6).to_bytes(4, "little")
        assert book.verify() == []


def _run_migrate_batched(src, dest, crash_after, batch):
    env = dict(os.environ)
    env[CRASH_ENV] = str(crash_after)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    code = textwrap.dedent(f"""
        import bookfs.cli.migrate as m
        m.BATCH_EVENTS = {batch}
        m.migrate({str(src)!r}, {str(dest)!r}, layout="uip")
    """)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_restart_re_verifies_unverified_events(tmp_path):
    """Events saved but not yet compared when the process died are compared on restart; a
    partial log that disagrees with the source is refused, not completed."""
    events = payloads(1, 500)
    src = make_lmdb_epoch(tmp_path / "0i0", 0, events)
    dest = tmp_path / "out"
    r = _run_migrate_batched(src, dest, crash_after=200, batch=100)
    assert r.returncode == 75, r.stderr
    partial = tmp_path / "out.partial" / "out"
    # corrupt event 150 in a way its CRC does not catch: rewrite the deed consistently
    with Book.open(partial) as book:
        assert book.gulf() == (1, 200)
        good = [book.read(e) for e in range(1, 201)]
    shutil.rmtree(partial)
    bad = list(good)
    bad[149] = b"\x00" + bad[149][1:]
    with Book.open(partial, writable=True, create=True) as book:
        book.save(1, bad)
    with pytest.raises(BookError, match="event 150 reads back different from the source"):
        migrate(src, dest, layout="uip")
    assert not dest.exists()


def test_kill_mid_way_then_rerun(tmp_path):
    """A real kill (SIGKILL at a random point of a long run), then a rerun completes."""
    events = payloads(1, 20_000, size=200)
    src = make_lmdb_epoch(tmp_path / "0i0", 0, events)
    dest = tmp_path / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    code = textwrap.dedent(f"""
        import sys
        import bookfs.cli.migrate as m
        m.BATCH_EVENTS = 500
        m.migrate({str(src)!r}, {str(dest)!r}, layout="uip",
                  progress=lambda n: (print(n, flush=True)))
    """)
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         text=True)
    done = 0
    while done < 3000:
        line = p.stdout.readline()
        if not line:
            break
        done += int(line)
    p.kill()
    p.wait(timeout=30)
    if dest.exists():  # pragma: no cover - the machine outran us; nothing left to test
        pytest.skip("migration finished before it could be killed")
    report = migrate(src, dest, layout="uip")
    assert report.resumed >= 3000 and report.events == 20_000
    with Book.open(dest) as book:
        assert book.gulf() == (1, 20_000)
        for e in (1, 2999, 3000, 3001, 12345, 20_000):
            assert book.read(e) == events[e - 1]
        assert book.verify() == []


def test_other_source_into_partial_is_refused(tmp_path):
    a = make_lmdb_epoch(tmp_path / "a" / "0i0", 0, payloads(1, 300))
    b = make_lmdb_epoch(tmp_path / "b" / "0i0", 0, payloads(1, 300, seed=1))
    r = _run_migrate_batched(a, tmp_path / "out", crash_after=100, batch=100)
    assert r.returncode == 75, r.stderr
    with pytest.raises(BookError, match=r"out\.partial: holds an unfinished migration from "
                                        r".*a/0i0"):
        migrate(b, tmp_path / "out")
    migrate(a, tmp_path / "out", layout="uip")


def test_memory_does_not_grow_with_the_log(tmp_path):
    # 20,000 events of ~2 KB: 40 MB of payload, more than two 16 MB batches
    src = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 20_000, size=2048))
    tracemalloc.start()
    try:
        migrate(src, tmp_path / "out")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"peak {peak:,} bytes"
    with open_source(tmp_path / "out") as book:
        assert book.count == 20_000


def test_cli_register(tmp_path, capsys):
    src = make_lmdb_epoch(tmp_path / "0i0", 0, payloads(1, 20), meta=meta_values())
    parser = argparse.ArgumentParser(prog="bookfs")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["migrate", "--help"])
    assert e.value.code == 0
    assert "DEST.partial" in capsys.readouterr().out
    args = parser.parse_args(["migrate", str(src), str(tmp_path / "out")])
    assert args.layout == "vere"  # issue 10 item 4: what the runtime reads
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "events 1..20 (20 events), every one verified" in out
    with open_source(tmp_path / "out") as log:
        assert log.gulf() == (1, 20)
    with pytest.raises(SystemExit):
        parser.parse_args(["migrate", str(src), "x", "--layout", "bogus"])


@pytest.mark.skipif(not HAVE_VERE, reason="bookfs.formats.vere is not there yet")
def test_vere_layout(tmp_path):
    from bookfs.formats.vere import VereBook

    a, b = payloads(1, 40), payloads(41, 10)
    pier = make_pier(tmp_path / "p", [("lmdb", a), ("lmdb", b)], meta=meta_values(life=3))
    migrate(pier, tmp_path / "out", layout="vere")
    for name, evs, first in (("0i0", a, 1), ("0i40", b, 41)):
        with open_source(tmp_path / "out" / name) as log:
            assert isinstance(log, VereBook)
            assert list(log.walk()) == list(enumerate(evs, start=first))
            assert log.read_meta("life") == (3).to_bytes(4, "little")
    # a single epoch into a DEST not named 0iN takes its base from the source
    migrate(pier / ".urb" / "log" / "0i40", tmp_path / "single", layout="vere")
    with open_source(tmp_path / "single") as log:
        assert isinstance(log, VereBook) and log.gulf() == (41, 50)


def test_rerunning_a_finished_migration_says_it_is_complete(tmp_path):
    """Issue 23.3: the same ``bookfs migrate`` run again exits 0 and says it is already
    complete, as ``bookfs sample`` does (it exited 1, "already exists"); the pier's epochs
    growing since makes it a different migration, refused as before."""
    pier = make_pier(tmp_path / "pier", [("lmdb", payloads(1, 20))])
    dest = tmp_path / "epochs"
    cmd = [sys.executable, "-m", "bookfs.cli", "migrate", str(pier), str(dest)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert "already complete, nothing written" in again.stdout
    assert "20 events" in again.stdout
