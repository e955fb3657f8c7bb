"""A power cut never takes back an event a reader was served (issue 32: "readers see only
what is committed"; DESIGN.md: committed means durable and acknowledged).

The log lives on ext4 on a loop device over an image file.  The loop device writes into
the image file through the host's page cache, so a copy of the image file holds what the
file system on it sent to its disk, and nothing still dirty in that file system's page
cache: what a power cut would leave.  A read-write mount of the log appends events while
``strace`` holds its daemon's ``fdatasync`` at the call's entry (the deeds are written,
not yet durable), and reader threads poll every reader path: the read-write mount's
``events/``, ``pretty/`` and ``segments/`` (its read-only companion's), a separate
read-only mount's ``events/``, ``follow/N`` and ``info``'s ``last:`` on both.  At each
of ``BOOKFS_POWER_CUT_IMAGES`` (20) moments during a held save, once every reader has
polled again, the events served so far are noted and the image file is copied, before the
held ``fdatasync`` is let go.  Then each copy is mounted (its journal replayed, as after
the power cut) and read with the engine: every event served before the copy began must be
there, byte for byte.  The code before issue 32 served an event as soon as its deed was
in the file (the companion and the read-only mount), so its images lack events a reader
had been given.

Each save is held only as long as the readers need (``strace`` is detached after the
copy, which lets the held call go on), so the test does not depend on the machine's
speed; ``BOOKFS_POWER_CUT_HOLD`` (seconds, default 0.2) holds each save longer before its
snapshot, for a longer local run with more images.  A copy whose held save ended before the
copy did (a very slow copy) is not checked: the file system was being written while it was
copied, which no power cut would leave.
"""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import faults
import pytest
from faults import (
    Readers,
    Served,
    Strace,
    add_mount_readers,
    append,
    attached_image,
    copy_image,
    env_number,
    held_task,
    loop_ext4,
    skip_reason,
    wait_held,
)
from mount_fixtures import payload
from mounting import daemon_pid, mounted

from bookfs.formats import index as index_mod
from bookfs.formats.pier import open_source

pytestmark = [
    pytest.mark.skipif(skip_reason(loop=True) is not None,
                       reason=str(skip_reason(loop=True))),
    pytest.mark.timeout(600),
]

IMAGES = int(env_number("BOOKFS_POWER_CUT_IMAGES", 20))
HOLD = env_number("BOOKFS_POWER_CUT_HOLD", 0.2)  # at least, before each snapshot
START = 300  # events in the log before the mount


def size_of(n: int) -> int:
    return 20 + (n * 37) % 300


def build_log(where: Path, layout: str) -> Path:
    """A small log of :data:`START` events in ``layout`` (``faults.build_log``)."""
    return faults.build_log(where, layout, [size_of(n) for n in range(1, START + 1)],
                            batches=3)


def image_problems(copy: Path, where: Path, name: str, snap: dict, expected: dict
                   ) -> list[str]:
    """What a copy lacks of what was served before it was taken (one line per event)."""
    with attached_image(copy, where) as d:
        log = open_source(d / name)
        try:
            got = dict(log.walk())
        finally:
            log.close()
    problems = []
    for n in sorted(snap):
        have = got.get(n)
        bad = sorted({kind for kind, data in snap[n]
                      if have != (expected[n] if data is None else data)})
        if bad:
            what = "not in the image" if have is None else "other bytes in the image"
            problems.append(f"{copy.name}: event {n} served by {', '.join(bad)}; {what}")
    return problems


@pytest.mark.parametrize("layout", ["uip", "vere"])
def test_every_event_served_survives_a_power_cut(tmp_path, layout):
    """The module docstring's check, for each layout: every copy taken during a held
    save holds every event any reader path served before the copy began."""
    disk, rw, ro = tmp_path / "disk", str(tmp_path / "rw"), str(tmp_path / "ro")
    image = tmp_path / "disk.img"
    copies: list[tuple[Path, dict]] = []
    expected = {n: payload(n, size_of(n)) for n in range(1, START + 1)}
    served = Served()
    late = 0
    try:
        with loop_ext4(image, disk):
            src = build_log(disk, layout)
            with mounted(src, rw, "-o", "follow_timeout=2"), \
                    mounted(src, ro, "-o", "ro,follow_timeout=2"), \
                    Readers(served) as readers:
                pid = daemon_pid(rw)
                add_mount_readers(readers, rw, ro, first=1, follow_from=START,
                                  segments=layout == "uip")
                readers.wait_rounds(2)
                for i, n in enumerate(range(START + 1, START + 1 + IMAGES)):
                    expected[n] = payload(n, size_of(n))
                    acks: dict = {}
                    writer = threading.Thread(target=append, args=(rw, n, expected[n], acks))
                    copy = tmp_path / f"copy{i:02d}.img"
                    with Strace(pid, "fdatasync:delay_enter=120s", tmp_path / "strace.out"):
                        writer.start()
                        tid = wait_held(pid, injected_error=False)  # the deed is written
                        readers.wait_rounds(2)
                        time.sleep(HOLD)
                        snap = served.snapshot()
                        copy_image(image, copy)
                        still = held_task(pid, injected_error=False) == tid and n not in acks
                    writer.join(120)  # strace is gone: the held fdatasync went on
                    assert acks.get(n, "no answer") is None, f"append {n}: {acks.get(n)}"
                    if still:
                        copies.append((copy, snap))
                    else:
                        late += 1
                        copy.unlink()
                readers.wait_rounds(2)
                readers.stop()
        problems = [f"{kind} failed with {errno.errorcode.get(e, e)} (event {event})"
                    for kind, event, e in served.errors]
        problems += [f"{kind} served other bytes than event {e}'s"
                     for (kind, e), values in sorted(served.values.items())
                     for v in values if v is not None and v != expected.get(e)]
        assert copies, f"every one of {IMAGES} copies outlasted its held save"
        index_mod.configure_cache(enabled=False)  # each copy's log scanned afresh
        try:
            for copy, snap in copies:
                problems += image_problems(copy, tmp_path / "image", src.name, snap,
                                           expected)
        finally:
            index_mod.configure_cache()
        assert not problems, (f"{len(problems)} problems; {len(copies)} power-cut images "
                              f"checked ({late} copies too slow to check):\n"
                              + "\n".join(problems[:30]))
    finally:
        for copy in tmp_path.glob("copy*.img"):
            copy.unlink()
