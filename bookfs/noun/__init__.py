"""Nouns, as pure functions.

``codec``      jam, cue and mug in pure Python: the reference
``scanner``    a validating scanner for jam bitstreams (the reference of the compiled one)
``ram``        vere's second event encoding, *ram*: detect, decode, encode
``ramscan``    a validating scanner for ram, fed in chunks
``payload``    what an event's payload must be, decided in one place
``aura``       the auras bookfs reads: @da (a date) and @p (a ship's name)
``peek``       an event's head (date, wire, card tag) read without cueing the event
``eventdate``  an event's date: Arvo's ``now`` when it ran
``route``      where an event goes: its vane and the Gall agent it names
``view``       the views the renderer reads a noun through
``render``     nouns as a person reads them: the dojo's notation
``event``      one event as text (``bookfs show``, ``pretty/N``)

The names of the codec, the scanner, the auras and :func:`peek_event` are re-exported
here; other layers import them from this package (``from bookfs.noun import cue``).
``jam``, ``cue``, ``mug``, ``scan`` and ``Scanner`` are the compiled core's
(``bookfs/noun/_core.pyx``) when it built, else the pure reference's: :data:`CORE` says
which (``"compiled"`` or ``"pure"``), :data:`CORE_REASON` why not compiled, and
:func:`core_description` puts it in one line for ``info``.
"""
from bookfs import compiled as _compiled

from bookfs.noun.aura import (DA_UNIX_EPOCH, PREFIXES, SUFFIXES, Prf, da_to_datetime,
                              datetime_to_da, fein, format_da, fynd, parse_da, parse_patp, patp)
# The codec and the scanner in pure Python: the reference implementation ...
from bookfs.noun import codec as _codec
from bookfs.noun import scanner as _scanner
from bookfs.noun.codec import (Cell, CueError, Noun, cell, cord, from_list, is_atom, is_cell,
                               muk, murmur3_32, murmur3_32_fast, noun_equal, path, tape,
                               to_list, uncord, unpath, untape)
from bookfs.noun.peek import peek_event
from bookfs.noun.scanner import REASONS, ScanResult

# ... and the same functions compiled (bookfs/noun/_core.pyx, issue 21), chosen over them
# when the extension built and imports.  tests/test_noun_core.py holds the two equal.
# BOOKFS_PURE_NOUNS=1 in the environment keeps the pure ones.
_choice = _compiled.choose("bookfs.noun._core", "BOOKFS_PURE_NOUNS", "bookfs/noun/_core.pyx")
CORE = _choice.name
#: why the pure core is in use (None when the compiled one is)
CORE_REASON: str | None = _choice.reason
_impl = _choice.module
if _impl is not None:
    jam, cue, mug, scan, Scanner = _impl.jam, _impl.cue, _impl.mug, _impl.scan, _impl.Scanner
    scan_ok = _impl.scan_ok
    event_head, murmur3_buffer = _impl.event_head, _impl.murmur3_buffer
else:
    jam, cue, mug = _codec.jam, _codec.cue, _codec.mug
    scan, scan_ok, Scanner = _scanner.scan, _scanner.scan_ok, _scanner.Scanner
    from bookfs.noun.peek import event_head

    def murmur3_buffer(data, seed: int) -> int:
        """MurmurHash3_x86_32 of any buffer (the compiled core hashes it in place; this
        fallback copies it)."""
        return murmur3_32_fast(bytes(data), seed)


def core_description() -> str:
    """Which noun core is in use, for ``info``: compiled, or pure and why."""
    return _choice.describe()

__all__ = ["CORE", "CORE_REASON", "DA_UNIX_EPOCH", "PREFIXES", "REASONS", "SUFFIXES", "Cell",
           "CueError", "Noun", "Prf", "ScanResult", "Scanner", "cell", "core_description",
           "cord", "cue", "da_to_datetime", "datetime_to_da", "event_head", "fein", "format_da",
           "from_list",
           "fynd", "is_atom", "is_cell", "jam", "muk", "mug", "murmur3_32", "murmur3_32_fast", "murmur3_buffer",
           "noun_equal", "parse_da", "parse_patp", "path", "patp", "peek_event", "scan", "scan_ok", "tape",
           "to_list", "uncord", "unpath", "untape"]
