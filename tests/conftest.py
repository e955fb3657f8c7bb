"""Shared fixtures.  Kept generic so any test module can use them.

* ``cache_dir`` (autouse): every test gets its own ``$BOOKFS_CACHE_DIR`` so persisted
  indexes never leak between tests or into the user's cache.
* ``make_book``: a factory that writes a real Book log under the test's ``tmp_path``.
* ``payload``: deterministic payload bytes (mug ++ jam) for an event number and size.
* ``signal_state_kept`` (autouse): a test leaves the signal state children inherit (the
  signals ignored, the mask) as it found it.

And one check of the whole run: every bookfs daemon its tests started has exited by the
end (:func:`pytest_sessionfinish`), so a daemon that outlives its unmount (a hang) fails
the run even when every test passed.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from bookfs.formats.book import Book


#: set in the environment by the run's main process, so that its xdist workers and every
#: daemon their tests start carry it (``mounting.daemons_left`` finds them by it)
RUN_MARK = "BOOKFS_TEST_RUN"


#: the JIT of the run's JVMs: C1 only.  Each of the suite's JVMs (a Spark driver, an
#: executor, a standalone master or worker) lives for seconds, and C2's compiler threads
#: took a share of the 2 cores the whole run has (``tests/test_spark.py``: 45 s, 35 s with
#: this).  Only the JIT's tiers change: what the code computes does not.  The product's
#: own JVMs (``bookfs spark`` outside the tests) are left to the JVM's defaults.
TEST_JIT = "-XX:TieredStopAtLevel=1"


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[RUN_MARK] = uuid.uuid4().hex
    hear_interrupts()
    # pyspark passes PYSPARK_SUBMIT_ARGS to spark-submit (its java_gateway.py), which
    # starts the driver; executors and the standalone daemons take their own settings
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-java-options {TEST_JIT} --conf "
                                                 f"spark.executor.extraJavaOptions={TEST_JIT} "
                                                 "pyspark-shell")
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", TEST_JIT)


def hear_interrupts() -> None:
    """Take SIGINT and SIGQUIT back from ``SIG_IGN``, in this process (the run's, and each
    xdist worker's, whose children are the tests' children).  A run started in the
    background of a non-interactive shell (``pytest &``, ``( ... ) &`` in a script: POSIX,
    "Asynchronous Lists") inherits both ignored, Python then leaves SIGINT ignored
    (``signal`` module docs: "if the parent process has not changed it"), and every
    process a test starts inherits that across ``exec``: the Ctrl-C a test sends to
    ``cat follow/N`` or ``bookfs top`` was lost, and the test timed out.  A handler is
    reset to the default by ``exec``, so children hear the signal again."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_sessionfinish(session, exitstatus):
    """In the run's main process: wait (a minute at most) for every bookfs daemon this
    run started to exit; any still running then fails the run, named."""
    if os.environ.get("PYTEST_XDIST_WORKER") or RUN_MARK not in os.environ:
        return
    from mounting import daemons_left

    left = daemons_left(os.environ[RUN_MARK], wait=60.0)
    if left:
        print("\nbookfs daemons still running after the run (a hang at unmount?):")
        for pid, cmdline in left:
            print(f"  pid {pid}: {cmdline}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _payload(event: int, size: int) -> bytes:
    """Deterministic pseudo-random payload of ``size`` bytes for ``event``."""
    return random.Random(event * 1_000_003 + size).randbytes(size)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch) -> Path:
    """A private index cache directory for this test (``$BOOKFS_CACHE_DIR``), and this
    process's index-cache settings back at their defaults before and after it (a test
    that calls ``configure_cache`` never leaks into the next)."""
    from bookfs.formats import index as index_mod

    d = tmp_path_factory.mktemp("bookfs-cache")
    monkeypatch.setenv("BOOKFS_CACHE_DIR", str(d))
    index_mod.configure_cache()
    yield d
    index_mod.configure_cache()


def _inherited_signal_state() -> tuple[frozenset, frozenset]:
    """What a child of this process inherits across ``exec`` of its signal state: the
    signals it ignores, and the main thread's mask (``signal(7)``: a caught signal is
    reset to its default, an ignored one stays ignored, the mask is kept)."""
    ignored = frozenset(s for s in signal.valid_signals()
                        if signal.getsignal(s) is signal.SIG_IGN)
    return ignored, frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def _signal_name(s: int) -> str:
    try:
        return signal.Signals(s).name
    except ValueError:  # a real-time signal past SIGRTMIN
        return f"signal {s}"


@pytest.fixture(autouse=True)
def signal_state_kept():
    """A test leaves what children inherit of this process's signal state (the signals
    it ignores, the mask) as it found it; if not, it is put back and the test fails.
    A leak would make a later test's child deaf to the signal that test sends it (``cat``
    to the SIGINT of ``test_live_tail.py``'s Ctrl-C), in some orders of the run only.
    (A handler a library installs, as pyspark's ``SparkContext`` does for SIGINT, is not
    inherited, and is left alone.)"""
    ignored, mask = _inherited_signal_state()
    yield
    now_ignored, now_mask = _inherited_signal_state()
    changed = [f"{_signal_name(s)} {'now' if s in now_ignored else 'no longer'} ignored"
               for s in sorted(ignored ^ now_ignored)]
    changed += [f"{_signal_name(s)} {'now' if s in now_mask else 'no longer'} blocked"
                for s in sorted(mask ^ now_mask)]
    if changed:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s in ignored ^ now_ignored:
            signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
        pytest.fail(f"the test changed the signal state children inherit: "
                    f"{', '.join(changed)} (put back; a test must restore what it changes)")


@pytest.fixture
def payload():
    """``payload(event, size) -> bytes``: deterministic payload bytes."""
    return _payload


@pytest.fixture
def make_book(tmp_path):
    """``make_book(*batches, name=None, epoch=0, meta=None) -> Path``.

    Creates a Book directory under ``tmp_path`` and saves each batch (a sequence of payload
    bytes, or of ints meaning "a deterministic payload of this size") in order, numbering
    from ``epoch + 1``.  ``meta`` maps meta keys to raw values.  The book is closed again,
    so its index is persisted; the directory path is returned.
    """
    counter = itertools.count()

    def make(*batches: Iterable[bytes | int], name: str | None = None, epoch: int = 0,
             meta: dict[str, bytes] | None = None) -> Path:
        path = tmp_path / (name or f"book{next(counter)}")
        with Book.open(path, writable=True, create=True) as book:
            nxt = epoch + 1
            for batch in batches:
                items: Sequence = list(batch)
                payloads = [
                    _payload(nxt + k, p) if isinstance(p, int) else bytes(p)
                    for k, p in enumerate(items)
                ]
                book.save(nxt, payloads, epoch=epoch)
                nxt += len(payloads)
            for key, value in (meta or {}).items():
                book.save_meta(key, value)
        return path

    return make


# --- Spark: one local session for the whole run ---------------------------------------------


class SharedSpark:
    """The ``local[2]`` SparkSession that the Spark test modules share (``bs.register``ed
    for ``format("bookfs")``), so a run creates it once instead of once per module.  Made
    on first use (again if a test stopped it); stopped at the end of the run, or by
    :meth:`stop` before a test that needs a session of another master (``getOrCreate``
    would hand it this one).  Tests that change a setting unset it again."""

    def __init__(self):
        self.session = None

    def get(self):
        if self.session is not None and self.session.sparkContext._jsc is None:
            self.session = None  # stopped by a test that took it for its own
        if self.session is None:
            from bookfs import spark as bs

            self.session = bs.register(bs.session("local[2]"))
        return self.session

    def stop(self) -> None:
        if self.session is not None and self.session.sparkContext._jsc is not None:
            self.session.stop()
        self.session = None


@pytest.fixture(scope="session")
def shared_spark():
    """The run's :class:`SharedSpark` (stopped at the end of the run)."""
    pytest.importorskip("pyspark")
    holder = SharedSpark()
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture(scope="module")
def spark(shared_spark):
    """The shared ``local[2]`` SparkSession (see :class:`SharedSpark`)."""
    return shared_spark.get()


@pytest.fixture
def no_shared_spark(shared_spark):
    """For a test that starts a SparkSession of its own: the shared one is stopped first
    (the next module's ``spark`` makes a new one)."""
    shared_spark.stop()
