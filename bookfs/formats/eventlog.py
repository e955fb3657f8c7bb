"""The small interface every on-disk log format offers, so the layers above (the pier, the
FUSE adapter, the CLI) work with any of them.

Implementations: :class:`bookfs.formats.book.Book` (the UIP layout), :class:`bookfs.formats.vere.VereBook`
(vere's two-slot layout), :class:`bookfs.formats.lmdb_log.LmdbLog` (read-only LMDB epochs), and
:class:`bookfs.formats.pier.Pier` (ordered epochs presented as one numbering).

Contract, for every implementation:

* ``gulf()`` is ``(first, last)``, or ``(0, 0)`` when empty; ``count``, ``first``,
  ``last`` and ``in`` agree with it.  Events are contiguous.
* ``read(event)`` returns the payload (mug ++ jam) after whatever integrity check the
  format has; it raises ``NoSuchEvent`` or ``CorruptDeed`` (never returns corrupt bytes).
  ``verify_event`` runs the same check without holding the payload in memory;
  ``read_slice`` returns unchecked bytes and is used only after ``verify_event``.
  ``seal(event)`` is ``verify_event`` that also gives, for a large deed of a format with
  a CRC per deed, its seal: a CRC per block (``seals.py``), so that ``read_sealed`` can
  check each block it reads; None where there is none (then ``read_slice``).  Unless
  ``fresh``, a kept seal that still holds is given without the whole check: the deed's
  bytes must then be read with ``read_sealed`` only (``verify_event`` always checks the
  whole deed).  ``read_sealed`` raises ``SealBroken`` when a block fails, and the caller
  seals again with ``fresh=True``, which checks the whole deed.
* ``payload_size`` and ``mtime_ns`` are cheap (no payload read where the format allows),
  once ``chain_confirmed(event)`` is True.  Until then (a UIP Book opened from its
  persisted index, a hint until the chain of deeds proves it) a read by number first
  walks the chain up to it, up to the whole log once an open; ``confirm_to(event)`` does
  that walk now, for a caller that runs it off its event loop.  A format whose index is
  built from the log itself is always confirmed.
* ``refresh()`` picks up events another process committed and returns how many.  It
  also notices when the log was rewritten under it (shrank, was replaced by a rename, or
  its header or already-published deeds changed: a writer's recovery that cut events and
  re-appended the same numbers) and then rebuilds its view from scratch.
* ``generation`` is an ``int`` that only grows.  It increases whenever events that were
  already published may have changed (a rebuild as above); a caller that caches event
  bytes or sizes (the FUSE layer, the kernel's page cache) must drop them when it sees a
  new value.  Plain appends do not change it.  :class:`~bookfs.formats.pier.Pier`'s is derived
  from its epochs'; an LMDB epoch's stays 0.
* ``save(first, payloads, epoch)`` appends durably or raises and leaves the log as it was
  (``ReadOnly`` for a read-only log or format).
* ``read_meta``/``save_meta``/``meta`` use the keys version, who, fake, life with the
  ``meta.bin`` encodings.
* ``close()`` releases everything (locks included); usable as a context manager.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from bookfs.types import EventNum

if TYPE_CHECKING:
    from bookfs.formats.seals import Seal


@runtime_checkable
class EventLog(Protocol):
    directory: str
    writable: bool
    generation: int

    @property
    def format(self) -> str: ...

    def gulf(self) -> tuple[EventNum, EventNum]: ...

    @property
    def first(self) -> EventNum: ...

    @property
    def last(self) -> EventNum: ...

    @property
    def count(self) -> int: ...

    @property
    def log_bytes(self) -> int: ...

    def __contains__(self, event: int) -> bool: ...

    def payload_size(self, event: int) -> int: ...

    def mtime_ns(self, event: int) -> int: ...

    def read(self, event: int) -> bytes: ...

    def verify_event(self, event: int) -> None: ...

    def read_slice(self, event: int, offset: int, size: int) -> bytes: ...

    def seal(self, event: int, *, fresh: bool = False) -> Seal | None: ...

    def read_sealed(self, event: int, seal: Seal, offset: int, size: int) -> bytes: ...

    def prefetch(self, event: int) -> None: ...

    def chain_confirmed(self, event: int) -> bool: ...

    def confirm_to(self, event: int, ahead: bool = True) -> None: ...

    def walk(self, start: int | None = None, end: int | None = None
             ) -> Iterator[tuple[EventNum, bytes]]: ...

    def refresh(self) -> int: ...

    def save(self, first_event: int, payloads: Iterable[bytes], epoch: int = 0) -> None: ...

    def read_meta(self, key: str) -> bytes: ...

    def save_meta(self, key: str, value: bytes) -> None: ...

    def meta(self) -> dict[str, bytes]: ...

    def close(self) -> None: ...
