"""A validating scanner for jam bitstreams, in pure Python: the reference for the compiled
scanner in ``bookfs/noun/_core.pyx``.

:func:`scan` (whole input) and :class:`Scanner` (input fed in chunks) walk a jam the way
:func:`~bookfs.noun.codec.cue` does, without building the noun, and say whether it is one:
a :class:`ScanResult` with ``ok``, and otherwise the ``reason`` and the ``bit`` (``byte``)
where parsing failed.  With ``mug=True`` they also compute the noun's mug (Hoon ``++mug``)
on the way, so an event's 4-byte mug prefix can be checked without cueing it.

**What is accepted.**  ``scan(data, exact=False).ok`` is true exactly when ``cue(data)``
returns a noun rather than raising :class:`~bookfs.noun.codec.CueError`.  ``cue`` is lax
about what follows the noun (bits after its end are ignored); ``exact=True``, the default,
adds one rule: the jam *cues completely and exactly*, i.e. the noun's encoding, which ends
at bit ``E`` (``ScanResult.bits``), ends within the input's last byte
(``len(data) == ceil(E / 8)``) and that byte's bits above ``E`` are all zero.  A jam as
``jam`` (and vere) writes it is exact; the same jam with a byte appended, or with a
non-zero bit after its end, is not.

**Reasons** (``ScanResult.reason``) and the offset reported for each (``bit``, absolute in
the input; ``byte == bit // 8``):

``"empty"``
    no input at all (``bit`` 0).
``"truncated"``
    the input ends before the noun does; ``bit`` is where the node being read starts (its
    tag), or the end of the input when it ends exactly where a node should start.
``"too-large"``
    a length prefix of 64 or more zero bits: an atom (or back-reference) of at least
    2^63 bits, larger than any input; ``bit`` is the node's tag.
``"bad-reference"``
    a back-reference to a position where no earlier, complete atom or cell starts (a
    position inside a node, one still being read such as an enclosing cell, another
    back-reference, or one past the input); ``bit`` is the reference's tag.
``"trailing"``
    (``exact`` only) the noun ends at ``E`` but the input goes on: more bytes, or
    non-zero bits in the last byte; ``bit`` is ``E`` and ``bits``/``mug`` are filled in.

When several things are wrong the first one met reading left to right is reported, and a
node that runs past the end of the input is "truncated" even when its content would have
been wrong too, as ``cue`` does.

**Memory.**  A scanner keeps, per node (atom, cell or back-reference) read, its start
position, and with ``mug=True`` its 31-bit mug, since any earlier node may be the target
of a later back-reference, plus one entry per enclosing cell still open; never the noun's
atoms.  The chunked :class:`Scanner` holds back only the bytes of the node being read, and
skips a large atom without holding it unless ``mug=True`` (its mug needs its bytes; a
back-reference's bits are always held, as they are few in any jam that ``jam`` writes).  This
pure version keeps those in Python dicts and lists; the compiled one (``_core.pyx``) in
packed arrays of about 2 bytes a node.

The verdicts (``ok``, ``reason``, ``bit``, ``bits``, ``mug`` and the message) are the same
however the input is split into chunks.
"""

from __future__ import annotations

from bookfs.noun.codec import _mum

__all__ = ["REASONS", "ScanResult", "Scanner", "scan", "scan_ok"]

REASONS = ("empty", "truncated", "too-large", "bad-reference", "trailing")

_MAX_ZEROS = 64  # a length prefix this long means an atom of >= 2^63 bits


class ScanResult:
    """The verdict of a scan.  ``ok``; ``reason`` (one of :data:`REASONS`) and ``bit``
    (``byte``) where it failed, None when ok; ``bits``, where the noun's encoding ends
    (None if it was not read to its end); ``mug``, the noun's mug when asked for and read;
    ``message``, one line for a person."""

    __slots__ = ("ok", "reason", "bit", "bits", "mug", "message")

    def __init__(self, ok: bool, reason: str | None = None, bit: int | None = None,
                 bits: int | None = None, mug: int | None = None, message: str = "ok"):
        self.ok, self.reason, self.bit, self.bits, self.mug, self.message = (
            ok, reason, bit, bits, mug, message)

    @property
    def byte(self) -> int | None:
        """The byte holding :attr:`bit` (None when ok)."""
        return None if self.bit is None else self.bit >> 3

    def _key(self) -> tuple:
        return (self.ok, self.reason, self.bit, self.bits, self.mug, self.message)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScanResult):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        if self.ok:
            return f"ScanResult(ok, bits={self.bits}, mug={self.mug})"
        return f"ScanResult({self.reason} at bit {self.bit} (byte {self.byte}): {self.message})"


def _ok(bits: int, mug: int | None) -> ScanResult:
    return ScanResult(True, None, None, bits, mug, "ok")


def _failure(reason: str, bit: int, total: int, detail: int = -1, mug: int | None = None,
             ) -> ScanResult:
    """The failed :class:`ScanResult`, its message made here for both scanners.  ``total``
    is the input's length in bits so far; ``detail`` the referenced position
    (bad-reference: -1 when wider than 63 bits)."""
    bits = None
    if reason == "empty":
        message = "empty input: no noun"
    elif reason == "truncated":
        if bit >= total:
            message = f"truncated: the input ends at bit {total}, where a noun should start"
        else:
            message = (f"truncated: the noun at bit {bit} runs past the end of the input "
                       f"({total} bits)")
    elif reason == "too-large":
        message = (f"length too large: the noun at bit {bit} has a length prefix of "
                   f"{_MAX_ZEROS} or more zero bits")
    elif reason == "bad-reference":
        where = f"position {detail}" if detail >= 0 else "position (wider than 63 bits)"
        message = (f"back-reference at bit {bit} to unknown {where}: no earlier complete "
                   "noun starts there")
    elif reason == "trailing":
        bits = bit
        message = (f"trailing data: the noun ends at bit {bit} but the input goes on (more "
                   "bytes, or non-zero bits after the noun)")
    else:  # pragma: no cover
        raise ValueError(reason)
    return ScanResult(False, reason, bit, bits, mug, message)


def _cell_mug(head: int, tail: int) -> int:
    return _mum(0xDEADBEEF, 0xFFFE, head | (tail << 32))


def _atom_mug(value: int) -> int:
    return _mum(0xCAFEBABE, 0x7FFF, value)


class Scanner:
    """Scan a jam fed in chunks: :meth:`feed` each chunk, then :meth:`finish` for the
    :class:`ScanResult`.  :attr:`result` is the failure as soon as one is certain (a bad
    back-reference, a length too large, trailing bytes), else None until :meth:`finish`;
    further chunks after a failure are ignored.  See the module docstring for what is
    accepted and what the scanner holds in memory."""

    def __init__(self, *, mug: bool = False, exact: bool = True):
        self.mug = bool(mug)
        self.exact = bool(exact)
        self.result: ScanResult | None = None
        self._buf = bytearray()
        self._base = 0  # absolute byte index of _buf[0]
        self._total = 0  # bytes fed
        self._pos = 0  # absolute bit of the next node
        self._skip_end = -1  # skipping an atom (or a wide reference) that ends here
        self._skip_tag = 0
        self._targets: dict[int, int] = {}  # start bit of a complete atom or cell -> mug
        self._stack: list[list] = []  # open cells: [start bit, head mug or None]
        self._end = -1  # where the noun ended, once it has
        self._mug: int | None = None
        self._finished = False

    # --- input ---------------------------------------------------------------------------

    def feed(self, chunk: bytes | bytearray | memoryview) -> bool:
        """Scan ``chunk``, the input's next bytes; False once the scan has failed."""
        if self._finished:
            raise ValueError("feed() after finish()")
        if self.result is not None:
            return False
        if not len(chunk):
            return True
        self._buf += chunk
        self._total += len(chunk)
        self._advance(False)
        keep = (self._total if self._end >= 0 else  # done: nothing more is read
                (self._skip_end if self._skip_end >= 0 else self._pos) >> 3)
        drop = min(keep - self._base, len(self._buf))
        if drop > 0:
            del self._buf[:drop]
            self._base += drop
        return self.result is None

    def finish(self) -> ScanResult:
        """The verdict, once all the input has been fed."""
        if not self._finished:
            self._finished = True
            if self.result is None:
                if self._total == 0:
                    self.result = _failure("empty", 0, 0)
                else:
                    self._advance(True)
                    if self.result is None:
                        self.result = _ok(self._end, self._mug)
        return self.result  # type: ignore[return-value]

    # --- parsing -------------------------------------------------------------------------

    def _bits(self, pos: int, width: int) -> int:
        """``width`` bits from absolute bit ``pos`` (all of them fed and held)."""
        if width == 0:
            return 0
        start = (pos >> 3) - self._base
        chunk = int.from_bytes(self._buf[start:((pos + width + 7) >> 3) - self._base], "little")
        return (chunk >> (pos & 7)) & ((1 << width) - 1)

    def _fail(self, reason: str, bit: int, detail: int = -1) -> None:
        self.result = _failure(reason, bit, self._total * 8, detail)

    def _advance(self, final: bool) -> None:
        """Read as many whole nodes as the input fed allows; with ``final``, the input is
        complete and a node it cannot finish is a failure."""
        avail = self._total * 8
        targets, stack, mugs = self._targets, self._stack, self.mug
        while self.result is None:
            if self._end >= 0:
                self._check_trailing()
                return
            if self._skip_end >= 0:
                if self._skip_end > avail:
                    if final:
                        self._fail("truncated", self._skip_tag)
                    return
                targets[self._skip_tag] = 0
                self._pos, self._skip_end = self._skip_end, -1
                self._complete(0)
                continue
            tag = self._pos
            if tag >= avail:
                if final:
                    self._fail("truncated", tag)
                return
            if not self._bits(tag, 1):
                is_ref, mat = False, tag + 1
            else:
                if tag + 1 >= avail:
                    if final:
                        self._fail("truncated", tag)
                    return
                if not self._bits(tag + 1, 1):  # a cell
                    stack.append([tag, None])
                    self._pos = tag + 2
                    continue
                is_ref, mat = True, tag + 2
            # mat at `mat`: c zero bits, a one, c - 1 bits of b's low bits, b bits of value.
            width = min(_MAX_ZEROS, avail - mat)
            window = self._bits(mat, width) if width > 0 else 0
            if not window:
                if width >= _MAX_ZEROS:
                    self._fail("too-large", tag)
                elif final:
                    self._fail("truncated", tag)
                return
            c = (window & -window).bit_length() - 1
            if c == 0:
                b, start = 0, mat + 1
            else:
                if mat + 2 * c > avail:
                    if final:
                        self._fail("truncated", tag)
                    return
                b = (1 << (c - 1)) | self._bits(mat + c + 1, c - 1)
                start = mat + 2 * c
            end = start + b
            if end > avail:
                if final:
                    self._fail("truncated", tag)
                elif not mugs and not is_ref:  # skip the atom's bits without holding them
                    self._skip_end, self._skip_tag = end, tag
                    continue
                return
            if not is_ref:
                node_mug = _atom_mug(self._bits(start, b)) if mugs else 0
                targets[tag] = node_mug
            else:
                ref = self._bits(start, b)  # b may be wide with leading zeros (cue allows it)
                node_mug = targets.get(ref)
                if node_mug is None:
                    self._fail("bad-reference", tag, ref if ref < 1 << 63 else -1)
                    return
            self._pos = end
            self._complete(node_mug)

    def _complete(self, node_mug: int) -> None:
        """A node has been read: it is the head of the innermost open cell, or its tail,
        which completes that cell (and maybe the cells around it), or the whole noun."""
        stack = self._stack
        while stack:
            top = stack[-1]
            if top[1] is None:
                top[1] = node_mug
                return
            stack.pop()
            node_mug = _cell_mug(top[1], node_mug) if self.mug else 0
            self._targets[top[0]] = node_mug
        self._end = self._pos
        self._mug = node_mug if self.mug else None

    def _check_trailing(self) -> None:
        if not self.exact:
            return
        end, total = self._end, self._total
        need = (end + 7) >> 3
        # The last byte's bits are read once, when the noun ends (later input only adds
        # bytes, and the buffer no longer holds that byte).
        held = self._base <= end >> 3 < self._base + len(self._buf)
        if total > need or (end & 7 and total == need and held
                            and self._bits(end, 8 - (end & 7))):
            self.result = _failure("trailing", end, total * 8, mug=self._mug)


def scan(data: bytes | bytearray | memoryview, *, mug: bool = False,
         exact: bool = True) -> ScanResult:
    """Scan the whole jam ``data`` (see the module docstring): a :class:`ScanResult`."""
    scanner = Scanner(mug=mug, exact=exact)
    scanner.feed(data)
    return scanner.finish()


def scan_ok(data: bytes | bytearray | memoryview) -> bool:
    """``scan(data).ok``: whether ``data`` is one whole jam and nothing after it (the
    compiled core's answers it without making a :class:`ScanResult`)."""
    return scan(data).ok
