"""The recovery ladder (``recovery.py``) for a pier: :class:`PierRecovery`, each epoch
through its own format's recovery, then the chain of epochs; and :func:`recovery_for`,
which picks the recovery for any path by :func:`~bookfs.formats.pier.identify` (a pier,
a UIP or vere Book directory, an LMDB epoch). ``bookfs fsck`` goes through it only."""

from __future__ import annotations

import os

from bookfs.errors import ContiguityError, FormatError
from bookfs.formats.lock import WriterLock
from bookfs.formats.pier import (
    EPOC_NAME,
    LOCK_NAME,
    LOG_DIR,
    Pier,
    identify,
)
from bookfs.formats.epochs import list_epochs
from bookfs.formats.reports import CheckReport, Problem
from bookfs.formats.salvage import publish_salvage


class PierRecovery:
    """``check`` walks each epoch through its own format's recovery (LMDB, UIP or vere
    layout, by ``epoc.txt`` and the layout detection) and then the chain of epochs;
    ``repair`` holds the runtime's ``.vere.lock`` (refused while a ship runs) and repairs
    each Book epoch (LMDB epochs are checked only, and the output says so); ``salvage``
    writes ``OUT/0iN/`` for each epoch (with its ``epoc.txt``: 3 for the Book epochs it
    writes, in vere's layout when the epoch was LMDB or vere's)."""

    kind = "pier"
    writes = True

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self.log_dir = os.path.join(self.path, LOG_DIR)

    def _parts(self):
        from bookfs.formats.lmdb_log import is_lmdb_dir
        from bookfs.formats.lmdb_recovery import LmdbRecovery

        names, kinds = list_epochs(self.log_dir)
        meta_from = self.log_dir if is_lmdb_dir(self.log_dir) else None
        out = []
        for (base, name), kind in zip(names, kinds):
            d = os.path.join(self.log_dir, name)
            if kind == "lmdb":
                out.append((name, LmdbRecovery(d, pier_locked=True, meta_from=meta_from)))
            else:
                rec = recovery_for(d, pier_locked=True)
                if rec.kind not in ("uip", "vere"):
                    raise FormatError(f"{d}: epoc.txt says Book, but there is no book.log")
                out.append((name, rec))
        return out

    def size(self) -> int:
        return sum(r.size() for _, r in self._parts())

    def open_log(self) -> "Pier":
        return Pier.open(self.path)

    def check(self, *, mugs: bool = False, progress=None):
        rep = CheckReport(self.log_dir, "pier")
        rep.state = self._parts()
        for name, rec in rep.state:
            part = rec.check(mugs=mugs, progress=progress)
            part.path = f"{name}: {part.path}"
            rep.parts.append(part)
        rep.format = "pier (" + ", ".join(f"{n} {r.kind}" for n, r in rep.state) + ")"
        counted = [p for p in rep.parts if p.events]
        if counted:
            rep.first, rep.last = counted[0].first, counted[-1].last
        rep.events = sum(p.events for p in rep.parts)
        if all(p.clean for p in rep.parts):  # the chain: only meaningful once each opens
            try:
                Pier.open(self.path).close()
            except (ContiguityError, FormatError) as e:
                rep.problems.append(Problem("chain", None, str(e), path=self.log_dir))
        return rep

    def repair(self, report) -> list[str]:
        done = []
        lock = WriterLock(os.path.join(self.path, LOCK_NAME), what="bookfs")
        try:
            for (name, rec), part in zip(report.state, report.parts):
                if part.clean:
                    continue
                if rec.kind == "lmdb":
                    done.append(f"{name}: not repaired: LMDB epochs are not written by "
                                "bookfs (checked only)")
                    continue
                done += [f"{name}: {line}" for line in rec.repair(part)]
        finally:
            lock.release()
        return done

    def salvage(self, report, out: str, *, progress=None) -> dict:
        """Each epoch salvaged by its format (``Recovery.salvage_into``) into
        ``OUT/0iN/``, with what each left out (``0iN/salvage-left-out.bin``, listed under
        ``left_out`` with its epoch), the whole built beside ``OUT`` and published by one
        rename (:func:`bookfs.formats.salvage.publish_salvage`)."""
        return publish_salvage(self.path, out, lambda root: self._salvage_into(
            report, root, progress=progress))

    def _salvage_into(self, report, out: str, *, progress=None) -> dict:
        epochs, gaps, left_out = {}, [], []
        for (name, rec), part in zip(report.state, report.parts):
            target = os.path.join(out, name)
            os.mkdir(target)
            res = rec.salvage_into(part, target, progress=progress)
            if res.get("layout") == "vere":  # never epoc.txt 3 beside a UIP-layout log
                with open(os.path.join(target, EPOC_NAME), "w") as f:
                    f.write("3")
            epochs[name] = {k: res.get(k) for k in ("recovered", "first", "last", "layout",
                                                    "past_committed_end") if k in res}
            gaps += [{"epoch": name, **g} for g in res["gaps"]]
            left_out += [{"epoch": name, **r, "file": os.path.join(name, r["file"])}
                         for r in res.get("left_out", [])]
        return {"source": self.log_dir, "out": os.path.abspath(out),
                "recovered": sum(e["recovered"] for e in epochs.values()),
                "past_committed_end": sum(e.get("past_committed_end", 0)
                                          for e in epochs.values()),
                "epochs": epochs, "gaps": gaps, "left_out": left_out}


def recovery_for(path: str | os.PathLike, *, pier_locked: bool = False):
    """The format's :class:`~bookfs.formats.recovery.Recovery` (check → repair → salvage) for
    ``path``, chosen by :func:`identify`, the detection :func:`open_source` uses.  An
    unknown or mismatched layout raises :class:`FormatError` before anything is read as a
    log."""
    kind, p = identify(path)
    if kind == "pier":
        return PierRecovery(p)
    if kind == "uip":
        from bookfs.formats.book_recovery import BookRecovery

        return BookRecovery(p, pier_locked=pier_locked)
    if kind == "vere":
        from bookfs.formats.vere_recovery import VereRecovery

        return VereRecovery(p, pier_locked=pier_locked)
    from bookfs.formats.lmdb_recovery import LmdbRecovery

    return LmdbRecovery(p, pier_locked=pier_locked)
