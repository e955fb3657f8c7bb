"""The recovery ladder (``recovery.py``) for LMDB epochs: :class:`LmdbRecovery` (check
and salvage; bookfs never writes LMDB, so it never repairs one)."""

from __future__ import annotations

import os

from bookfs.errors import BookError, ReadOnly
from bookfs.formats import nouncheck, recovery, reports
from bookfs.formats.lmdb_log import DATA_NAME, LmdbLog
from bookfs.formats.salvage import LeftOut, SalvageBatch


class LmdbRecovery(recovery.Recovery):
    """``check`` reads an LMDB epoch through :class:`LmdbLog` (contiguous keys from
    ``N + 1``, ``MDB_INTEGERKEY``, every value readable; optionally every event
    decode-checked).  bookfs never writes LMDB, so ``repair`` refuses (:class:`ReadOnly`).
    ``salvage`` copies every event that reads into a new vere-layout Book log with the
    same epoch base."""

    kind = "lmdb"
    writes = False

    def __init__(self, path: str, *, pier_locked: bool = False, meta_from: str | None = None):
        super().__init__(path, pier_locked=pier_locked)
        self.meta_from = meta_from

    def size(self) -> int:
        return os.path.getsize(os.path.join(self.path, DATA_NAME))

    def open_log(self) -> LmdbLog:
        return LmdbLog.open(self.path, meta_from=self.meta_from)

    def check(self, *, mugs: bool = False, progress=None) -> reports.CheckReport:
        with self.open_log() as lg:
            rep = reports.CheckReport(lg.data_path, lg.format)
            for event, _ in lg.verify(progress=progress):
                rep.problems.append(reports.Problem(
                    "read", None, f"event {event} cannot be read from EVENTS; the events "
                    "after it were not checked", event=event, path=lg.data_path))
            rep.first, rep.last = lg.gulf()
            rep.events = lg.count
            if mugs:
                nouncheck.check_nouns(lg, rep, bob_dir=self.bob_dir, progress=progress)
        return rep

    def repair(self, report: reports.CheckReport) -> list[str]:
        raise ReadOnly(f"{os.path.join(self.path, DATA_NAME)}: LMDB epochs are not written "
                       "by bookfs, so fsck checks them but never repairs them (copy the "
                       "readable events with --salvage OUT, or convert with bookfs migrate)")

    def salvage_into(self, report: reports.CheckReport, out: str, *, progress=None) -> dict:
        """Every event that reads, in key order, into a new vere-layout log in ``out`` with
        the epoch base.  A value under 4 bytes is no event bookfs writes: it is kept in
        ``salvage-left-out.bin`` and recorded (a gap of one event), never copied as one."""
        import lmdb

        from bookfs.formats.vere import VereBook

        with self.open_log() as lg:
            base = lg.base if lg.base is not None else (lg.first - 1 if lg.count else 0)
            lost = None
            gaps: list[dict] = []
            with VereBook.open(out, writable=True, create=True, epoch=base) as dst, \
                    LeftOut(out) as left:
                for key, value in lg.meta().items():
                    dst.save_meta(key, value)
                batch = SalvageBatch(dst, base + 1, epoch=base, left_out=left, gaps=gaps)
                try:
                    for event, value in lg.iter_buffers():
                        batch.add(bytes(value), original_event=event)
                        if progress is not None:
                            progress(len(value))
                except (lmdb.Error, BookError) as e:
                    lost = f"reading stopped after event {batch.next_event - 1}: {e}"
                batch.flush()
                if lost is not None:
                    gaps.append({"after_new_event": batch.next_event - 1,
                                 "events_lost": "unknown", "why": lost})
                result = {"source": lg.data_path, "out": os.path.abspath(out),
                          "layout": "vere", "recovered": dst.count, "first": dst.first,
                          "last": dst.last, "gaps": gaps, "left_out": left.records}
        return result
