"""What checking and recovering a log report: :class:`RecoveryReport` (what an open found
and did), :class:`VereRecoveryReport` (vere's header slots besides), :class:`CheckReport`
(what ``bookfs fsck`` and ``verify`` found, nothing modified to find it) and its
:class:`Problem` findings.  The ladder that fills them is ``recovery.py``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RecoveryReport:
    """What opening a log found and did.  Empty lists mean the log was clean."""

    torn_tail: tuple[int, int] | None = None  # (offset, bytes) cut
    quarantined: list[tuple[str, int, int]] = field(default_factory=list)  # (path, offset, bytes)
    bad_region: tuple[int, int] | None = None  # (offset, bytes) excluded (read-only opens)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.torn_tail is None and not self.quarantined and self.bad_region is None


@dataclass
class VereRecoveryReport(RecoveryReport):
    """What opening a vere log found and did, beyond :class:`RecoveryReport`."""

    slot: str | None = None  # "A"/"B": the slot whose state is committed; None: framing only
    bad_slots: list[str] = field(default_factory=list)  # "B: CRC mismatch (...)", ...
    rolled_back: tuple[int, int] | None = None  # (first, last) events a header claimed, dropped
    header_repaired: str | None = None  # the slot rewritten to describe the recovered state

    @property
    def clean(self) -> bool:
        return (super().clean and not self.bad_slots and self.rolled_back is None
                and self.header_repaired is None)


@dataclass
class Problem:
    """One finding.  ``kind``: header | slot | meta | crc | framing | torn-tail | garbage |
    rollback | noun | read | chain.  ``offset`` is a byte offset in ``path`` (the log)."""

    kind: str
    offset: int | None
    message: str
    event: int | None = None
    path: str | None = None
    #: ``noun`` problems: the byte of the event's payload where parsing failed
    payload_offset: int | None = None


@dataclass
class CheckReport:
    """What :meth:`Recovery.check` found; nothing was modified to find it.

    ``repairs`` says what :meth:`Recovery.repair` would do; ``parts`` are a pier's epochs;
    ``state`` holds the format's own findings for its ``repair``/``salvage``."""

    path: str
    format: str
    first: int = 0
    last: int = 0
    events: int = 0
    problems: list[Problem] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    nouns_checked: int = 0  # events decode-checked (``--nouns``)
    nouns_ram: int = 0  # of which in vere's ram encoding
    parts: list["CheckReport"] = field(default_factory=list)
    state: object = field(default=None, repr=False)

    @property
    def clean(self) -> bool:
        return not self.problems and all(p.clean for p in self.parts)

    def all_problems(self) -> list[Problem]:
        out = list(self.problems)
        for p in self.parts:
            out += p.all_problems()
        return out
