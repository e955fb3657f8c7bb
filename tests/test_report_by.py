"""``bookfs report SRC --by KEY`` (issue 35) on sample logs whose make-up is known by
construction (``iter_sample_events`` says what the generator wrote into each event:
wire, tag, vane, agent), on a Book log, a pier of three epochs (LMDB, UIP, vere), a real
mount of each and a fleet (directory and mount).  Every group adds up to the total, and
the total is the log's payload bytes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from lmdb_fixtures import make_pier
from mount_fixtures import build_sample
from mounting import mounted, run_bookfs

from bookfs.cli.sample import SAMPLE_LIFE, iter_sample_events, sample_meta
from bookfs.formats.pier import open_source

EVENTS = 2400
SPLIT = (800, 1600)  # the pier's epochs: 1..800 LMDB, 801..1600 UIP Book, 1601.. vere


def _expected(events: int, key: str, depth: int = 2, seed: int = 0, first: int = 1,
              last: int | None = None) -> dict[str, tuple[int, int]]:
    """``group -> (events, bytes)`` from what the generator says it wrote."""
    out: Counter = Counter()
    size: Counter = Counter()
    for n, (payload, made) in enumerate(iter_sample_events(events, seed), 1):
        if n < first or (last is not None and n > last):
            continue
        if made is None:
            g = "(boot)"
        elif key == "wire":
            g = "/" + "/".join(made.wire[1:].split("/")[:depth])
        elif key == "card":
            g = made.tag
        else:
            g = getattr(made, key)
        out[g] += 1
        size[g] += len(payload)
    return {g: (out[g], size[g]) for g in out}


def _report(src, *args) -> dict:
    r = run_bookfs("report", str(src), *args, "--json")
    return json.loads(r.stdout)


def _groups(result: dict) -> dict[str, tuple[int, int]]:
    return {g["key"]: (g["events"], g["bytes"]) for g in result["groups"]}


def _payload_bytes(src) -> int:
    with open_source(src) as log:
        first, last = log.gulf()
        return sum(log.payload_size(e) for e in range(first, last + 1))


def _adds_up(result: dict) -> None:
    t = result["total"]
    assert sum(g["events"] for g in result["groups"]) == t["events"]
    assert sum(g["bytes"] for g in result["groups"]) == t["bytes"]
    assert abs(sum(g["share"] for g in result["groups"]) - 1) < 1e-4


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    return build_sample(tmp_path_factory.mktemp("by") / "log", EVENTS)


@pytest.fixture(scope="module")
def pier(tmp_path_factory) -> Path:
    payloads = [p for p, _ in iter_sample_events(EVENTS)]
    a, b = SPLIT
    return make_pier(tmp_path_factory.mktemp("by") / "pier",
                     [("lmdb", payloads[:a]), ("book", payloads[a:b]),
                      ("vere", payloads[b:])], meta=sample_meta())


@pytest.mark.parametrize("key,depth", [("vane", 2), ("wire", 1), ("wire", 2), ("card", 2),
                                       ("agent", 2)])
def test_every_key_on_a_log_matches_what_was_written(log, key, depth):
    args = ["--by", key] + (["--depth", str(depth)] if key == "wire" else [])
    result = _report(log, *args)
    assert _groups(result) == _expected(EVENTS, key, depth)
    _adds_up(result)
    assert result["total"]["bytes"] == _payload_bytes(log)
    assert result["total"]["events"] == EVENTS
    biggest = max(result["groups"], key=lambda g: g["biggest"]["bytes"])["biggest"]
    assert biggest == result["total"]["biggest"]
    ranked = [(g["bytes"], g["events"]) for g in result["groups"]]
    assert ranked == sorted(ranked, reverse=True)


def test_top_and_window(log):
    full = _report(log, "--by", "card")
    top = _report(log, "--by", "card", "--top", "3", "--since", "100", "--until", "1999")
    assert [g["key"] for g in top["groups"]][-1] == "(other)" and len(top["groups"]) == 4
    _adds_up(top)
    assert _groups(top)["(other)"][0] == top["total"]["events"] - sum(
        g["events"] for g in top["groups"][:3])
    want = _expected(EVENTS, "card", first=100, last=1999)
    assert top["total"]["events"] == sum(n for n, _ in want.values()) == 1900
    assert top["total"]["bytes"] == sum(b for _, b in want.values())
    assert full["total"]["events"] == EVENTS
    # a date window: no boot event, and only events dated inside it
    first, last = full["total"]["first_date"], full["total"]["last_date"]
    dated = _report(log, "--by", "vane", "--since", first, "--until", last)
    assert dated["total"]["events"] == EVENTS - SAMPLE_LIFE and "(boot)" not in _groups(dated)


def test_text_output_lists_every_group(log):
    r = run_bookfs("report", str(log), "--by", "vane")
    assert r.returncode == 0 and f"{EVENTS:,} events" in r.stdout
    for vane in _expected(EVENTS, "vane"):
        assert f"\n{vane} " in r.stdout


def test_a_pier_of_three_epochs_and_what_chop_frees(pier):
    result = _report(pier, "--by", "vane")
    assert _groups(result) == _expected(EVENTS, "vane")
    _adds_up(result)
    assert result["total"]["bytes"] == _payload_bytes(pier)
    epochs = result["epochs"]
    assert [e["epoch"] for e in epochs] == ["0i0", f"0i{SPLIT[0]}", f"0i{SPLIT[1]}"]
    assert [e["events"] for e in epochs] == [800, 800, EVENTS - 1600]
    assert sum(e["counted_bytes"] for e in epochs) == result["total"]["bytes"]
    # vere's chop keeps the newest two epochs; after a roll, the newest is a new empty one
    chop = result["chop"]
    assert chop["deletes"] == ["0i0", "0i800"] and chop["keeps"] == ["0i1600"]
    d = Path(pier) / ".urb" / "log"
    on_disk = sum(f.stat().st_blocks * 512 for e in ("0i0", "0i800") for f in (d / e).iterdir())
    assert chop["frees_disk_bytes"] == on_disk > 0


def test_through_a_mount_the_same(pier, log, tmp_path):
    direct = _report(pier, "--by", "agent")
    with mounted(pier, tmp_path / "mnt", "-o", "ro") as mnt:
        via = _report(mnt, "--by", "agent")
    assert _groups(via) == _groups(direct) == _expected(EVENTS, "agent")
    assert [e["counted_bytes"] for e in via["epochs"]] == [
        e["counted_bytes"] for e in direct["epochs"]]
    with mounted(log, tmp_path / "mnt2") as mnt:  # read-write
        assert _groups(_report(mnt, "--by", "wire")) == _expected(EVENTS, "wire")


def test_a_fleet_by_ship(tmp_path):
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    sizes = {}
    for seed, n in ((1, 300), (2, 500)):
        build_sample(fleet / f"s{seed}", n, seed=seed)
        sizes[seed] = n
    from bookfs.noun import patp

    names = {patp(int.from_bytes(sample_meta(s)["who"], "little")): s for s in sizes}
    direct = _report(fleet, "--by", "ship")
    with mounted(fleet, tmp_path / "mnt", "--fleet") as mnt:
        via = _report(mnt, "--by", "ship")
        cards = _report(mnt, "--by", "card")
    for result in (direct, via):
        _adds_up(result)
        got = _groups(result)
        assert {n: e for n, (e, _) in got.items()} == {n: sizes[s] for n, s in names.items()}
        for name, seed in names.items():
            assert got[name][1] == _payload_bytes(fleet / f"s{seed}")
    want = Counter()
    for s, n in sizes.items():
        for g, (e, _) in _expected(n, "card", seed=s).items():
            want[g] += e
    assert {k: e for k, (e, _) in _groups(cards).items()} == dict(want)


@pytest.mark.parametrize("args,says", [
    (["--by", "colour"], "invalid choice"),
    (["--by", "vane", "--since", "last tuesday"], "--since 'last tuesday'"),
    (["--by", "vane", "--since", "200", "--until", "100"], "is after"),
    (["--by", "vane", "--depth", "3"], "--depth is for --by wire"),
    (["--by", "wire", "--top", "0"], "expected a whole number >= 1"),
    (["--top", "3"], "add --by KEY"),
    ([], "expected --out DIR"),
])
def test_bad_input_is_one_line_exit_2(log, args, says):
    r = run_bookfs("report", str(log), *args, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert r.stdout == ""
