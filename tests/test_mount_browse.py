"""Browsing a real mount with ordinary tools: every byte compared with the engine's."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat

import pytest

from bookfs.formats.book import Book
from bookfs.formats.layout import HEADER_SIZE
from bookfs.noun.render import human_bytes
from mount_fixtures import (  # noqa: F401  (fixtures)
    BROWSE_EVENTS,
    build_sample,
    engine_events,
    log_state,
    module_cache,
    mounted,
    payload,
    sample_src,
    sh,
)


@pytest.fixture(scope="module")
def engine(sample_src):
    return engine_events(sample_src)


@pytest.fixture(scope="module")
def browse(sample_src, tmp_path_factory):
    """The sample log mounted read-write (as an operator would), for the whole module."""
    mnt = tmp_path_factory.mktemp("browse-mnt")
    before = log_state(sample_src)
    with mounted(sample_src, mnt):
        yield mnt
    assert log_state(sample_src) == before  # browsing never changes the log


def ev(mnt, n):
    return f"{mnt}/events/{n:012d}"


def test_ls_lists_every_event_in_order(browse):
    out = sh(f"ls {browse}/events").stdout.decode().split()
    assert out == [f"{n:012d}" for n in range(1, BROWSE_EVENTS + 1)]
    # segments/ holds the log's bytes again: not listed (whole-mount walks count each byte
    # once, issue 23.1), opened by name
    assert sorted(sh(f"ls {browse}").stdout.decode().split()) == [
        "events", "follow", "info", "meta", "new", "pretty"]
    assert sh(f"ls {browse}/segments").stdout.decode().split() == [f"{1:012d}"]
    assert sh(f"ls {browse}/meta").stdout.decode().split() == ["fake", "life", "version", "who"]


def test_ls_l_sizes_are_payload_sizes(browse, sample_src):
    out = sh(f"ls -l --time-style=+%s {browse}/events").stdout.decode().splitlines()
    rows = [line.split() for line in out if line.startswith("-")]
    assert len(rows) == BROWSE_EVENTS
    # the log's read bits where every user of a class could read it on disk, all the way
    # down (README, allow_other): pytest's root-only directories leave the owner's alone
    from bookfs.fs.nodes.base import modes_of
    read = modes_of(str(sample_src / "book.log"), str(sample_src), True)[2].read
    with Book.open(sample_src) as book:
        for row in rows:
            assert row[0] == stat.filemode(stat.S_IFREG | read)
            assert int(row[4]) == book.payload_size(int(row[-1])), row


def test_stat_inode_size_mtime(browse, sample_src):
    """An event file's mtime is the event's own date where it has one (issue 23.4:
    ``bookfs/fs/dates.py``), to the nanosecond the @da carries, else the time the log
    grew to hold it; ``ls -l`` (the listing's attributes) says the same as ``stat``."""
    from bookfs.noun import DA_UNIX_EPOCH, peek_event

    def da_ns(da: int) -> int:  # the @da in ns since 1970, truncated
        return ((da >> 64) - DA_UNIX_EPOCH) * 10**9 + (((da & (2**64 - 1)) * 10**9) >> 64)

    dated, prev = 0, 0
    log_time = os.stat(os.path.join(sample_src, "book.log")).st_mtime_ns
    with Book.open(sample_src) as book:
        for n in range(1, BROWSE_EVENTS + 1):
            st = os.stat(ev(browse, n))
            assert st.st_ino == 2**63 + n
            assert st.st_size == book.payload_size(n)
            date = peek_event(book.read(n)[4:])[0]
            if date is not None:
                assert st.st_mtime_ns == da_ns(date), n
                dated += 1
            else:  # when the log grew to hold it: in order, and no later than the log
                assert prev <= st.st_mtime_ns <= log_time, n
                prev = st.st_mtime_ns
    assert 0 < dated < BROWSE_EVENTS  # both kinds are there: lifecycle events have no date
    listed = sh(f"ls -l --time-style=+%s.%N {browse}/events | sed -n 2,6p").stdout.decode()
    for line in listed.splitlines():
        when, name = line.split()[-2:]
        ns = os.stat(ev(browse, int(name))).st_mtime_ns
        assert when == f"{ns // 10**9}.{ns % 10**9:09d}", line
    out = sh(f"stat -c '%i %s %F' {browse}/events/42").stdout.decode().split(maxsplit=2)
    assert out == [str(2**63 + 42), str(os.stat(ev(browse, 42)).st_size), "regular file\n"]


def test_inodes_stable_across_remount(sample_src, tmp_path):
    picks = [1, 2, 999, BROWSE_EVENTS]
    seen = []
    for i in range(2):
        with mounted(sample_src, tmp_path / f"m{i}", "-o", "ro"):
            seen.append([(os.stat(ev(tmp_path / f"m{i}", n)).st_ino,
                          os.stat(ev(tmp_path / f"m{i}", n)).st_mtime_ns) for n in picks])
    assert seen[0] == seen[1]
    assert [ino for ino, _ in seen[0]] == [2**63 + n for n in picks]


def test_cat_every_event(browse, engine):
    for n, data in engine.items():
        with open(ev(browse, n), "rb") as f:
            assert f.read() == data, n
    for n in (1, 7, 1500, BROWSE_EVENTS):
        assert sh(f"cat {ev(browse, n)}").stdout == engine[n]


def test_lookup_by_plain_and_padded_number(browse, engine):
    assert sh(f"cat {browse}/events/42").stdout == engine[42]
    assert sh(f"cat {browse}/events/000000000042").stdout == engine[42]
    assert os.stat(f"{browse}/events/42").st_ino == os.stat(ev(browse, 42)).st_ino
    for bad in ("0", str(BROWSE_EVENTS + 1), "abc", "-1", "4" * 25):
        r = sh(f"cat {browse}/events/{bad}")
        assert r.returncode != 0 and b"No such file" in r.stderr, bad


def test_hexdump_tools(browse, engine):
    import binascii

    n = max(range(1, 200), key=lambda k: len(engine[k]))
    xxd = sh(f"xxd -p {ev(browse, n)}").stdout.decode().replace("\n", "")
    assert binascii.unhexlify(xxd) == engine[n]
    od = sh(f"od -An -v -tx1 {ev(browse, n)}").stdout.decode().split()
    assert bytes(int(x, 16) for x in od) == engine[n]


def test_head_tail_wc_sha256(browse, engine):
    big = max(engine, key=lambda k: len(engine[k]))
    data = engine[big]
    assert sh(f"head -c 100 {ev(browse, big)}").stdout == data[:100]
    assert sh(f"tail -c 333 {ev(browse, big)}").stdout == data[-333:]
    assert sh(f"head -c 5 {ev(browse, 3)}").stdout == engine[3][:5]
    assert int(sh(f"wc -c < {ev(browse, big)}").stdout) == len(data)
    got = sh(f"sha256sum {ev(browse, big)} {ev(browse, 2)}").stdout.decode().split()
    assert got[0] == hashlib.sha256(data).hexdigest()
    assert got[2] == hashlib.sha256(engine[2]).hexdigest()
    total = int(sh(f"cat {browse}/events/* | wc -c").stdout)
    assert total == sum(map(len, engine.values()))


def test_cp_and_find_du(browse, engine, tmp_path):
    out = tmp_path / "copy"
    assert sh(f"cp -r {browse}/events {out}").returncode == 0
    names = sorted(os.listdir(out))
    assert len(names) == BROWSE_EVENTS
    for name in names:
        assert (out / name).read_bytes() == engine[int(name)]
    assert int(sh(f"find {browse}/events -type f | wc -l").stdout) == BROWSE_EVENTS
    # find over the whole mount: events, meta (4), info; new/ and pretty/ list as empty,
    # segments/ is not listed in the root
    assert int(sh(f"find {browse} -type f | wc -l").stdout) == BROWSE_EVENTS + 4 + 1
    du = sh(f"du -s --block-size=1 --apparent-size {browse}/events")
    assert du.returncode == 0
    assert int(du.stdout.split()[0]) >= sum(map(len, engine.values()))
    assert sh(f"du -s {browse}/events {browse}/meta {browse}/segments").returncode == 0
    # new/ lists as empty, so tools that walk the whole mount work
    r = sh(f"du -s {browse}")
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert os.listdir(f"{browse}/new") == []


def test_shell_tools_over_the_whole_mount(browse, engine, tmp_path):
    """find, du, grep -r, rsync -a and tar walk every directory, new/ included."""
    for cmd in (f"find {browse}", f"du -a {browse}", f"ls -lR {browse}",
                f"grep -rc zzzz-not-there {browse}; test $? -eq 1",
                f"tar -C {browse} -cf {tmp_path}/all.tar ."):
        r = sh(cmd)
        assert r.returncode == 0 and not r.stderr, (cmd, r.stderr)
    listing = sh(f"tar -tf {tmp_path}/all.tar").stdout.decode().split()
    assert "./new/" in listing and f"./events/{1:012d}" in listing
    if shutil.which("rsync"):
        r = sh(f"rsync -a {browse}/ {tmp_path}/copy/")
        assert r.returncode == 0, r.stderr
        for n in (1, BROWSE_EVENTS):
            assert (tmp_path / "copy/events" / f"{n:012d}").read_bytes() == engine[n]


@pytest.mark.parametrize("bs,skip,count", [(7, 3, None), (4099, 0, None), (1, 10, 20),
                                           (513, 1, 2), (65536, 0, None)])
def test_dd_odd_blocks(browse, engine, bs, skip, count):
    n = max(engine, key=lambda k: len(engine[k]))
    data = engine[n]
    cnt = f"count={count}" if count else ""
    r = sh(f"dd if={ev(browse, n)} bs={bs} skip={skip} {cnt} status=none")
    assert r.returncode == 0, r.stderr
    want = data[bs * skip:]
    if count:
        want = want[: bs * count]
    assert r.stdout == want


def test_python_preads_at_odd_offsets(browse, engine):
    n = max(engine, key=lambda k: len(engine[k]))
    data = engine[n]
    fd = os.open(ev(browse, n), os.O_RDONLY)
    try:
        for off, size in [(0, 1), (1, 4095), (4095, 2), (len(data) - 1, 10),
                          (len(data), 10), (len(data) + 100, 10), (12345 % len(data), 70000)]:
            assert os.pread(fd, size, off) == data[off: off + size], (off, size)
    finally:
        os.close(fd)


def test_info_and_meta(browse, sample_src):
    with Book.open(sample_src) as book:
        text = open(f"{browse}/info").read()
        fields = dict(line.split(":", 1) for line in text.splitlines())
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        assert fields["first"] == "1"
        assert fields["last"] == str(BROWSE_EVENTS)
        assert fields["events"] == str(BROWSE_EVENTS)
        assert fields["bytes"] == human_bytes(book.log_bytes)
        assert fields["ship"].startswith("~")
        from bookfs.noun import patp
        assert fields["ship"] == patp(int.from_bytes(book.read_meta("who"), "little"))
        assert sh(f"cat {browse}/info").stdout.decode() == text
        for key, size in (("version", 4), ("who", 16), ("fake", 1), ("life", 4)):
            data = open(f"{browse}/meta/{key}", "rb").read()
            assert data == book.read_meta(key)
            assert len(data) == size == os.stat(f"{browse}/meta/{key}").st_size
    assert not os.path.exists(f"{browse}/meta/nope")


def test_segments_default_is_whole_log(browse, sample_src):
    names = sorted(os.listdir(f"{browse}/segments"))
    assert names == ["000000000001"]
    raw = (sample_src / "book.log").read_bytes()
    assert open(f"{browse}/segments/000000000001", "rb").read() == raw[HEADER_SIZE:]


def test_segments_split_with_segment_mb(sample_src, tmp_path):
    raw = (sample_src / "book.log").read_bytes()
    m = tmp_path / "m"
    with mounted(sample_src, m, "-o", "ro,segment_mb=1"):
        names = sorted(os.listdir(f"{m}/segments"))
        assert len(names) >= 5  # ~10 MB of log
        assert names[0] == "000000000001"
        firsts = [int(x) for x in names]
        assert firsts == sorted(firsts)
        joined = b"".join(open(f"{m}/segments/{x}", "rb").read() for x in names)
        assert joined == raw[HEADER_SIZE:]
        # through cat, in name order, too
        assert sh(f"cat {m}/segments/*").stdout == raw[HEADER_SIZE:]
        for x in names:
            assert os.stat(f"{m}/segments/{x}").st_size == len(
                open(f"{m}/segments/{x}", "rb").read())


def test_large_event_dd(tmp_path):
    big = payload(11, 5 * (1 << 20) + 123)
    src = build_sample(tmp_path / "src", 20, extra=[big, payload(22, 10)])
    m = tmp_path / "m"
    with mounted(src, m, "-o", "ro"):
        path = f"{m}/events/21"
        assert os.stat(path).st_size == len(big)
        r = sh(f"dd if={path} bs=1M status=none")
        assert r.stdout == big
        assert sh(f"sha256sum {path}").stdout.split()[0].decode() == hashlib.sha256(
            big).hexdigest()
        assert sh(f"dd if={path} bs=4099 skip=3 status=none").stdout == big[4099 * 3:]
        assert sh(f"tail -c 1000 {path}").stdout == big[-1000:]
        assert open(f"{m}/events/22", "rb").read() == payload(22, 10)
        shutil.copyfile(path, tmp_path / "copy")
        assert (tmp_path / "copy").read_bytes() == big


def test_whole_mount_walks_count_the_log_once(browse, engine, tmp_path):
    """Issue 23.1: ``du``, ``tar``, ``rsync`` and ``find -size`` over the whole mount count
    every byte of the log once (segments/ repeated events/: du said 521M for a 244 MiB
    log); the bulk view stays reachable by name."""
    payload = sum(map(len, engine.values()))
    du = int(sh(f"du -s --block-size=1 --apparent-size {browse}").stdout.split()[0])
    assert payload <= du < payload * 1.05 + 64 * 1024, (du, payload)
    found = sh(f"find {browse} -type f -printf '%s\\n'").stdout.decode().split()
    assert payload <= sum(map(int, found)) < payload * 1.05 + 4096
    assert sh(f"tar -C {browse} -cf {tmp_path}/all.tar .").returncode == 0
    assert os.path.getsize(tmp_path / "all.tar") < payload * 1.2 + 1024 * 1024
    if shutil.which("rsync"):
        assert sh(f"rsync -a {browse}/ {tmp_path}/copy/").returncode == 0
        copied = sum(p.stat().st_size for p in (tmp_path / "copy").rglob("*") if p.is_file())
        assert payload <= copied < payload * 1.05 + 4096
    seg = os.path.join(browse, "segments", f"{1:012d}")  # by name, as Spark reads it
    assert os.path.getsize(seg) >= payload
