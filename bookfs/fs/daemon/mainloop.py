"""``pyfuse3.main``'s arguments: how many requests it may serve at once, and how long its
event loop polls for the next request before it sleeps (``-o busy_poll=``).  Used by
both daemons (``mount.py``, ``fs/fleet/daemon.py``)."""

from __future__ import annotations

import logging

log = logging.getLogger("bookfs.fs.daemon.mount")


def main_options(busy_poll_us: int) -> dict:
    """``pyfuse3.main``'s arguments: :func:`max_tasks`, and ``-o busy_poll=``.

    **Busy polling** (the patched pyfuse3's ``busy_poll``): when the event loop is about
    to sleep for want of work, just after answering a request and with no request left
    waiting on a worker thread or a commit (it then sleeps: the disk is what it waits
    for), it first polls its epoll set (``/dev/fuse``, and trio's wake-up socket, by
    which a worker thread's result comes) for up to an adaptive window of at most
    ``busy_poll_us``.  The poll gives way at once when more tasks are runnable than the
    daemon has CPUs (``/proc/loadavg``), so it never takes a CPU another task waits for.

    A program that reads events one after another sends its next request a few tens of
    microseconds after the last reply; without the poll the daemon's thread has gone to
    sleep by then, and on a virtual machine each sleep is a halt of the vCPU and each
    wake-up an exit to the host (``docs/benchmarks.md``, "A daemon that polls before it
    sleeps").  The window follows the kernel's guest halt-polling rule
    (``drivers/cpuidle/governors/haltpoll.c``, ``adjust_poll_limit()``;
    ``Documentation/virt/guest-halt-polling.rst``): it grows (from a quarter of the
    maximum, doubling) after a sleep that the poll missed but that ended within the
    maximum, and halves after a sleep longer than the maximum.  A poll follows an
    answered request only, so a mount left idle polls once, for at most the window, and
    then sleeps; one asked a thing now and then, with long gaps, stops polling after a
    few gaps.  A pyfuse3 without the feature (:data:`bookfs.fs.ops.FEATURES`) never
    polls.

    A read-write daemon whose reads go through its companion is given 0: its requests
    are appends, most of which wait on a commit, and polling there cost it up to 14% of
    its appends a second in ``bench/bench_append.py`` (``docs/benchmarks.md``); its
    companion, which serves the reads, polls."""
    from bookfs.fs import ops

    opts = {"max_tasks": max_tasks()}
    if "busy_poll" in ops.FEATURES:
        opts["busy_poll_us"] = busy_poll_us
    return opts


def log_busy_poll(options: dict) -> None:
    """At unmount, log what the busy poll did over the mount's life (the patched
    pyfuse3's ``busy_poll_stats()``: polls tried, those that found a request, those that
    gave way to another task wanting a CPU, the window at the end), or that it was off.
    ``options``: what :func:`main_options` gave ``pyfuse3.main``."""
    import pyfuse3

    if not options.get("busy_poll_us"):
        log.info("busy poll: off")
        return
    stats = pyfuse3.busy_poll_stats()
    log.info("busy poll: %s", ", ".join(f"{k} {v}" for k, v in stats.items()))


def max_tasks() -> int:
    """How many requests pyfuse3 may serve at once (its worker tasks; stock default 99).

    A close of ``new/N`` waits in its FLUSH until N is committed, and it holds a worker
    all that time.  With 99 workers, 99 waiting closes left none to read ``/dev/fuse``,
    so the write that would let N commit was never served and the mount froze (issue
    19, item 7).  Waiting requests must never starve the ones that let them finish, so
    the bound is what the kernel can have in flight, not a guess: every request but the
    background ones (readahead, async reads and writes, bounded by ``max_background``,
    12 by default) is synchronous, sent by one task that waits for its answer
    (``fs/fuse/dev.c``: ``__fuse_request_send()`` waits in ``request_wait_answer()``;
    ``flush_bg_queue()`` holds background requests at ``max_background``), and FLUSH is
    one of them (``fs/fuse/file.c``, ``fuse_flush()``: ``fuse_simple_request``).  So at
    most one request per task in the system (``/proc/sys/kernel/threads-max``) plus the
    background ones can be waiting.  A waiting worker costs a few KiB: the patched
    pyfuse3 (``bounded_buffers``) frees its 1 MiB receive buffer while it waits.  The
    same bound keeps lookups under ``follow/`` (which wait for an event, ``tail.py``)
    from starving the appends and reads that let them finish."""
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            threads = int(f.read())
    except (OSError, ValueError):
        threads = 1 << 22  # the kernel's own ceiling (FUTEX_TID_MASK)
    return min(threads + 1024, (1 << 31) - 1)
