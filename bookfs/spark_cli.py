"""``bookfs spark MOUNTPOINT --out DIR``: the events of a mount as Parquet.

Output layout (under ``--out``)::

    data/run=<first event, 12 digits>/event_bucket=<event // 100000>/part-*.parquet
    data/run=.../_bookfs_run.json     what the run holds: first, last, events
    state.json                         {"high_water": last event published, ...}
    _staging/                          a run being written (discarded when found)

``spark.read.parquet(OUT + "/data")`` reads every run (``run`` and ``event_bucket`` become
columns).  Each run is written to ``_staging/run=<first>``, published by one ``rename``
into ``data/``, and only then is the high-water mark recorded in ``state.json`` (temp
file + rename).  A run is named after the first event it may hold (the mark + 1), so:

* killed before the rename: the staging directory is discarded on restart and the run
  redone from the recorded mark;
* killed after the rename, before the mark: ``data/run=<mark+1>`` already exists, its
  ``_bookfs_run.json`` says what it holds, and the restart records that mark (roll
  forward) instead of writing it again.

Either way no event is duplicated or skipped.  A lock file (``.lock``, ``flock``) keeps two
runs on one ``--out`` apart.  Without ``--incremental`` the whole ``data/`` is replaced
(again staged and renamed into place).

Failure injection for tests: ``BOOKFS_SPARK_FAIL=staged`` exits (status 75) after the
staging directory is complete, ``BOOKFS_SPARK_FAIL=published`` after the rename and before
the mark is recorded (in-process, :func:`run` raises :class:`InjectedFailure` there).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import threading
import time

BUCKET = 100_000
FAIL_ENV = "BOOKFS_SPARK_FAIL"


def _status(msg: str) -> None:
    print(f"bookfs spark: {msg}", file=sys.stderr, flush=True)


class InjectedFailure(BaseException):
    """Raised at the point ``$BOOKFS_SPARK_FAIL`` names (the command exits with 75)."""


def _fail_point(name: str) -> None:
    if os.environ.get(FAIL_ENV) == name:
        _status(f"{FAIL_ENV}={name}: stopping here on purpose")
        raise InjectedFailure(name)


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_state(out: str) -> dict:
    try:
        with open(os.path.join(out, "state.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _recover(out: str, state: dict) -> dict:
    """Finish or discard what a killed run left behind; return the state to go on from."""
    staging = os.path.join(out, "_staging")
    old, data = os.path.join(staging, "old"), os.path.join(out, "data")
    if os.path.isdir(old) and not os.path.exists(data):  # killed between the two renames
        _status("putting back the data/ an interrupted run had moved aside")
        os.rename(old, data)
        _fsync_dir(out)
    if os.path.isdir(staging):
        _status("discarding the staging left by an interrupted run")
        shutil.rmtree(staging)
    hw = state.get("high_water")
    if hw is None:  # the first run may have been published but not recorded
        runs = []
        data = os.path.join(out, "data")
        for name in (os.listdir(data) if os.path.isdir(data) else []):
            path = os.path.join(data, name, "_bookfs_run.json")
            if name.startswith("run=") and os.path.exists(path):
                with open(path) as f:
                    runs.append(json.load(f)["last"])
        if not runs:
            return state
        _status("a published run was not recorded; recording it")
        state = dict(state, high_water=max(runs))
        _write_json(os.path.join(out, "state.json"), state)
        return _recover(out, state)
    nxt = os.path.join(out, "data", f"run={hw + 1:012d}")
    manifest = os.path.join(nxt, "_bookfs_run.json")
    if os.path.exists(manifest):  # published, mark not recorded: roll forward
        with open(manifest) as f:
            run = json.load(f)
        _status(f"run from event {hw + 1} was published but not recorded; recording it")
        state = dict(state, high_water=run["last"])
        _write_json(os.path.join(out, "state.json"), state)
        return _recover(out, state)
    return state


def summarize(spark, path: str) -> dict:
    """Events, bytes, first/last event, events per card tag and size percentiles of the
    Parquet data at ``path``."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(path)
    row = df.agg(F.count("*").alias("events"), F.sum("size").alias("bytes"),
                 F.min("event").alias("first"), F.max("event").alias("last"),
                 F.expr("percentile(size, array(0.5, 0.9, 0.99))").alias("p"),
                 F.max("size").alias("max")).collect()[0]
    tags = {(r["card"] if r["card"] is not None else "(none)"): r["count"]
            for r in df.groupBy("card").count().collect()}
    p = row["p"] or [None, None, None]
    return {"events": row["events"], "bytes": row["bytes"] or 0, "first": row["first"],
            "last": row["last"], "cards": dict(sorted(tags.items(), key=lambda kv: -kv[1])),
            "size": {"p50": p[0], "p90": p[1], "p99": p[2], "max": row["max"]}}


def render_summary(s: dict) -> str:
    lines = [f"events:  {s['events']:,}", f"bytes:   {s['bytes']:,}",
             f"first:   {s['first']}", f"last:    {s['last']}",
             "size:    " + "  ".join(f"{k} {int(v):,}" if v is not None else f"{k} -"
                                     for k, v in s["size"].items()),
             "cards:"]
    lines += [f"  {tag:<12} {n:,}" for tag, n in s["cards"].items()]
    return "\n".join(lines) + "\n"


def _write(df, path: str) -> None:
    from pyspark.sql import functions as F

    (df.withColumn("event_bucket", (F.col("event") / BUCKET).cast("long"))
     .write.mode("error").partitionBy("event_bucket").parquet(path))


def _mount_info(mnt: str) -> dict[str, str]:
    """``key: value`` lines of the mount's ``info`` file (empty if unreadable)."""
    try:
        with open(os.path.join(mnt, "info")) as f:
            text = f.read(1 << 16)
    except OSError:
        return {}
    from .info import parse

    return parse(text)


def _number(text: str | None) -> int | None:
    try:
        return int((text or "").replace(",", "").split()[0])
    except (ValueError, IndexError):
        return None


def check_inputs(args) -> tuple[str, int, int | None]:
    """Everything ``bookfs spark`` can refuse without Spark, checked in milliseconds
    before the 15-30 s Spark start-up (pyspark is not even imported): MOUNTPOINT is a
    bookfs mount, ``--bulk`` has a ``segments/`` to read (a plain UIP-layout log; not a
    pier, vere-layout or LMDB mount), ``--since`` <= ``--until``, ``--out`` is not a file
    nor inside the mount.  Raises :class:`bookfs.errors.UsageError`.  Returns ``(out,
    first, last)``: the absolute output directory, the first event this run would read
    (after the recorded high-water mark with ``--incremental``) and the last event it
    could read (the mount's last, capped by ``--until``; None if the mount does not say).
    """
    from .errors import UsageError

    from .fs.mountinfo import mount_at

    mnt = args.mountpoint
    found = mount_at(mnt)
    fstype = found.fstype if found else None
    if found is None or not found.is_bookfs:
        raise UsageError(f"{mnt}: not a bookfs mount (found "
                         f"{'a ' + fstype + ' mount' if fstype else 'no mount'} there); "
                         "expected the mount point of `bookfs mount SOURCE MOUNTPOINT`")
    if args.since is not None and args.until is not None and args.since > args.until:
        raise UsageError(f"--since {args.since} is after --until {args.until}; expected "
                         "--since <= --until")
    out = os.path.abspath(args.out)
    real_mnt, real_out = os.path.realpath(mnt), os.path.realpath(out)
    if real_out == real_mnt or real_out.startswith(real_mnt + os.sep):
        raise UsageError(f"--out {args.out}: inside the mount {mnt}; expected a directory "
                         "outside it")
    info = _mount_info(mnt)
    if args.bulk and not os.path.isdir(os.path.join(mnt, "segments")):
        what = ("a pier (its epochs differ in layout)" if os.path.isdir(
            os.path.join(mnt, "epochs")) else f"a {info.get('format', 'non-UIP')} log")
        raise UsageError(f"--bulk reads {mnt}/segments/, which bookfs offers only for a "
                         f"plain UIP-layout Book log, and this mount is {what}; run "
                         "without --bulk (events/)")
    last = _number(info.get("last"))
    if info.get("events") is not None and _number(info.get("events")) == 0:
        last = 0
    if last is not None and args.until is not None:
        last = min(last, args.until)
    first = args.since if args.since is not None else 1
    if args.incremental:
        hw = _read_state(out).get("high_water") if os.path.isdir(out) else None
        if hw is not None:
            first = max(first, hw + 1)
    return out, first, last


class _DeferSigint:
    """Ctrl-C waits until the block ends (publishing must not stop half-way); ``.hit``
    says whether one came."""

    def __enter__(self):
        import signal

        self.hit = False
        self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.hit = True

    def __exit__(self, *exc):
        import signal

        signal.signal(signal.SIGINT, self._old)


class _Job:
    """One Spark run, done in a worker thread so that the main thread, which alone gets
    Ctrl-C, never interrupts a call into the JVM half-way: it sets :attr:`abort`, cancels
    the Spark jobs and waits.  The worker checks :attr:`abort` before each step and
    before publishing; :attr:`published` is the high-water mark it recorded, if it got
    that far.  ``result`` is the exit status, or ``error`` the exception to re-raise."""

    def __init__(self, args, out: str, state: dict, since: int | None, own: bool):
        self.args, self.out, self.state, self.since, self.own = args, out, state, since, own
        self.first = since if since is not None else 1
        self.staging = os.path.join(out, "_staging")
        self.abort = False
        self.spark = None
        self.published: int | None = None
        self.result: int | None = None
        self.error: BaseException | None = None

    def __call__(self) -> None:
        try:
            self.result = self._run()
        except BaseException as e:  # handed to the main thread
            self.error = e
        finally:
            if self.own and self.spark is not None:
                self.spark.stop()

    def _check_abort(self) -> None:
        if self.abort:
            raise KeyboardInterrupt

    def _run(self) -> int:
        from . import spark as bs

        args, out, state, first = self.args, self.out, self.state, self.first
        progress = sys.stderr.isatty() or bool(os.environ.get("BOOKFS_PROGRESS"))
        t0 = time.monotonic()
        self.spark = spark = bs.session(args.master, "bookfs spark", progress=progress)
        t1 = time.monotonic()  # Spark's start-up (the JVM) is reported apart from the work
        self._check_abort()
        _status(f"reading {'segments' if args.bulk else 'events'} of {args.mountpoint} "
                f"from event {first}" + (f" to {args.until}" if args.until else ""))
        df = bs.read_events(spark, args.mountpoint, since=self.since, until=args.until,
                            bulk=args.bulk)
        name = f"run={first:012d}" if args.incremental else "data"
        stage = os.path.join(self.staging, name)
        os.makedirs(self.staging, exist_ok=True)
        self._check_abort()
        _status(f"writing Parquet to {stage}")
        _write(df, stage)
        import glob

        empty = not glob.glob(os.path.join(stage, "**", "*.parquet"), recursive=True)
        summary = {"events": 0} if empty else summarize(spark, stage)
        if not summary["events"]:
            shutil.rmtree(self.staging)
            _status(f"no events from {first}: nothing to do")
            print(f"0 events (high-water mark {state.get('high_water')})")
            return 0
        manifest = {"first": summary["first"], "last": summary["last"],
                    "events": summary["events"], "since": first,
                    "mountpoint": os.path.abspath(args.mountpoint), "bulk": args.bulk}
        _write_json(os.path.join(stage, "_bookfs_run.json"), manifest)
        _fail_point("staged")
        self._check_abort()  # the last point where Ctrl-C leaves OUT as it was
        data = os.path.join(out, "data")
        if args.incremental:
            os.makedirs(data, exist_ok=True)
            os.rename(stage, os.path.join(data, name))
            _fsync_dir(data)
            _fail_point("published")
            state = dict(state, high_water=summary["last"], updated=time.time())
        else:
            old = os.path.join(self.staging, "old")
            if os.path.exists(data):
                os.rename(data, old)
            os.rename(stage, data)
            _fsync_dir(out)
            _fail_point("published")
            state = {"high_water": summary["last"], "updated": time.time()}
        _write_json(os.path.join(out, "state.json"), state)
        self.published = summary["last"]
        shutil.rmtree(self.staging, ignore_errors=True)
        secs = time.monotonic() - t1
        sys.stdout.write(render_summary(summary))
        print(f"wrote {out}/data: Spark start-up {t1 - t0:.1f} s, then the pipeline "
              f"{secs:.1f} s ({summary['events'] / secs:,.0f} events/s); "
              f"high-water mark {summary['last']}")
        return 0


def run(args) -> int:
    """The ``bookfs spark`` command (see the module docstring).  Inputs are checked first
    (:func:`check_inputs`), then Spark starts.  Ctrl-C cancels the job, discards the run
    being written and leaves ``data/`` and ``state.json`` as they were (one line, exit
    130); a run already being published is finished first and reported."""
    from .cliargs import EXIT_INTERRUPTED

    out, first, last = check_inputs(args)
    if last is not None and first > last:
        hw = _read_state(out).get("high_water") if os.path.isdir(out) else None
        _status(f"no events from {first} (the mount's last is {last}): nothing to do; "
                "Spark not started")
        print(f"0 events (high-water mark {hw})")
        return 0
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        print(f"bookfs spark: needs pyspark ({e})", file=sys.stderr)
        return 1
    os.makedirs(out, exist_ok=True)
    lock = open(os.path.join(out, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"bookfs spark: another run holds {out}/.lock", file=sys.stderr)
        return 1
    state = _recover(out, _read_state(out))
    since = args.since
    if args.incremental and state.get("high_water") is not None:
        since = max(since or 0, state["high_water"] + 1)
    own = SparkSession.getActiveSession() is None  # else reuse it (tests) and keep it
    job = _Job(args, out, state, since, own)
    _status(f"starting Spark ({args.master})")
    worker = threading.Thread(target=job, name="bookfs-spark", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except KeyboardInterrupt:
        with _DeferSigint():  # cleaning up takes a few seconds: let it finish
            job.abort = True
            if job.spark is not None:
                with contextlib.suppress(Exception):  # the session is going away anyway
                    job.spark.sparkContext.cancelAllJobs()
            worker.join()
            if job.published is not None:
                _status(f"interrupted after the run was published: {out}/data holds it, "
                        f"high-water mark {job.published}")
            else:
                shutil.rmtree(job.staging, ignore_errors=True)
                _status(f"interrupted; {out} is as it was before this run (high-water mark "
                        f"{state.get('high_water')}; the half-written run was discarded)")
        return EXIT_INTERRUPTED
    finally:
        lock.close()
    if job.error is None:
        return job.result
    e = job.error
    from . import spark as bs

    if isinstance(e, bs.EventTooLarge):
        print(f"bookfs spark: {e}", file=sys.stderr)
        return 1
    if not isinstance(e, Exception):  # InjectedFailure, KeyboardInterrupt: not ours to eat
        raise e
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"bookfs spark: {type(e).__name__}: {msg[:500]}", file=sys.stderr)  # not a JVM trace
    return 1


def cmd_spark(args) -> int:
    try:
        return run(args)
    except InjectedFailure:
        return 75


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "spark", help="export a mount's events to Parquet with PySpark",
        description=("Read MOUNTPOINT/events (or, with --bulk, MOUNTPOINT/segments) with "
                     "Spark's binaryFile source and write Parquet under OUT/data, "
                     "partitioned by run and event_bucket (event // 100000).  Prints a "
                     "summary.  --incremental processes only events after the last "
                     "run's high-water mark (OUT/state.json), exactly once even across "
                     "crashes.  Inputs are checked before Spark starts; Ctrl-C leaves OUT "
                     "as it was."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from .cliargs import dir_to_create, event_number, existing_dir

    s.add_argument("mountpoint", type=existing_dir, help="a bookfs mount")
    s.add_argument("--out", required=True, type=dir_to_create,
                   help="output directory (created if missing; not inside the mount)")
    s.add_argument("--incremental", action="store_true",
                   help="only events after the recorded high-water mark")
    s.add_argument("--bulk", action="store_true",
                   help="read segments/ (few large files) instead of events/")
    s.add_argument("--since", type=event_number, help="first event (inclusive)")
    s.add_argument("--until", type=event_number, help="last event (inclusive)")
    s.add_argument("--master", default="local[2]",
                   help="Spark master: local[N], local-cluster[W,C,MB] or spark://HOST:PORT")
    s.set_defaults(func=cmd_spark)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bookfs")
    sub = p.add_subparsers(dest="command", required=True)
    register(sub)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
