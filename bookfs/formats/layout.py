"""Every constant and byte layout of the Book format, in one place.

All integers on disk are little-endian.  The layout is the UIP's (``book-uip.md``), byte for
byte; ``docs/format.md`` explains it in one page.

::

    book.log : header (16 B) | deed | deed | ...
    header   : u32 magic 0x424F4F4B | u32 version 1 | u64 fir_d
    deed     : u64 len_d | u32 mug | (len_d - 4) B jam | u32 crc | u64 let_d   (len_d + 20 B)
    crc      : crc32(len_d ++ mug ++ jam)   -- the first len_d + 8 bytes of the deed
    meta.bin : 16 B who | u32 version | u32 life | u8 fake | 231 B zero            (256 B)
"""

from __future__ import annotations

import os
import re
import struct
from typing import Final

try:  # ISA-L's CRC-32 is the same function as zlib's, several times faster
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    from zlib import crc32 as _crc32

# --- file names --------------------------------------------------------------------------

LOG_NAME: Final = "book.log"
META_NAME: Final = "meta.bin"
#: The writer lock lives beside the log (bookfs's own; piers use the runtime's ``.vere.lock``).
LOCK_NAME: Final = "book.lock"
#: Quarantined bytes are copied to ``QUARANTINE_PREFIX + <offset>-<unix time>``, beside the log.
QUARANTINE_PREFIX: Final = "quarantine-book.log.at-"

#: ``create_files`` writes a new file as ``<name> + CREATING_SUFFIX`` and renames it into place.
CREATING_SUFFIX: Final = ".creating"

# --- piers (reference-formats.md §3) -------------------------------------------------------

#: A pier keeps its epochs in ``<pier>/PIER_LOG_DIR``; a directory holding it is a pier.
PIER_LOG_DIR: Final = ".urb/log"
#: An epoch is the directory ``<pier>/PIER_LOG_DIR/0i<N>``: its first event is ``N + 1``.
EPOCH_NAME: Final = re.compile(r"0i(\d+)")


def epoch_of_directory(directory: str | os.PathLike) -> int | None:
    """``N`` for a directory named ``0i<N>`` (plain decimal digits), else ``None``."""
    m = EPOCH_NAME.fullmatch(os.path.basename(os.path.normpath(os.fspath(directory))))
    return int(m.group(1)) if m else None


#: The runtime's writer lock, ``<pier>/VERE_LOCK_NAME``: a PID, fcntl-locked on byte 0.
VERE_LOCK_NAME: Final = ".vere.lock"

#: ``<epoch>/EPOC_NAME``: the epoch's format as ASCII digits (vere writes no newline).
EPOC_NAME: Final = "epoc.txt"
#: What every vere means by these: an LMDB epoch (``data.mdb``).
EPOC_LMDB: Final = (b"1", b"2")
#: A Book epoch (``book.log``) on vere's ``ml/book``, an LMDB epoch with ram events on
#: ``ml/bob``: only the files can say which (``docs/format.md``, "Identifying an epoch").
EPOC_EITHER: Final = b"3"
#: An LMDB epoch's environment file.
LMDB_DATA_NAME: Final = "data.mdb"
#: LMDB's magic, a u32 at byte 16 of each of its two meta pages (page 0, and page 1 one
#: page size further on); bookfs looks for page 1 at these page sizes.
LMDB_MAGIC: Final = 0xBEEFC0DE
LMDB_MAGIC_OFFSET: Final = 16
LMDB_PAGE_SIZES: Final = (4096, 8192, 16384, 65536)

FILE_MODE: Final = 0o644

# --- book.log header -----------------------------------------------------------------------

MAGIC: Final = 0x424F4F4B  # "BOOK"; on disk (LE) the first four bytes read "KOOB"
VERSION: Final = 1
HEADER = struct.Struct("<IIQ")  # magic, version, fir_d
HEADER_SIZE: Final = HEADER.size  # 16
FIR_OFFSET: Final = 8  # where fir_d lives inside the header

# --- deeds ---------------------------------------------------------------------------------

DEED_HEAD = struct.Struct("<QI")  # len_d, mug
DEED_TAIL = struct.Struct("<IQ")  # crc, let_d
DEED_LEN = struct.Struct("<Q")  # len_d alone (also let_d alone)
DEED_HEAD_SIZE: Final = DEED_HEAD.size  # 12
DEED_TAIL_SIZE: Final = DEED_TAIL.size  # 12
#: On-disk bytes of a deed beyond its payload: len_d (8) + crc (4) + let_d (8).
DEED_OVERHEAD: Final = 20
#: len_d counts mug + jam, so the smallest payload is a bare 4-byte mug.
MIN_PAYLOAD: Final = 4
#: The largest payload a deed may carry.  The UIP rejects let_d above 2^32 during recovery.
MAX_PAYLOAD: Final = 1 << 32

# --- meta.bin ------------------------------------------------------------------------------

META_SIZE: Final = 256
#: key -> (offset, size) inside meta.bin
META_FIELDS: Final[dict[str, tuple[int, int]]] = {
    "who": (0, 16),
    "version": (16, 4),
    "life": (20, 4),
    "fake": (24, 1),
}
META_KEYS: Final = ("version", "who", "fake", "life")

# --- the January 2026 padded layout (detected and refused, never written) -----------------

#: C structs with 4 pad bytes: deed header 16 B and tail 16 B, so a deed is len_d + 28 B.
PADDED_DEED_OVERHEAD: Final = 28


#: The standard CRC-32 as zlib computes it (poly 0x04C11DB7 reflected, init and xorout
#: 0xFFFFFFFF): ``crc32(data, value=0) -> int``.  Tests check it against crcmod.
crc32 = _crc32


def deed_size(payload_len: int) -> int:
    """On-disk size of a deed carrying ``payload_len`` bytes (mug + jam)."""
    return payload_len + DEED_OVERHEAD


def encode_deed(payload: bytes) -> bytes:
    """The on-disk bytes of one deed carrying ``payload`` (mug ++ jam)."""
    n = len(payload)
    head = DEED_LEN.pack(n)
    crc = _crc32(payload, _crc32(head))
    return b"".join((head, payload, DEED_TAIL.pack(crc, n)))


def deed_parts(payload) -> tuple[bytes, bytes]:
    """The bytes that go before and after ``payload`` on disk, for vectored writes."""
    n = len(payload)
    head = DEED_LEN.pack(n)
    crc = _crc32(payload, _crc32(head))
    return head, DEED_TAIL.pack(crc, n)


# --- vere's two-slot layout (reference-formats.md §2; engine in vere.py) -----------------
#
#   slot A at 0, slot B at 4096, each 48 B:
#     u32 magic | u32 version 1 | u64 fir_d | u64 las_d | u64 seq_d | u64 bat | u32 sum | u32 crc
#   bytes 48..4095 and 4144..8191 are zero; deeds start at 8192
#   deed : u64 len_d | len_d B payload (mug ++ jam) | u64 let_d        (len_d + 16 B, no CRC)
#   sum  : crc32 of the last batch's on-disk deed bytes, concatenated
#   crc  : crc32(slot bytes 0..43)

#: The CRC-covered part of a slot: magic, version, fir_d, las_d, seq_d, bat, sum (44 B).
VERE_SLOT_BODY = struct.Struct("<IIQQQQI")
VERE_SLOT_CRC = struct.Struct("<I")
VERE_SLOT_SIZE: Final = 48
#: Where slot A and slot B live.
VERE_SLOT_OFFSETS: Final = (0, 4096)
VERE_SLOT_NAMES: Final = ("A", "B")
#: Where the first deed starts (everything before it is the two slots and zero padding).
VERE_DEEDS_START: Final = 8192
#: On-disk bytes of a vere deed beyond its payload: len_d (8) + let_d (8).
VERE_DEED_OVERHEAD: Final = 16
#: vere's recovery accepts any deed with len_d != 0 (bookfs still writes at least 4 bytes).
VERE_MIN_LEN: Final = 1
#: What vere writes to meta.bin's ``version``: the pier's disk version, not the book's.
VERE_META_VERSION: Final = 3


# --- the commit mark (bookfs's own; engine in mark.py, rule in docs/reliability.md) -------
#
#   <lock dir>/.bookfs-mark : one 56-byte record at offset 0, rewritten in place
#     4 B magic "BKMK" | u32 version 1 | u64 st_dev | u64 st_ino | u64 seq
#     | u64 end | u64 last | u32 crc | 4 B zero
#   crc  : crc32 of the record's first 48 bytes
#   (st_dev, st_ino): the book.log the record speaks of; end: the byte just past its last
#   committed deed; last: the last committed event (a vere log's las_d); seq: bumped by
#   every update.  Its writer holds an OFD write lock on byte 0 while it lives.

#: The commit mark lives beside the writer lock (``lock.lock_path_for``): ``book.lock``'s
#: directory for a plain Book directory, the pier for every epoch of a pier.
MARK_NAME: Final = ".bookfs-mark"
MARK_MAGIC: Final = b"BKMK"
MARK_VERSION: Final = 1
MARK_BODY = struct.Struct("<4sIQQQQQ")
MARK_CRC = struct.Struct("<I4x")
MARK_SIZE: Final = MARK_BODY.size + MARK_CRC.size  # 56
