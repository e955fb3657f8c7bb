"""What an event's payload must be, decided in one place (issue 21).

A payload is a 4-byte mug (little-endian) followed by either

* a **jam** that cues completely and exactly: the validating scanner
  (:class:`bookfs.noun.Scanner` / :func:`bookfs.noun.scan` with ``exact=True``) finds one
  noun, nothing after it, not even a non-zero bit in its last byte.  No noun is built and
  the jam is fed in slices, so memory does not grow with the event; or
* vere's **ram** encoding (``ml/bob``): bytes 4..8 are ``"RAM\\0"`` and version 1, and
  the ram scanner (:class:`bookfs.noun.ramscan.RamScanner`) accepts it exactly when
  :func:`bookfs.noun.ram.ram_decode` (``exact=True``) would, fed in slices too, without
  holding it.  A bob atom's file is checked (mapped, not read) when ``bob_dir`` (a pier's
  ``.urb/bob``) is given and holds it; otherwise the bob is the reference it is.

The stored mug is never compared with anything: it is the mug of Arvo's state *after* the
event (reference-formats.md §4; vere's ``mars.c``), which only a replay can check.

Everyone who judges a payload asks this module: the mount's ``new/`` (fed as a file is
written: :class:`PayloadCheck`), ``bookfs append`` (:func:`check_payload_file`, before
anything is appended), ``verify``/``fsck --nouns``, ``show``, ``pretty/``, ``report`` and
the Spark rows (:func:`payload_problem`, :func:`check_payload`).  A payload that is not an
event's gives a :class:`Problem`: the byte where parsing failed and one line of why.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from bookfs.noun import Scanner, scan
from bookfs.noun.codec import CueError
from bookfs.noun.ram import RAM_HEADER, BobError
from bookfs.noun.ramscan import RamScanner, ram_check

MUG_BYTES = 4  #: a payload starts with the 4-byte mug
HEAD_BYTES = MUG_BYTES + len(RAM_HEADER)  #: bytes read before the encoding is known
SLICE = 4 << 20  #: a stored payload is read and scanned in slices of this many bytes

Pread = Callable[[int, int], bytes]  #: (offset, size) -> bytes of an event's payload


@dataclass(frozen=True)
class Problem:
    """Why a payload is not an event's.

    ``offset`` is the byte of the payload (counting the mug's 4) where parsing failed, or
    None when the event's bytes are fine but a bob file it names is present and wrong.
    ``why`` is one line naming the encoding (``jam: ...``, ``ram: ...``); ``refusal`` is
    the line an append's refusal gives (``not a mug and a jam: parsing failed at byte
    ...``)."""

    offset: int | None
    why: str
    refusal: str


def _one_line(text: str) -> str:
    return " ".join(text.split())


def ram_error_offset(message: str) -> int:
    """The payload byte a :func:`~bookfs.noun.ram.ram_decode` error names: its messages
    count bytes from the ``R`` of the header, which is payload byte 4."""
    m = re.search(r"\(byte (\d+) of the ram encoding\)", message)
    if m:
        return MUG_BYTES + int(m.group(1))
    m = re.search(r"at byte (\d+)", message)
    return MUG_BYTES + int(m.group(1)) if m else MUG_BYTES


def _too_short(size: int) -> Problem:
    text = f"{size} bytes, expected at least {MUG_BYTES} (a {MUG_BYTES}-byte mug, then the jam)"
    return Problem(size, text, text)


def _jam_problem(res) -> Problem | None:
    """The :class:`Problem` of a finished scan of the jam (None if it is one)."""
    if res.ok:
        return None
    at = MUG_BYTES + res.byte
    return Problem(at, f"jam: {res.message}",
                   f"not a mug and a jam: parsing failed at byte {at} (bit {res.bit} of the "
                   f"jam, which starts at byte {MUG_BYTES}): {res.message}")


def _ram_problem(error: CueError | None) -> Problem | None:
    """The :class:`Problem` of a ram encoding :class:`RamScanner` refused with ``error``
    (None if it accepted it)."""
    if error is None:
        return None
    if isinstance(error, BobError):
        text = f"ram encoding: {_one_line(str(error))}"
        return Problem(None, text, text)
    at, text = ram_error_offset(str(error)), _one_line(str(error))
    return Problem(at, text, f"not a mug and a ram encoding: parsing failed at byte "
                             f"{at}: {text}")


def is_ram_head(head) -> bool:
    """Whether a payload whose first bytes are ``head`` (at least :data:`HEAD_BYTES`) is
    in the ram encoding."""
    return bytes(head[MUG_BYTES:HEAD_BYTES]) == RAM_HEADER


def check_payload(payload, bob_dir=None) -> Problem | None:
    """The whole payload in memory (bytes, bytearray or memoryview): None if it is an
    event's, else its :class:`Problem`."""
    size = len(payload)
    if size < MUG_BYTES:
        return _too_short(size)
    return check_body(payload[MUG_BYTES:], bob_dir)


def check_body(body, bob_dir=None) -> Problem | None:
    """:func:`check_payload` of a payload whose bytes after the mug are ``body`` (offsets
    still count the mug's 4 bytes)."""
    if bytes(body[:len(RAM_HEADER)]) == RAM_HEADER:
        return _ram_problem(ram_check(body, bob_dir))
    return _jam_problem(scan(body, exact=True))


class PayloadCheck:
    """:func:`check_payload` of bytes fed in order, in chunks of any size: a jam is scanned
    as it comes, and so is a ram encoding, without building the noun or holding its
    bytes.  :meth:`feed` returns False once the payload is
    certainly refused (the rest cannot change that).  Not thread-safe: one feeder at a
    time."""

    def __init__(self, bob_dir=None) -> None:
        self.size = 0  # bytes fed
        self._bob_dir = bob_dir
        self._head = bytearray()  # the first bytes, until the encoding is known
        self._scanner = None
        self._ram: RamScanner | None = None
        self._verdict: Problem | None | bool = False  # False: not finished

    def feed(self, chunk) -> bool:
        """The payload's next bytes; False once it is certainly refused."""
        if self._verdict is not False:
            raise ValueError("feed() after finish()")
        n = len(chunk)
        if not n:
            return True
        self.size += n
        if self._scanner is None and self._ram is None:
            need = HEAD_BYTES - len(self._head)
            self._head += chunk[:need]
            if len(self._head) < HEAD_BYTES:
                return True
            self._start()
            if n <= need:
                return (self._scanner.result is None if self._scanner is not None
                        else self._ram.error is None)
            chunk = memoryview(chunk)[need:]
        if self._ram is not None:
            return self._ram.feed(chunk)
        return self._scanner.feed(chunk)

    def feed_from(self, pread: Pread, start: int, end: int,
                  slice_bytes: int | None = None) -> Problem | None:
        """Feed bytes ``start..end`` that ``pread(offset, size)`` reads, in slices of
        ``slice_bytes`` (default :data:`SLICE`), stopping early once refused, then
        :meth:`finish`."""
        step = slice_bytes or SLICE
        off = start
        while off < end:
            chunk = pread(off, min(step, end - off))
            if not chunk:
                break
            off += len(chunk)
            if not self.feed(chunk):
                break  # refused: the rest cannot change that
        return self.finish()

    def _start(self) -> None:
        head = bytes(self._head)
        if is_ram_head(head):
            self._ram = RamScanner(self._bob_dir)
            self._ram.feed(head[MUG_BYTES:])
        else:
            self._scanner = Scanner(exact=True)
            self._scanner.feed(head[MUG_BYTES:])

    def finish(self) -> Problem | None:
        """None if the payload fed is an event's, else its :class:`Problem`."""
        if self._verdict is False:
            self._verdict = self._judge()
        return self._verdict  # type: ignore[return-value]

    def _judge(self) -> Problem | None:
        if self.size < MUG_BYTES:
            return _too_short(self.size)
        if self._scanner is None and self._ram is None:
            self._start()
        if self._ram is not None:
            return _ram_problem(self._ram.finish())
        return _jam_problem(self._scanner.finish())


def payload_problem(size: int, pread: Pread, bob_dir=None) -> Problem | None:
    """:func:`check_payload` of a stored payload of ``size`` bytes that ``pread`` reads:
    at once when it is at most :data:`SLICE` bytes, else in slices (memory bounded by a
    slice, for a jam)."""
    if size <= SLICE:
        return check_payload(pread(0, size), bob_dir)
    return PayloadCheck(bob_dir).feed_from(pread, 0, size)


def check_payload_file(path: str, chunk: int = SLICE) -> Problem | None:
    """:class:`PayloadCheck` of the file at ``path``, read in ``chunk``-byte pieces
    (``OSError`` if it cannot be read)."""
    check = PayloadCheck()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            if not check.feed(block):
                break  # refused: the rest cannot change that
    return check.finish()


def not_a_noun(event: int, problem: Problem) -> str:
    """The one line saying an event is not a noun: which, where parsing failed, why."""
    where = (f"at byte {problem.offset} of its payload" if problem.offset is not None
             else "in a bob file")
    return f"event {event} is not a noun: parsing failed {where}: {problem.why}"
