"""The recovery ladder (``recovery.py``) for vere's layout: :class:`VereRecovery`.

``check`` goes through :class:`~bookfs.formats.vere.VereBook` itself (the recovery rule a
mount applies), ``repair`` does what a writable open does and rebuilds a short header
region, ``salvage`` copies the committed events (and, past damage, those a header's batch
CRC vouches for) into a new vere-layout log.  The scans only it uses are here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bookfs.formats import quarantine, recovery, reports
from bookfs.formats.deeds import VERE
from bookfs.formats.fileio import open_regular
from bookfs.formats.index import OffsetIndex
from bookfs.formats.layout import (
    META_NAME,
    META_SIZE,
    MIN_PAYLOAD,
    VERE_DEEDS_START,
    VERE_SLOT_OFFSETS,
    VERE_SLOT_SIZE,
)
from bookfs.formats.salvage import (
    DAMAGED,
    LEFT_OUT_NAME,
    NOT_COMMITTED,
    LeftOut,
    SalvageBatch,
)
from bookfs.formats.vere import VereBook
from bookfs.formats.vere_deeds import (
    crc_range,
    find_framed_deed,
    is_torn_vere_tail,
)
from bookfs.formats.vere_header import Slot, parse_slot


def short_payloads(b: VereBook) -> list[tuple[int, int, int]]:
    """``(event, offset, size)`` of each committed event of ``b`` whose payload is under
    4 bytes (vere's API can write one; bookfs never does)."""
    import numpy as np

    first, count, end = b._view[:3]
    if not count:
        return []
    offs = np.frombuffer(b._index.offsets, dtype=np.uint64)[:count].astype(np.int64)
    sizes = VERE.payload_size(offs, np.append(offs[1:], end))
    return [(first + int(i), int(offs[i]), int(sizes[i]))
            for i in np.nonzero(sizes < MIN_PAYLOAD)[0]]


@dataclass
class VereFindings:
    """What :meth:`VereRecovery.check` found beyond the problem list."""

    short: bool = False  # under the 8192-byte header region
    fir: int = 0
    las: int = 0  # the best valid slot's las_d
    meta_missing: bool = False


class VereRecovery(recovery.BookDirRecovery):
    """``check``/``repair``/``salvage`` for a vere-layout Book directory, through
    :class:`VereBook` itself (the same recovery rule the mount applies).

    * ``check`` opens the log read-only (which changes nothing) and reports: damaged or
      missing header slots, a batch rolled back, bytes past the committed end (a torn tail
      or quarantine-worthy), every committed deed whose framing fails, the newest batch's
      CRC, a file under 8192 bytes, ``meta.bin``; optionally every mug (vere deeds carry
      no CRC, so the mug is the only check of an older payload).
    * ``repair`` pads a short file's header region (quarantining any bytes there), then
      does what a writable open does: roll back an unacknowledged batch and cut a torn
      tail, quarantining anything that may hold events first, and rewrite a header slot.
      It says each thing it did.
    * ``salvage`` copies the committed events (past damage: up to the end of a batch
      whose CRC a valid slot holds, found by trying every byte offset) into a new
      vere-layout log with the same epoch base; what was never committed, damaged bytes
      and payloads under 4 bytes are kept aside in ``salvage-left-out.bin``, never as
      events.  A log whose committed events include a 0-byte payload is checked and
      salvaged as the reference reads it; its repair is refused (:class:`EmptyPayload`).
    """

    kind = "vere"
    engine = VereBook

    def size(self) -> int:
        return os.path.getsize(self.log_path)

    def check(self, *, mugs: bool = False, progress=None) -> reports.CheckReport:
        P = reports.Problem
        path = self.log_path
        rep = reports.CheckReport(path, "vere-book (two-slot layout)")
        st = rep.state = VereFindings()
        size = os.path.getsize(path)
        st.meta_missing = recovery.check_meta_file(self.path, rep)
        if size < VERE_DEEDS_START:
            st.short = True
            rep.problems.append(P("header", size, f"{size} bytes, under the "
                                  f"{VERE_DEEDS_START}-byte header region (a writable open "
                                  "refuses it)"))
            rep.repairs.append(f"pad the header region to {VERE_DEEDS_START} bytes")
        with VereBook.open(self.path, empty_payloads=True) as b:
            r = b.recovery
            st.fir = b.epoch
            best = max((s for s in b._slots if s), key=lambda s: (s.seq, -s.which))
            st.las = best.las
            for why in r.bad_slots:
                rep.problems.append(P("slot", None, f"header {why}"))
            if r.bad_slots and not st.short:
                rep.repairs.append("rewrite the damaged header slot")
            if r.rolled_back is not None:
                lo, hi = r.rolled_back
                rep.problems.append(P("rollback", None, f"events {lo}..{hi} that slot "
                                      f"{best.name} names are not all on disk: " +
                                      "; ".join(r.notes), event=lo))
                rep.repairs.append(f"roll back events {lo}..{hi} (quarantining their bytes)")
            if r.bad_region is not None:
                off, n = r.bad_region
                torn = (r.rolled_back is None
                        and is_torn_vere_tail(b.fileno(), off, off + n))
                if torn:
                    rep.problems.append(P("torn-tail", off, f"{n} bytes at offset {off} are "
                                          "an incomplete final deed no header committed"))
                    rep.repairs.append(f"cut the torn tail at offset {off}")
                else:
                    rep.problems.append(P("garbage", off, f"{n} bytes at offset {off} are "
                                          "not committed deeds (they may hold events)"))
                    rep.repairs.append(f"quarantine {n} bytes at offset {off}, then cut them")
            for event, off in b.verify(progress=progress):
                rep.problems.append(P("framing", off, f"the deed of event {event} at offset "
                                      f"{off} fails its framing or batch CRC check",
                                      event=event))
            for event, off, n in short_payloads(b):
                rep.problems.append(P("payload", off, f"event {event} at offset {off} has a "
                                      f"{n}-byte payload, under a 4-byte mug" +
                                      (" (bookfs refuses to open a log with a 0-byte one)"
                                       if n == 0 else "") + "; --salvage OUT keeps it aside, "
                                      "not as an event", event=event))
            rep.first, rep.last = b.gulf()
            rep.events = b.count
        return self._finish_check(rep, mugs, progress)

    def repair(self, report: reports.CheckReport) -> list[str]:
        st: VereFindings = report.state
        done = []
        with self._repairing():
            if st.short:
                done += self._rebuild_short_header(st.fir)
            if st.meta_missing:
                made = recovery.create_meta_file(self.path)
                if made:
                    done.append(made)
            with VereBook.open(self.path, writable=True, lock=False) as b:
                r = b.recovery
                if r.rolled_back is not None:
                    done.append(f"rolled back events {r.rolled_back[0]}..{r.rolled_back[1]} "
                                "(their batch was never acknowledged, or does not frame)")
                if r.torn_tail is not None:
                    done.append(f"cut the torn tail of {r.torn_tail[1]} bytes at offset "
                                f"{r.torn_tail[0]}")
                for qpath, off, n in r.quarantined:
                    done.append(f"copied {n} bytes at offset {off} to {qpath}, then cut them")
                if r.header_repaired is not None:
                    done.append(f"rewrote header slot {r.header_repaired} (las_d {b.las_d})")
                elif r.bad_slots and not st.short:
                    done += self._rewrite_bad_slot(b)
        return done

    def _rebuild_short_header(self, fir: int) -> list[str]:
        """A file under 8192 bytes: no deed can be in it.  Copy any bytes past slot A
        that are not zero to quarantine, then write the 8192-byte header region with both
        slots saying ``fir_d = las_d = fir`` and a ``seq_d`` above every valid slot's."""
        done = []
        fd = open_regular(self.log_path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            raw = os.pread(fd, size, 0)
            seq = max([s.seq for s in (parse_slot(raw[o:o + VERE_SLOT_SIZE], w)[0]
                                       for w, o in enumerate(VERE_SLOT_OFFSETS)) if s] + [0])
            if any(raw[VERE_SLOT_SIZE:]):
                q = quarantine.quarantine(self.path, fd, VERE_SLOT_SIZE, size)
                done.append(f"copied {size - VERE_SLOT_SIZE} bytes at offset "
                            f"{VERE_SLOT_SIZE} to {q}")
            buf = bytearray(VERE_DEEDS_START)
            for which, off in enumerate(VERE_SLOT_OFFSETS):
                buf[off : off + VERE_SLOT_SIZE] = Slot(which, fir, fir, seq + 1, 0, 0).pack()
            os.pwrite(fd, bytes(buf), 0)
            os.ftruncate(fd, VERE_DEEDS_START)
            os.fsync(fd)
        finally:
            os.close(fd)
        done.append(f"grew {self.log_path} from {size} to {VERE_DEEDS_START} bytes: the "
                    f"header region, both slots saying epoch {fir} with no events")
        return done

    @staticmethod
    def _rewrite_bad_slot(b: VereBook) -> list[str]:
        """A damaged slot the recovery did not need to rewrite (the other one holds the
        state): write the committed state into it, so both slots are valid again."""
        active = b._active
        bad = [w for w, s in enumerate(b._slots) if s is None]
        if active is None or not bad:
            return []
        target = bad[0]
        new = Slot(target, active.fir, active.las, active.seq - 1 if active.seq else 0,
                   active.bat, active.sum)
        if target == 0 and new.seq == active.seq:  # pragma: no cover - seq 0 tie: A wins
            return []
        os.pwrite(b.fileno(), new.pack(), new.offset)
        os.fdatasync(b.fileno())
        return [f"rewrote damaged header slot {new.name} with the committed state "
                f"(las_d {new.las}, seq_d {new.seq}) below slot {active.name}'s"]

    def salvage_into(self, report: reports.CheckReport, out: str, *, progress=None) -> dict:
        """Copy the committed events into a new vere-layout log in ``out`` (epoch base
        ``fir_d``), and keep every other byte past the header region aside.

        * The events are those the recovery rule keeps (:meth:`VereBook._committed_count`,
          what a mount serves), read as the reference reads them (a 0-byte payload the
          batch CRC vouches for is committed, and then, like every payload under 4
          bytes, kept aside and recorded as a gap of one event).
        * When damage breaks the framing inside acknowledged events, the deeds past it are
          found by trying every byte offset, and those up to the end of a batch whose CRC
          equals a valid header slot's ``sum`` are committed: they are copied, numbered on
          from the last event before the damage (the report lists the gaps).
        * Everything else is never an event of the new log: deeds past the committed end
          (a batch rolled back because its CRC fails or it is cut, deeds no header
          commits), the damaged bytes, and payloads under 4 bytes go byte for byte to
          ``salvage-left-out.bin``; ``past_committed_end`` counts the framed deeds past
          the committed end.  vere deeds carry no CRC, so check the payloads with
          ``bookfs verify --nouns``."""
        from bookfs.formats.layout import META_FIELDS

        gaps: list[dict] = []
        fd = open_regular(self.log_path, os.O_RDONLY, follow=True)
        try:
            size = os.fstat(fd).st_size
            with VereBook.open(self.path, empty_payloads=True) as src:
                fir, count, end = src.epoch, src.count, src._view[2]
                committed = src._index.offsets[:count]
                slots = [x for x in src._slots if x]
                rolled_back = src.recovery.rolled_back
            best = max(slots, key=lambda x: (x.seq, -x.which))
            acked = best.las - fir - (best.bat if rolled_back else 0)
            with VereBook.open(out, writable=True, create=True, epoch=fir) as dst, \
                    LeftOut(out) as left:
                try:
                    with open(os.path.join(self.path, META_NAME), "rb") as f:
                        raw = f.read(META_SIZE + 1)
                except FileNotFoundError:
                    raw = b""
                if len(raw) == META_SIZE:
                    for key, (o, n) in META_FIELDS.items():
                        dst.save_meta(key, raw[o : o + n])
                batch = SalvageBatch(dst, fir + 1, epoch=fir, left_out=left, gaps=gaps)
                for i, off in enumerate(committed):
                    nxt = committed[i + 1] if i + 1 < count else end
                    batch.add(VERE.payload_at(fd, off, VERE.payload_size(off, nxt)),
                              offset=off, original_event=fir + 1 + i)
                    if progress is not None:
                        progress(nxt - off)
                pos, why = end, None
                if count < acked:  # damage inside acknowledged events, not a crash
                    pos, why = self._salvage_past_damage(fd, size, end, fir, slots, batch,
                                                         left, progress)
                past = 0
                if pos < size:
                    past = _count_framed(fd, pos, size)
                    if why is None:
                        why = (f"past the committed end (event {fir + count}): " +
                               (f"events {rolled_back[0]}..{rolled_back[1]} that slot "
                                f"{best.name} names fail their batch CRC or are cut, so "
                                "that save was never acknowledged (the reference rolls it "
                                "back too)" if rolled_back and count == acked else
                                "no valid header slot commits these bytes"))
                    left.copy(fd, pos, size - pos, kind=NOT_COMMITTED, why=why,
                              deeds=past)
                batch.flush()
                result = {
                    "source": self.log_path, "out": os.path.abspath(out), "layout": "vere",
                    "recovered": dst.count, "first": dst.first, "last": dst.last,
                    "past_committed_end": past, "gaps": gaps, "left_out": left.records,
                    "note": ("the committed events, numbered from the epoch base "
                             f"{fir}; deeds that were never committed are only in "
                             f"{LEFT_OUT_NAME}; vere deeds carry no CRC, so check "
                             "the payloads with `bookfs verify --nouns`"),
                }
        finally:
            os.close(fd)
        return result

    #: bytes of CRC computed while looking for a header's batch past damage, at least
    _COMMIT_SEARCH_BYTES = 64 << 20

    def _salvage_past_damage(self, fd: int, size: int, pos: int, fir: int, slots: list,
                             batch, left, progress) -> tuple[int, str]:
        """Damage at ``pos`` inside acknowledged events: find every framed deed after it
        (trying every byte offset past each break), then the last point where a valid
        slot's batch (its ``bat`` deeds, contiguous) has the CRC ``sum``, newest slot
        first: the deeds up to there are committed and added to ``batch``, each break
        before them recorded as a gap and its bytes copied to ``left``.  The search stops
        after CRCs over twice the bytes past ``pos`` (at least 64 MiB).  Returns where the
        committed deeds end and why the bytes after that are not committed."""
        before = batch.next_event - 1 - fir + batch.skipped
        runs: list[list[tuple[int, int]]] = []  # runs of contiguous framed deeds (off, len)
        breaks: list[tuple[int, int]] = []  # (offset, bytes) before each run
        at = pos
        while at < size:
            resume = find_framed_deed(fd, at + 1, size)
            if resume is None:
                break
            ix = OffsetIndex(first=1, end=resume)
            stop = VERE.scan(fd, ix, size)
            ends = list(ix.offsets[1:]) + [stop]
            breaks.append((at, resume - at))
            runs.append([(o, VERE.payload_size(o, e)) for o, e in zip(ix.offsets, ends)])
            at = stop
        deeds = [(r, d) for r, run in enumerate(runs) for d in run]
        found = None
        budget = max(self._COMMIT_SEARCH_BYTES, 2 * (size - pos))
        for c in sorted(slots, key=lambda x: (-x.seq, x.which)):
            for j in range(len(deeds) - 1, c.bat - 2 if c.bat else len(deeds), -1):
                window = deeds[j - c.bat + 1 : j + 1]
                if window[0][0] != window[-1][0]:
                    continue  # a batch never spans a break
                lo = window[0][1][0]
                hi = window[-1][1][0] + VERE.size(window[-1][1][1])
                budget -= hi - lo
                if budget < 0:
                    break
                if crc_range(fd, lo, hi) == c.sum:
                    found = (j, c)
                    break
            if found is not None or budget < 0:
                break
        if found is None:
            return pos, (f"past damage at offset {pos} inside acknowledged events: no "
                         "valid header slot's batch CRC matches the deeds after it, so "
                         "none of them can be shown committed")
        j, c = found
        kept, done, end, used = j + 1, 0, pos, []
        for r, run in enumerate(runs):
            if done >= kept:
                break
            off, n = breaks[r]
            used.append({"offset": off, "bytes": n, "after_new_event": batch.next_event - 1,
                         "events_lost": "unknown"})
            batch.gaps.append(used[-1])
            left.copy(fd, off, n, kind=DAMAGED,
                      why="bytes inside acknowledged events that do not frame a deed")
            take = run[: kept - done]
            for o, m in take:
                batch.add(VERE.payload_at(fd, o, m), offset=o)
                end = o + VERE.size(m)
                if progress is not None:
                    progress(VERE.size(m))
            done += len(take)
        if len(used) == 1:  # one break: slot c says how many events it lost
            used[0]["events_lost"] = c.las - fir - before - kept
        return end, (f"past the committed end: slot {c.name}'s batch (up to event "
                     f"{c.las}) ends at offset {end} and its CRC holds; no newer valid "
                     "slot's batch matches the deeds after it")


def _count_framed(fd: int, pos: int, size: int) -> int:
    """How many deeds with sound framing lie in ``[pos, size)``, trying every byte offset
    past each break (a count for the salvage report)."""
    n = 0
    at = pos
    while at < size:
        ix = OffsetIndex(first=1, end=at)
        stop = VERE.scan(fd, ix, size)
        n += ix.count
        if stop >= size:
            break
        nxt = find_framed_deed(fd, stop + 1, size)
        if nxt is None:
            break
        at = nxt
    return n
