"""``bookfs spark MOUNTPOINT --out DIR``: the events of a mount as Parquet.

Output layout (under ``--out``)::

    data/run=<NNNNNN>/day=<YYYY-MM-DD>/part-*.parquet
    data/run=<NNNNNN>/day=__HIVE_DEFAULT_PARTITION__/part-*.parquet   (no date: lifecycle)
    data/run=<NNNNNN>/_bookfs_run.json   what the run holds: first, last, events, ...
    state.json                            {"high_water": last event published, ...}
    _staging/                             a run being written (discarded when found)

``spark.read.parquet(OUT + "/data")`` reads every run as one table with two partition
columns: ``run`` (an int, 1, 2, ... in the order the runs were published) and ``day``
(a DATE: the UTC day of the event's ``date``, null for events without one).  Within a run,
each day is one file sorted by ``event`` (:func:`bookfs.spark.write_parquet`), so filters
on ``day`` prune directories and filters on ``event`` or ``date`` skip row groups.

Write modes (``--mode``, as DataFrameWriter names them), for what is already in ``data/``:

* ``error`` (the default without ``--incremental``): refuse, before Spark starts, if
  ``data/`` holds anything (one line, exit 2, nothing touched);
* ``append`` (the only mode of ``--incremental``): add this run as the next ``run=``;
* ``overwrite``: replace the whole of ``data/`` by this run (``run=000001``);
* ``ignore``: do nothing (exit 0, Spark not started) if ``data/`` holds anything.

Publishing is crash-safe.  A run is written to ``_staging/``, published by renames (one
``rename`` into ``data/`` for a new run; for ``overwrite``, ``data/`` is moved aside to
``_staging/old`` and the new one renamed into place), and only then is the high-water mark
-- the largest ``last`` of the runs' ``_bookfs_run.json`` in ``data/`` -- recorded in
``state.json`` (temp file + rename).  So ``data/`` is the truth and ``state.json`` what it
held at the last recorded run:

* killed before the renames: the staging directory is discarded on restart (and a
  ``data/`` moved aside is put back), and the run redone;
* killed after them, before the mark: the restart finds a published run the mark does not
  match and records the mark from ``data/`` (roll forward) instead of writing it again.

Either way no event is duplicated or skipped by ``--incremental``.  A lock file
(``.lock``, ``flock``) keeps two runs on one ``--out`` apart.

Failure injection for tests: ``BOOKFS_SPARK_FAIL=staged`` exits (status 75) after the
staging directory is complete, ``BOOKFS_SPARK_FAIL=published`` after the rename and before
the mark is recorded (in-process, :func:`run` raises :class:`InjectedFailure` there).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import json
import os
import shutil
import sys
import threading
import time

from bookfs.formats.fileio import fsync_dir
from bookfs.spark.summary import pace, render_summary, summarize  # noqa: F401 (re-exported)

FAIL_ENV = "BOOKFS_SPARK_FAIL"
#: ``--mode`` values (DataFrameWriter's names; ``errorifexists`` is ``error``).
MODES = ("error", "errorifexists", "append", "overwrite", "ignore")
#: Digits of a run's number in its directory name (``run=000001``).
RUN_DIGITS = 6
RUN_PREFIX = "run="
MANIFEST = "_bookfs_run.json"
#: Seconds between the lines saying that Spark is still starting (a ``spark://`` master
#: that has not registered the run yet: waited for, never refused by a timer of ours).
STARTING_EVERY = 15.0


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
    fsync_dir(os.path.dirname(path) or ".")


def _read_state(out: str) -> dict:
    try:
        with open(os.path.join(out, "state.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _runs(data: str) -> dict[int, dict]:
    """The published runs under ``data``: run number -> its ``_bookfs_run.json``."""
    runs = {}
    for name in (os.listdir(data) if os.path.isdir(data) else []):
        path = os.path.join(data, name, MANIFEST)
        if name.startswith(RUN_PREFIX) and name[len(RUN_PREFIX):].isdigit() \
                and os.path.exists(path):
            with open(path) as f:
                runs[int(name[len(RUN_PREFIX):])] = json.load(f)
    return runs


def _published_mark(out: str) -> int | None:
    """The high-water mark ``data/`` holds: the largest ``last`` of its runs (None if it
    holds no run)."""
    lasts = [run["last"] for run in _runs(os.path.join(out, "data")).values()]
    return max(lasts) if lasts else None


def _mark(out: str) -> int | None:
    """The high-water mark a run on ``out`` goes on from, read without changing anything:
    what ``data/`` holds (:func:`_published_mark`), which :func:`_recover` records if
    ``state.json`` lags behind it, else ``state.json``'s (None if neither says)."""
    if not os.path.isdir(out):
        return None
    published = _published_mark(out)
    return published if published is not None else _read_state(out).get("high_water")


def _holds_data(out: str) -> bool:
    """Whether ``OUT/data`` exists and is not empty (what ``--mode error|ignore`` test)."""
    data = os.path.join(out, "data")
    return os.path.isdir(data) and bool(os.listdir(data))


def _recover(out: str, state: dict) -> dict:
    """Finish or discard what a killed run left behind; return the state to go on from."""
    staging = os.path.join(out, "_staging")
    old, data = os.path.join(staging, "old"), os.path.join(out, "data")
    if os.path.isdir(old) and not os.path.exists(data):  # killed between the two renames
        _status("putting back the data/ an interrupted run had moved aside")
        os.rename(old, data)
        fsync_dir(out)
    if os.path.isdir(staging):
        _status("discarding the staging left by an interrupted run")
        shutil.rmtree(staging)
    published = _published_mark(out)
    if published is not None and published != state.get("high_water"):
        # published, mark not recorded: roll forward to what data/ holds
        _status(f"a published run was not recorded; recording high-water mark {published}")
        state = dict(state, high_water=published)
        _write_json(os.path.join(out, "state.json"), state)
    return state


def _mount_info(mnt: str) -> dict[str, str]:
    """``key: value`` lines of the mount's ``info`` file (empty if unreadable)."""
    try:
        with open(os.path.join(mnt, "info")) as f:
            text = f.read(1 << 16)
    except OSError:
        return {}
    from bookfs.formats.info import parse

    return parse(text)


def _number(text: str | None) -> int | None:
    try:
        return int((text or "").replace(",", "").split()[0])
    except (ValueError, IndexError):
        return None


def write_mode(args) -> str:
    """The write mode of this run: ``--mode`` (``errorifexists`` read as ``error``), else
    ``append`` with ``--incremental`` and ``error`` without.  ``--incremental`` with any
    other mode raises :class:`bookfs.errors.UsageError`."""
    from bookfs.errors import UsageError

    mode = getattr(args, "mode", None)
    mode = "error" if mode == "errorifexists" else mode
    if args.incremental:
        if mode not in (None, "append"):
            raise UsageError(f"--incremental adds the events after the high-water mark as "
                             f"a new run, so --mode {mode} does not apply; expected "
                             "--mode append or no --mode")
        return "append"
    return mode or "error"


#: The partition directory of the layout bookfs wrote before day partitions.
OLD_LAYOUT = "event_bucket="


def _old_layout(out: str) -> str | None:
    """A directory of ``OUT/data`` in the layout of an earlier bookfs (``event_bucket=N``
    at the top or under a ``run=``), if there is one."""
    data = glob.escape(os.path.join(out, "data"))
    for pattern in (OLD_LAYOUT + "*", "run=*/" + OLD_LAYOUT + "*"):
        found = sorted(glob.glob(os.path.join(data, pattern)))
        if found:
            return found[0]
    return None


def refuse_existing(out: str, mode: str, shown: str) -> None:
    """With ``mode`` ``error``, raise :class:`bookfs.errors.UsageError` (one line) if
    ``OUT/data`` already holds something; with ``append``, if what it holds is in an
    earlier bookfs's layout (a run added beside it would make a table of two layouts).
    ``shown`` is ``--out`` as the user gave it."""
    from bookfs.errors import UsageError

    old = _old_layout(out) if mode == "append" else None
    if old is not None:
        raise UsageError(f"--out {shown}: {old} is in the layout of an earlier bookfs "
                         f"({OLD_LAYOUT}N, not day=); a new run beside it would mix the two "
                         "in one table; expected --mode overwrite (rewrite data/) or a new "
                         "--out")
    if mode == "error" and _holds_data(out):
        raise UsageError(f"--out {shown}: {os.path.join(out, 'data')} already holds Parquet "
                         "from an earlier run; expected --mode append (add this run), "
                         "--mode overwrite (replace it), --mode ignore (leave it) or "
                         "--incremental (only new events)")


def check_inputs(args) -> tuple[str, int, int | None, str]:
    """Everything ``bookfs spark`` can refuse without Spark, checked in milliseconds
    before the 15-30 s Spark start-up (pyspark is not even imported): MOUNTPOINT is a
    bookfs mount, ``--bulk`` has a ``segments/`` to read (a plain UIP-layout log; not a
    pier, vere-layout or LMDB mount), ``--since`` <= ``--until``, a ``spark://`` master
    answers (:func:`bookfs.spark.pipeline.check_master`), ``--out`` is not a file
    nor inside the mount, ``--mode`` fits ``--incremental`` and, with ``--mode error``
    (the default without ``--incremental``), ``OUT/data`` holds nothing yet.  Raises
    :class:`bookfs.errors.UsageError`.  Returns ``(out, first, last, mode)``: the
    absolute output directory, the first event this run would read (after the recorded
    high-water mark with ``--incremental``), the last event it could read (the mount's
    last, capped by ``--until``; None if the mount does not say) and the write mode
    (:func:`write_mode`).
    """
    from bookfs.errors import UsageError

    from bookfs.fs.daemon.mountinfo import mount_at

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
    from bookfs.spark.master import MASTER_TIMEOUT, check_master  # no pyspark import

    check_master(args.master, getattr(args, "master_timeout", MASTER_TIMEOUT))
    out = os.path.abspath(args.out)
    real_mnt, real_out = os.path.realpath(mnt), os.path.realpath(out)
    if real_out == real_mnt or real_out.startswith(real_mnt + os.sep):
        raise UsageError(f"--out {args.out}: inside the mount {mnt}; expected a directory "
                         "outside it")
    mode = write_mode(args)
    refuse_existing(out, mode, args.out)
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
        hw = _mark(out)
        if hw is not None:
            first = max(first, hw + 1)
    return out, first, last, mode


class _Job:
    """One Spark run, done in a worker thread so that the main thread, which alone gets
    Ctrl-C, never interrupts a call into the JVM half-way: it sets :attr:`abort`, cancels
    the Spark jobs and waits.  The worker checks :attr:`abort` before each step and
    before publishing; :attr:`published` is the high-water mark it recorded, if it got
    that far.  ``result`` is the exit status, or ``error`` the exception to re-raise."""

    def __init__(self, args, out: str, state: dict, since: int | None, own: bool,
                 mode: str = "append", last: int | None = None):
        self.args, self.out, self.state, self.since, self.own = args, out, state, since, own
        self.mode = mode
        # the mount's last event when the inputs were checked: a run from `since` reads
        # up to it (a short range by naming its files: pipeline.NAMED_RANGE); what is
        # appended meanwhile is the next --incremental run's
        self.last = last
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
        from bookfs.spark import pipeline as bs

        args, out, state, first = self.args, self.out, self.state, self.first
        progress = sys.stderr.isatty() or bool(os.environ.get("BOOKFS_PROGRESS"))
        t0 = time.monotonic()
        self.spark = spark = bs.session(args.master, "bookfs spark", progress=progress)
        t1 = time.monotonic()  # Spark's start-up (the JVM) is reported apart from the work
        self._check_abort()
        _status(f"reading {'segments' if args.bulk else 'events'} of {args.mountpoint} "
                f"from event {first}" + (f" to {args.until}" if args.until else ""))
        until = args.until
        if until is None and self.since is not None and self.last is not None:
            until = self.last
        df = bs.read_events(spark, args.mountpoint, since=self.since, until=until,
                            bulk=args.bulk)
        data = os.path.join(out, "data")
        replace = self.mode == "overwrite"  # else a new run beside those in data/
        number = 1 if replace else max(_runs(data), default=0) + 1
        name = f"{RUN_PREFIX}{number:0{RUN_DIGITS}d}"
        # overwrite stages a whole new data/ (_staging/data/run=000001), the rest one run
        stage = os.path.join(self.staging, "data", name) if replace else os.path.join(
            self.staging, name)
        os.makedirs(os.path.dirname(stage), exist_ok=True)
        self._check_abort()
        _status(f"writing Parquet to {stage} (by day, sorted by event)")
        bs.write_parquet(df, stage)
        empty = not glob.glob(os.path.join(stage, "**", "*.parquet"), recursive=True)
        summary = {"events": 0} if empty else summarize(spark, stage)
        if not summary["events"]:
            shutil.rmtree(self.staging)
            _status(f"no events from {first}: nothing to do")
            print(f"0 events (high-water mark {state.get('high_water')})")
            return 0
        manifest = {"run": number, "first": summary["first"], "last": summary["last"],
                    "events": summary["events"], "since": first, "mode": self.mode,
                    "incremental": args.incremental,
                    "mountpoint": os.path.abspath(args.mountpoint), "bulk": args.bulk}
        _write_json(os.path.join(stage, MANIFEST), manifest)
        _fail_point("staged")
        self._check_abort()  # the last point where Ctrl-C leaves OUT as it was
        if not replace:  # --incremental, append (and error/ignore into an empty data/)
            os.makedirs(data, exist_ok=True)
            os.rename(stage, os.path.join(data, name))
            fsync_dir(data)
            _fail_point("published")
            state = dict(state, high_water=_published_mark(out), updated=time.time())
        else:
            old = os.path.join(self.staging, "old")
            if os.path.exists(data):
                os.rename(data, old)
            os.rename(os.path.join(self.staging, "data"), data)
            fsync_dir(out)
            _fail_point("published")
            state = {"high_water": summary["last"], "updated": time.time()}
        _write_json(os.path.join(out, "state.json"), state)
        self.published = summary["last"]
        shutil.rmtree(self.staging, ignore_errors=True)
        secs = time.monotonic() - t1
        sys.stdout.write(render_summary(summary))
        print(f"wrote {out}/data/{name}: Spark start-up {t1 - t0:.1f} s, then "
              f"{pace(summary['events'], secs)}; high-water mark {summary['last']}")
        return 0


def _tidy(out: str) -> None:
    """Before saying 'nothing to do' (no Spark): if an interrupted run left a staging
    directory or an unrecorded mark, :func:`_recover` under the lock (unless another run
    holds it: that run recovers)."""
    if not os.path.isdir(out):
        return
    published = _published_mark(out)
    if not os.path.exists(os.path.join(out, "_staging")) and (
            published is None or published == _read_state(out).get("high_water")):
        return
    with open(os.path.join(out, ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        _recover(out, _read_state(out))


def _ignored(out: str, state: dict) -> int:
    """``--mode ignore`` and ``data/`` holds something: say so, change nothing."""
    _status(f"--mode ignore: {out}/data already holds Parquet; nothing to do; Spark not "
            "started")
    print(f"0 events (high-water mark {state.get('high_water')})")
    return 0


def run(args) -> int:
    """The ``bookfs spark`` command (see the module docstring).  Inputs are checked first
    (:func:`check_inputs`), then Spark starts; a ``spark://`` master that answered the
    probe is waited for as long as Spark's own client waits, with a line every 15 s.  Ctrl-C cancels the job, discards the run
    being written and leaves ``data/`` and ``state.json`` as they were (one line, exit
    130); a run already being published is finished first and reported."""
    from bookfs.cli.args import EXIT_INTERRUPTED

    out, first, last, mode = check_inputs(args)
    if mode == "ignore" and _holds_data(out):
        _tidy(out)
        return _ignored(out, _read_state(out))
    if last is not None and first > last:
        _tidy(out)
        hw = _mark(out)
        _status(f"no events from {first} (the mount's last is {last}): nothing to do; "
                "Spark not started")
        print(f"0 events (high-water mark {hw})")
        return 0
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        print(f"bookfs spark: needs pyspark ({e})", file=sys.stderr)
        return 1
    created = not os.path.lexists(out)
    os.makedirs(out, exist_ok=True)
    lock = open(os.path.join(out, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()  # not ours: the other run's lock stays
        print(f"bookfs spark: another run holds {out}/.lock", file=sys.stderr)
        return 1
    try:  # under the lock, after recovery (which may have put a data/ back): again
        state = _recover(out, _read_state(out))
        refuse_existing(out, mode, args.out)
    except BaseException:
        _release(lock, out, created)
        raise
    if mode == "ignore" and _holds_data(out):
        _release(lock, out, created)
        return _ignored(out, state)
    since = args.since
    if args.incremental and state.get("high_water") is not None:
        since = max(since or 0, state["high_water"] + 1)
    own = SparkSession.getActiveSession() is None  # else reuse it (tests) and keep it
    job = _Job(args, out, state, since, own, mode, last)
    _status(f"starting Spark ({args.master})")
    worker = threading.Thread(target=job, name="bookfs-spark", daemon=True)
    worker.start()
    started = time.monotonic()
    said = 0
    try:
        while worker.is_alive():
            worker.join(0.2)
            waited = time.monotonic() - started
            if job.spark is None and args.master.startswith("spark://") and \
                    waited >= (said + 1) * STARTING_EVERY:  # never refused for being slow
                said = int(waited // STARTING_EVERY)
                _status(f"still starting Spark after {said * STARTING_EVERY:.0f} s: "
                        f"waiting for the master at {args.master} to register this run "
                        "(Spark gives up after 3 tries of 20 s without an answer)")
    except KeyboardInterrupt:
        from bookfs.cli.commands import _SigintFlag

        with _SigintFlag(defer=True):  # cleaning up takes a few seconds: let it finish
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
        _release(lock, out, created)
    if job.error is None:
        return job.result
    e = job.error
    from bookfs.spark import pipeline as bs

    if isinstance(e, bs.EventTooLarge):
        print(f"bookfs spark: {e}", file=sys.stderr)
        return 1
    if not isinstance(e, Exception):  # InjectedFailure, KeyboardInterrupt: not ours to eat
        raise e
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if job.spark is None and args.master.startswith("spark://"):  # Spark's client gave up
        msg += f" (the master at {args.master} answered, but never registered this run)"
    print(f"bookfs spark: {type(e).__name__}: {msg[:500]}", file=sys.stderr)  # not a JVM trace
    return 1


def _release(lock, out: str, created: bool) -> None:
    """Close the run's lock on ``out``; a run that created ``out`` and wrote nothing in it
    (Spark failed to start, say) takes the directory away again, lock file and all, so a
    failed run leaves nothing behind.  Done while the lock is still held."""
    try:
        if created and os.listdir(out) == [".lock"]:
            os.unlink(os.path.join(out, ".lock"))
            os.rmdir(out)
    except OSError:
        pass  # something else appeared in it meanwhile: leave it as it is
    finally:
        lock.close()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, not {text!r}")
    return value


def cmd_spark(args) -> int:
    try:
        return run(args)
    except InjectedFailure:
        return 75


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "spark", help="export a mount's events to Parquet with PySpark",
        description=("Read MOUNTPOINT/events (or, with --bulk, MOUNTPOINT/segments) with "
                     "Spark's binaryFile source and write Parquet under "
                     "OUT/data/run=N/day=YYYY-MM-DD/ (day: the UTC day of the event's "
                     "date; events without one under day=__HIVE_DEFAULT_PARTITION__), "
                     "each day one file sorted by event.  Prints a summary.  "
                     "--incremental processes only events after the last run's "
                     "high-water mark (OUT/state.json), exactly once even across crashes. "
                     " Inputs are checked before Spark starts; Ctrl-C leaves OUT as it "
                     "was."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from bookfs.cli.args import dir_to_create, event_number, existing_dir

    s.add_argument("mountpoint", type=existing_dir, help="a bookfs mount")
    s.add_argument("--out", required=True, type=dir_to_create,
                   help="output directory (created if missing; not inside the mount)")
    s.add_argument("--incremental", action="store_true",
                   help="only events after the recorded high-water mark")
    s.add_argument("--bulk", action="store_true",
                   help="read segments/ (few large files) instead of events/")
    s.add_argument("--since", type=event_number, help="first event (inclusive)")
    s.add_argument("--until", type=event_number, help="last event (inclusive)")
    s.add_argument("--mode", choices=MODES, default=None,
                   help="what to do if OUT/data already holds Parquet: error (refuse; "
                   "the default without --incremental), append (add this run; the only "
                   "mode of --incremental), overwrite (replace data/), ignore (do "
                   "nothing)")
    s.add_argument("--master", default="local[2]",
                   help="Spark master: local[N], local-cluster[W,C,MB] or spark://HOST:PORT")
    from bookfs.spark.master import MASTER_TIMEOUT

    s.add_argument("--master-timeout", type=_seconds, default=MASTER_TIMEOUT,
                   metavar="SECONDS",
                   help="seconds a spark:// address has to answer bookfs's probe in Spark's "
                   "RPC protocol (a master that answered is then waited for)")
    s.set_defaults(func=cmd_spark)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bookfs")
    sub = p.add_subparsers(dest="command", required=True)
    register(sub)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
