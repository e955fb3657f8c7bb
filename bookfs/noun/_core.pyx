# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""The noun codec compiled (issue 21): jam, cue, mug and the validating scanner.

The same functions as the pure-Python reference, :mod:`bookfs.noun.codec` (``jam``,
``cue``, ``mug``) and :mod:`bookfs.noun.scanner` (``scan``, ``Scanner``), with the same
results, byte for byte, mug for mug and verdict for verdict (``tests/test_noun_core.py``
holds them equal); read those modules' docstrings for the definitions.  This module only
says how it does it.  It is over 600 lines because it is one extension module: the bit
reader, the node reader (a node's tag and length prefix, ``_read_node``, shared by ``cue``
and the scanner), murmur3 and the growable arrays inline into cue's and the scanner's
loops, which split across extension modules would become calls through Python's import
machinery.

* ``cue`` reads the bitstream with unaligned 64-bit loads, keeps every atom's and cell's
  start in a sorted array (back-references are found by binary search) and builds ints
  and 2-tuples directly: a wide atom's 30-bit digits are written straight from the
  bitstream on CPython 3.11-3.13 (elsewhere through ``_PyLong_FromByteArray``), and the
  tuples, which cannot be in a cycle, are not tracked by the garbage collector.
* ``scan`` / ``Scanner`` never build the noun.  Per node (atom, cell or back-reference) they
  keep its start position, delta-coded in blocks of 32 (about 1.5 bytes a node), one bit
  saying whether it may be referred to (an atom, or a cell once complete) and, with
  ``mug=True``, its mug (4 bytes).  Open cells are a stack of delta-coded node numbers (a
  byte or two each); the head of the cell numbered ``i`` is node ``i + 1``, so its mug is
  found there.  ``scan`` of 64 KiB or more, and ``Scanner.feed``, run without the GIL.
* Assumes a little-endian machine (elsewhere the import fails) and GCC/Clang builtins
  (elsewhere the build fails); either way bookfs uses the pure version
  (``bookfs.noun.CORE`` says which).
"""

import sys

cimport cython

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsUnsignedLongLong, PyLong_Check, PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove, memset

from bookfs.noun.aura import DA_UNIX_EPOCH
from bookfs.noun.codec import CueError, uncord
from bookfs.noun.peek import SECONDS_MAX, SECONDS_MIN, TEXTS_MAX
from bookfs.noun.scanner import ScanResult, _failure, _ok

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("the compiled noun core assumes a little-endian machine")

__all__ = ["jam", "cue", "mug", "scan", "scan_ok", "Scanner", "event_head"]

cdef extern from "Python.h":
    void _set_item "PyTuple_SET_ITEM" (object, Py_ssize_t, PyObject*)
    void PyObject_GC_UnTrack(void*)

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil
    int __builtin_clzll(unsigned long long) nogil


# --------------------------------------------------------------------------- bits

cdef extern from *:
    """
    /* An int from `b` bits at bit `pos` of p[0..nbytes) (bits past nbytes read 0). */
    static inline uint64_t bookfs_load64(const uint8_t *p, uint64_t nbytes, uint64_t byte) {
        uint64_t v = 0;
        if (byte + 8 <= nbytes) memcpy(&v, p + byte, 8);
        else if (byte < nbytes) memcpy(&v, p + byte, nbytes - byte);
        return v;
    }
    static inline uint64_t bookfs_bits(const uint8_t *p, uint64_t nbytes, uint64_t pos,
                                       uint64_t width) {
        uint64_t byte = pos >> 3, sh = pos & 7, v;
        if (width == 0) return 0;
        v = bookfs_load64(p, nbytes, byte) >> sh;
        if (sh + width > 64) v |= bookfs_load64(p, nbytes, byte + 8) << (64 - sh);
        if (width < 64) v &= (((uint64_t)1) << width) - 1;
        return v;
    }
    #if !defined(PYPY_VERSION) && PYLONG_BITS_IN_DIGIT == 30 && \
        PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
    #  if PY_VERSION_HEX >= 0x030C0000
    #    define BOOKFS_DIGITS(v) (((PyLongObject *)(v))->long_value.ob_digit)
    #  else
    #    define BOOKFS_DIGITS(v) (((PyLongObject *)(v))->ob_digit)
    #  endif
    #  define BOOKFS_FAST_LONG 1
    #else
    #  define BOOKFS_FAST_LONG 0
    #endif
    #if BOOKFS_FAST_LONG
    /* n4 groups of four 30-bit digits into d, from the bits of bp starting at bit s0 */
    static inline __attribute__((always_inline)) void bookfs_digits4(
            digit *d, const uint8_t *bp, uint64_t n4, const unsigned s0) {
        const unsigned o1 = (s0 + 30) >> 3, h1 = (s0 + 30) & 7;
        const unsigned o2 = (s0 + 60) >> 3, h2 = (s0 + 60) & 7;
        const unsigned o3 = (s0 + 90) >> 3, h3 = (s0 + 90) & 7;
        uint64_t w, g;
        for (g = 0; g < n4; g++, bp += 15, d += 4) {
            memcpy(&w, bp, 8);      d[0] = (digit)((w >> s0) & 0x3FFFFFFF);
            memcpy(&w, bp + o1, 8); d[1] = (digit)((w >> h1) & 0x3FFFFFFF);
            memcpy(&w, bp + o2, 8); d[2] = (digit)((w >> h2) & 0x3FFFFFFF);
            memcpy(&w, bp + o3, 8); d[3] = (digit)((w >> h3) & 0x3FFFFFFF);
        }
    }
    #if defined(__x86_64__) && defined(__GNUC__)
    #include <immintrin.h>
    #define BOOKFS_AVX2 1
    /* bookfs_digits4 with AVX2: each group of 15 bytes is loaded once (16 bytes: the
       bound check above leaves room), copied to both 128-bit lanes, and one byte shuffle,
       one variable shift and one mask give its four digits in 64-bit elements, packed to
       32 bits and stored together. */
    __attribute__((target("avx2"))) static void bookfs_digits4_avx2(
            digit *d, const uint8_t *bp, uint64_t n4, const unsigned s0) {
        int8_t shuf[32];
        int64_t sh[4];
        unsigned k, j;
        uint64_t g;
        for (k = 0; k < 4; k++) {
            unsigned bit = s0 + 30 * k, o = bit >> 3;
            sh[k] = bit & 7;
            for (j = 0; j < 8; j++)
                shuf[8 * k + j] = (int8_t)(o + j < 16 ? o + j : 0x80);
        }
        const __m256i ctl = _mm256_loadu_si256((const __m256i *)shuf);
        const __m256i shifts = _mm256_loadu_si256((const __m256i *)sh);
        const __m256i mask = _mm256_set1_epi64x(0x3FFFFFFF);
        const __m256i pack = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        for (g = 0; g < n4; g++, bp += 15, d += 4) {
            __m256i y = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bp));
            y = _mm256_and_si256(_mm256_srlv_epi64(_mm256_shuffle_epi8(y, ctl), shifts), mask);
            _mm_storeu_si128((__m128i *)d,
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(y, pack)));
        }
    }
    static int bookfs_has_avx2 = -1;
    #else
    #define BOOKFS_AVX2 0
    #endif
    #endif
    static PyObject *bookfs_long_from_bits(const uint8_t *p, uint64_t nbytes, uint64_t pos,
                                           uint64_t b) {
        uint64_t len = b, n, v, i;
    #if BOOKFS_FAST_LONG && defined(__SIZEOF_INT128__)
        if (b <= 128) {  /* two words at most, as most wide atoms are (@da dates) */
            uint64_t lo = bookfs_bits(p, nbytes, pos, b < 64 ? b : 64);
            uint64_t hi = b > 64 ? bookfs_bits(p, nbytes, pos + 64, b - 64) : 0;
            unsigned __int128 x;
            Py_ssize_t nd, k;
            PyLongObject *r;
            if (hi == 0) return PyLong_FromUnsignedLongLong(lo);
            nd = (Py_ssize_t)((128 - __builtin_clzll(hi) + 29) / 30);
            r = _PyLong_New(nd);
            if (r == NULL) return NULL;
            x = ((unsigned __int128)hi << 64) | lo;
            for (k = 0; k < nd; k++, x >>= 30)
                BOOKFS_DIGITS(r)[k] = (digit)((uint64_t)x & 0x3FFFFFFF);
            return (PyObject *)r;
        }
    #endif
        while (len > 0) {  /* the atom's true width: a mat may carry leading zeros */
            n = len > 64 ? 64 : len;
            v = bookfs_bits(p, nbytes, pos + len - n, n);
            if (v) { len = len - n + (64 - __builtin_clzll(v)); break; }
            len -= n;
        }
        if (len <= 64)
            return PyLong_FromUnsignedLongLong(bookfs_bits(p, nbytes, pos, len));
    #if BOOKFS_FAST_LONG
        {
            Py_ssize_t nd = (Py_ssize_t)((len + 29) / 30);
            PyLongObject *r = _PyLong_New(nd);
            digit *d;
            if (r == NULL) return NULL;
            uint64_t q = pos, w, s0 = pos & 7;
            const uint8_t *bp = p + (pos >> 3);
            uint64_t off0 = (uint64_t)(bp - p), n4;
            d = BOOKFS_DIGITS(r);
            /* four digits are 120 bits, 15 bytes: the same four shifts over and over, by
               amounts fixed by s0, so one copy of the loop per s0 (constant shifts) */
            n4 = (uint64_t)(nd - 1) / 4;
            if (nbytes < off0 + 24) n4 = 0;
            else if ((nbytes - off0 - 24) / 15 + 1 < n4) n4 = (nbytes - off0 - 24) / 15 + 1;
    #if BOOKFS_AVX2
            if (bookfs_has_avx2 < 0) bookfs_has_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
            if (n4 >= 8 && bookfs_has_avx2) bookfs_digits4_avx2(d, bp, n4, (unsigned)s0); else
    #endif
            switch (s0) {
            case 0: bookfs_digits4(d, bp, n4, 0); break;
            case 1: bookfs_digits4(d, bp, n4, 1); break;
            case 2: bookfs_digits4(d, bp, n4, 2); break;
            case 3: bookfs_digits4(d, bp, n4, 3); break;
            case 4: bookfs_digits4(d, bp, n4, 4); break;
            case 5: bookfs_digits4(d, bp, n4, 5); break;
            case 6: bookfs_digits4(d, bp, n4, 6); break;
            default: bookfs_digits4(d, bp, n4, 7); break;
            }
            i = 4 * n4;
            q = pos + 30 * i;
            for (; i + 1 < (uint64_t)nd && (q >> 3) + 8 <= nbytes; i++, q += 30) {
                memcpy(&w, p + (q >> 3), 8);  /* 30 + 7 bits fit in one load */
                d[i] = (digit)((w >> (q & 7)) & 0x3FFFFFFF);
            }
            for (; i + 1 < (uint64_t)nd; i++)
                d[i] = (digit)bookfs_bits(p, nbytes, pos + 30 * i, 30);
            d[nd - 1] = (digit)bookfs_bits(p, nbytes, pos + 30 * (nd - 1), len - 30 * (nd - 1));
            return (PyObject *)r;
        }
    #else
        {
            uint64_t nb = (len + 7) >> 3, w;
            PyObject *r;
            uint8_t *tmp = (uint8_t *)PyMem_Malloc(nb + 8);
            if (tmp == NULL) return PyErr_NoMemory();
            for (i = 0; i < nb; i += 8) {
                w = bookfs_bits(p, nbytes, pos + 8 * i, len - 8 * i > 64 ? 64 : len - 8 * i);
                memcpy(tmp + i, &w, 8);
            }
            r = _PyLong_FromByteArray(tmp, (size_t)nb, 1, 0);
            PyMem_Free(tmp);
            return r;
        }
    #endif
    }
    """
    object bookfs_long_from_bits(const uint8_t* p, uint64_t nbytes, uint64_t pos, uint64_t b)
    int BOOKFS_FAST_LONG


cdef inline uint64_t _load64(const uint8_t* p, uint64_t nbytes, uint64_t byte) noexcept nogil:
    """8 bytes from ``p[byte]``, little-endian, zeros past ``nbytes``."""
    cdef uint64_t v = 0
    if byte + 8 <= nbytes:
        memcpy(&v, p + byte, 8)
    elif byte < nbytes:
        memcpy(&v, p + byte, nbytes - byte)
    return v


cdef inline uint64_t _bits(const uint8_t* p, uint64_t nbytes, uint64_t pos,
                           uint64_t width) noexcept nogil:
    """``width`` (<= 64) bits from bit ``pos`` of ``p``; bits past ``nbytes`` read 0."""
    cdef uint64_t byte, sh, v
    if width == 0:
        return 0
    byte = pos >> 3
    sh = pos & 7
    v = _load64(p, nbytes, byte) >> sh
    if sh + width > 64:
        v |= _load64(p, nbytes, byte + 8) << (64 - sh)
    if width < 64:
        v &= ((<uint64_t>1) << width) - 1
    return v


cdef inline int _bitlen(uint64_t v) noexcept nogil:
    return 0 if v == 0 else 64 - __builtin_clzll(v)


# --------------------------------------------------------------------------- murmur3 / mug

cdef inline uint32_t _rotl(uint32_t x, int r) noexcept nogil:
    return (x << r) | (x >> (32 - r))


cdef inline uint32_t _mix(uint32_t h, uint32_t k) noexcept nogil:
    k *= 0xCC9E2D51u
    k = _rotl(k, 15)
    k *= 0x1B873593u
    h ^= k
    h = _rotl(h, 13)
    return h * 5u + 0xE6546B64u


cdef inline uint32_t _fmix(uint32_t h, uint64_t n) noexcept nogil:
    h ^= <uint32_t>n
    h ^= h >> 16
    h *= 0x85EBCA6Bu
    h ^= h >> 13
    h *= 0xC2B2AE35u
    h ^= h >> 16
    return h


cdef uint32_t _murmur_bytes(const uint8_t* data, uint64_t n, uint32_t seed) noexcept nogil:
    """MurmurHash3_x86_32."""
    cdef uint32_t h = seed, k
    cdef uint64_t i, blocks = n >> 2, rem = n & 3
    for i in range(blocks):
        memcpy(&k, data + 4 * i, 4)
        h = _mix(h, k)
    if rem:
        k = 0
        memcpy(&k, data + 4 * blocks, rem)
        k *= 0xCC9E2D51u
        k = _rotl(k, 15)
        k *= 0x1B873593u
        h ^= k
    return _fmix(h, n)


def murmur3_buffer(const uint8_t[::1] data, uint32_t seed):
    """MurmurHash3_x86_32 of any buffer (bytes, a read-only ``mmap``...) with ``seed``,
    without copying it; the GIL is released while it hashes."""
    cdef uint64_t n = data.shape[0]
    cdef uint32_t h
    if n == 0:
        return _fmix(seed, 0)
    with nogil:
        h = _murmur_bytes(&data[0], n, seed)
    return h


cdef uint32_t _murmur_bits(const uint8_t* p, uint64_t nbytes, uint64_t pos, uint64_t length,
                           uint32_t seed) noexcept nogil:
    """Murmur3 of the atom whose ``length`` significant bits start at bit ``pos``."""
    cdef uint64_t n = (length + 7) >> 3, blocks = n >> 2, i, left
    cdef uint32_t h = seed, k
    for i in range(blocks):
        left = length - 32 * i
        k = <uint32_t>_bits(p, nbytes, pos + 32 * i, 32 if left > 32 else left)
        h = _mix(h, k)
    if n & 3:
        k = <uint32_t>_bits(p, nbytes, pos + 32 * blocks, length - 32 * blocks)
        k *= 0xCC9E2D51u
        k = _rotl(k, 15)
        k *= 0x1B873593u
        h ^= k
    return _fmix(h, n)


cdef inline uint32_t _ham(uint32_t h) noexcept nogil:
    return (h >> 31) ^ (h & 0x7FFFFFFFu)


cdef uint32_t _atom_mug_bits(const uint8_t* p, uint64_t nbytes, uint64_t pos,
                             uint64_t width) noexcept nogil:
    """Mug of the atom in ``width`` bits at ``pos`` (leading zeros allowed)."""
    cdef uint64_t length = width, n, v
    cdef uint32_t seed, ham
    while length > 0:
        n = 64 if length > 64 else length
        v = _bits(p, nbytes, pos + length - n, n)
        if v:
            length = length - n + _bitlen(v)
            break
        length -= n
    for seed in range(0xCAFEBABEu, 0xCAFEBABEu + 8):
        ham = _ham(_murmur_bits(p, nbytes, pos, length, seed))
        if ham:
            return ham
    return 0x7FFF


cdef uint32_t _small_atom_mug(uint64_t v) noexcept nogil:
    cdef uint8_t buf[8]
    cdef uint32_t seed, ham
    cdef int n = (_bitlen(v) + 7) >> 3
    memcpy(buf, &v, 8)
    for seed in range(0xCAFEBABEu, 0xCAFEBABEu + 8):
        ham = _ham(_murmur_bytes(buf, n, seed))
        if ham:
            return ham
    return 0x7FFF


cdef uint32_t _cell_mug(uint32_t head, uint32_t tail) noexcept nogil:
    """Mug of a cell: murmur3 of ``head`` (4 bytes LE) then ``tail`` (minimal LE)."""
    cdef uint8_t buf[8]
    cdef uint32_t seed, ham
    cdef int n = 4 + ((_bitlen(tail) + 7) >> 3)
    memcpy(buf, &head, 4)
    memcpy(buf + 4, &tail, 4)
    for seed in range(0xDEADBEEFu, 0xDEADBEEFu + 8):
        ham = _ham(_murmur_bytes(buf, n, seed))
        if ham:
            return ham
    return 0xFFFE


cdef object _LIMIT64 = 1 << 64


cdef uint32_t _atom_mug(object atom) except? 0:
    cdef bytes data
    if atom < _LIMIT64:
        return _small_atom_mug(PyLong_AsUnsignedLongLong(atom))
    data = atom.to_bytes((atom.bit_length() + 7) >> 3, "little")
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef uint64_t n = len(data)
    cdef uint32_t seed, ham
    for seed in range(0xCAFEBABEu, 0xCAFEBABEu + 8):
        ham = _ham(_murmur_bytes(p, n, seed))
        if ham:
            return ham
    return 0x7FFF


cdef inline int _check_atom(object noun) except -1:
    if not PyLong_Check(noun):
        raise TypeError(f"not a noun: {type(noun).__name__}")
    if noun < 0:
        raise ValueError(f"atoms must be non-negative, got {noun}")
    return 0


def mug(noun):
    """The 31-bit hash of a noun (Hoon ``++mug``); see :func:`bookfs.noun.codec.mug`."""
    cdef dict memo
    cdef list stack
    cdef object node, head, tail, child
    cdef bint children_done
    cdef uint32_t hm, tm
    if not isinstance(noun, tuple):
        _check_atom(noun)
        return _atom_mug(noun)
    memo = {}
    stack = [(noun, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in memo:
            continue
        head, tail = node
        if not children_done:
            stack.append((node, True))
            for child in (tail, head):
                if isinstance(child, tuple) and id(child) not in memo:
                    stack.append((child, False))
            continue
        if isinstance(head, tuple):
            hm = memo[id(head)]
        else:
            _check_atom(head)
            hm = _atom_mug(head)
        if isinstance(tail, tuple):
            tm = memo[id(tail)]
        else:
            _check_atom(tail)
            tm = _atom_mug(tail)
        memo[id(node)] = _cell_mug(hm, tm)
    return memo[id(noun)]


# --------------------------------------------------------------------------- jam

cdef struct _Out:
    uint8_t* buf
    uint64_t cap      # bytes, all zero past the bits written
    uint64_t nbits


cdef int _out_reserve(_Out* w, uint64_t extra_bits) except -1:
    cdef uint64_t need = ((w.nbits + extra_bits + 7) >> 3) + 16, cap
    cdef uint8_t* nb
    if need <= w.cap:
        return 0
    cap = w.cap * 2 if w.cap * 2 > need else need
    nb = <uint8_t*>PyMem_Realloc(w.buf, cap)
    if nb == NULL:
        raise MemoryError()
    memset(nb + w.cap, 0, cap - w.cap)
    w.buf, w.cap = nb, cap
    return 0


cdef inline int _put(_Out* w, uint64_t v, uint64_t width) except -1:
    """Append the low ``width`` (<= 64) bits of ``v``."""
    cdef uint64_t byte, sh, cur
    if width == 0:
        return 0
    if width < 64:
        v &= ((<uint64_t>1) << width) - 1
    _out_reserve(w, width)
    byte = w.nbits >> 3
    sh = w.nbits & 7
    memcpy(&cur, w.buf + byte, 8)
    cur |= v << sh
    memcpy(w.buf + byte, &cur, 8)
    if sh and width + sh > 64:
        w.buf[byte + 8] |= <uint8_t>(v >> (64 - sh))
    w.nbits += width
    return 0


cdef int _put_mat_small(_Out* w, uint64_t a) except -1:
    cdef int b, c
    if a == 0:
        return _put(w, 1, 1)
    b = _bitlen(a)
    c = _bitlen(b)
    _put(w, (<uint64_t>1) << c, c + 1)
    _put(w, b, c - 1)
    return _put(w, a, b)


cdef int _put_mat_big(_Out* w, object a) except -1:
    cdef uint64_t b = a.bit_length(), i, n
    cdef int c = _bitlen(b)
    cdef bytes data = a.to_bytes((b + 7) >> 3, "little")
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    n = len(data)
    _put(w, (<uint64_t>1) << c, c + 1)
    _put(w, b, c - 1)
    _out_reserve(w, b)
    i = 0
    while i < b:
        _put(w, _load64(p, n, i >> 3), 64 if b - i > 64 else b - i)
        i += 64
    return 0


cdef dict _canonical_cells(object noun):
    """id(cell) -> a negative key shared exactly by equal cells (as in codec.jam)."""
    cdef dict keys = {}, interned = {}
    cdef list stack
    cdef object node, child, head, tail, pair, key
    cdef bint children_done
    if type(noun) is not tuple:
        return keys
    stack = [(noun, False)]
    while stack:
        node, children_done = stack.pop()
        if not children_done:
            if id(node) in keys:
                continue
            if len(<tuple>node) != 2:
                raise TypeError(f"cells must be 2-tuples, got a {len(node)}-tuple")
            keys[id(node)] = 0
            stack.append((node, True))
            for child in <tuple>node:
                if type(child) is tuple:
                    if id(child) not in keys:
                        stack.append((child, False))
                else:
                    _check_atom(child)
            continue
        head, tail = <tuple>node
        pair = (keys[id(head)] if type(head) is tuple else head,
                keys[id(tail)] if type(tail) is tuple else tail)
        key = interned.get(pair)
        if key is None:
            key = -1 - len(interned)
            interned[pair] = key
        keys[id(node)] = key
    return keys


def jam(noun):
    """Serialise a noun (``++jam``) to the jam atom's LE bytes; as :func:`codec.jam`."""
    cdef dict cell_keys, seen = {}
    cdef list stack
    cdef object node, key, where
    cdef _Out w
    cdef uint64_t pos, wpos
    if type(noun) is not tuple:
        _check_atom(noun)
    cell_keys = _canonical_cells(noun)
    w.buf = NULL
    w.cap = 0
    w.nbits = 0
    stack = [noun]
    try:
        while stack:
            node = stack.pop()
            pos = w.nbits
            if type(node) is tuple:
                key = cell_keys[id(node)]
                where = seen.get(key)
                if where is None:
                    seen[key] = pos
                    stack.append((<tuple>node)[1])
                    stack.append((<tuple>node)[0])
                    _put(&w, 1, 2)
                else:
                    _put(&w, 3, 2)
                    _put_mat_small(&w, where)
            else:
                where = seen.get(node)
                if node < _LIMIT64:
                    if where is not None:
                        wpos = where
                        if _bitlen(PyLong_AsUnsignedLongLong(node)) > _bitlen(wpos):
                            _put(&w, 3, 2)
                            _put_mat_small(&w, wpos)
                            continue
                    else:
                        seen[node] = pos
                    _put(&w, 0, 1)
                    _put_mat_small(&w, PyLong_AsUnsignedLongLong(node))
                else:
                    if where is not None:  # wider than 64 bits: always wider than `where`
                        _put(&w, 3, 2)
                        _put_mat_small(&w, where)
                        continue
                    seen[node] = pos
                    _put(&w, 0, 1)
                    _put_mat_big(&w, node)
        return PyBytes_FromStringAndSize(<char*>w.buf, (w.nbits + 7) >> 3)
    finally:
        PyMem_Free(w.buf)


# --------------------------------------------------------------------------- cue

cdef const uint8_t[::1] _as_view(object data):
    cdef const uint8_t[::1] view
    try:
        view = data
    except (TypeError, ValueError, BufferError):
        view = bytes(data)
    return view


cdef int64_t _find(const uint64_t* arr, uint64_t n, uint64_t key) noexcept nogil:
    cdef uint64_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    if lo < n and arr[lo] == key:
        return <int64_t>lo
    return -1


cdef struct _Input:
    Py_buffer view
    bint have_view        # view is held (release it with _close_input)
    const uint8_t* p
    uint64_t n


cdef inline object _open_input(object data, _Input* inp):
    """Point ``inp`` at the bytes of ``data``: its buffer, or for bytes (or what has no
    simple buffer) a bytes object, which is returned for the caller to keep alive."""
    inp.have_view = False
    if type(data) is not bytes:
        try:
            PyObject_GetBuffer(data, &inp.view, PyBUF_SIMPLE)
            inp.have_view = True
        except (TypeError, ValueError, BufferError):
            data = bytes(data)
    if inp.have_view:
        inp.p = <const uint8_t*>inp.view.buf
        inp.n = <uint64_t>inp.view.len
    else:
        inp.p = <const uint8_t*>PyBytes_AS_STRING(data)
        inp.n = <uint64_t>len(<bytes>data)
    return data


cdef inline void _close_input(_Input* inp):
    if inp.have_view:
        PyBuffer_Release(&inp.view)
        inp.have_view = False


cdef inline int _reserve(void** arr, uint64_t* cap, uint64_t need, size_t item,
                         uint64_t least) except -1:
    """Grow the array ``arr[0]`` of ``cap[0]`` items of ``item`` bytes to hold ``need``:
    to twice its size, or ``need``, and at least ``least`` items.  Holds the GIL."""
    cdef uint64_t c = cap[0]
    cdef void* p
    if need <= c:
        return 0
    c = c * 2 if c * 2 >= need else need
    if c < least:
        c = least
    p = PyMem_Realloc(arr[0], c * item)
    if p == NULL:
        raise MemoryError()
    arr[0] = p
    cap[0] = c
    return 0


cdef int _grow2(void** a, void** b, uint64_t* cap, uint64_t need) except -1:
    """Grow the parallel arrays ``a`` (8-byte items) and ``b`` (pointers) to ``need``."""
    cdef uint64_t bcap = cap[0]
    _reserve(a, &bcap, need, 8, 64)
    _reserve(b, cap, need, sizeof(void*), 64)
    return 0


cdef enum:
    STACK_NODES = 48      # cue's arrays start on the C stack: most events need no more


cdef int _grow2_stack(void** a, void** b, uint64_t* cap, uint64_t need,
                      const void* a_stack) except -1:
    """:func:`_grow2` for arrays that may still be the caller's stack buffers (``a[0] ==
    a_stack``, ``b`` likewise): their first growth copies them to the heap."""
    cdef uint64_t c
    cdef void* na
    cdef void* nb
    if a[0] != a_stack:
        return _grow2(a, b, cap, need)
    c = cap[0] * 2 if cap[0] * 2 >= need else need
    na = PyMem_Malloc(c * 8)
    nb = PyMem_Malloc(c * sizeof(void*))
    if na == NULL or nb == NULL:
        PyMem_Free(na)
        PyMem_Free(nb)
        raise MemoryError()
    memcpy(na, a[0], cap[0] * 8)
    memcpy(nb, b[0], cap[0] * sizeof(void*))
    a[0], b[0], cap[0] = na, nb, c
    return 0


# --------------------------------------------------------------------------- nodes

cdef enum:
    MAX_ZEROS = 64        # a length prefix this long: an atom of >= 2^63 bits
    # failure codes (the reasons of bookfs.noun.scanner)
    F_NONE = 0
    F_TRUNCATED = 1
    F_TOO_LARGE = 2
    F_BAD_REF = 3
    F_TRAILING = 4
    N_CELL = 5            # not a failure: _read_node met a cell

_REASON = {F_TRUNCATED: "truncated", F_TOO_LARGE: "too-large",
           F_BAD_REF: "bad-reference", F_TRAILING: "trailing"}


cdef struct _Node:
    bint is_ref           # a back-reference, else an atom
    uint64_t b            # its value's width in bits (a mat may carry leading zeros)
    uint64_t start        # the absolute bit its value starts at
    uint64_t end          # start + b, where the node ends (maybe past the input)
    bint small            # the value was among the 64 bits read at the tag ...
    uint64_t value        # ... and is this


cdef inline int _read_node(const uint8_t* p, uint64_t nbytes, uint64_t base_bits,
                           uint64_t avail, uint64_t tag, _Node* n) noexcept nogil:
    """Read the tag and the length prefix (mat) of the node at absolute bit ``tag``, for
    ``cue`` and the scanner: ``p`` holds ``nbytes`` bytes of the input from absolute bit
    ``base_bits``, and the input fed is ``avail`` bits.  Returns F_NONE, an atom or a
    back-reference, ``n`` filled in (the caller checks ``n.end`` against ``avail``);
    N_CELL, a cell, whose head starts at ``tag + 2``; or F_TRUNCATED (the input ends
    inside the tag or the length prefix) or F_TOO_LARGE (a prefix of 64 zero bits), to
    be reported at ``tag``."""
    cdef uint64_t win, kk, mat, window, width, c, b
    if tag >= avail:
        return F_TRUNCATED
    win = _bits(p, nbytes, tag - base_bits, 64)  # zeros past the input
    if not win & 1:
        n.is_ref = False
        kk = 1
    else:
        if tag + 1 >= avail:
            return F_TRUNCATED
        if not win & 2:
            return N_CELL
        n.is_ref = True
        kk = 2
    mat = tag + kk
    window = win >> kk
    n.small = False
    n.value = 0
    if window:  # the length prefix ends in these 64 bits (a one read is real input)
        c = __builtin_ctzll(window)
        if c == 0:
            n.b = 0
            n.start = mat + 1
            n.end = n.start
            n.small = True
            n.value = 0
            return F_NONE
        if kk + 2 * c <= 64:
            if mat + 2 * c > avail:
                return F_TRUNCATED
            b = ((<uint64_t>1) << (c - 1)) | ((window >> (c + 1)) &
                                              (((<uint64_t>1) << (c - 1)) - 1))
            n.b = b
            n.start = mat + 2 * c
            n.end = n.start + b
            if kk + 2 * c + b <= 64:
                n.small = True
                n.value = (window >> (2 * c)) & ((((<uint64_t>1) << b) - 1)
                                                 if b < 64 else <uint64_t>-1)
            return F_NONE
    # the prefix runs past the 64 bits read: read it from the mat
    width = avail - mat if avail > mat else 0
    if width > MAX_ZEROS:
        width = MAX_ZEROS
    window = _bits(p, nbytes, mat - base_bits, width)
    if window == 0:
        return F_TOO_LARGE if width >= MAX_ZEROS else F_TRUNCATED
    c = __builtin_ctzll(window)
    if c == 0:
        n.b = 0
        n.start = mat + 1
    else:
        if mat + 2 * c > avail:
            return F_TRUNCATED
        n.b = ((<uint64_t>1) << (c - 1)) | _bits(p, nbytes, mat + c + 1 - base_bits, c - 1)
        n.start = mat + 2 * c
    n.end = n.start + n.b
    return F_NONE


cdef inline bint _ref_position(const uint8_t* p, uint64_t nbytes, uint64_t base_bits,
                               const _Node* n, uint64_t* ref) noexcept nogil:
    """The position the back-reference ``n`` (read whole) points at, in ``ref[0]``; False
    when it is wider than 64 bits with a one above them (it points at no node)."""
    cdef uint64_t k = n.start + 64
    while k < n.end:  # a wide reference must have only zeros above bit 64
        if _bits(p, nbytes, k - base_bits, 64 if n.end - k > 64 else n.end - k):
            return False
        k += 64
    ref[0] = n.value if n.small else _bits(p, nbytes, n.start - base_bits,
                                           64 if n.b > 64 else n.b)
    return True


cdef inline int64_t _ref_detail(uint64_t ref) noexcept nogil:
    """A bad reference's position as the failure reports it (-1: 63 bits or wider)."""
    return <int64_t>ref if ref < ((<uint64_t>1) << 63) else -1


cdef enum:
    WORDS = 1024          # the word cache's slots (a power of two)
    WORD_SHIFT = 54       # 64 - log2(WORDS)

# Atoms of one word that cue made lately, so an atom met again (a wire's knots, a card's
# tag, a ship) is shared, not allocated and freed again: a direct-mapped cache of WORDS
# slots, keyed by value.  Ints are immutable, so sharing one is invisible to the caller.
# cue holds the GIL throughout, so the slots need no lock.
cdef uint64_t _word_keys[WORDS]
cdef PyObject* _word_vals[WORDS]


cdef inline object _word(uint64_t v):
    """The int ``v`` (at most one word), from the cache when it holds it."""
    cdef uint64_t i
    cdef object atom
    if v <= 256:  # CPython's own small ints: never allocated
        return PyLong_FromUnsignedLongLong(v)
    i = (v * <uint64_t>0x9E3779B97F4A7C15) >> WORD_SHIFT
    if _word_vals[i] != NULL and _word_keys[i] == v:
        return <object>_word_vals[i]
    atom = PyLong_FromUnsignedLongLong(v)
    Py_XDECREF(_word_vals[i])
    Py_INCREF(atom)
    _word_vals[i] = <PyObject*>atom
    _word_keys[i] = v
    return atom


def cue(data):
    """Deserialise jam bytes into a noun (``++cue``); as :func:`codec.cue`, including its
    laxness: bits after the noun are ignored.  Raises :class:`CueError`."""
    cdef _Input inp
    cdef uint64_t nbytes, total
    cdef const uint8_t* p
    # the arrays start in these stack buffers, and move to the heap when they outgrow them
    cdef uint64_t starts_buf[STACK_NODES]
    cdef PyObject* objs_buf[STACK_NODES]
    cdef uint64_t sidx_buf[STACK_NODES]
    cdef PyObject* shead_buf[STACK_NODES]
    cdef uint64_t* starts = starts_buf    # start bit of every atom and cell, increasing
    cdef PyObject** objs = objs_buf       # its noun once complete (borrowed: every
    #                                       complete node is inside an open cell's head,
    #                                       or the node in hand, until cue returns)
    cdef uint64_t count = 0, cap = STACK_NODES
    cdef uint64_t* sidx = sidx_buf        # open cells: node number
    cdef PyObject** shead = shead_buf     # and head (NULL until read; a reference held)
    cdef uint64_t depth = 0, scap = STACK_NODES
    cdef uint64_t pos = 0, tag, ref, i
    cdef _Node n
    cdef int64_t found
    cdef int fail
    cdef object node
    cdef object cell
    cdef int64_t detail = -1
    data = _open_input(data, &inp)
    p = inp.p
    nbytes = inp.n
    total = nbytes * 8
    try:
        if nbytes == 0:
            raise CueError("cannot cue empty input")
        while True:
            tag = pos
            fail = _read_node(p, nbytes, 0, total, tag, &n)
            if fail == N_CELL:
                if count >= cap:
                    _grow2_stack(<void**>&starts, <void**>&objs, &cap, count + 1, starts_buf)
                starts[count] = tag
                objs[count] = NULL
                if depth >= scap:
                    _grow2_stack(<void**>&sidx, <void**>&shead, &scap, depth + 1, sidx_buf)
                sidx[depth] = count
                shead[depth] = NULL
                depth += 1
                count += 1
                pos = tag + 2
                continue
            if fail != F_NONE:
                break
            if n.end > total:
                fail = F_TRUNCATED
                break
            if not n.is_ref:
                if n.small:
                    node = _word(n.value)
                elif n.b <= 64:
                    node = _word(_bits(p, nbytes, n.start, n.b))
                else:
                    node = bookfs_long_from_bits(p, nbytes, n.start, n.b)
                if count >= cap:
                    _grow2_stack(<void**>&starts, <void**>&objs, &cap, count + 1, starts_buf)
                starts[count] = tag
                objs[count] = <PyObject*>node  # borrowed: the noun being built holds it
                count += 1
            else:
                if not _ref_position(p, nbytes, 0, &n, &ref):
                    fail = F_BAD_REF
                    break
                found = _find(starts, count, ref)
                if found < 0 or objs[found] == NULL:
                    fail = F_BAD_REF
                    detail = _ref_detail(ref)
                    break
                node = <object>objs[found]
            pos = n.end
            # attach the complete node to the open cells
            while depth:
                if shead[depth - 1] == NULL:
                    Py_INCREF(node)
                    shead[depth - 1] = <PyObject*>node
                    break
                depth -= 1
                cell = PyTuple_New(2)
                _set_item(cell, 0, shead[depth])  # the stack's reference moves to the cell
                shead[depth] = NULL
                Py_INCREF(node)
                _set_item(cell, 1, <PyObject*>node)
                # Ints and these tuples only, built bottom-up: never part of a cycle, so the
                # collector need not track them (it would untrack them itself, later).
                PyObject_GC_UnTrack(<PyObject*>cell)
                objs[sidx[depth]] = <PyObject*>cell  # borrowed, as above
                node = cell
            else:
                return node
        raise CueError(_failure(_REASON[fail], tag, total, detail).message)
    finally:
        for i in range(depth):
            Py_XDECREF(shead[i])
        if starts != starts_buf:
            PyMem_Free(starts)
            PyMem_Free(objs)
        if sidx != sidx_buf:
            PyMem_Free(sidx)
            PyMem_Free(shead)
        _close_input(&inp)


# --------------------------------------------------------------------------- scan

cdef enum:
    BLOCK = 32            # node start positions per block of the position index


@cython.final
cdef class Scanner:
    """Scan a jam fed in chunks; as :class:`bookfs.noun.scanner.Scanner` (same verdicts).
    ``feed`` runs without the GIL: one Scanner must not be fed from two threads at once."""

    cdef readonly bint mug, exact
    cdef bint finished
    cdef object _result
    # input held back: bytes from absolute byte `base`; `total` bytes fed in all
    cdef uint8_t* buf
    cdef uint64_t blen, bcap, base, total
    # parse state
    cdef uint64_t pos, skip_end, skip_tag, end
    cdef bint skipping, done
    cdef uint32_t final_mug
    cdef int fail
    cdef uint64_t fail_bit
    cdef int64_t fail_detail
    # nodes: start positions (blocks of BLOCK, delta-coded), referable bits, mugs
    cdef uint64_t count
    cdef uint64_t last
    cdef uint64_t* bbase
    cdef uint64_t* boff
    cdef uint64_t nblocks, blcap, boffcap
    cdef uint8_t* deltas
    cdef uint64_t dlen, dcap
    cdef uint8_t* referable
    cdef uint64_t rcap
    cdef uint32_t* mugs
    cdef uint64_t mcap
    # open cells: node numbers, delta-coded, popped from the top; bit 0: head read
    cdef uint8_t* stk
    cdef uint64_t slen, scap, depth, stop

    def __cinit__(self, *, mug=False, exact=True):
        self.mug = bool(mug)
        self.exact = bool(exact)
        self._result = None

    def __dealloc__(self):
        PyMem_Free(self.buf)
        PyMem_Free(self.bbase)
        PyMem_Free(self.boff)
        PyMem_Free(self.deltas)
        PyMem_Free(self.referable)
        PyMem_Free(self.mugs)
        PyMem_Free(self.stk)

    @property
    def result(self):
        """The failure once certain, else None until :meth:`finish`."""
        if self._result is None and self.fail != F_NONE:
            self._make_result()
        return self._result

    # --- memory ----------------------------------------------------------------------

    cdef inline int _reserve(self, void** arr, uint64_t* cap, uint64_t need,
                             size_t item) except -1 nogil:
        if need <= cap[0]:
            return 0
        with gil:
            _reserve(arr, cap, need, item, 16)
        return 0

    cdef inline int64_t _new_node(self, uint64_t pos, bint referable) except -1 nogil:
        """Number the node starting at ``pos`` (after every earlier one); ``referable``:
        a back-reference may point at it (an atom; a cell only once complete)."""
        cdef uint64_t i = self.count, d
        cdef uint8_t bit = <uint8_t>(1 << (i & 7))
        if i % BLOCK == 0:
            if self.nblocks >= self.blcap:
                self._reserve(<void**>&self.bbase, &self.blcap, self.nblocks + 1, 8)
            self.bbase[self.nblocks] = pos
            self.nblocks += 1
            self._boff_set(self.nblocks - 1, self.dlen)
        else:
            if self.dlen + 10 > self.dcap:
                self._reserve(<void**>&self.deltas, &self.dcap, self.dlen + 10, 1)
            d = pos - self.last
            while d >= 0x80:
                self.deltas[self.dlen] = <uint8_t>(d & 0x7F) | 0x80
                self.dlen += 1
                d >>= 7
            self.deltas[self.dlen] = <uint8_t>d
            self.dlen += 1
        self.last = pos
        if (i >> 3) >= self.rcap:
            self._reserve(<void**>&self.referable, &self.rcap, (i >> 3) + 1, 1)
        if referable:
            self.referable[i >> 3] |= bit
        else:
            self.referable[i >> 3] &= ~bit
        if self.mug and i >= self.mcap:
            self._reserve(<void**>&self.mugs, &self.mcap, i + 1, 4)
        self.count = i + 1
        return <int64_t>i

    cdef inline int _boff_set(self, uint64_t k, uint64_t off) except -1 nogil:
        self._reserve(<void**>&self.boff, &self.boffcap, k + 1, 8)
        self.boff[k] = off
        return 0

    cdef inline void _set_referable(self, uint64_t i) noexcept nogil:
        self.referable[i >> 3] |= 1 << (i & 7)

    cdef inline int64_t _find(self, uint64_t p) noexcept nogil:
        """The number of the node starting at bit ``p``, or -1."""
        cdef uint64_t lo, hi, mid, cur, i, end, off, d
        cdef int sh
        cdef uint8_t byte
        if self.nblocks == 0 or p < self.bbase[0]:
            return -1
        lo = 0
        hi = self.nblocks - 1
        while lo < hi:  # the last block whose first start is <= p
            mid = (lo + hi + 1) >> 1
            if self.bbase[mid] <= p:
                lo = mid
            else:
                hi = mid - 1
        cur = self.bbase[lo]
        i = lo * BLOCK
        if cur == p:
            return <int64_t>i
        end = i + BLOCK if i + BLOCK < self.count else self.count
        off = self.boff[lo]
        i += 1
        while i < end:
            d = 0
            sh = 0
            while True:
                byte = self.deltas[off]
                off += 1
                d |= (<uint64_t>(byte & 0x7F)) << sh
                if not byte & 0x80:
                    break
                sh += 7
            cur += d
            if cur == p:
                return <int64_t>i
            if cur > p:
                return -1
            i += 1
        return -1

    cdef inline int _push(self, uint64_t idx) except -1 nogil:
        cdef uint64_t v = (idx - (self.stop if self.depth else 0)) << 1
        cdef uint8_t groups[10]
        cdef int n = 0, j
        while True:
            groups[n] = <uint8_t>(v & 0x7F)
            n += 1
            v >>= 7
            if not v:
                break
        if self.slen + n > self.scap:
            self._reserve(<void**>&self.stk, &self.scap, self.slen + n, 1)
        # most significant group at the bottom (no flag), least significant on top
        for j in range(n - 1, -1, -1):
            self.stk[self.slen] = groups[j] | (0x80 if j < n - 1 else 0)
            self.slen += 1
        self.stop = idx
        self.depth += 1
        return 0

    cdef inline uint64_t _pop(self) noexcept nogil:
        """Pop the top open cell: its node number."""
        cdef uint64_t v = 0, idx = self.stop
        cdef int sh = 0
        cdef uint8_t byte
        while True:
            self.slen -= 1
            byte = self.stk[self.slen]
            v |= (<uint64_t>(byte & 0x7F)) << sh
            sh += 7
            if not byte & 0x80:
                break
        self.stop = idx - (v >> 1)
        self.depth -= 1
        return idx

    # --- parsing ---------------------------------------------------------------------

    cdef inline int _complete(self, uint32_t m) except -1 nogil:
        cdef uint64_t c
        while self.depth:
            if not self.stk[self.slen - 1] & 1:
                self.stk[self.slen - 1] |= 1  # the head is read; the tail comes next
                return 0
            c = self._pop()
            if self.mug:
                m = _cell_mug(self.mugs[c + 1], m)
                self.mugs[c] = m
            self._set_referable(c)
        self.done = True
        self.end = self.pos
        self.final_mug = m
        return 0

    cdef int _failed(self, int code, uint64_t bit, int64_t detail) noexcept nogil:
        self.fail = code
        self.fail_bit = bit
        self.fail_detail = detail
        return 0

    cdef int _advance(self, const uint8_t* p, uint64_t nbytes, uint64_t base_bits,
                      bint final) except -1 nogil:
        """Read whole nodes from ``p`` (``nbytes`` bytes; ``p[0]`` is absolute bit
        ``base_bits``); all input fed so far is ``self.total`` bytes."""
        cdef uint64_t avail = self.total * 8
        cdef uint64_t tag, end, ref, need
        cdef _Node n
        cdef int code
        cdef int64_t idx, found
        cdef uint32_t m = 0
        while self.fail == F_NONE:
            if self.done:
                if self.exact:
                    end = self.end
                    need = (end + 7) >> 3
                    # (the last byte's bits are read once, when the noun ends; later input
                    # only adds bytes, and the buffer no longer holds that byte)
                    if self.total > need or (end & 7 and self.total == need and
                                             end >= base_bits and
                                             ((end - base_bits) >> 3) < nbytes and
                                             _bits(p, nbytes, end - base_bits,
                                                   8 - (end & 7))):
                        self._failed(F_TRAILING, end, -1)
                return 0
            if self.skipping:
                if self.skip_end > avail:
                    if final:
                        self._failed(F_TRUNCATED, self.skip_tag, -1)
                    return 0
                idx = self._new_node(self.skip_tag, True)
                self.pos = self.skip_end
                self.skipping = False
                self._complete(0)
                continue
            tag = self.pos
            code = _read_node(p, nbytes, base_bits, avail, tag, &n)
            if code == N_CELL:
                idx = self._new_node(tag, False)
                self._push(idx)
                self.pos = tag + 2
                continue
            if code != F_NONE:
                if code == F_TOO_LARGE:
                    self._failed(F_TOO_LARGE, tag, -1)
                elif final:
                    self._failed(F_TRUNCATED, tag, -1)
                return 0
            if n.end > avail:
                if final:
                    self._failed(F_TRUNCATED, tag, -1)
                elif not self.mug and not n.is_ref:  # skip the atom without holding it
                    self.skipping = True
                    self.skip_end = n.end
                    self.skip_tag = tag
                    continue
                return 0
            if not n.is_ref:
                idx = self._new_node(tag, True)
                if self.mug:
                    if n.small:
                        m = _small_atom_mug(n.value)
                    elif n.b <= 64:
                        m = _small_atom_mug(_bits(p, nbytes, n.start - base_bits, n.b))
                    else:
                        m = _atom_mug_bits(p, nbytes, n.start - base_bits, n.b)
                    self.mugs[idx] = m
            else:
                if not _ref_position(p, nbytes, base_bits, &n, &ref):
                    self._failed(F_BAD_REF, tag, -1)
                    return 0
                found = self._find(ref)
                if found < 0 or not (self.referable[found >> 3] >> (found & 7)) & 1:
                    self._failed(F_BAD_REF, tag, _ref_detail(ref))
                    return 0
                idx = self._new_node(tag, False)
                if self.mug:
                    m = self.mugs[found]
                    self.mugs[idx] = m
            self.pos = n.end
            self._complete(m)
        return 0

    cdef object _make_result(self):
        cdef object m = self.final_mug if (self.mug and self.done) else None
        if self.fail != F_NONE:
            self._result = _failure(_REASON[self.fail], self.fail_bit, self.total * 8,
                                    self.fail_detail, m if self.fail == F_TRAILING else None)
        else:
            self._result = _ok(self.end, m)
        return self._result

    cdef uint64_t _keep_byte(self):
        if self.done:
            return self.total  # nothing more is read
        return (self.skip_end if self.skipping else self.pos) >> 3

    # --- input -----------------------------------------------------------------------

    def feed(self, chunk):
        """Scan ``chunk``, the input's next bytes; False once the scan has failed."""
        cdef const uint8_t[::1] view
        cdef const uint8_t* p
        cdef uint64_t n, at, skip, keep, drop
        if self.finished:
            raise ValueError("feed() after finish()")
        if self.fail != F_NONE:
            return False
        view = _as_view(chunk)
        n = view.shape[0]
        if n == 0:
            return True
        p = &view[0]
        at = self.total  # absolute byte of p[0]
        keep = self._keep_byte()
        skip = keep - at if keep > at else 0
        if skip > n:
            skip = n
        self.total += n
        if self.blen == 0:  # scan the chunk in place, then hold back what is unread
            self.base = at + skip
            with nogil:
                self._advance(p + skip, n - skip, (at + skip) * 8, False)
            keep = self._keep_byte()
            if keep < at + skip:  # pragma: no cover - cannot happen
                keep = at + skip
            if keep < self.total:
                self._reserve(<void**>&self.buf, &self.bcap, self.total - keep, 1)
                memcpy(self.buf, p + (keep - at), self.total - keep)
                self.blen = self.total - keep
            self.base = keep if keep < self.total else self.total
        else:
            self._reserve(<void**>&self.buf, &self.bcap, self.blen + n - skip, 1)
            memcpy(self.buf + self.blen, p + skip, n - skip)
            self.blen += n - skip
            with nogil:
                self._advance(self.buf, self.blen, self.base * 8, False)
            keep = self._keep_byte()
            drop = keep - self.base if keep > self.base else 0
            if drop >= self.blen:
                self.blen = 0
                self.base = self.total
            elif drop:
                memmove(self.buf, self.buf + drop, self.blen - drop)
                self.blen -= drop
                self.base += drop
        return self.fail == F_NONE

    def finish(self):
        """The verdict, once all the input has been fed: a :class:`ScanResult`."""
        if not self.finished:
            self.finished = True
            if self._result is None:
                if self.fail == F_NONE and self.total == 0:
                    self._result = _failure("empty", 0, 0)
                    return self._result
                if self.fail == F_NONE:
                    self._advance(self.buf, self.blen, self.base * 8, True)
                self._make_result()
        return self._result

    cdef object _scan_whole(self, const uint8_t* p, uint64_t n):
        self.total = n
        if n < 65536:  # releasing the GIL costs more than a small scan
            self._advance(p, n, 0, True)
        else:
            with nogil:
                self._advance(p, n, 0, True)
        self.finished = True
        return self._make_result()


cdef Scanner _KEPT = None      # scan_ok's scanner, its arrays kept from call to call
cdef bint _kept_busy = False   # held by a scan (one over 64 KiB runs without the GIL)
cdef uint64_t _KEPT_MAX = 1 << 20  # arrays past this many bytes are not kept


cdef inline void _restart(Scanner s) noexcept:
    """``s`` as a new exact, mug-less Scanner, its arrays (and their sizes) kept."""
    s.mug = False
    s.exact = True
    s.finished = False
    s._result = None
    s.blen = s.base = s.total = 0
    s.pos = s.skip_end = s.skip_tag = s.end = 0
    s.skipping = s.done = False
    s.final_mug = 0
    s.fail = F_NONE
    s.fail_bit = 0
    s.fail_detail = 0
    s.count = s.last = s.nblocks = s.dlen = 0
    s.slen = s.depth = s.stop = 0


def scan_ok(data):
    """``scan(data).ok``, the exact scan's verdict alone: whether ``data`` is one whole
    jam and nothing after it.  It makes no :class:`~bookfs.noun.scanner.ScanResult` and
    reuses one Scanner's arrays (a new Scanner only while that one is busy in another
    thread), which were most of a small jam's scan (the Spark row builder validates every
    event's jam with it: ``bookfs/spark/_rows.pyx``)."""
    global _KEPT, _kept_busy
    cdef _Input inp
    cdef Scanner s
    cdef bint kept = not _kept_busy
    if kept:
        if _KEPT is None:
            _KEPT = Scanner.__new__(Scanner)
        s = _KEPT
        _kept_busy = True
    else:
        s = Scanner.__new__(Scanner)
    data = _open_input(data, &inp)
    try:
        if inp.n == 0:
            return False
        _restart(s)
        s.total = inp.n
        if inp.n < 65536:
            s._advance(inp.p, inp.n, 0, True)
        else:
            with nogil:
                s._advance(inp.p, inp.n, 0, True)
        return s.fail == F_NONE
    finally:
        _close_input(&inp)
        if kept:
            _kept_busy = False
            if s.dcap + 8 * (s.blcap + s.boffcap) + s.rcap + s.scap > _KEPT_MAX:
                _KEPT = None  # a large jam's arrays: not held for the next one


def scan(data, *, mug=False, exact=True):
    """Scan the whole jam ``data``; as :func:`bookfs.noun.scanner.scan` (same verdicts)."""
    cdef _Input inp
    cdef Scanner s = Scanner.__new__(Scanner)
    s.mug = bool(mug)
    s.exact = bool(exact)
    data = _open_input(data, &inp)
    try:
        if inp.n == 0:
            return _failure("empty", 0, 0)
        return s._scan_whole(inp.p, inp.n)
    finally:
        _close_input(&inp)


# --------------------------------------------------------------------------- event head

cdef extern from "Python.h":
    size_t _PyLong_NumBits(object) except? <size_t>-1

cdef tuple _NO_HEAD = (None, None, None)
cdef size_t _HEAD_ATOM_BITS = 1 << 16
cdef object _SECONDS_LO = SECONDS_MIN + DA_UNIX_EPOCH   # (date >> 64) bounds
cdef object _SECONDS_HI = SECONDS_MAX + DA_UNIX_EPOCH


cdef inline bint _small_atom(object a):
    """An int (not a bob reference) of at most 2^16 bits."""
    return type(a) is int and _PyLong_NumBits(a) <= _HEAD_ATOM_BITS


cdef object _head_text(object atom, dict texts):
    text = texts.get(atom)
    if text is None:
        text = uncord(atom)
        if len(texts) >= TEXTS_MAX:
            texts.clear()
        texts[atom] = text
    return text


def event_head(noun, dict texts):
    """:func:`bookfs.noun.peek.event_head`, compiled (tests/test_noun_core.py holds the
    two equal)."""
    cdef list knots
    if type(noun) is not tuple:
        return _NO_HEAD
    date, ovum = <tuple>noun
    if not _small_atom(date) or type(ovum) is not tuple:
        return _NO_HEAD
    secs = date >> 64
    if secs < _SECONDS_LO or secs > _SECONDS_HI:
        return _NO_HEAD
    wire, card = <tuple>ovum
    knots = []
    try:
        while type(wire) is tuple:
            knot, wire = <tuple>wire
            if not _small_atom(knot):
                return _NO_HEAD
            knots.append(_head_text(knot, texts))
        if type(wire) is not int or wire != 0 or type(card) is not tuple:
            return _NO_HEAD
        tag = (<tuple>card)[0]
        if not _small_atom(tag):
            return _NO_HEAD
        return date, "/" + "/".join(knots), _head_text(tag, texts)
    except UnicodeDecodeError:
        return _NO_HEAD
