"""Nouns, as pure functions: the codec (jam, cue, mug), the auras bookfs reads (@p, @da),
and the dojo-style rendering (:mod:`bookfs.noun.render`).

The codec's names are re-exported here (``from bookfs.noun import cue``).
"""
from bookfs.noun.codec import (DA_UNIX_EPOCH, PREFIXES, SUFFIXES, Cell, CueError, Noun, Prf,
                               cell, cord, cue, da_to_datetime, datetime_to_da, fein, format_da,
                               from_list, fynd, is_atom, is_cell, jam, muk, mug, murmur3_32,
                               murmur3_32_fast, noun_equal, parse_da, parse_patp, path, patp,
                               peek_event, tape, to_list, uncord, unpath, untape)

__all__ = ["DA_UNIX_EPOCH", "PREFIXES", "SUFFIXES", "Cell", "CueError", "Noun", "Prf", "cell",
           "cord", "cue", "da_to_datetime", "datetime_to_da", "fein", "format_da", "from_list",
           "fynd", "is_atom", "is_cell", "jam", "muk", "mug", "murmur3_32", "murmur3_32_fast",
           "noun_equal", "parse_da", "parse_patp", "path", "patp", "peek_event", "tape",
           "to_list", "uncord", "unpath", "untape"]
