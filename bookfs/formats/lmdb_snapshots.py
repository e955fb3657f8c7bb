"""Reading a live LMDB store without its lock file: snapshots whose pages a writer may
recycle, and a map a writer may grow (``lmdb_log.py`` says why bookfs reads outside the
reader table).

**Recycled pages.**  A reader outside the reader table is invisible to the writer, whose
``mdb_find_oldest()`` then answers ``txnid - 1``; ``mdb_page_alloc()`` reuses the pages a
transaction T freed (freeDB record T) once ``T < oldest``, i.e. from transaction T + 2 on
(LMDB ``libraries/liblmdb/mdb.c``, 0.9 and master alike).  The pages a snapshot S reads are
freed at S + 1 at the earliest, so the first transaction that may overwrite them is S + 3,
and it starts writing only after S + 2 committed, which writes S + 2's meta page last
(``mdb_txn_commit()``: data pages, sync, then ``mdb_env_write_meta()``).  So a read that
copies what it needs out of snapshot S and *then* finds the newest meta page at most
S + 1 (``mdb_env_info()`` picks the meta from the map without a lock, as a lock-free read
transaction does) read no recycled byte; otherwise :meth:`Snapshots.read` reads again
in a new transaction (a busy writer commits a batch every few milliseconds; a read takes
microseconds).

**Map growth.**  ``mdb_txn_renew0()`` answers ``MDB_MAP_RESIZED`` when the snapshot's last
page lies beyond this process's map; the documented answer is ``mdb_env_set_mapsize(env,
0)`` (``lmdb.h``), which must not run with a transaction of the environment open in this
process: every transaction is taken under :class:`Gate`'s shared side, a resize under its
exclusive side.
"""

from __future__ import annotations

import contextlib
import threading

from bookfs.errors import BookError

__all__ = ["Gate", "Snapshots", "TRIES"]

#: how often a read whose snapshot a writer may have recycled is tried again
TRIES = 100


class Gate:
    """Transactions of one environment (shared) and a map resize or reopen (alone):
    py-lmdb's ``set_mapsize`` invalidates every open transaction and may move the map,
    so it waits until none is open."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._alone = False

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            while self._alone:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self):
        with self._cond:
            while self._alone or self._shared:
                self._cond.wait()
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()


class Snapshots(Gate):
    """Checked read transactions of the environment ``env()`` (a callable: a store
    opened again after a replacement is another environment) of ``path``."""

    def __init__(self, env, path: str):
        super().__init__()
        self._env = env
        self.path = path

    def newest(self) -> int:
        """The newest meta page's transaction id, read from the map."""
        return self._env().info()["last_txnid"]

    def read(self, use):
        """``(use(txn), txnid)`` from a read transaction, ``use`` copying out whatever it
        keeps: read again while a writer may have recycled the snapshot's pages
        meanwhile, and after adopting a map a writer grew (module docstring)."""
        import lmdb

        for _ in range(TRIES):
            try:
                with self.shared():
                    with self._env().begin(buffers=True) as txn:
                        sid = txn.id()
                        try:
                            got = use(txn)
                        except lmdb.MapResizedError:
                            raise
                        except Exception:  # a recycled page read as garbage: again
                            if self.newest() > sid + 1:
                                continue
                            raise
                    if self.newest() <= sid + 1:
                        return got, sid
            except lmdb.MapResizedError:  # a writer grew the map past ours
                self.resize()
        raise BookError(f"{self.path}: a writer replaced the pages of every snapshot "
                        f"before a read could finish, {TRIES} times")

    def resize(self) -> None:
        """Adopt a writer's larger map (``mdb_env_set_mapsize(env, 0)``), with no
        transaction of this environment open."""
        with self.alone():
            self._env().set_mapsize(0)
