"""Telling stores apart by their bytes, without guessing.

A ``book.log`` is in vere's two-slot layout (``vere.py``) or the UIP layout (``book.py``);
the version number cannot tell them apart (both are 1), a header slot's CRC can.
:func:`detect_layout` decides (``pier.identify`` and ``pier.open_book_dir`` ask it), and
the UIP engine runs the same check on open (:func:`identify_fd`), so no path reaches a
layout by another road.

For telling an epoch's stores apart (``epochs.epoch_kind``): :func:`is_lmdb_file` (LMDB's
magic in a ``data.mdb``) and :func:`book_log_holds_events` (whether a ``book.log``'s bytes
can hold any event).
"""

from __future__ import annotations

import os
import struct

from bookfs.errors import BadMagic, BadVersion, BookError, FormatError, TooShort
from bookfs.formats.deeds import UIP
from bookfs.formats.fileio import open_regular
from bookfs.formats.layout import (
    DEED_LEN,
    HEADER,
    HEADER_SIZE,
    LMDB_MAGIC,
    LMDB_MAGIC_OFFSET,
    LMDB_PAGE_SIZES,
    MAGIC,
    MAX_PAYLOAD,
    MIN_PAYLOAD,
    PADDED_DEED_OVERHEAD,
    VERE_DEEDS_START,
    VERE_SLOT_BODY,
    VERE_SLOT_CRC,
    VERE_SLOT_OFFSETS,
    VERE_SLOT_SIZE,
    VERSION,
    crc32,
)


def slot_crc_ok(raw: bytes) -> bool:
    """A vere header slot (48 bytes) whose CRC (of bytes 0..43, stored at 44) matches."""
    return (len(raw) >= VERE_SLOT_SIZE
            and crc32(raw[: VERE_SLOT_BODY.size]) == VERE_SLOT_CRC.unpack_from(raw, 44)[0])


def is_vere_layout(path: str | os.PathLike) -> bool:
    """True when the file at ``path`` (a ``book.log``) is in vere's two-slot layout: slot A
    or slot B has a matching header CRC and the Book magic.  The version number cannot tell
    the layouts apart (both are 1); the CRC can.  False for a missing or short file."""
    try:
        fd = open_regular(os.fspath(path), os.O_RDONLY, follow=True)
    except (OSError, BookError):  # missing, or not a regular file: the opener says why
        return False
    try:
        for off in VERE_SLOT_OFFSETS:
            raw = os.pread(fd, VERE_SLOT_SIZE, off)
            if slot_crc_ok(raw) and struct.unpack_from("<I", raw)[0] == MAGIC:
                return True
        return False
    finally:
        os.close(fd)


def epoch_says_vere(directory: str | os.PathLike) -> bool:
    """True when ``directory`` is a pier's epoch whose ``epoc.txt`` is ``3``: vere opens
    such an epoch only in its own two-slot layout, so that is the layout its ``book.log``
    was written in (bookfs never writes a UIP-layout log beside ``epoc.txt`` 3).  An
    unreadable or absent ``epoc.txt`` says nothing."""
    try:
        fd = open_regular(os.path.join(os.fspath(directory), "epoc.txt"), os.O_RDONLY,
                          follow=True)
    except (OSError, BookError):
        return False
    try:
        return os.pread(fd, 64, 0).strip() == b"3"
    except OSError:
        return False
    finally:
        os.close(fd)


def detect_layout(log_path: str | os.PathLike) -> str:
    """``"vere"`` or ``"uip"`` for the ``book.log`` at ``log_path``, or a
    :class:`FormatError` saying why it is neither (nothing is parsed as a layout it has not
    been identified as).  Missing file: :class:`BookError`.

    Identification never guesses; a file is refused (untouched, one line saying why and
    what to do) unless its bytes decide, or bytes that are not decisive meet a context
    that is (``epoc.txt`` 3 beside it: :func:`epoch_says_vere`):

    * a header slot whose CRC holds and whose magic is Book's: vere's layout;
    * under 16 bytes: refused (no Book header of either layout);
    * the Book magic and version 1 at offset 0, and a whole UIP deed at offset 16 whose
      CRC holds: the UIP layout (a vere slot cannot hold one: its CRC would have to hold
      by chance);
    * otherwise the bytes after the 16-byte header are either a UIP log's torn first
      deed or the rest of a vere slot that lost its CRC, whose cutting would destroy
      vere's ``las_d``/``seq_d``: refused when the file is too short to hold a whole vere
      slot (16 < size <= 48), when vere's zero padding follows (both slots damaged), and
      whenever ``epoc.txt`` 3 says the file is vere's;
    * exactly the 16-byte header and nothing else, with no ``epoc.txt`` 3: the UIP layout
      (an empty UIP log is exactly this; a vere log is never shorter than 8192 bytes, so
      such a file holds no vere event, and appending after it cuts nothing);
    * longer files with non-zero bytes where vere keeps zeros: the UIP layout (a UIP log
      whose first deed is damaged, which its recovery quarantines before cutting)."""
    path = os.fspath(log_path)
    try:  # a FIFO or directory is refused here (NotRegularFile), never waited on
        fd = open_regular(path, os.O_RDONLY, follow=True)
    except FileNotFoundError:
        raise BookError(f"{path}: no such file (expected a Book log)") from None
    try:
        return identify_fd(fd, path, epoch_says_vere(os.path.dirname(path) or "."))
    finally:
        os.close(fd)


_REFUSED = ("refused, nothing was changed; if it is a UIP log whose first append was torn, "
            "copy it aside and `truncate -s 16` it, else restore book.log from a backup")


_REFUSED_VERE = "refused, nothing was changed: restore book.log from a backup"


def identify_fd(fd: int, path: str, vere_context: bool) -> str:
    """:func:`detect_layout` on an open descriptor (also the UIP engine's own check on
    open, so no path reaches a layout by another road)."""
    size = os.fstat(fd).st_size
    for off in VERE_SLOT_OFFSETS:
        raw = os.pread(fd, VERE_SLOT_SIZE, off)
        if slot_crc_ok(raw) and struct.unpack_from("<I", raw)[0] == MAGIC:
            return "vere"
    context = " (epoc.txt 3 beside it says vere's layout)" if vere_context else ""
    head = os.pread(fd, 16, 0)
    if len(head) < 16:
        raise TooShort(f"{path}: {size} bytes, under the 16-byte header of either Book "
                       f"layout{context}; refused, nothing was changed: restore book.log "
                       "from a backup")
    magic, version, _ = HEADER.unpack(head)
    if magic != MAGIC:
        raise BadMagic(f"{path}: magic {magic:#010x}, expected {MAGIC:#010x} (BOOK); not "
                       "a Book log in either layout")
    if version != VERSION:
        raise BadVersion(f"{path}: version {version}, expected {VERSION}")
    if size == 16 and not vere_context:
        return "uip"  # an empty UIP log (see detect_layout)
    (n,) = DEED_LEN.unpack(os.pread(fd, 8, 16).ljust(8, b"\0"))
    if 4 <= n <= MAX_PAYLOAD and UIP.sound(fd, 16, n):
        return "uip"
    if size <= VERE_SLOT_SIZE and vere_context:
        raise TooShort(f"{path}: {size} bytes, but epoc.txt 3 beside it says vere's layout, "
                       f"whose header slot alone is {VERE_SLOT_SIZE} bytes (the file was cut "
                       f"and holds no whole slot); {_REFUSED_VERE}")
    if size <= VERE_SLOT_SIZE:
        raise TooShort(f"{path}: {size} bytes with Book's header: too short to tell a UIP "
                       "log with a torn first deed from vere's layout cut inside its "
                       f"{VERE_SLOT_SIZE}-byte header slot; {_REFUSED}")
    pad = os.pread(fd, min(size, VERE_SLOT_OFFSETS[1]) - VERE_SLOT_SIZE, VERE_SLOT_SIZE)
    if vere_context or not any(pad):
        raise FormatError(f"{path}: looks like vere's two-slot layout with both "
                          f"header slots damaged (no slot CRC holds){context}; refusing to "
                          "guess the committed state, nothing was changed: restore "
                          "book.log from a backup")
    return "uip"


def is_lmdb_file(path: str | os.PathLike) -> bool:
    """True when the file at ``path`` begins as an LMDB environment does: LMDB's magic
    (``0xBEEFC0DE``) at byte 16 of its first meta page, or of its second one page further
    on (a torn first page).  False for a missing, empty or non-regular file (never blocks
    on a FIFO)."""
    try:
        fd = open_regular(os.fspath(path), os.O_RDONLY, follow=True)
    except (OSError, BookError):
        return False
    try:
        for page in (0, *LMDB_PAGE_SIZES):
            raw = os.pread(fd, 4, page + LMDB_MAGIC_OFFSET)
            if len(raw) == 4 and struct.unpack("<I", raw)[0] == LMDB_MAGIC:
                return True
        return False
    finally:
        os.close(fd)


def book_log_holds_events(path: str | os.PathLike) -> bool:
    """False only when the bytes of the ``book.log`` at ``path`` show it holds no event:
    an empty file (vere's ``ml/book`` creates it before writing its header), one no longer
    than the 16-byte header, or a log in vere's layout no longer than its 8192 bytes of
    header slots (what ``u3_book_init`` leaves in a new epoch).  True otherwise, including
    a file whose layout :func:`detect_layout` refuses (the Book engines then say why) and
    one that cannot be opened."""
    p = os.fspath(path)
    try:
        fd = open_regular(p, os.O_RDONLY, follow=True)
    except (OSError, BookError):
        return True
    try:
        size = os.fstat(fd).st_size
        if size <= HEADER_SIZE:
            return False
        try:
            layout = identify_fd(fd, p, epoch_says_vere(os.path.dirname(p) or "."))
        except BookError:
            return True
        return layout != "vere" or size > VERE_DEEDS_START
    finally:
        os.close(fd)


def looks_padded(fd: int, size: int) -> bool:
    """The January 2026 layout: deeds of len_d + 28 bytes (C structs with padding).

    The first padded deed must frame (``let_d == len_d`` at ``len_d + 28``) and end the
    file or be followed by a plausible second one.  One deed alone is not enough: a UIP
    log whose first deed is damaged and whose second has the same length frames the
    same way (the second deed's ``len_d`` sits where a padded ``let_d`` would)."""
    if size < HEADER_SIZE + PADDED_DEED_OVERHEAD + MIN_PAYLOAD:
        return False
    (n,) = DEED_LEN.unpack(os.pread(fd, 8, HEADER_SIZE))
    stop = HEADER_SIZE + n + PADDED_DEED_OVERHEAD
    if not (MIN_PAYLOAD <= n <= MAX_PAYLOAD) or stop > size:
        return False
    (let,) = DEED_LEN.unpack(os.pread(fd, 8, stop - 8))
    if let != n:
        return False
    if stop + 8 > size:
        return stop == size
    (n2,) = DEED_LEN.unpack(os.pread(fd, 8, stop))
    if not (MIN_PAYLOAD <= n2 <= MAX_PAYLOAD):
        return False
    stop2 = stop + n2 + PADDED_DEED_OVERHEAD
    if stop2 > size:
        return True  # a torn second deed
    (let2,) = DEED_LEN.unpack(os.pread(fd, 8, stop2 - 8))
    return let2 == n2
