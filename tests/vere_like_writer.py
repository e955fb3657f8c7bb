"""A writer that writes a pier's LMDB event log the way vere does, for live-reader tests
(``tests/test_live_lmdb.py``, issue 32).  Run as its own process::

    python tests/vere_like_writer.py PIER --seed S --seconds T [--batch-max B]
        [--roll-every R] [--map-size BYTES] [--grow BYTES] [--pause-max SECONDS]
        [--out FILE]

What it copies from vere (urbit/vere ``pkg/vere/db/lmdb.c``, ``pkg/vere/disk.c``, develop):

* ``<pier>/.vere.lock`` held with a classic ``fcntl`` record lock (``F_SETLK``, ``F_WRLCK``
  on byte 0, as ``_disk_acquire()`` takes it) and its PID written there (``"%u\\n"``),
  for the whole run;
* each epoch's environment opened as ``u3_lmdb_init()`` opens it: ``mdb_env_open`` flags 0
  (the binding's defaults: sync on, meta sync on, no ``MDB_WRITEMAP``), mode 0664, two
  databases;
* one write transaction per batch (``u3_lmdb_save()``): ``EVENTS`` opened in it with
  ``MDB_CREATE | MDB_INTEGERKEY``, each event put with ``MDB_NOOVERWRITE`` under its number
  as 8 bytes little-endian, one commit; a batch counts as written once the commit returned;
* a roll (``_disk_epoc_roll()``): at a batch boundary, ``.urb/log/0i<last>/`` made (0700),
  ``epoc.txt`` ("2") and ``vere.txt`` written through a temporary file and renamed, the
  old environment closed, the new one opened, its ``META`` written one transaction per key
  (``u3_disk_save_meta()``); its first batch then creates ``EVENTS``.

Unlike vere, which maps 1 TiB and never grows its map, it starts with a small map
(``--map-size``, default 256 KiB) and grows it by ``--grow`` bytes (``mdb_env_set_mapsize``)
each time a batch meets ``MDB_MAP_FULL`` (the batch's transaction is aborted and the whole
batch written again in a new one), so that readers meet a map that grows under them.

Everything it writes follows from ``--seed``: the batch sizes, the pauses between batches,
each event's payload (:func:`payload`, which the test uses to check every byte read), and
so where it rolls and where the map fills up.  Only how many batches fit in ``--seconds``
depends on the machine.  It stops after ``--seconds`` (or on SIGTERM/SIGINT) at a batch
boundary.

It reports one JSON object a line (to ``--out``, else stdout; flushed each line):
``{"kind": "start", ...}``, then ``{"kind": "batch", "first": A, "last": B, "epoch": N,
"t": time}`` for each batch once its commit returned (``t``: ``time.time()`` then),
``{"kind": "grow", ...}``, ``{"kind": "roll", ...}``, and at the end ``{"kind": "done",
"events": ..., "batches": ..., "growths": ..., "rolls": ..., "last": ...}``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import re
import signal
import struct
import sys
import time

import lmdb

from bookfs.formats.fileio import fsync_dir

KEY = struct.Struct("<Q")
EPOCH_NAME = re.compile(r"0i(\d+)")
#: META as vere writes it in a new epoch (``u3_disk_save_meta``: version, who, fake, life)
META = {
    b"version": struct.pack("<I", 3),
    b"who": (0x100).to_bytes(16, "little"),
    b"fake": bytes([1]),
    b"life": struct.pack("<I", 17),
}


def payload_size(seed: int, event: int) -> int:
    """The size of ``event``'s payload: mostly small, some spanning pages, a few of tens of
    KiB (LMDB overflow pages: many pages freed and reused per commit)."""
    r = random.Random(f"{seed}/size/{event}")
    x = r.random()
    if x < 0.60:
        return r.randrange(5, 400)
    if x < 0.90:
        return r.randrange(400, 8000)
    return r.randrange(8000, 40000)


def payload(seed: int, event: int) -> bytes:
    """``event``'s payload for ``seed``: ``mug ++ jam`` of an atom (a valid event, as vere
    stores it), :func:`payload_size` bytes, the same on every run."""
    from mounting import noun_payload

    size = payload_size(seed, event)
    data = random.Random(f"{seed}/data/{event}").randbytes(size)
    return noun_payload(data)


def hold_vere_lock(pier: str) -> int:
    """``<pier>/.vere.lock`` locked as vere's ``_disk_acquire()`` locks it (a classic
    fcntl lock, F_WRLCK on byte 0) with this PID in it; the descriptor, kept open."""
    fd = os.open(os.path.join(pier, ".vere.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    os.fsync(fd)
    return fd


def newest_epoch(log_dir: str) -> tuple[int, str]:
    epochs = sorted((int(m.group(1)), name) for name in os.listdir(log_dir)
                    if (m := EPOCH_NAME.fullmatch(name)))
    return epochs[-1]




def write_file(directory: str, name: str, text: str) -> None:
    """``name`` written as vere writes ``epoc.txt``: a ``.tmp`` file, synced, renamed."""
    tmp = os.path.join(directory, name.replace(".txt", ".tmp"))
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(directory, name))


class Writer:
    def __init__(self, pier: str, args, report):
        self.pier = pier
        self.log_dir = os.path.join(pier, ".urb", "log")
        self.args = args
        self.report = report
        self.map_size = args.map_size
        self.growths = self.rolls = self.batches = self.events = 0
        self.env = None
        self.base, name = newest_epoch(self.log_dir)
        self.open_env(os.path.join(self.log_dir, name))
        self.last = self.last_event()
        self.in_epoch = self.last - self.base

    def open_env(self, directory: str) -> None:
        """``u3_lmdb_init()``: flags 0 (sync on), mode 0664, two databases; the map as small
        as ``map_size`` allows (LMDB raises it to what the file already uses)."""
        self.env = lmdb.open(directory, map_size=self.map_size, max_dbs=2, subdir=True,
                             mode=0o664)
        self.map_size = self.env.info()["map_size"]

    def last_event(self) -> int:
        with self.env.begin() as txn:
            try:
                db = self.env.open_db(b"EVENTS", txn=txn, integerkey=True, create=False)
            except lmdb.NotFoundError:
                return self.base
            cur = txn.cursor(db=db)
            return KEY.unpack(cur.key())[0] if cur.last() else self.base

    def grow(self) -> None:
        self.map_size += self.args.grow
        self.env.set_mapsize(self.map_size)
        self.growths += 1
        self.report(kind="grow", map_size=self.map_size, at=self.last,
                    epoch=self.base, t=time.time())

    def save(self, payloads: list[bytes]) -> None:
        """``u3_lmdb_save()``: one write transaction for the batch; grown and done again
        when the map is full."""
        first = self.last + 1
        while True:
            txn = self.env.begin(write=True)
            try:
                db = self.env.open_db(b"EVENTS", txn=txn, integerkey=True, create=True)
                for k, value in enumerate(payloads):
                    if not txn.put(KEY.pack(first + k), value, db=db, overwrite=False):
                        raise SystemExit(f"event {first + k} is already in the store")
                txn.commit()
                return
            except lmdb.MapFullError:
                txn.abort()
                self.grow()
            except BaseException:
                txn.abort()
                raise

    def save_meta(self) -> None:
        """``u3_disk_save_meta()``: one transaction per key, into the epoch's own META."""
        for key, value in META.items():
            while True:
                try:
                    with self.env.begin(write=True) as txn:
                        db = self.env.open_db(b"META", txn=txn, create=True)
                        txn.put(key, value, db=db)
                    break
                except lmdb.MapFullError:
                    self.grow()

    def roll(self) -> None:
        """``_disk_epoc_roll()`` at ``last``: a new epoch ``0i<last>`` written on from now."""
        name = f"0i{self.last}"
        d = os.path.join(self.log_dir, name)
        os.mkdir(d, 0o700)
        fsync_dir(d)
        write_file(d, "epoc.txt", "2")
        write_file(d, "vere.txt", "3.2")
        fsync_dir(d)
        self.env.close()
        self.map_size = self.args.map_size
        self.open_env(d)
        self.save_meta()
        fsync_dir(d)
        fsync_dir(self.log_dir)
        self.base, self.in_epoch = self.last, 0
        self.rolls += 1
        self.report(kind="roll", epoch=name, at=self.last, t=time.time())

    def run(self, stop) -> None:
        rng = random.Random(f"{self.args.seed}/batches")
        deadline = time.monotonic() + self.args.seconds
        # the deadline, but never fewer than --min-events (a loaded machine writes less in
        # the same seconds, and what must be met, a roll, a map growth, must still be)
        while not stop() and (time.monotonic() < deadline
                              or self.events < self.args.min_events):
            if self.args.roll_every and self.in_epoch >= self.args.roll_every:
                self.roll()
            count = rng.randint(1, self.args.batch_max)
            pause = rng.uniform(0, self.args.pause_max)
            first = self.last + 1
            self.save([payload(self.args.seed, n) for n in range(first, first + count)])
            t = time.time()
            self.last += count
            self.in_epoch += count
            self.events += count
            self.batches += 1
            self.report(kind="batch", first=first, last=self.last, epoch=self.base, t=t)
            if pause:
                time.sleep(pause)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pier")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--batch-max", type=int, default=24)
    p.add_argument("--roll-every", type=int, default=0, help="events per epoch (0: never)")
    p.add_argument("--min-events", type=int, default=0,
                   help="write on past --seconds until this many events")
    p.add_argument("--map-size", type=int, default=256 << 10)
    p.add_argument("--grow", type=int, default=256 << 10)
    p.add_argument("--pause-max", type=float, default=0.004)
    p.add_argument("--out")
    a = p.parse_args(argv)
    out = open(a.out, "a") if a.out else sys.stdout

    def report(**fields) -> None:
        out.write(json.dumps(fields) + "\n")
        out.flush()

    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(1))
    lock_fd = hold_vere_lock(a.pier)
    w = Writer(a.pier, a, report)
    report(kind="start", pid=os.getpid(), seed=a.seed, first=w.last + 1, epoch=w.base,
           map_size=w.map_size, t=time.time())
    try:
        w.run(lambda: bool(stopping))
    finally:
        w.close()
        report(kind="done", events=w.events, batches=w.batches, growths=w.growths,
               rolls=w.rolls, last=w.last, t=time.time())
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
