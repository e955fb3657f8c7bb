"""The suite's own scheduling holds: under ``--dist loadgroup`` (``mount_scripts/test.sh``)
every test of one ``xdist_group`` runs on one worker.  The Spark tests rely on it: their
two groups keep one JVM and one set of module fixtures (a standalone cluster, a mounted
log) per worker.  With pytest 9.2, pytest-xdist's group suffix no longer reached the
scheduler and the groups were silently split (pytest-xdist issue #1386): each worker
started its own Spark sessions and clusters, and the run took about a minute longer."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent("""
        import pytest, time
        pytestmark = pytest.mark.xdist_group("g")
        @pytest.mark.parametrize("i", range(6))
        def test_member(i):
            time.sleep(0.05)
    """))
    (tmp_path / "test_free.py").write_text(textwrap.dedent("""
        import time
        def test_a(): time.sleep(0.05)
        def test_b(): time.sleep(0.05)
    """))
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "-v", "-o", "addopts=", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    workers = {m.group(1) for m in re.finditer(r"\[(gw\d+)\] .* PASSED .*test_member",
                                               res.stdout)}
    assert len(re.findall(r"PASSED .*test_member", res.stdout)) == 6, res.stdout[-3000:]
    assert len(workers) == 1, res.stdout[-3000:]
