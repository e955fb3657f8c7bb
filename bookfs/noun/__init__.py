"""Nouns, as pure functions: the codec (:mod:`~bookfs.noun.codec`: jam, cue, mug), the
auras bookfs reads (:mod:`~bookfs.noun.aura`: @da, @p), an event's head without cueing it
(:mod:`~bookfs.noun.peek`), and the dojo-style rendering (:mod:`bookfs.noun.render`,
:mod:`bookfs.noun.view`, :mod:`bookfs.noun.event`).

The names of the codec, the auras and :func:`peek_event` are re-exported here; other
layers import them from this package (``from bookfs.noun import cue``).
"""
from bookfs.noun.aura import (DA_UNIX_EPOCH, PREFIXES, SUFFIXES, Prf, da_to_datetime,
                              datetime_to_da, fein, format_da, fynd, parse_da, parse_patp, patp)
# The codec: pure Python, the reference implementation.  A compiled core (issue 21) would be
# chosen here, over these names, and tested against bookfs.noun.codec.
from bookfs.noun.codec import (Cell, CueError, Noun, cell, cord, cue, from_list, is_atom,
                               is_cell, jam, muk, mug, murmur3_32, murmur3_32_fast, noun_equal,
                               path, tape, to_list, uncord, unpath, untape)
from bookfs.noun.peek import peek_event

__all__ = ["DA_UNIX_EPOCH", "PREFIXES", "SUFFIXES", "Cell", "CueError", "Noun", "Prf", "cell",
           "cord", "cue", "da_to_datetime", "datetime_to_da", "fein", "format_da", "from_list",
           "fynd", "is_atom", "is_cell", "jam", "muk", "mug", "murmur3_32", "murmur3_32_fast",
           "noun_equal", "parse_da", "parse_patp", "path", "patp", "peek_event", "tape",
           "to_list", "uncord", "unpath", "untape"]
