"""The shared check of an optional compiled extension's fallback (bookfs/compiled.py):
with the extension hidden as if it had not built, or with its environment variable set,
a fresh interpreter runs a script against the pure reference, and the package says why
in the line ``info`` shows."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_fallback(script: str, module: str, env_var: str, how: str) -> None:
    """Run ``script`` (a format string with ``{hide}``, which must print the package's
    description last) in a fresh interpreter, ``module`` hidden (``how="missing"``) or
    ``env_var`` set (``how="env"``), and check it succeeds and says why it is pure."""
    env = dict(os.environ)
    env.pop(env_var, None)
    hide = ""
    if how == "missing":
        hide = f"sys.modules[{module!r}] = None  # as if it had not built"
    else:
        env[env_var] = "1"
    out = subprocess.run([sys.executable, "-c", script.format(hide=hide)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("pure Python: ")
    assert ("did not build" in line) if how == "missing" else (env_var in line)


def info_both_ways(tmp_path, env_var: str) -> tuple[str, str]:
    """``bookfs info`` of a small sample log, with ``env_var`` unset and then set: the
    two texts (whose ``nouns:``/``rows:`` lines say which implementation is in use)."""
    log = tmp_path / "log"
    run = [sys.executable, "-m", "bookfs.cli"]
    subprocess.run(run + ["sample", str(log), "--events", "12"], cwd=REPO, check=True,
                   capture_output=True, timeout=120)
    env = dict(os.environ)
    env.pop(env_var, None)
    texts = []
    for value in (None, "1"):
        if value:
            env[env_var] = value
        texts.append(subprocess.run(run + ["info", str(log)], cwd=REPO, env=env, check=True,
                                    capture_output=True, text=True, timeout=120).stdout)
    return texts[0], texts[1]
