"""Events a person can read: the renderer (bookfs.noun.render), ``bookfs show`` on a log and
through a real mount, the mount's ``pretty/`` view, and the dates and human sizes of
``info``."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats.book import Book
from bookfs.fs import inodes as I
from bookfs.noun import (
    cell,
    cord,
    cue,
    datetime_to_da,
    format_da,
    from_list,
    jam,
    noun_equal,
    patp,
    path,
    peek_event,
    tape,
)
from bookfs.noun.render import DEFAULT, Limits, human_bytes, render_text
from bookfs.noun.view import JamView, NounView
from bookfs.cli.sample import iter_sample_payloads, sample_meta
from mounting import mounted, run_bookfs

EVENTS = 300
UTC = dt.timezone.utc
NOW = datetime_to_da(dt.datetime(2026, 11, 23, 12, 0, 0, 500000, tzinfo=UTC))


def text(noun, limits=DEFAULT, ships=()) -> str:
    return render_text(NounView(), noun, limits, ships)


def jam_text(noun, limits=DEFAULT, ships=(), as_json=False) -> str:
    return render_text(JamView.of_bytes(jam(noun)), 0, limits, ships, as_json)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A sample log of EVENTS events (5 boot events, then ship events), written by the CLI."""
    d = tmp_path_factory.mktemp("show") / "log"
    run_bookfs("sample", str(d), "--events", str(EVENTS))
    return d


@pytest.fixture(scope="module")
def payloads():
    return [None, *iter_sample_payloads(EVENTS)]


# --- the notation --------------------------------------------------------------------------


@pytest.mark.parametrize("noun, shown", [
    (0, "0"),
    (1234567, "1.234.567"),
    (cell(1, 2, 3), "[1 2 3]"),
    (((1, 2), 3), "[[1 2] 3]"),
    (from_list([1, 2]), "[1 2 ~]"),
    (cord("belt"), "%belt"),
    (cord("Hello, world"), "'Hello, world'"),
    (cord("it's"), "'it\\'s'"),
    (cell(cord("txt"), tape("ls -la")), '[%txt "ls -la"]'),
    (path("/d/term/1"), "/d/term/1"),
    (NOW, "~2026.11.23..12.00.00..8000"),
    ((1 << 48) - 1, "0xffff.ffff.ffff"),
    (1 << 300, "0x10000000...00000000 (38 B)"),
    (cell(cord("wake"), 0), "[%wake ~]"),
    (from_list(range(40)), "[0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 ...]"),
])
def test_notation(noun, shown):
    """Cells flattened, lists ending in ~, terms, cords, tapes, paths, @da, dotted
    decimal and hex, long atoms abbreviated, wide lists cut: as the dojo shows them."""
    assert text(noun) == shown
    assert jam_text(noun) == shown


def test_ships_only_from_context():
    """A number becomes an @p only when the context names that ship (and never below
    a planet, so 0 stays 0)."""
    ship = 0x7D3A_1C22
    assert text(cell(cord("plea"), ship), ships={ship}) == f"[%plea {patp(ship)}]"
    assert text(cell(cord("plea"), ship)) == "[%plea 2.100.960.290]"
    assert text(cell(0, 1), ships={0, 1}) == "[0 1]"


def test_depth_and_node_limits_and_full():
    deep = 0
    for _ in range(30):
        deep = (deep, 1)
    assert text(deep) == "[[[[[[[[... 1] 1] 1] 1] 1] 1] 1] 1]"
    assert text(deep, None).count("[") == 30
    small = Limits(nodes=5)
    assert text(from_list(range(40)), small) == "[0 1 2 3 ...]"
    assert text(from_list(range(40)), None).endswith("38 39 ~]")


def test_huge_atom_is_never_built_by_the_jam_view():
    """A 1 MiB atom read in place: the view reads its two ends, never the value."""
    big = int.from_bytes(os.urandom(1 << 20), "little") | (1 << ((1 << 23) - 1))
    reads = []
    data = jam(cell(cord("boon"), big))
    view = JamView(len(data), lambda off, n: reads.append(n) or data[off:off + n])
    shown = render_text(view, 0)
    assert shown == f"[%boon 0x{big >> ((1 << 23) - 32):x}...{big & 0xffffffff:08x} (1.0 MiB)]"
    assert sum(reads) < 256 << 10


small_atoms = st.one_of(st.integers(0, 300), st.integers(0, 1 << 70),
                        st.sampled_from([cord("hear"), cord("Text!"), NOW, 1 << 5000]))
nouns = st.recursive(small_atoms, lambda kids: st.tuples(kids, kids), max_leaves=60)
shared = st.builds(lambda a, b: cell(a, b, a, (b, a), from_list([a, b, a])), nouns, nouns)
limits = st.builds(Limits, depth=st.integers(1, 6), width=st.integers(1, 6),
                   nodes=st.integers(1, 60), text=st.integers(1, 10),
                   atom_bytes=st.integers(1, 40), chars=st.integers(1, 400))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(nouns, shared), st.one_of(st.just(DEFAULT), limits), st.booleans())
def test_jam_view_renders_as_the_cued_noun(noun, lim, as_json):
    """Reading the jam in place gives exactly the text of the cued noun, for any limits
    (back-references, elisions and budgets included)."""
    assert jam_text(noun, lim, as_json=as_json) == render_text(NounView(), noun, lim,
                                                               as_json=as_json)


def _from_json(value):
    if isinstance(value, list):
        out = _from_json(value[-1])
        for item in reversed(value[:-1]):
            out = (_from_json(item), out)
        return out
    return int(value, 16) if isinstance(value, str) else value


@settings(max_examples=200, deadline=None)
@given(st.one_of(nouns, shared))
def test_full_json_is_the_exact_noun(noun):
    """``--full --json`` is lossless: flattened arrays and numbers give the noun back."""
    assert noun_equal(_from_json(json.loads(jam_text(noun, None, as_json=True))), noun)


# --- bookfs show ---------------------------------------------------------------------------


def show(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_bookfs("show", *args, check=check)


def test_show_prints_date_wire_card_and_noun(src, payloads):
    out = show(str(src), "1..12").stdout
    blocks = out.strip().split("\n\n")
    assert len(blocks) == 12
    assert blocks[0].splitlines() == [
        "event: 1", "kind:  not [date [wire card]] (a lifecycle event of the boot)",
        "size:  9 B, mug 0x00000000", "noun:  [2 [0 3] 0 2]"]
    for n in range(6, 13):
        date, wire, tag = peek_event(payloads[n][4:])
        fields = {k: v.strip() for k, v in (line.split(":", 1)
                                             for line in blocks[n - 1].splitlines())}
        assert fields["event"] == str(n) and fields["wire"] == wire
        assert fields["date"].startswith(format_da(date) + " (")
        assert fields["card"] == "%" + tag and fields["noun"].startswith(f"[%{tag}")
    assert '[%belt %txt "' in out  # a dojo line, as text
    assert "/d/term/1" in out


def test_show_json_lines(src, payloads):
    rows = [json.loads(line) for line in show(str(src), "4..9", "--json").stdout.splitlines()]
    assert [r["event"] for r in rows] == list(range(4, 10))
    assert rows[0]["date"] is None and rows[0]["card"] is None
    for r in rows[2:]:
        date, wire, tag = peek_event(payloads[r["event"]][4:])
        assert (r["date"], r["wire"], r["card"]) == (format_da(date), wire, tag)
        assert r["size"] == len(payloads[r["event"]])
        assert r["mug"] == int.from_bytes(payloads[r["event"]][:4], "little")
    full = json.loads(show(str(src), "9", "--json", "--full").stdout)
    job = cue(payloads[9][4:])
    assert noun_equal(_from_json(full["noun"]), job[1][1])  # the card, exactly


def test_show_through_a_mount_matches_the_log(src, tmp_path):
    with mounted(src, tmp_path / "mnt", "-o", "ro") as mnt:
        assert show(mnt, "1..40").stdout == show(str(src), "1..40").stdout


@pytest.mark.parametrize("args, status, says", [
    (("9..3",), 2, "expected 1 <= N <= M"),
    (("x",), 2, "expected an event number N or a range N..M"),
    (("0",), 2, "expected 1 <= N <= M"),
    ((f"{EVENTS}..{EVENTS + 1}",), 1, f"no event {EVENTS + 1} in"),
])
def test_show_errors_are_one_line(src, args, status, says):
    r = show(str(src), *args, check=False)
    assert r.returncode == status and r.stdout == ""
    assert r.stderr.count("\n") == 1 and says in r.stderr and "Traceback" not in r.stderr


def test_show_missing_source_is_bad_usage(tmp_path):
    r = show(str(tmp_path / "nothing"), "1", check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such file" in r.stderr


def _big_log(path, blob_bytes: int, wide: int):
    """Event 1: [now /g/use/hood %boon <blob_bytes-byte atom>]; event 2: [now /a/b %wide
    0 1 2 ... wide-1 ~]."""
    blob = int.from_bytes(os.urandom(blob_bytes), "little") | (1 << (8 * blob_bytes - 1))
    big = cell(NOW, path_of("/g/use/hood"), cord("boon"), blob)
    wide_noun = cell(NOW, path_of("/a/b"), cord("wide"), from_list(range(wide)))
    with Book.open(path, writable=True, create=True) as book:
        book.save(1, [bytes(4) + jam(big), bytes(4) + jam(wide_noun)])
    return blob


path_of = path


@pytest.mark.serial  # wall-clock or CPU bounds: run alone, after the parallel pass
def test_show_100_mb_event_is_quick_and_small(tmp_path):
    """Abbreviated, a 100 MiB event prints in a moment, and the process never holds it:
    its peak RSS stays far below the event's size (it is CRC-checked by streaming, then
    only the ends of its atom are read)."""
    blob = _big_log(tmp_path / "big", 100 << 20, 100_000)
    head = f"{blob >> (8 * (100 << 20) - 32):x}"
    del blob
    # VmHWM is this process's own peak (ru_maxrss would carry the forking parent's)
    code = ("import sys; from bookfs.cli import main; rc = main(sys.argv[1:]); "
            "print(next(ln for ln in open('/proc/self/status') if ln.startswith('VmHWM'))"
            ".split()[1], file=sys.stderr); sys.exit(rc)")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, "show", str(tmp_path / "big"), "1..2"],
                       capture_output=True, text=True, check=True)
    took = time.monotonic() - t
    peak_kib = int(r.stderr.split()[-1])
    assert f"noun:  [%boon 0x{head}..." in r.stdout
    assert "(100.0 MiB)]" in r.stdout
    assert "noun:  [%wide 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 ...]" in r.stdout
    assert took < 10, took
    assert peak_kib < 80 << 10, f"peak RSS {peak_kib} KiB for a 100 MiB event"


# --- pretty/ in the mount ------------------------------------------------------------------


def test_pretty_view_through_a_real_mount(src, tmp_path):
    expected = show(str(src), "1..30").stdout.strip().split("\n\n")
    with mounted(src, tmp_path / "mnt") as mnt:
        # lists as empty, so whole-mount walks never render every event
        assert os.listdir(f"{mnt}/pretty") == []
        assert "pretty" in os.listdir(mnt)
        st = os.stat(f"{mnt}/pretty/7")
        # the rendering's real size (issue 23.4: it was 0, and rsync copied nothing)
        seven = subprocess.run(["cat", f"{mnt}/pretty/7"], capture_output=True,
                               check=True).stdout
        assert seven.decode().strip() == expected[6]
        assert st.st_size == len(seven) and st.st_ino == I.pretty_inode(7)
        if shutil.which("rsync"):
            r = subprocess.run(["rsync", f"{mnt}/pretty/7", str(tmp_path / "seven")],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert (tmp_path / "seven").read_bytes() == seven
        assert os.stat(f"{mnt}/pretty/000000000007").st_ino == st.st_ino
        for n in (1, 2, 7, 30):
            got = subprocess.run(["cat", f"{mnt}/pretty/{n}"], capture_output=True,
                                 text=True, check=True).stdout
            assert got.strip() == expected[n - 1]
        head = subprocess.run(["head", "-n", "2", f"{mnt}/pretty/8"], capture_output=True,
                              text=True, check=True).stdout
        assert head.splitlines() == expected[7].splitlines()[:2]
        paths = [f"{mnt}/pretty/{n}" for n in range(1, EVENTS + 1)]
        hits = subprocess.run(["grep", "-l", "card:  %belt", *paths],
                              capture_output=True, text=True, check=True).stdout.split()
        belts = [n for n in range(1, EVENTS + 1) if peek_event(
            Book.open(src).read(n)[4:])[2] == "belt"]
        assert sorted(int(os.path.basename(h)) for h in hits) == belts
        with pytest.raises(OSError) as e:
            open(f"{mnt}/pretty/7", "w")
        assert e.value.errno == 30  # EROFS
        assert not os.path.exists(f"{mnt}/pretty/{EVENTS + 1}")
        assert not os.path.exists(f"{mnt}/pretty/abc")


def test_pretty_follows_appends(tmp_path, payloads):
    d = tmp_path / "log"
    with Book.open(d, writable=True, create=True) as book:
        book.save(1, payloads[1:8])
    with mounted(d, tmp_path / "mnt", "-o", "ro") as mnt:
        assert open(f"{mnt}/pretty/7").read().startswith("event: 7\n")
        assert not os.path.exists(f"{mnt}/pretty/8")
        with Book.open(d, writable=True) as book:
            book.save(8, [payloads[8]])
        got = open(f"{mnt}/pretty/8").read()
        assert got.startswith("event: 8\ndate:  ")


# --- info: dates and human sizes -----------------------------------------------------------


def test_info_shows_dates_and_human_sizes(src, payloads, tmp_path):
    first_date = peek_event(payloads[6][4:])[0]
    last_date = peek_event(payloads[EVENTS][4:])[0]
    with Book.open(src) as book:
        size = book.log_bytes
    out = run_bookfs("info", str(src)).stdout
    fields = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in out.splitlines())}
    assert fields["bytes"] == human_bytes(size) and f"({size:,} bytes)" in fields["bytes"]
    assert fields["since"].startswith(format_da(first_date) + " (2024-")
    assert fields["until"].startswith(format_da(last_date) + " (")
    data = json.loads(run_bookfs("info", str(src), "--json").stdout)
    assert data["bytes"] == size
    assert data["dates"]["first"] == format_da(first_date)
    assert data["dates"]["last"] == format_da(last_date)
    assert dt.datetime.fromisoformat(data["dates"]["first_utc"]).tzinfo is not None
    with mounted(src, tmp_path / "mnt", "-o", "ro") as mnt:
        with open(f"{mnt}/info") as f:  # the CLI's, plus the mount's request path
            lines = f.read().splitlines(keepends=True)
        assert lines[-1].startswith("fuse:")
        assert "".join(lines[:-1]) == out.replace(str(src), os.path.abspath(src))


def test_info_of_a_boot_only_log_has_no_dates(tmp_path, payloads):
    d = tmp_path / "boot"
    with Book.open(d, writable=True, create=True) as book:
        for key, value in sample_meta(0).items():
            book.save_meta(key, value)
        book.save(1, payloads[1:4])
    out = run_bookfs("info", str(d)).stdout
    assert "since:" not in out and "bytes:" in out
    assert "dates" not in json.loads(run_bookfs("info", str(d), "--json").stdout)


def test_elided_parts_are_skipped_within_a_budget():
    """A subtree the renderer elides is walked over to reach what follows it; past the
    view's skip budget the rest is shown as ``...`` instead of reading on."""
    noun = cell(from_list(range(1000)), cord("after"))
    shallow = Limits(depth=1)
    data = jam(noun)
    assert render_text(JamView.of_bytes(data), 0, shallow) == "[... %after]"
    assert render_text(JamView.of_bytes(data, skip_nodes=100), 0, shallow) == "[...]"
    assert text(noun, shallow) == "[... %after]"
