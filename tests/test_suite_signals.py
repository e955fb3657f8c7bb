"""The suite's own set-up: a run started in the background of a non-interactive shell
(``pytest &``, as a CI script may) inherits SIGINT and SIGQUIT ignored, and every child a
test starts would inherit that too; ``conftest.hear_interrupts`` takes them back, so a
test's Ctrl-C to its child (``cat follow/N``, ``bookfs top``) is heard."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

INNER = '''
import signal, subprocess, time

def test_a_child_hears_ctrl_c():
    p = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == -signal.SIGINT
    finally:
        p.kill()
        p.wait()
'''


def _as_a_background_job() -> None:
    """What a non-interactive shell does for a command it runs with ``&``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def test_a_run_started_in_the_background_still_delivers_ctrl_c(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "-p", "conftest", "test_inner.py"],
                       cwd=tmp_path, env=env, preexec_fn=_as_a_background_job,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
