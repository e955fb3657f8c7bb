"""The card builders of ship readahead (``ahead.py``): spawned interpreters, each fed its
jobs down a pipe of its own, whose answers the event loop reads itself.

Why not ``multiprocessing.Pool``: its worker-handler thread counts the results pipe
among the sentinels it waits on (``multiprocessing/pool.py``, ``Pool._get_sentinels()``
and ``Pool._handle_workers()``).  From the moment a builder writes an answer until the
pool's result thread has read it, that pipe stays readable, so the handler thread goes
round its loop (``_maintain_pool()``, a new selector over every worker's sentinel) again
and again, under the GIL the event loop needs.  Over a first-ever ``find`` of 1,000
ships, the pool's three threads took about 0.3 s of CPU, a third of the event loop's own
(``docs/benchmarks.md``).  Here a trio task per builder waits for its pipe to be
readable: no thread, nothing that spins.

* :meth:`Builders.submit` (in the event loop) hands a job, a list of ship paths, to the
  builder with the fewest in flight: one pipe write of a few hundred bytes.  The caller
  keeps at most a few dozen jobs in flight (``ahead.py``: a window of at most 64 ships,
  :data:`~bookfs.fs.fleet.ahead.BATCH` a job), far below a pipe's 64 KiB, so the write
  never waits for a builder.
* ``on_done(paths)`` runs in the event loop for each answer: the paths done.
* A builder that dies (killed, a ``SIGBUS`` from a log cut under it) loses its jobs in
  flight: ``on_lost(n)`` says how many; it is not replaced until the builders are started
  again.  One whose daemon died reads the end of its pipe and exits.
* :meth:`Builders.stop` ends them all: their pipes closed (an idle builder then exits of
  itself), SIGTERM (a builder keeps its default action: a handler raising SystemExit can
  have it swallowed where Python ignores exceptions, and the builder would then wait for
  good), and SIGKILL for one still alive after :data:`STOP_WAIT` seconds; it waits for
  them, never longer than that.  Every save of a builder is an atomic replace, so one
  stopped mid-save leaves the old file or none.

Memory: each builder is a process of its own (about 40 MB while it runs); in the
daemon, a pipe and a task per builder.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import time
from typing import Callable, Sequence

import trio

from bookfs.fs.fleet.builder import serve

log = logging.getLogger(__name__)

STOP_WAIT = 10.0  # seconds the builders have to die of SIGTERM before they are killed


class _Builder:
    __slots__ = ("proc", "conn", "jobs")

    def __init__(self, proc, conn):
        self.proc, self.conn, self.jobs = proc, conn, 0


class Builders:
    """``workers`` builders (module docstring): each runs ``start()`` once, then
    ``job(paths)`` for each job, whose answer goes to ``on_done``.  ``start`` and ``job``
    are module-level functions (or partials of them), as a spawned process needs
    (``ahead.py``: the index cache's set-up and ``build_cards``).  Started, fed and read
    from the event loop; :meth:`stop` may also be called once the loop has ended."""

    def __init__(self, workers: int, start: Callable[[], object], job: Callable,
                 on_done: Callable[[list[str]], None], on_lost: Callable[[int], None]):
        self.workers, self.start_builder, self.job = workers, start, job
        self.on_done, self.on_lost = on_done, on_lost
        self._running: list[_Builder] = []

    @property
    def running(self) -> bool:
        return bool(self._running)

    def start(self) -> None:
        """Spawn the builders (fresh interpreters, not forks of the threaded daemon), and
        a task of the event loop per builder that reads its answers."""
        ctx = multiprocessing.get_context("spawn")
        for _ in range(self.workers):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(theirs, self.start_builder, self.job),
                               daemon=True,
                               name="bookfs card builder")
            try:
                proc.start()
            finally:
                theirs.close()
            builder = _Builder(proc, ours)
            self._running.append(builder)
            trio.lowlevel.spawn_system_task(self._read, builder,
                                            name="card builder answers")

    def submit(self, paths: Sequence[str]) -> None:
        """Hand ``paths`` to the builder with the fewest jobs in flight."""
        builder = min(self._running, key=lambda b: b.jobs)
        builder.conn.send(list(paths))
        builder.jobs += 1

    async def _read(self, builder: _Builder) -> None:
        try:
            fd = builder.conn.fileno()
            while True:
                await trio.lowlevel.wait_readable(fd)
                done = builder.conn.recv()
                builder.jobs -= 1
                self.on_done(done)
        except (trio.ClosedResourceError, OSError):
            return  # stopped: the pipe closed here
        except EOFError:  # the builder died
            if builder in self._running:
                self._running.remove(builder)
                lost, builder.jobs = builder.jobs, 0
                log.warning("ship readahead: a card builder died (exit status %s); "
                            "%d job(s) lost", builder.proc.exitcode, lost)
                self.on_lost(lost)
                builder.conn.close()

    def stop(self) -> None:
        """End every builder (module docstring); a job in flight is abandoned."""
        running, self._running = self._running, []
        for builder in running:
            with contextlib.suppress(RuntimeError, OSError):  # (outside the loop: none)
                trio.lowlevel.notify_closing(builder.conn.fileno())
            builder.conn.close()
            with contextlib.suppress(OSError):
                builder.proc.terminate()
        deadline = time.monotonic() + STOP_WAIT
        for builder in running:
            builder.proc.join(max(0.0, deadline - time.monotonic()))
        for builder in running:
            if builder.proc.is_alive():
                log.warning("ship readahead: a card builder outlived SIGTERM; killing it")
                builder.proc.kill()
                builder.proc.join()
