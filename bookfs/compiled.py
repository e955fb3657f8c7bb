"""Optional compiled extensions: which one a package uses, and why not when it does not.

bookfs ships pure-Python references of its hot loops and compiled twins of them (the
noun core, ``bookfs/noun/_core.pyx``; Spark's row builder, ``bookfs/spark/_rows.pyx``),
built by ``mount_scripts/setup.sh`` where a compiler is at hand.  A package picks the
compiled one when it imports and the user has not asked for the pure one with its
environment variable; ``info`` says which, and why (:func:`describe`).  Nothing else
here: the caller binds its names to whichever it got.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`: ``module`` (None: the pure reference is in use) and
    ``reason`` (None when the compiled module is in use)."""

    module: ModuleType | None
    reason: str | None
    source: str

    @property
    def name(self) -> str:
        """``"compiled"`` or ``"pure"``."""
        return "compiled" if self.module is not None else "pure"

    def describe(self) -> str:
        """One line for ``info``: compiled, or pure and why."""
        if self.module is not None:
            return f"compiled ({self.source})"
        return f"pure Python: {self.reason} (mount_scripts/setup.sh builds the compiled one)"


def choose(module: str, env_var: str, source: str) -> Choice:
    """The compiled ``module`` (a dotted name), unless ``env_var`` is set in the
    environment (the user asked for the pure reference) or it does not import (not
    built: ``source``, the ``.pyx`` it is built from, is named in the reason)."""
    if os.environ.get(env_var):
        return Choice(None, f"{env_var} is set", source)
    try:
        return Choice(importlib.import_module(module), None, source)
    except ImportError as exc:
        return Choice(None, f"{source} did not build or import ({exc})", source)
