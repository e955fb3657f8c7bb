"""Typed numbers used across bookfs.

``EventNum`` is an event number (1-based, as Urbit counts them; 0 means "none").
Byte offsets into a log are plain ``int``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NewType

EventNum = NewType("EventNum", int)

#: A progress callback: called with a number of bytes just processed (long scans).
Progress = Callable[[int], None]
