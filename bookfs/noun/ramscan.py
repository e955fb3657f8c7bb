"""A validating scanner for the ram encoding, fed in chunks: :class:`RamScanner`.

:func:`bookfs.noun.ram.ram_decode` builds the noun, so it holds the whole encoding and
every atom.  A payload check needs only the verdict, and an append may be any size, so
this scanner walks the same bits the same way without building anything:

* it accepts exactly what ``ram_decode(data, bob_dir, exact=True)`` accepts, and refuses
  everything else with the same :class:`~bookfs.noun.codec.CueError` (or
  :class:`~bookfs.noun.ram.BobError`) message, however the input is split into chunks
  (``tests/test_ramscan.py`` holds the two equal over hypothesis cases and every bit
  flip and truncation of vere's own vectors);
* **memory** is one entry per node read (its start position, since a later
  back-reference may name any earlier atom, bob or completed cell), one per enclosing
  cell still open, and the bytes of the node being read; an atom's bits are skipped
  without being held, however large;
* a **bob** whose file is present under ``bob_dir`` is checked (not empty, and its
  content's mug is the one in its name: :func:`~bookfs.noun.ram.check_bob_file`) with the
  file mapped, not read into memory; a bob whose file is missing is a reference, and
  fine.

Errors that mention the input's length ("past the end of the input (N bits)", trailing
bytes) are only known once the input is complete, so they come from :meth:`finish`;
:meth:`feed` returns False as soon as the encoding is refused for a reason the rest of the
input cannot change.
"""

from __future__ import annotations

import os

from bookfs.noun.codec import CueError
from bookfs.noun.ram import (_U32, RAM_MAGIC, RAM_VERSION, TAG_ATOM, TAG_BACK, TAG_CELL,
                             check_bob_file)

__all__ = ["RamScanner", "ram_check"]

_HEADER = len(RAM_MAGIC) + 1
_M64 = (1 << 64) - 1
_NEED = None  # a node's bits are not all fed yet


def _where(pos: int) -> str:
    return f"bit {pos} (byte {_HEADER + (pos >> 3)} of the ram encoding)"


class RamScanner:
    """Check a ram encoding (its 5-byte header included, the event's mug not) fed in
    order: :meth:`feed` each chunk, then :meth:`finish`, which returns None when it is
    one and the error ``ram_decode(..., exact=True)`` would raise when not.  Not
    thread-safe."""

    def __init__(self, bob_dir: str | os.PathLike[str] | None = None) -> None:
        self._bob_dir = bob_dir
        self._head = bytearray()  # the header's bytes, until it is read
        self._buf = bytearray()  # body bytes held, from body byte _base
        self._base = 0
        self._fed = 0  # body bytes fed
        self._pos = 0  # body bit of the next node
        self._skip: tuple[int, int, int] | None = None  # (end bit, mat bit, width): an atom skipped
        self._targets: set[int] = set()
        self._cells: list[list] = []  # open cells: [tag bit, head read]
        self._bobs: set[tuple[int, int]] = set()
        self._end = -1  # where the noun ended, once it has
        self._tail_bits = False  # non-zero bits after the noun in its last byte
        self._error: CueError | None = None
        self._done = False

    @property
    def error(self) -> CueError | None:
        """The error as soon as the refusal is certain, else None (until :meth:`finish`)."""
        return self._error

    # --- input ---------------------------------------------------------------------------

    def feed(self, chunk) -> bool:
        """The encoding's next bytes; False once it is certainly refused."""
        if self._done:
            raise ValueError("feed() after finish()")
        if self._error is not None:
            return False
        mv = memoryview(chunk).cast("B")
        if len(self._head) < _HEADER:
            need = _HEADER - len(self._head)
            self._head += mv[:need]
            mv = mv[need:]
            if len(self._head) < _HEADER or not self._check_header():
                return self._error is None
        if not len(mv):
            return True
        self._fed += len(mv)
        if self._end >= 0:
            return True  # only counted: the trailing check needs the total
        if self._skip is not None and self._skip[0] > self._fed * 8:
            self._base = self._fed  # still inside a skipped atom: hold nothing
            return True
        self._buf += mv
        self._advance(False)
        self._trim()
        return self._error is None

    def finish(self) -> CueError | None:
        """None if the input fed is a ram encoding, else the error."""
        if not self._done:
            self._done = True
            if self._error is None:
                if len(self._head) < _HEADER:
                    self._check_header(final=True)
                else:
                    self._advance(True)
                    if self._error is None:
                        self._check_trailing()
        return self._error

    def _check_header(self, final: bool = False) -> bool:
        head = bytes(self._head)
        if head[:len(RAM_MAGIC)] != RAM_MAGIC[:len(head)] or (final and len(head) < _HEADER):
            self._error = CueError(f"not a ram encoding: it does not start with {RAM_MAGIC!r}")
            return False
        if len(head) == _HEADER and head[-1] != RAM_VERSION:
            self._error = CueError(f"ram version {head[-1]} at byte 4: only version "
                                   f"{RAM_VERSION} exists")
            return False
        return len(head) == _HEADER

    def _trim(self) -> None:
        keep = self._fed if self._end >= 0 else (
            self._skip[0] if self._skip is not None else self._pos) >> 3
        drop = min(keep - self._base, len(self._buf))
        if drop > 0:
            del self._buf[:drop]
            self._base += drop

    # --- bits ----------------------------------------------------------------------------

    def _read(self, pos: int, width: int) -> int:
        """``width`` bits from body bit ``pos`` (bits past the input read as zero)."""
        start = (pos >> 3) - self._base
        raw = self._buf[start:((pos + width + 7) >> 3) - self._base]
        return (int.from_bytes(raw, "little") >> (pos & 7)) & ((1 << width) - 1)

    def _rub(self, pos: int, what: str, limit: int | None, final: bool, value: bool,
             after_tag: bool = True):
        """``mat`` at ``pos``: (value or None, next bit), :data:`_NEED` when its bits are
        not all fed and ``final`` is false; raises :class:`CueError` as ``ram_decode``.
        ``after_tag``: the mat follows a node's tag, and ``ram_decode`` looks for its
        length in the 72-bit window it read at the tag (so its "64 leading zeros" test
        sees as many bits as it does there)."""
        total = self._fed * 8
        if after_tag:
            win_bits = min(72 - ((pos - 2) & 7), total - pos + 2) - 2
        else:
            win_bits = min(72 - (pos & 7), total - pos)
        low = self._read(pos, min(64, max(win_bits, 0))) if win_bits > 0 else 0
        if not low:
            if win_bits >= 64:
                raise CueError(f"ram: the length of the {what} at {_where(pos)} has 64 or "
                               "more leading zeros (vere reads at most 63)")
            if not final:
                return _NEED
            raise CueError(f"ram: the length of the {what} at {_where(pos)} runs past "
                           f"the end of the input ({total} bits)")
        c = (low & -low).bit_length() - 1
        if c == 0:
            return (0 if value else None), pos + 1
        if pos + 2 * c > total:
            if not final:
                return _NEED
            raise CueError(f"ram: the length of the {what} at {_where(pos)} runs past "
                           f"the end of the input ({total} bits)")
        b = 1 if c == 1 else (1 << (c - 1)) | self._read(pos + c + 1, c - 1)
        if limit is not None and b > limit:
            raise CueError(f"ram: the {what} at {_where(pos)} is {b} bits wide; vere reads "
                           f"at most {limit}")
        end = pos + 2 * c + b
        if end > total:
            if not final and not value:
                self._skip = (end, pos, b)  # an atom: skip its bits
                return end, end
            if not final:
                return _NEED
            raise CueError(f"ram: the {what} at {_where(pos)} claims {b} bits, past the end "
                           f"of the input ({total} bits)")
        return (self._read(pos + 2 * c, b) if value else None), end

    # --- parsing -------------------------------------------------------------------------

    def _advance(self, final: bool) -> None:
        try:
            self._walk(final)
        except CueError as e:  # BobError is one
            self._error = e

    def _walk(self, final: bool) -> None:
        total = self._fed * 8
        targets, cells = self._targets, self._cells
        while self._end < 0:
            if self._skip is not None:
                end, mat, width = self._skip
                if end > total:
                    if final:
                        raise CueError(f"ram: the atom at {_where(mat)} claims {width} bits, "
                                       f"past the end of the input ({total} bits)")
                    return
                self._skip = None
                self._pos = end
                self._complete()
                continue
            pos = self._pos
            if pos + 2 > total:
                if final:
                    raise CueError(f"ram: truncated input: a tag expected at {_where(pos)}, "
                                   f"the input has {total} bits")
                return
            tag = self._read(pos, 2)
            if tag == TAG_CELL:
                cells.append([pos, False])
                self._pos = pos + 2
                continue
            if tag == TAG_ATOM:
                got = self._rub(pos + 2, "atom", None, final, False)
                if got is _NEED:
                    return
                if self._skip is not None:
                    targets.add(pos)
                    continue  # its bits are skipped as they come
                targets.add(pos)
                self._pos = got[1]
            elif tag == TAG_BACK:
                got = self._rub(pos + 2, "back-reference", 62, final, True)
                if got is _NEED:
                    return
                if got[0] not in targets:
                    raise CueError(f"ram: back-reference at {_where(pos)} to bit {got[0]}, "
                                   "where no atom, bob or completed cell starts")
                self._pos = got[1]
            else:  # TAG_BOB
                got = self._rub(pos + 2, "bob mug", 62, final, True)
                if got is _NEED:
                    return
                seq = self._rub(got[1], "bob seq", 62, final, True, after_tag=False)
                if seq is _NEED:
                    return
                mug, seq, nxt = got[0], seq[0], seq[1]
                if mug >= _U32 or seq >= _U32:
                    raise CueError(f"ram: bob at {_where(pos)} has mug {mug} and seq {seq}; "
                                   "both must be below 2^32")
                if self._bob_dir is not None and (mug, seq) not in self._bobs:
                    check_bob_file(self._bob_dir, mug, seq)
                    self._bobs.add((mug, seq))
                targets.add(pos)
                self._pos = nxt
            self._complete()

    def _complete(self) -> None:
        """A node has been read: it is the head of the innermost open cell, or its tail,
        which completes that cell (and maybe the cells around it), or the whole noun."""
        cells = self._cells
        while cells:
            top = cells[-1]
            if not top[1]:
                top[1] = True
                return
            cells.pop()
            self._targets.add(top[0])
        end = self._end = self._pos
        if end & 7:  # the bits above the noun's end in its last byte, fed already
            self._tail_bits = bool(self._read(end, 8 - (end & 7)))

    def _check_trailing(self) -> None:
        end, total = self._end, self._fed * 8
        if self._fed > (end + 7) >> 3 or self._tail_bits:
            self._error = CueError(f"ram: the noun ends at {_where(end)} but the input goes "
                                   f"on to bit {total}")


def ram_check(data, bob_dir: str | os.PathLike[str] | None = None) -> CueError | None:
    """:class:`RamScanner` of the whole encoding ``data``: None, or the error."""
    scanner = RamScanner(bob_dir)
    scanner.feed(data)
    return scanner.finish()
