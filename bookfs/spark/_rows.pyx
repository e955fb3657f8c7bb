# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: cdivision=True
"""The per-event loop of :mod:`bookfs.spark.rows`, compiled (issue 22.3): the same rows
as its pure builder (``_Rows``, ``_deeds``, ``_pure_batches``,
``_pure_segment_batches``), which stays the reference and the fallback when this
extension did not build (``bookfs.spark.rows.ROWS`` says which is in use;
``tests/test_rows.py`` holds the two to the same batches and the same errors).

What is done here, in C, per event:

* **deeds**: a segment's deeds are walked in its buffer, each deed's length checked and
  its CRC computed by ``bookfs.formats.layout.crc32`` (ISA-L's, called on one reused
  buffer object pointed at each deed: no copy, no new object); a bad deed is the ValueError ``_deeds`` raises, word for word, after
  the batches before it;
* **columns**: ``event``, ``size``, ``mug``, ``committed_at`` and ``date`` are written
  into contiguous buffers, ``jam`` and the strings into one offsets and one data buffer
  each, all handed to Arrow without a copy (``pa.foreign_buffer``): no Python object per
  row for them;
* **decoding**: a payload whose jam (after the 4-byte mug) is at most
  ``decoding.CUE_BYTES`` and not ram is validated by the scanner
  (``bookfs.noun.scan_ok``, exact: one Python call, no result object, the scanner's
  arrays reused), then its date, wire and tag are read from the jam's bits
  (:func:`jam_head`), never building the noun, by exactly
  :func:`bookfs.noun.event_head`'s rules over the cued noun; the @da becomes
  microseconds in C.  Every other payload (shorter than its mug, ram, a larger jam, one
  the scanner refuses) goes to ``decoding.decode_payload`` / ``decoding.decode_body``,
  the pure path's own functions, so its columns and its ``error`` are theirs.

Why the scan stays: the compiled ``cue`` gives the scanner's verdict when it fails (the
same reason at the same bit) but accepts what follows the noun (it is ``++cue``, lax by
design) and says nothing of where the noun ended, while a payload whose jam has bytes or
bits after its noun is not an event's (``error`` says ``trailing``).  ``cue`` is not
called at all: :func:`jam_head` reads the head from the validated bits.
"""

cimport cython
from cpython.buffer cimport (PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release,
                             PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport INT32_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy, memset

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)

cdef extern from *:
    """
    /* bookfs.noun.aura.DA_UNIX_EPOCH, and peek's years 1..9999 as an @da's seconds half */
    #define BOOKFS_DA_UNIX_EPOCH 0x8000000CCE9E0D80ULL
    #define BOOKFS_SECONDS_LO (BOOKFS_DA_UNIX_EPOCH - 62135596800ULL)
    #define BOOKFS_SECONDS_HI (BOOKFS_DA_UNIX_EPOCH + 253402300799ULL)
    static inline uint64_t bookfs_mulhi_1e6(uint64_t lo) {
        return (uint64_t)(((unsigned __int128)lo * 1000000u) >> 64);
    }
    """
    uint64_t bookfs_mulhi_1e6(uint64_t lo) noexcept nogil
    const uint64_t DA_UNIX_EPOCH "BOOKFS_DA_UNIX_EPOCH"
    const uint64_t SECONDS_LO "BOOKFS_SECONDS_LO"
    const uint64_t SECONDS_HI "BOOKFS_SECONDS_HI"
    int __builtin_ctzll(unsigned long long) noexcept nogil
    int __builtin_clzll(unsigned long long) noexcept nogil

from bookfs.formats.layout import crc32 as _crc32
from bookfs.spark import decoding as _decoding

cdef object _pa = None      # pyarrow, imported by the first batch (workers only)
cdef object _I64 = (1 << 63) - 1

cdef enum:
    MUG = 4                 # bookfs.noun.payload.MUG_BYTES
    DEED_OVERHEAD = 20      # bookfs.formats.layout.DEED_OVERHEAD: len_d 8, crc 4, let_d 8
    HEAD_ATOM_BITS = 65536  # bookfs.noun.peek._PEEK_MAX_ATOM_BITS

cdef const char* RAM_HEADER = b"RAM\x00\x01"   # bookfs.noun.ram.RAM_HEADER


# --------------------------------------------------------------------------- buffers

cdef struct Buf:
    uint8_t* p
    size_t n
    size_t cap


cdef int buf_reserve(Buf* b, size_t extra) except -1:
    cdef size_t need = b.n + extra, cap
    cdef uint8_t* q
    if need <= b.cap and b.p != NULL:
        return 0
    cap = b.cap * 2 if b.cap * 2 >= need else need
    if cap < 256:
        cap = 256
    q = <uint8_t*>realloc(b.p, cap)
    if q == NULL:
        raise MemoryError()
    b.p = q
    b.cap = cap
    return 0


cdef inline int buf_put(Buf* b, const void* src, size_t n) except -1:
    if b.n + n > b.cap or b.p == NULL:
        buf_reserve(b, n)
    if n:
        memcpy(b.p + b.n, src, n)
        b.n += n
    return 0


cdef inline int buf_i64(Buf* b, int64_t v) except -1:
    return buf_put(b, &v, 8)


cdef inline int buf_i32(Buf* b, int32_t v) except -1:
    return buf_put(b, &v, 4)


@cython.final
cdef class _Owner:
    """Memory of a :c:type:`Buf` handed to Arrow (``pa.foreign_buffer``'s base): freed
    when Arrow lets go of the buffer."""
    cdef void* p

    def __dealloc__(self):
        free(self.p)


cdef object buf_arrow(Buf* b):
    """``b``'s bytes as a pyarrow Buffer, without a copy; ``b`` is left empty."""
    cdef _Owner owner
    buf_reserve(b, 0)  # a buffer even when empty
    owner = _Owner.__new__(_Owner)
    owner.p = b.p
    out = _pa.foreign_buffer(<size_t>b.p, b.n, owner)
    b.p = NULL
    b.n = b.cap = 0
    return out


@cython.final
cdef class _View:
    """A read-only buffer over bytes someone else holds, pointed anew before each call
    that reads it (``crc32``, ``scan_ok``): one object for every deed, not a memoryview
    each.  The callee must not keep it (neither does), and the bytes must outlive the
    call."""
    cdef const uint8_t* p
    cdef Py_ssize_t n

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.p, self.n, 1, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass


@cython.final
cdef class _Held:
    """The bytes of any object with a buffer (bytes, a memoryview of any item format, a
    pyarrow buffer's), held until this is dropped: a segment across the batches yielded
    from it."""
    cdef Py_buffer view
    cdef bint held

    def __cinit__(self, data):
        PyObject_GetBuffer(data, &self.view, PyBUF_SIMPLE)
        self.held = True

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline _View point(_View v, const uint8_t* p, Py_ssize_t n):
    v.p = p
    v.n = n
    return v


cdef void buf_free(Buf* b) noexcept:
    free(b.p)
    b.p = NULL
    b.n = b.cap = 0


cdef inline uint64_t le64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(7, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline uint32_t le32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0]) | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (
        <uint32_t>p[3] << 24)


# --------------------------------------------------------------------------- columns

cdef struct Col:
    Buf data        # fixed-width values, or the bytes of variable-width ones
    Buf offsets     # variable-width: int64 offsets, n + 1 of them (int32 in the batch)
    Buf valid       # the validity bitmap
    int64_t nulls


cdef inline int col_valid(Col* c, int64_t i, bint ok) except -1:
    cdef uint8_t zero = 0
    if not (i & 7):
        buf_put(&c.valid, &zero, 1)
    if ok:
        c.valid.p[i >> 3] |= <uint8_t>(1 << (i & 7))
    else:
        c.nulls += 1
    return 0


cdef inline int col_i64(Col* c, int64_t i, int64_t v, bint ok) except -1:
    buf_i64(&c.data, v if ok else 0)
    return col_valid(c, i, ok)


cdef inline int col_var(Col* c, int64_t i, const void* p, size_t n, bint ok) except -1:
    if c.offsets.n == 0:
        buf_i64(&c.offsets, 0)
    if ok:
        buf_put(&c.data, p, n)
    buf_i64(&c.offsets, <int64_t>c.data.n)
    return col_valid(c, i, ok)


cdef int col_text(Col* c, int64_t i, object text) except -1:
    """A str (or None: null) into a string column."""
    cdef Py_ssize_t size
    cdef const char* s
    if text is None:
        return col_var(c, i, NULL, 0, False)
    s = PyUnicode_AsUTF8AndSize(text, &size)
    return col_var(c, i, s, size, True)


cdef int buf_text(Buf* b, object text) except -1:
    """``b`` holds the UTF-8 of the str ``text`` (nothing for None)."""
    cdef Py_ssize_t size
    cdef const char* s
    b.n = 0
    if text is None:
        return 0
    s = PyUnicode_AsUTF8AndSize(text, &size)
    return buf_put(b, s, size)


cdef void col_free(Col* c) noexcept:
    buf_free(&c.data)
    buf_free(&c.offsets)
    buf_free(&c.valid)
    c.nulls = 0


cdef object col_validity(Col* c):
    if c.nulls:
        return buf_arrow(&c.valid)
    buf_free(&c.valid)
    return None


cdef object col_fixed(Col* c, int64_t n, object kind):
    validity = col_validity(c)
    return _pa.Array.from_buffers(kind, n, [validity, buf_arrow(&c.data)], null_count=c.nulls)


cdef object col_variable(Col* c, int64_t n, object kind, bint text):
    """A binary or string array of ``c``; past 2 GiB of data (more than int32 offsets
    hold) it is made the pure builder's way, ``pa.array`` of the values, with whatever
    that gives."""
    cdef int64_t* wide
    cdef int32_t* narrow
    cdef int64_t k, a, b
    if c.offsets.n == 0:
        buf_i64(&c.offsets, 0)
    wide = <int64_t*>c.offsets.p
    if c.data.n > <size_t>INT32_MAX:
        values = []
        for k in range(n):
            if c.valid.p[k >> 3] >> (k & 7) & 1:
                a, b = wide[k], wide[k + 1]
                raw = PyBytes_FromStringAndSize(<char*>c.data.p + a, b - a)
                values.append(raw.decode("utf-8") if text else raw)
            else:
                values.append(None)
        return _pa.array(values, kind)
    narrow = <int32_t*>c.offsets.p  # in place: item k moves from byte 8k down to 4k
    for k in range(n + 1):
        narrow[k] = <int32_t>wide[k]
    c.offsets.n = <size_t>(n + 1) * 4
    validity = col_validity(c)
    return _pa.Array.from_buffers(kind, n, [validity, buf_arrow(&c.offsets),
                                            buf_arrow(&c.data)], null_count=c.nulls)


# --------------------------------------------------------------------------- the head

cdef inline uint64_t load64(const uint8_t* p, uint64_t nbytes, uint64_t byte) noexcept nogil:
    """8 bytes from ``byte``, little-endian, zeros past the end."""
    cdef uint64_t v = 0
    cdef int i
    if byte + 8 <= nbytes:
        return le64(p + byte)
    for i in range(7, -1, -1):
        v <<= 8
        if byte + i < nbytes:
            v |= p[byte + i]
    return v


cdef inline uint64_t bits(const uint8_t* p, uint64_t nbytes, uint64_t pos,
                          uint64_t width) noexcept nogil:
    """``width`` (at most 64) bits from bit ``pos``, zeros past the end."""
    cdef uint64_t byte = pos >> 3, sh = pos & 7
    cdef uint64_t v = load64(p, nbytes, byte)
    if sh:
        v = (v >> sh) | (load64(p, nbytes, byte + 8) << (64 - sh))
    if width < 64:
        v &= ((<uint64_t>1) << width) - 1
    return v


cdef enum:
    ATOM = 0
    CELL = 1
    REF = 2


cdef struct Node:
    int kind
    uint64_t start      # an atom's or a reference's value: its first bit; a cell: its head
    uint64_t b          # the value's width in bits (a mat may carry leading zeros)
    uint64_t end        # the bit after this node's own encoding (not a cell's)


cdef int read_node(const uint8_t* p, uint64_t nbytes, uint64_t pos, Node* n) noexcept nogil:
    """The node whose tag is at bit ``pos``: 0, or -1 where the bits are not a node (the
    scanner has accepted the jam, so this is a guard, never the verdict)."""
    cdef uint64_t total = nbytes * 8, q, w, c
    if pos >= total:
        return -1
    w = bits(p, nbytes, pos, 2)
    if not (w & 1):
        n.kind = ATOM
        q = pos + 1
    elif not (w & 2):
        n.kind = CELL
        n.start = pos + 2
        n.b = 0
        n.end = 0
        return 0
    else:
        n.kind = REF
        q = pos + 2
    if q >= total:
        return -1
    w = bits(p, nbytes, q, 64)
    if w & 1:
        n.b = 0
        n.start = q + 1
    else:
        if w == 0:
            return -1  # a length of 2^63 bits or more: not in a jam the scanner accepted
        c = __builtin_ctzll(w)
        n.b = ((<uint64_t>1) << (c - 1)) | bits(p, nbytes, q + c + 1, c - 1)
        n.start = q + 2 * c
    n.end = n.start + n.b
    if n.end > total or n.end < n.start:
        return -1
    return 0


cdef int resolve(const uint8_t* p, uint64_t nbytes, Node* n) noexcept nogil:
    """Follow ``n`` if it is a back-reference: the atom or cell it names (-1: none)."""
    cdef uint64_t target, k
    if n.kind != REF:
        return 0
    k = n.start + 64
    while k < n.end:  # a reference wider than 64 bits: only zeros above them
        if bits(p, nbytes, k, 64 if n.end - k > 64 else n.end - k):
            return -1
        k += 64
    target = bits(p, nbytes, n.start, n.b if n.b < 64 else 64)
    if read_node(p, nbytes, target, n) < 0 or n.kind == REF or target >= n.start:
        return -1  # (a reference to another reference: the scanner refuses it)
    return 0


cdef int atom_at(const uint8_t* p, uint64_t nbytes, uint64_t pos, Node* n,
                 uint64_t* end) noexcept nogil:
    """The atom the node at ``pos`` is or names (a back-reference followed), in ``n``, and
    in ``end`` where the node at ``pos`` ends: 1; 0 when it is a cell; -1 for bits that
    are no node."""
    if read_node(p, nbytes, pos, n) < 0:
        return -1
    end[0] = n.end
    if n.kind == CELL:
        return 0
    if resolve(p, nbytes, n) < 0:
        return -1
    return 1 if n.kind == ATOM else 0


cdef uint64_t atom_width(const uint8_t* p, uint64_t nbytes, const Node* a) noexcept nogil:
    """The atom's value's bit length (its mat may have leading zeros)."""
    cdef uint64_t top = a.b, w, k
    while top:
        k = top - 64 if top > 64 else 0
        w = bits(p, nbytes, a.start + k, top - k)
        if w:
            return k + 64 - __builtin_clzll(w)
        top = k
    return 0


cdef int put_text(Buf* out, const uint8_t* p, uint64_t nbytes, const Node* a,
                  bint slash) except -1:
    """Append the text of the atom ``a`` (its little-endian bytes, no trailing zeros:
    ``uncord``), after a ``/`` when ``slash``: 1, or 0 when it is over 2^16 bits or not
    UTF-8 (:func:`bookfs.noun.event_head` gives no head then)."""
    cdef uint64_t width = atom_width(p, nbytes, a), size, k, w
    cdef size_t at
    cdef uint8_t* q
    cdef bint ascii = True
    if width > HEAD_ATOM_BITS:
        return 0
    size = (width + 7) >> 3
    buf_reserve(out, size + 9)
    if slash:
        out.p[out.n] = 47  # '/'
        out.n += 1
    at = out.n
    q = out.p + at
    k = 0
    while k < size:
        w = bits(p, nbytes, a.start + 8 * k, width - 8 * k if width - 8 * k < 64 else 64)
        memcpy(q + k, &w, 8)  # little-endian; the room was reserved above
        k += 8
    out.n = at + size
    for k in range(size):
        if q[k] & 0x80:
            ascii = False
            break
    if not ascii:
        try:
            PyUnicode_DecodeUTF8(<const char*>q, size, "strict")
        except UnicodeDecodeError:
            return 0
    return 1


cdef int jam_head_c(const uint8_t* p, uint64_t nbytes, Buf* wire, Buf* tag,
                    uint64_t* date_hi, uint64_t* date_lo) except -2:
    """The head of the jam ``p`` (``nbytes``), which the scanner accepted, read from its
    bits by the rules :func:`bookfs.noun.event_head` applies to the cued noun: 1 with the
    date's two 64-bit halves, the wire's text (``/a/b``) and the tag's in ``wire`` and
    ``tag``; 0 when the noun is not a ``[date [wire [tag data]]]`` event by those rules;
    -1 when the bits are not what the scanner accepted (never: the caller then asks the
    pure path)."""
    cdef Node n, k
    cdef uint64_t pos, width
    cdef int got
    cdef bint inline = True
    cdef uint64_t wire_end = 0, knots = 0
    wire.n = 0
    tag.n = 0
    if read_node(p, nbytes, 0, &n) < 0:
        return -1
    if n.kind != CELL:
        return 0
    # the date: an atom of at most 2^16 bits whose seconds fall in years 1..9999; the
    # ovum follows the date's own encoding
    got = atom_at(p, nbytes, 2, &n, &pos)
    if got <= 0:
        return got
    width = atom_width(p, nbytes, &n)
    if width > 128:  # seconds of 2^64 or more: past year 9999 (wider than 2^16 bits too)
        return 0
    date_lo[0] = bits(p, nbytes, n.start, width if width < 64 else 64)
    date_hi[0] = bits(p, nbytes, n.start + 64, width - 64) if width > 64 else 0
    if date_hi[0] < SECONDS_LO or date_hi[0] > SECONDS_HI:
        return 0
    # the ovum: a cell [wire card]
    if read_node(p, nbytes, pos, &n) < 0 or resolve(p, nbytes, &n) < 0:
        return -1
    if n.kind != CELL:
        return 0
    # the wire: a null-terminated list of texts; the card starts where its encoding ends
    if read_node(p, nbytes, n.start, &n) < 0:
        return -1
    buf_put(wire, b"/", 1)
    while True:
        if n.kind == REF:
            if inline:
                wire_end = n.end
                inline = False
            if resolve(p, nbytes, &n) < 0:
                return -1
        if n.kind == ATOM:
            if atom_width(p, nbytes, &n):
                return 0  # a wire must end in ~ (0)
            if inline:
                wire_end = n.end
            break
        # a cell: its head is a knot, and its tail follows the knot's own encoding
        got = atom_at(p, nbytes, n.start, &k, &pos)
        if got <= 0:
            return got
        if not put_text(wire, p, nbytes, &k, knots > 0):
            return 0
        knots += 1
        if read_node(p, nbytes, pos, &n) < 0:
            return -1
    # the card: a cell whose head, the tag, is a text
    if read_node(p, nbytes, wire_end, &n) < 0 or resolve(p, nbytes, &n) < 0:
        return -1
    if n.kind != CELL:
        return 0
    got = atom_at(p, nbytes, n.start, &k, &pos)
    if got <= 0:
        return got
    return put_text(tag, p, nbytes, &k, False)


cdef inline int64_t da_micros(uint64_t hi, uint64_t lo) noexcept nogil:
    """``decoding.da_micros`` of the @da ``hi·2^64 + lo`` (``hi`` in years 1..9999)."""
    return (<int64_t>(hi - DA_UNIX_EPOCH)) * 1000000 + <int64_t>bookfs_mulhi_1e6(lo)


cdef inline int64_t ms_floor(int64_t us) noexcept nogil:
    """``us - us % 1000`` with Python's floored ``%``."""
    cdef int64_t r = us % 1000
    if r < 0:
        r += 1000
    return us - r


def jam_head(data):
    """``(date, wire, tag)`` of the jam ``data`` (bytes-like) by
    :func:`bookfs.noun.event_head`'s rules, read from its bits; for a jam the scanner
    accepts (``bookfs.noun.scan(data).ok``), and then equal to
    ``event_head(cue(data), {})`` (tests/test_rows.py holds them equal).  ValueError when
    the bits are not a jam's."""
    cdef _Held held = _Held(data)
    cdef Buf wire, tag
    cdef uint64_t hi = 0, lo = 0
    cdef int got
    wire.p = tag.p = NULL
    wire.n = wire.cap = tag.n = tag.cap = 0
    try:
        if held.view.len == 0:
            raise ValueError("not a jam: no bits")
        got = jam_head_c(<const uint8_t*>held.view.buf, held.view.len, &wire, &tag, &hi, &lo)
        if got < 0:
            raise ValueError("not a jam the scanner accepts")
        if not got:
            return (None, None, None)
        return ((<object>hi << 64) | <object>lo,
                PyBytes_FromStringAndSize(<char*>wire.p, wire.n).decode("utf-8"),
                PyBytes_FromStringAndSize(<char*>tag.p, tag.n).decode("utf-8"))
    finally:
        buf_free(&wire)
        buf_free(&tag)


# --------------------------------------------------------------------------- rows

@cython.final
cdef class Rows:
    """``bookfs.spark.rows._Rows``, compiled: the columns of one batch (``want``, a set of
    column names, or None for all; ``stamp`` as ``_Rows`` takes it).  The decoding
    functions are looked up in :mod:`bookfs.spark.decoding` when the builder is made."""

    cdef readonly list columns
    cdef object stamp
    cdef bint want_mug, want_jam, want_committed, want_date, want_wire, want_card
    cdef bint want_error, decode, head
    cdef int64_t n, nbytes
    cdef uint64_t cue_bytes
    cdef object scan_ok, decode_body, decode_payload, micros
    cdef _View view
    cdef Col event, mug, size, jam, committed, date, wire, card, error
    cdef Buf wire_text, tag_text

    def __cinit__(self):
        memset(&self.event, 0, sizeof(Col))
        memset(&self.mug, 0, sizeof(Col))
        memset(&self.size, 0, sizeof(Col))
        memset(&self.jam, 0, sizeof(Col))
        memset(&self.committed, 0, sizeof(Col))
        memset(&self.date, 0, sizeof(Col))
        memset(&self.wire, 0, sizeof(Col))
        memset(&self.card, 0, sizeof(Col))
        memset(&self.error, 0, sizeof(Col))
        memset(&self.wire_text, 0, sizeof(Buf))
        memset(&self.tag_text, 0, sizeof(Buf))

    def __init__(self, want=None, stamp=None):
        cdef set names
        cols = _decoding.COLUMNS
        self.columns = list(cols) if want is None else [c for c in cols
                                                        if c in want or c == "event"]
        names = set(self.columns)
        self.stamp = stamp
        self.want_mug, self.want_jam = "mug" in names, "jam" in names
        self.want_committed = "committed_at" in names
        self.want_date, self.want_wire = "date" in names, "wire" in names
        self.want_card, self.want_error = "card" in names, "error" in names
        self.decode = (any(c in names for c in _decoding.DECODED)
                       or (stamp is not None and self.want_committed))
        # the head is read only for a column that shows it
        self.head = (self.want_date or self.want_wire or self.want_card
                     or (stamp is not None and self.want_committed))
        self.cue_bytes = _decoding.CUE_BYTES
        self.scan_ok = _decoding.scan_ok
        self.decode_body = _decoding.decode_body
        self.decode_payload = _decoding.decode_payload
        self.micros = _decoding.da_micros
        self.view = _View.__new__(_View)

    def __dealloc__(self):
        col_free(&self.event)
        col_free(&self.mug)
        col_free(&self.size)
        col_free(&self.jam)
        col_free(&self.committed)
        col_free(&self.date)
        col_free(&self.wire)
        col_free(&self.card)
        col_free(&self.error)
        buf_free(&self.wire_text)
        buf_free(&self.tag_text)

    def __len__(self):
        return self.n

    @property
    def bytes(self):
        """Payload bytes added (where a batch ends: ``decoding.BATCH_BYTES``)."""
        return self.nbytes

    def add(self, event, payload, committed_us=None):
        """One row: ``_Rows.add``."""
        cdef Py_buffer view
        if not (self.want_mug or self.want_jam or self.decode):
            # only the length is used (events/'s stand-in for an unread file has no bytes)
            return self.add_bytes(event, NULL, len(payload), committed_us)
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        try:
            return self.add_bytes(event, <const uint8_t*>view.buf, view.len, committed_us)
        finally:
            PyBuffer_Release(&view)

    cdef int add_bytes(self, int64_t event, const uint8_t* p, int64_t n,
                       object committed_us) except -1:
        cdef int64_t i = self.n
        col_i64(&self.event, i, event, True)
        col_i64(&self.size, i, n, True)
        self.nbytes += n
        if self.want_mug:
            buf_i32(&self.mug.data, <int32_t>le32(p) if n >= MUG else 0)
            col_valid(&self.mug, i, n >= MUG)
        if self.want_jam:
            if n >= MUG:
                col_var(&self.jam, i, p + MUG, n - MUG, True)
            else:
                col_var(&self.jam, i, p, n, True)
        if not self.decode:
            if self.want_committed:
                self.undated(i, event, committed_us)
        elif n < MUG:
            self.put_decoded(i, event, self.decode_payload(
                PyBytes_FromStringAndSize(<const char*>p, n)), committed_us)
        else:
            self.decode_jam(i, event, p + MUG, n - MUG, committed_us)
        self.n = i + 1
        return 0

    cdef int undated(self, int64_t i, int64_t event, object committed_us) except -1:
        """committed_at of a row without a date (``_Rows._undated``)."""
        if self.stamp is not None:
            committed_us = self.stamp(event)
        if committed_us is None:
            return col_i64(&self.committed, i, 0, False)
        return col_i64(&self.committed, i, committed_us, True)

    cdef int decode_jam(self, int64_t i, int64_t event, const uint8_t* body, uint64_t n,
                        object committed_us) except -1:
        cdef int got
        cdef uint64_t hi = 0, lo = 0
        cdef int64_t us
        if n > self.cue_bytes or (n >= 5 and memcmp(body, RAM_HEADER, 5) == 0):
            return self.pure(i, event, body, n, committed_us)  # a large jam, or ram
        if not self.scan_ok(point(self.view, body, n)):
            return self.pure(i, event, body, n, committed_us)  # not a noun: its error
        got = 0
        if self.head:
            got = jam_head_c(body, n, &self.wire_text, &self.tag_text, &hi, &lo)
            if got < 0:
                return self.pure(i, event, body, n, committed_us)
        if self.want_error:
            col_var(&self.error, i, NULL, 0, False)
        if not got:
            return self.no_head(i, event, committed_us)
        return self.head_read(i, event, da_micros(hi, lo), True, True, committed_us)

    cdef int head_read(self, int64_t i, int64_t event, int64_t us, bint wire, bint tag,
                       object committed_us) except -1:
        """The columns of a row whose head was read: its date, ``us`` microseconds, and
        the texts of its wire and tag in ``wire_text`` and ``tag_text`` (null where
        ``wire`` or ``tag`` is false)."""
        if self.want_committed:
            if self.stamp is not None:
                col_i64(&self.committed, i, ms_floor(us), True)
            else:
                self.undated(i, event, committed_us)
        if self.want_date:
            col_i64(&self.date, i, us, True)
        if self.want_wire:
            col_var(&self.wire, i, self.wire_text.p, self.wire_text.n, wire)
        if self.want_card:
            col_var(&self.card, i, self.tag_text.p, self.tag_text.n, tag)
        return 0

    cdef int no_head(self, int64_t i, int64_t event, object committed_us) except -1:
        if self.want_committed:
            self.undated(i, event, committed_us)
        if self.want_date:
            col_i64(&self.date, i, 0, False)
        if self.want_wire:
            col_var(&self.wire, i, NULL, 0, False)
        if self.want_card:
            col_var(&self.card, i, NULL, 0, False)
        return 0

    cdef int pure(self, int64_t i, int64_t event, const uint8_t* body, uint64_t n,
                  object committed_us) except -1:
        """The row's decoded columns by ``decoding.decode_body``."""
        return self.put_decoded(i, event, self.decode_body(
            PyBytes_FromStringAndSize(<const char*>body, n)), committed_us)

    cdef int put_decoded(self, int64_t i, int64_t event, object decoded,
                         object committed_us) except -1:
        """The decoded columns of a row from ``((da, wire, tag), error)``."""
        head, error = decoded
        da, wire, tag = head
        if self.want_error:
            col_text(&self.error, i, error)
        if da is None:
            return self.no_head(i, event, committed_us)
        buf_text(&self.wire_text, wire)
        buf_text(&self.tag_text, tag)
        return self.head_read(i, event, self.micros(da), wire is not None, tag is not None,
                              committed_us)

    def batch(self):
        """The rows as one Arrow RecordBatch (``_Rows.batch``); the builder is spent."""
        global _pa
        if _pa is None:
            import pyarrow
            _pa = pyarrow
        schema = _decoding.out_schema(self.columns)
        arrays = []
        for name in self.columns:
            kind = schema.field(name).type
            if name == "event":
                arrays.append(col_fixed(&self.event, self.n, kind))
            elif name == "epoch":
                arrays.append(_pa.nulls(self.n, kind))
            elif name == "mug":
                arrays.append(col_fixed(&self.mug, self.n, kind))
            elif name == "size":
                arrays.append(col_fixed(&self.size, self.n, kind))
            elif name == "jam":
                arrays.append(col_variable(&self.jam, self.n, kind, False))
            elif name == "committed_at":
                arrays.append(col_fixed(&self.committed, self.n, kind))
            elif name == "date":
                arrays.append(col_fixed(&self.date, self.n, kind))
            elif name == "wire":
                arrays.append(col_variable(&self.wire, self.n, kind, True))
            elif name == "card":
                arrays.append(col_variable(&self.card, self.n, kind, True))
            else:
                arrays.append(col_variable(&self.error, self.n, kind, True))
        return _pa.RecordBatch.from_arrays(arrays, schema=schema)


def batches(items, want=None, stamp=None, batch_rows=None, batch_bytes=None):
    """``bookfs.spark.rows._pure_batches``, compiled: Arrow batches of ``(event, payload,
    committed_us)`` items."""
    cdef Rows rows = Rows(want, stamp)
    cdef int64_t most_rows = _decoding.BATCH_ROWS if batch_rows is None else batch_rows
    cdef int64_t most_bytes = _decoding.BATCH_BYTES if batch_bytes is None else batch_bytes
    for event, payload, when in items:
        rows.add(event, payload, when)
        if rows.n >= most_rows or rows.nbytes >= most_bytes:
            yield rows.batch()
            rows = Rows(want, stamp)
    if rows.n:
        yield rows.batch()


def segment_batches(segments, since, until, stamp, want=None, batch_rows=None,
                    batch_bytes=None):
    """``bookfs.spark.rows._pure_segment_batches``, compiled: the deeds of each
    ``(first, bytes[, name])`` segment up to event ``until``, every one's length and CRC
    checked (``_deeds``' ValueError, after the batches before it), the rows of events
    ``since..until`` in Arrow batches."""
    cdef Rows rows = Rows(want, stamp)
    cdef int64_t most_rows = _decoding.BATCH_ROWS if batch_rows is None else batch_rows
    cdef int64_t most_bytes = _decoding.BATCH_BYTES if batch_bytes is None else batch_bytes
    cdef int64_t lo = max(since, -_I64), hi = min(until, _I64), event
    cdef _Held held
    cdef const uint8_t* p
    cdef uint64_t pos, end, size, stop
    cdef _View deed = _View.__new__(_View)
    for item in segments:
        first = item[0]
        seg = item[1]
        name = item[2] if len(item) > 2 else None
        name = first if name is None else name
        held = _Held(seg)
        end = held.view.len
        p = <const uint8_t*>held.view.buf
        pos = 0
        event = first
        while pos < end and event <= hi:
            # the messages are bookfs.formats.deeds.BadDeed's, as the pure walk gives them
            if end - pos < DEED_OVERHEAD:
                raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                                 "fails its framing check: a truncated deed")
            size = le64(p + pos)
            if size > end - pos - DEED_OVERHEAD:
                raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                                 f"fails its framing check: it claims {size} bytes, "
                                 "past the end")
            stop = pos + 8 + size
            if le64(p + stop + 4) != size:
                raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                                 f"fails its framing check: let_d is {le64(p + stop + 4)}, "
                                 f"not len_d {size}")
            if _crc32(point(deed, p + pos, 8 + size)) != le32(p + stop):
                raise ValueError(f"segments/{name:012d}: event {event} at byte {pos} "
                                 "fails its CRC check")
            if event >= lo:
                rows.add_bytes(event, p + pos + 8, size, None)
                if rows.n >= most_rows or rows.nbytes >= most_bytes:
                    yield rows.batch()
                    rows = Rows(want, stamp)
            pos = stop + 12
            event += 1
    if rows.n:
        yield rows.batch()
