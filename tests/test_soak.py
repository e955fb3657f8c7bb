"""The soak loop (tests/soak.py), kept short for CI: a few seeded cycles of concurrent
appends of every kind, with daemon kills and a read-only follower.  Nothing acknowledged
may be lost, nothing unacknowledged may appear, and the follower never serves wrong bytes.
Run it longer by hand: ``python tests/soak.py --cycles 200``."""

from __future__ import annotations

import pytest

from soak import soak


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
def test_soak_short(tmp_path, seed):
    totals = soak(tmp_path, cycles=4, seed=seed, writers=3, appends=5, kill_every=2,
                  log=lambda m: None)
    assert totals.problems == []
    assert totals.lost == totals.invented == totals.wrong_bytes_served == 0
    assert totals.spurious_close_errors == 0, totals.notes
    assert totals.acknowledged > 20 and totals.follower_reads > 0
