"""vere's header: two 48-byte slots, the commit point of a vere-layout log.

Slot A at offset 0, slot B at 4096 (``layout.py``; ``vere.py`` has the whole layout)::

    u32 magic | u32 version 1 | u64 fir_d | u64 las_d | u64 seq_d | u64 bat | u32 sum | u32 crc

A save writes the inactive slot; the valid slot with the higher ``seq_d`` (tie: slot A)
says what is committed.  This module parses, packs and chooses slots; the engine
(``vere.py``) decides, with the batch CRC, what its deeds commit.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from bookfs.errors import BadMagic, FormatError, TooShort, UnsupportedLayout
from bookfs.formats.layout import (
    HEADER,
    MAGIC,
    VERE_DEEDS_START,
    VERE_SLOT_BODY,
    VERE_SLOT_CRC,
    VERE_SLOT_NAMES,
    VERE_SLOT_OFFSETS,
    VERE_SLOT_SIZE,
    VERSION,
    crc32,
)


@dataclass(frozen=True)
class Slot:
    """One header slot's fields.  ``which`` is 0 for slot A (offset 0), 1 for slot B."""

    which: int
    fir: int
    las: int
    seq: int
    bat: int
    sum: int

    @property
    def name(self) -> str:
        return VERE_SLOT_NAMES[self.which]

    @property
    def offset(self) -> int:
        return VERE_SLOT_OFFSETS[self.which]

    def pack(self) -> bytes:
        """The slot's 48 on-disk bytes (body, then the CRC of the body)."""
        body = VERE_SLOT_BODY.pack(MAGIC, VERSION, self.fir, self.las, self.seq, self.bat,
                                   self.sum)
        return body + VERE_SLOT_CRC.pack(crc32(body))


def parse_slot(raw: bytes, which: int) -> tuple[Slot | None, str]:
    """``(slot, "")`` for a valid slot, else ``(None, why)``.  Valid: 48 bytes whose CRC
    holds, magic and version right, ``las_d >= fir_d`` and ``bat <= las_d - fir_d``."""
    if len(raw) < VERE_SLOT_SIZE:
        return None, "missing (the file ends before it)"
    body = raw[: VERE_SLOT_BODY.size]
    (crc,) = VERE_SLOT_CRC.unpack_from(raw, VERE_SLOT_BODY.size)
    if crc32(body) != crc:
        return None, f"CRC mismatch (stored {crc:#010x}, computed {crc32(body):#010x})"
    magic, version, fir, las, seq, bat, sm = VERE_SLOT_BODY.unpack(body)
    if magic != MAGIC:
        return None, f"magic {magic:#010x}, expected {MAGIC:#010x}"
    if version != VERSION:
        return None, f"version {version}, expected {VERSION}"
    if las < fir:
        return None, f"las_d {las} is below fir_d {fir}"
    if bat > las - fir:
        return None, f"bat {bat} exceeds the {las - fir} events it would cover"
    return Slot(which, fir, las, seq, bat, sm), ""


def initial_log_bytes(fir: int) -> bytes:
    """The 8192 bytes of a fresh log with epoch base ``fir``: both slots say
    ``fir_d = las_d = fir``, ``seq_d = bat = sum = 0``."""
    buf = bytearray(VERE_DEEDS_START)
    for which in (0, 1):
        off = VERE_SLOT_OFFSETS[which]
        buf[off : off + VERE_SLOT_SIZE] = Slot(which, fir, fir, 0, 0, 0).pack()
    return bytes(buf)


def read_slots(fd: int) -> tuple[bytes, bytes]:
    """Both slots' raw bytes (shorter where the file ends)."""
    return tuple(os.pread(fd, VERE_SLOT_SIZE, off) for off in VERE_SLOT_OFFSETS)


def read_header(fd: int, path: str, size: int
                ) -> tuple[list[Slot | None], list[Slot], list[str]]:
    """``(slots, candidates, why)`` for the log ``fd`` (``path``, ``size`` bytes): each
    slot parsed (``None`` where invalid), the valid ones newest first (a slot whose
    ``fir_d`` disagrees with the newest's is dropped, and said why), and why each dropped
    slot was.  No valid slot at all raises (:func:`_refuse_unreadable`)."""
    raw = read_slots(fd)
    why = []
    slots: list[Slot | None] = []
    for which, r in enumerate(raw):
        s, w = parse_slot(r, which)
        slots.append(s)
        if s is None:
            why.append(f"slot {VERE_SLOT_NAMES[which]} at {VERE_SLOT_OFFSETS[which]}: {w}")
    cands = sorted((s for s in slots if s), key=lambda s: (-s.seq, s.which))
    if not cands:
        _refuse_unreadable(path, size, raw, why)
    best = cands[0]
    if len(cands) == 2 and cands[1].fir != best.fir:
        why.append(f"slot {cands[1].name}: fir_d {cands[1].fir} disagrees with slot "
                   f"{best.name}'s {best.fir}; ignored")
        cands = [best]
        slots[1 - best.which] = None
    return slots, cands, why


def _refuse_unreadable(path: str, size: int, raw: tuple[bytes, bytes], why: list[str]):
    if size < VERE_SLOT_SIZE:
        raise TooShort(f"{path}: {size} bytes, under one {VERE_SLOT_SIZE}-byte "
                       "vere header slot")
    magic_a = struct.unpack_from("<I", raw[0])[0]
    magic_b = struct.unpack_from("<I", raw[1])[0] if len(raw[1]) >= 4 else None
    if magic_a != MAGIC and magic_b != MAGIC:
        raise BadMagic(f"{path}: magic {magic_a:#010x} at offset 0, expected "
                       f"{MAGIC:#010x} (BOOK); not a vere-layout Book log")
    if magic_b != MAGIC and HEADER.unpack_from(raw[0])[1] == VERSION:
        raise UnsupportedLayout(
            f"{path}: no vere header slot has a valid CRC; this looks like the "
            "UIP layout (16-byte header), open it with bookfs.formats.book.Book")
    raise FormatError(f"{path}: neither vere header slot is valid "
                      f"({'; '.join(why)}); refusing to guess the committed state")


def durable_slots(fir: int, size: int, witness: bytes):
    """``gate(slot, index) -> bool``: whether a reader made the state ``slot`` describes
    durable itself, by an ``fdatasync`` started when the log had ``size`` bytes and its
    two slots were ``witness`` (``committed.py``).  vere writes the header slot before the
    same ``fdatasync`` as the deeds (``pkg/vere/db/book.c``, ``u3_book_save()``), so a
    slot seen in the file says nothing of durability; one seen *before* a sync that then
    returned, with all its deeds below ``size``, is durable."""

    def durable(c: Slot, ix) -> bool:
        k = min(c.las - fir, ix.count)  # of its deeds, those there (recovery judges them)
        end = ix.offsets[k] if k < ix.count else ix.end
        mine = witness[c.which * VERE_SLOT_SIZE : (c.which + 1) * VERE_SLOT_SIZE]
        return (k == 0 or end <= size) and mine == c.pack()

    return durable
