# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: cdivision=True
"""The inner loop of :func:`bookfs.formats.framing.scan_deeds`, compiled: the deeds of one
chunk of a Book log walked in memory, as the pure loop walks them (the reference, and
the fallback where this extension did not build; ``bookfs.formats.framing.FRAMING`` says
which is in use, and ``tests/test_framing_compiled.py`` holds the two to the same
offsets and the same stops over random and damaged logs).

Why: a framing scan reads every deed's ``len_d`` and ``let_d``; in Python that is about
0.3 µs a deed on top of the read, which is most of the first open of a log of small
deeds (a fleet's first ``find`` opens a thousand of them, ``fs/fleet/ahead.py``).
"""

from libc.stdint cimport uint64_t, int64_t
from libc.string cimport memcpy


def scan_chunk(const unsigned char[::1] buf, Py_ssize_t rel, int64_t base, int64_t size,
               uint64_t lo, uint64_t hi, Py_ssize_t gap, uint64_t[::1] out):
    """Walk the deeds of ``buf`` (the log's bytes from ``base``) from ``rel``: each
    ``len_d`` (u64 LE at the deed's start) within ``lo .. hi``, its deed inside the file
    (``size``) and its ``let_d`` (``gap`` bytes past the payload) equal to it.  The
    start (``base + rel``) of each sound deed goes to ``out``.

    Returns ``(rel, found, how)``: where the walk stopped, the offsets written to
    ``out`` and why it stopped: 0, the next ``len_d`` is not whole in ``buf`` (or
    ``out`` is full); 1, the bytes at ``rel`` frame no deed; 2, the deed at ``rel``
    passes but for its ``let_d``, which lies past ``buf`` (the caller reads it, at
    ``base + rel + len_d + gap``, and goes on)."""
    cdef Py_ssize_t n_buf = buf.shape[0], last = n_buf - 8, found = 0, room = out.shape[0]
    cdef uint64_t n, let
    cdef Py_ssize_t t
    while rel <= last and found < room:
        memcpy(&n, &buf[rel], 8)
        if n < lo or n > hi or <uint64_t>(base + rel) + n + <uint64_t>gap + 8 > <uint64_t>size:
            return rel, found, 1
        t = rel + <Py_ssize_t>n + gap
        if t > last:
            return rel, found, 2
        memcpy(&let, &buf[t], 8)
        if let != n:
            return rel, found, 1
        out[found] = <uint64_t>(base + rel)
        found += 1
        rel = t + 8
    return rel, found, 0
