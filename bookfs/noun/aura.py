"""The auras bookfs reads, in pure Python: @da (a date) and @p (a ship's name).

An @da is a 128-bit atom: the high 64 bits are whole seconds (:data:`DA_UNIX_EPOCH` at
the Unix epoch), the low 64 bits a binary fraction of a second; its text form is
``~2024.1.1..12.00.00..8000``.  An @p is a ship number scrambled (:func:`fein`) and
written in syllables (``~sampel-palnet``).  Both follow the Hoon standard library
(``++ob``, ``++co``) bit for bit, as urbit-ob does.
"""

from __future__ import annotations

import datetime as _dt
from typing import Callable, TypeAlias

from bookfs.noun.codec import _check_atom, muk

__all__ = ["DA_UNIX_EPOCH", "da_to_datetime", "datetime_to_da", "format_da", "parse_da",
           "PREFIXES", "SUFFIXES", "Prf", "fein", "fynd", "patp", "parse_patp"]


# ---------------------------------------------------------------------------
# @da
# ---------------------------------------------------------------------------

DA_UNIX_EPOCH = 0x8000000CCE9E0D80
"""The high 64 bits of the @da for the Unix epoch (1970-01-01T00:00:00Z)."""

_UNIX_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_FRAC_ONE = 1 << 64


def da_to_datetime(da: int) -> _dt.datetime:
    """An @da as an aware UTC datetime, with the fraction truncated to microseconds.

    ``ValueError`` if the date is outside ``datetime``'s range (years 1..9999).
    """
    _check_atom(da)
    seconds = (da >> 64) - DA_UNIX_EPOCH
    micros = ((da & (_FRAC_ONE - 1)) * 1_000_000) >> 64
    try:
        return _UNIX_EPOCH + _dt.timedelta(seconds=seconds, microseconds=micros)
    except OverflowError as exc:
        raise ValueError(f"@da {da:#x} is outside datetime's range") from exc


def datetime_to_da(when: _dt.datetime) -> int:
    """An aware datetime as an @da.

    The microseconds become the smallest 2^-64 fraction that reads back as the same
    microsecond, so ``da_to_datetime(datetime_to_da(t)) == t`` exactly.  Naive
    datetimes are rejected with ``ValueError``.
    """
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("datetime_to_da needs an aware datetime")
    delta = when - _UNIX_EPOCH
    seconds = delta.days * 86400 + delta.seconds
    fraction = -((-delta.microseconds << 64) // 1_000_000)  # ceiling division
    return ((seconds + DA_UNIX_EPOCH) << 64) | fraction


def format_da(da: int) -> str:
    """The Urbit text form of an @da, e.g. ``~2024.1.1..12.00.00..8000``.

    The time part is omitted at midnight with no fraction; the fraction is printed as
    dot-separated 16-bit hex words, most significant first, trailing zero words
    dropped.  Only years 1..9999 are supported.
    """
    _check_atom(da)
    fraction = da & (_FRAC_ONE - 1)
    try:
        when = _UNIX_EPOCH + _dt.timedelta(seconds=(da >> 64) - DA_UNIX_EPOCH)
    except OverflowError as exc:
        raise ValueError(f"@da {da:#x} is outside the supported years") from exc
    text = f"~{when.year}.{when.month}.{when.day}"
    if when.hour or when.minute or when.second or fraction:
        text += f"..{when.hour:02d}.{when.minute:02d}.{when.second:02d}"
    if fraction:
        words = [(fraction >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
        while words[-1] == 0:
            words.pop()
        text += ".." + ".".join(f"{w:04x}" for w in words)
    return text


def parse_da(text: str) -> int:
    """Parse the text form produced by :func:`format_da` (``~Y.M.D[..H.M.S[..ffff...]]``)."""
    if not text.startswith("~"):
        raise ValueError(f"@da must start with '~': {text!r}")
    parts = text[1:].split("..")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"malformed @da: {text!r}")
    try:
        year, month, day = (int(x) for x in parts[0].split("."))
        hour = minute = second = 0
        if len(parts) > 1:
            hour, minute, second = (int(x) for x in parts[1].split("."))
        fraction = 0
        if len(parts) > 2:
            words = parts[2].split(".")
            if not 1 <= len(words) <= 4 or any(len(w) != 4 for w in words):
                raise ValueError("fraction words must be 4 hex digits, at most 4 of them")
            for i, word in enumerate(words):
                fraction |= int(word, 16) << (48 - 16 * i)
        when = _dt.datetime(year, month, day, hour, minute, second, tzinfo=_dt.timezone.utc)
    except ValueError as exc:
        raise ValueError(f"malformed @da {text!r}: {exc}") from exc
    return datetime_to_da(when) | fraction


# ---------------------------------------------------------------------------
# @p (hoon.hoon ++ob and ++co, as in urbit-ob)
# ---------------------------------------------------------------------------


def _syllables(table: str) -> tuple[str, ...]:
    syls = tuple(table[i:i + 3] for i in range(0, len(table), 3))
    assert len(syls) == 256 and len(set(syls)) == 256
    return syls


PREFIXES = _syllables(
    "dozmarbinwansamlitsighidfidlissogdirwacsabwissib"
    "rigsoldopmodfoglidhopdardorlorhodfolrintogsilmir"
    "holpaslacrovlivdalsatlibtabhanticpidtorbolfosdot"
    "losdilforpilramtirwintadbicdifrocwidbisdasmidlop"
    "rilnardapmolsanlocnovsitnidtipsicropwitnatpanmin"
    "ritpodmottamtolsavposnapnopsomfinfonbanmorworsip"
    "ronnorbotwicsocwatdolmagpicdavbidbaltimtasmallig"
    "sivtagpadsaldivdactansidfabtarmonranniswolmispal"
    "lasdismaprabtobrollatlonnodnavfignomnibpagsopral"
    "bilhaddocridmocpacravripfaltodtiltinhapmicfanpat"
    "taclabmogsimsonpinlomrictapfirhasbosbatpochactid"
    "havsaplindibhosdabbitbarracparloddosbortochilmac"
    "tomdigfilfasmithobharmighinradmashalraglagfadtop"
    "mophabnilnosmilfopfamdatnoldinhatnacrisfotribhoc"
    "nimlarfitwalrapsarnalmoslandondanladdovrivbacpol"
    "laptalpitnambonrostonfodponsovnocsorlavmatmipfip"
)
"""The 256 @p prefix syllables (the high byte of each 16-bit word)."""

SUFFIXES = _syllables(
    "zodnecbudwessevpersutletfulpensytdurwepserwylsun"
    "rypsyxdyrnuphebpeglupdepdysputlughecryttyvsydnex"
    "lunmeplutseppesdelsulpedtemledtulmetwenbynhexfeb"
    "pyldulhetmevruttylwydtepbesdexsefwycburderneppur"
    "rysrebdennutsubpetrulsynregtydsupsemwynrecmegnet"
    "secmulnymtevwebsummutnyxrextebfushepbenmuswyxsym"
    "selrucdecwexsyrwetdylmynmesdetbetbeltuxtugmyrpel"
    "syptermebsetdutdegtexsurfeltudnuxruxrenwytnubmed"
    "lytdusnebrumtynseglyxpunresredfunrevrefmectedrus"
    "bexlebduxrynnumpyxrygryxfeptyrtustyclegnemfermer"
    "tenlusnussyltecmexpubrymtucfyllepdebbermughuttun"
    "bylsudpemdevlurdefbusbeprunmelpexdytbyttyplevmyl"
    "wedducfurfexnulluclennerlexrupnedlecrydlydfenwel"
    "nydhusrelrudneshesfetdesretdunlernyrsebhulryllud"
    "remlysfynwerrycsugnysnyllyndyndemluxfedsedbecmun"
    "lyrtesmudnytbyrsenwegfyrmurtelreptegpecnelnevfes"
)
"""The 256 @p suffix syllables (the low byte of each 16-bit word)."""

_PREFIX_INDEX = {s: i for i, s in enumerate(PREFIXES)}
_SUFFIX_INDEX = {s: i for i, s in enumerate(SUFFIXES)}

# Seeds of the Feistel round function (hoon.hoon ++raku:ob).
_RAKU = (0xB76D5EED, 0xEE281300, 0x85BCAE01, 0x4B387AF7)

Prf: TypeAlias = Callable[[int, int], int]


def _eff(j: int, r: int) -> int:
    """The round function ``F_j(r)`` (``++eff:ob``): murmur3 of 2 bytes of ``r``."""
    return muk(_RAKU[j], 2, r)


def _fe(r: int, a: int, b: int, prf: Prf, m: int) -> int:
    """One pass of the generalised Feistel cipher (Black & Rogaway 2002, "fe").

    As in hoon.hoon, for an even number of rounds the halves are recombined as
    ``a * left + right``, except when ``right == a`` (urbit/arvo#1105: a legacy
    bug made some inputs collide; the fix keeps every other output unchanged).
    """
    left, right = m % a, m // a
    for j in range(1, r + 1):
        tmp = (left + prf(j - 1, right)) % (a if j % 2 else b)
        left, right = right, tmp
    if r % 2 or right == a:
        return a * right + left
    return a * left + right


def _fen(r: int, a: int, b: int, prf: Prf, m: int) -> int:
    """Inverse of :func:`_fe` (B&R's "fe^-1", with the same legacy adjustment)."""
    ahh, ale = (m // a, m % a) if r % 2 else (m % a, m // a)
    left, right = (ahh, ale) if ale == a else (ale, ahh)
    for j in range(r, 0, -1):
        mod = a if j % 2 else b
        tmp = (right + mod - prf(j - 1, left) % mod) % mod
        left, right = tmp, left
    return a * right + left


def _fee(r: int, a: int, b: int, k: int, prf: Prf, m: int) -> int:
    """B&R's "Fe": a permutation of ``[0, k)`` by cycle-walking :func:`_fe`."""
    c = _fe(r, a, b, prf, m)
    return c if c < k else _fe(r, a, b, prf, c)


def _feen(r: int, a: int, b: int, k: int, prf: Prf, m: int) -> int:
    """Inverse of :func:`_fee`."""
    c = _fen(r, a, b, prf, m)
    return c if c < k else _fen(r, a, b, prf, c)


def _feis(m: int) -> int:
    """``++feis:ob``: the 4-round cipher on ``[0, 0xffff * 0x10000)``."""
    return _fee(4, 0xFFFF, 0x10000, 0xFFFF * 0x10000, _eff, m)


def _tail(m: int) -> int:
    """``++tail:ob``: inverse of :func:`_feis`."""
    return _feen(4, 0xFFFF, 0x10000, 0xFFFF * 0x10000, _eff, m)


def _scramble(cipher: Callable[[int], int], n: int) -> int:
    """Apply ``cipher`` to the planet part of ``n`` (shared by fein and fynd)."""
    if 0x10000 <= n <= 0xFFFFFFFF:
        return 0x10000 + cipher(n - 0x10000)
    if 0x100000000 <= n <= 0xFFFFFFFFFFFFFFFF:
        return (n & 0xFFFFFFFF00000000) | _scramble(cipher, n & 0xFFFFFFFF)
    return n


def fein(n: int) -> int:
    """Conceal the structure of a ship number (``++fein:ob``): permutes planets, and
    the low 32 bits of moons; galaxies, stars and comets are unchanged."""
    _check_atom(n)
    return _scramble(_feis, n)


def fynd(n: int) -> int:
    """Inverse of :func:`fein` (``++fynd:ob``)."""
    _check_atom(n)
    return _scramble(_tail, n)


def patp(n: int) -> str:
    """The @p text of a ship number: ``patp(0) == "~zod"``, ``patp(256) == "~marzod"``.

    Works for any atom (galaxies, stars, planets, moons, comets and beyond); 16-bit
    words are joined by ``-``, and every fourth word boundary by ``--``.
    """
    sxz = fein(n)
    if sxz < 0x100:
        return "~" + SUFFIXES[sxz]
    words: list[str] = []
    i = 0
    while sxz:
        word = sxz & 0xFFFF
        if i:
            words.append("--" if i % 4 == 0 else "-")
        words.append(PREFIXES[word >> 8] + SUFFIXES[word & 0xFF])
        sxz >>= 16
        i += 1
    return "~" + "".join(reversed(words))


def parse_patp(text: str) -> int:
    """The ship number of an @p (inverse of :func:`patp`).

    Only the canonical form is accepted (as :func:`patp` renders it); anything else
    raises ``ValueError``.
    """
    if not isinstance(text, str) or not text.startswith("~"):
        raise ValueError(f"@p must start with '~': {text!r}")
    body = text[1:].replace("-", "")
    if not body or len(body) % 3:
        raise ValueError(f"malformed @p: {text!r}")
    syls = [body[i:i + 3] for i in range(0, len(body), 3)]
    try:
        if len(syls) == 1:
            value = _SUFFIX_INDEX[syls[0]]
        elif len(syls) % 2:
            raise ValueError("odd number of syllables")
        else:
            value = 0
            for i in range(0, len(syls), 2):
                value = (value << 16) | (_PREFIX_INDEX[syls[i]] << 8) | _SUFFIX_INDEX[syls[i + 1]]
    except (KeyError, ValueError) as exc:
        raise ValueError(f"malformed @p {text!r}: {exc}") from exc
    n = fynd(value)
    if patp(n) != text:
        raise ValueError(f"non-canonical @p {text!r} (canonical: {patp(n)})")
    return n
