"""``bookfs report SOURCE --out DIR``: a picture of a log.

Reads every event once, in order, decoding only its head (date, wire, card tag:
:func:`~bookfs.noun.peek_event` on the first :data:`HEAD_BYTES` of the jam or of vere's ram
encoding), and checking that the whole payload is a noun
(:func:`bookfs.noun.payload.payload_problem`: the validating scanner for a jam, in slices,
never building the noun; ``ram_decode`` for a ram event).  An event that is not a noun is
counted as such (:data:`NOT_A_NOUN`), never as a boot event.  It writes to DIR:

* ``events_over_time.png``: events per time bin, stacked by card tag (the bin is a day
  when the log spans weeks, down to a minute for a short one: about :data:`TARGET_BINS`
  bins);
* ``sizes_over_time.png``: event sizes against time, log scale (a uniform sample of at
  most :data:`SCATTER_POINTS` events);
* ``largest_events.png``: the :data:`TOP_K` largest events, as bars;
* ``index.html``: one page showing the three images, a summary table and the largest
  events as a table.

SOURCE is a bookfs mount or any log :func:`~bookfs.formats.pier.open_source` opens.  Memory is
bounded whatever the log's length: counters per (bin, tag) (at most :data:`MAX_TAGS` tags
are told apart, the rest are ``other``), a top-K heap and a reservoir sample.  Boot events
(no date) are counted and shown among the largest, but not placed in time.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import heapq
import html
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass, field

from bookfs.errors import UsageError
from bookfs.noun import da_to_datetime, format_da, peek_event
from bookfs.noun.render import human_bytes, human_size

HEAD_BYTES = 64 << 10  # jam bytes read per event: its date, wire and tag lie at the start
TOP_K = 20  # largest events listed
SCATTER_POINTS = 20_000  # events sampled for the size scatter (reservoir)
MAX_TAGS = 12  # card tags told apart in the stacked chart; the rest are "other"
TARGET_BINS = 120  # the time bin is the smallest of BIN_CHOICES giving at most this many
BIN_CHOICES = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)  # seconds
BIN_NAMES = {60: "minute", 300: "5 minutes", 900: "15 minutes", 3600: "hour",
             6 * 3600: "6 hours", 86400: "day", 7 * 86400: "week", 30 * 86400: "30 days"}
IMAGES = ("events_over_time.png", "sizes_over_time.png", "largest_events.png")
DPI = 100
UNDATED = "(boot)"  # the tag shown for events without a date
NOT_A_NOUN = "(not a noun)"  # the tag shown for events whose payload does not decode


@dataclass
class Stats:
    """What one pass over a log gathers (bounded memory)."""

    events: int = 0
    bytes: int = 0
    undated: int = 0
    not_nouns: int = 0  # events whose payload does not decode (not counted as undated)
    ram: int = 0  # events in vere's ram encoding
    first_date: int | None = None
    last_date: int | None = None
    bin_seconds: int = 86400
    origin: float = 0.0  # unix seconds of bin 0
    max_bin: int = 0  # dates outside bins 0..max_bin (out of order) go to the end bins
    per_bin: Counter = field(default_factory=Counter)  # (bin, tag) -> events
    tags: Counter = field(default_factory=Counter)  # tag -> events (all tags seen)
    top: list = field(default_factory=list)  # min-heap of (size, -event, tag, date)
    sample: list = field(default_factory=list)  # (unix seconds, size)
    seen_dated: int = 0

    def add(self, event: int, size: int, date: int | None, tag: str | None,
            rng: random.Random, *, noun: bool = True, ram: bool = False) -> None:
        self.events += 1
        self.bytes += size
        self.ram += ram
        if not noun:
            self.not_nouns += 1
            date = None
        label = (NOT_A_NOUN if not noun else UNDATED if date is None
                 else (tag or "(no tag)"))
        if label not in self.tags and len(self.tags) >= MAX_TAGS:
            label = "other"
        self.tags[label] += 1
        item = (size, -event, label, date)
        if len(self.top) < TOP_K:
            heapq.heappush(self.top, item)
        elif item > self.top[0]:
            heapq.heapreplace(self.top, item)
        if date is None:
            self.undated += noun
            return
        if self.first_date is None or date < self.first_date:
            self.first_date = date
        if self.last_date is None or date > self.last_date:
            self.last_date = date
        t = da_to_datetime(date).timestamp()
        b = min(max(0, int((t - self.origin) // self.bin_seconds)), self.max_bin)
        self.per_bin[(b, label)] += 1
        self.seen_dated += 1
        if len(self.sample) < SCATTER_POINTS:
            self.sample.append((t, size))
        else:
            j = rng.randrange(self.seen_dated)
            if j < SCATTER_POINTS:
                self.sample[j] = (t, size)

    def largest(self) -> list[tuple[int, int, str, int | None]]:
        """``(event, size, tag, date)``, largest first (ties: lower event first)."""
        return [(-e, s, t, d) for s, e, t, d in sorted(self.top, reverse=True)]


def _head(source, event: int, check: bool = False
          ) -> tuple[int, int | None, str | None, bool, bool]:
    """``(size, date, tag, noun, ram)`` of one event, reading only the start of its
    payload, unless ``check``: then the whole payload is decode-checked (``noun`` is
    False when it is not an event's; always True without ``check``)."""
    from bookfs.noun.payload import payload_problem
    from bookfs.noun.ram import RAM_HEADER

    size, pread, done = source.payload(event)
    try:
        head = pread(4, HEAD_BYTES) if size > 4 else b""
        date, _, tag = peek_event(head) if head else (None, None, None)
        ram = head[:len(RAM_HEADER)] == RAM_HEADER
        noun = not check or payload_problem(size, pread, getattr(source, "bob_dir", None)
                                            ) is None
    finally:
        done()
    return size, date, tag, noun, ram


def _bin_for(first: int | None, last: int | None) -> int:
    if first is None or last is None:
        return 86400
    span = (da_to_datetime(last) - da_to_datetime(first)).total_seconds()
    return next((b for b in BIN_CHOICES if span / b <= TARGET_BINS), BIN_CHOICES[-1])


def gather(source, progress=None) -> Stats:
    """One pass over ``source`` (``open_any``'s interface), events in order.  The time bin
    is chosen first from the dates of the first and last dated events (see
    :func:`bookfs.formats.info.date_range`'s search: a few events from each end)."""
    first, last = source.range
    stats = Stats()
    if not last:
        return stats
    from bookfs.formats.info import DATE_SEARCH

    ends = []
    for events in (range(first, min(last, first + DATE_SEARCH - 1) + 1),
                   range(last, max(first, last - DATE_SEARCH + 1) - 1, -1)):
        ends.append(next((d for d in (_head(source, e)[1] for e in events) if d is not None),
                         None))
    _place_bins(stats, *ends)
    rng = random.Random(0)
    for event in range(first, last + 1):
        size, date, tag, noun, ram = _head(source, event, check=True)
        stats.add(event, size, date, tag, rng, noun=noun, ram=ram)
        if progress is not None:
            progress(1)
    return stats


# --- drawing -------------------------------------------------------------------------------


def _plots(stats: Stats, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    def when(t: float) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(t, _dt.timezone.utc)

    # 1. events per bin, stacked by tag
    fig, ax = plt.subplots(figsize=(11, 5), dpi=DPI)
    bins = sorted({b for b, _ in stats.per_bin})
    tags = [t for t, _ in stats.tags.most_common() if t != UNDATED]
    if bins:
        lo, hi = bins[0], bins[-1]
        xs = [when(stats.origin + b * stats.bin_seconds) for b in range(lo, hi + 1)]
        bottom = [0] * len(xs)
        width = stats.bin_seconds / 86400 * 0.9  # matplotlib dates are in days
        cmap = plt.get_cmap("tab20")
        for i, tag in enumerate(tags):
            heights = [stats.per_bin.get((b, tag), 0) for b in range(lo, hi + 1)]
            ax.bar(xs, heights, width=width, bottom=bottom, align="edge", label=f"%{tag}"
                   if not tag.startswith("(") and tag != "other" else tag, color=cmap(i % 20))
            bottom = [a + h for a, h in zip(bottom, heights)]
        ax.legend(loc="upper left", fontsize="small", ncol=2)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    else:
        ax.text(0.5, 0.5, "no dated events", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"Events per {BIN_NAMES[stats.bin_seconds]}, by card (UTC)")
    ax.set_ylabel("events")
    fig.tight_layout()
    fig.savefig(os.path.join(out, IMAGES[0]))
    plt.close(fig)

    # 2. sizes over time, log scale
    fig, ax = plt.subplots(figsize=(11, 5), dpi=DPI)
    if stats.sample:
        pts = sorted(stats.sample)
        ax.scatter([when(t) for t, _ in pts], [max(s, 1) for _, s in pts], s=4, alpha=0.4,
                   linewidths=0)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    else:
        ax.text(0.5, 0.5, "no dated events", ha="center", va="center", transform=ax.transAxes)
    shown = len(stats.sample)
    ax.set_title(f"Event sizes over time ({shown:,} of {stats.seen_dated:,} dated events"
                 f"{', a uniform sample' if shown < stats.seen_dated else ''})")
    ax.set_ylabel("bytes (log scale)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, IMAGES[1]))
    plt.close(fig)

    # 3. the largest events
    largest = stats.largest()
    fig, ax = plt.subplots(figsize=(11, max(3, 0.35 * len(largest) + 1)), dpi=DPI)
    if largest:
        labels = [f"{e}  {t if t.startswith('(') or t == 'other' else '%' + t}"
                  for e, _, t, _ in largest]
        ax.barh(range(len(largest)), [s for _, s, _, _ in largest], color="tab:orange")
        ax.set_yticks(range(len(largest)), labels, fontsize="small")
        ax.invert_yaxis()
        ax.set_xscale("log")
        for i, (_, s, _, _) in enumerate(largest):
            ax.text(s, i, " " + human_size(s), va="center", fontsize="small")
    ax.set_title(f"The {len(largest)} largest events")
    ax.set_xlabel("bytes (log scale)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, IMAGES[2]))
    plt.close(fig)


def _html(stats: Stats, source_name: str, span: tuple[int, int]) -> str:
    def date_cell(d: int | None) -> str:
        if d is None:
            return "(no date)"
        return f"{format_da(d)} ({da_to_datetime(d):%Y-%m-%d %H:%M:%S} UTC)"

    e = html.escape
    summary = [
        ("source", source_name),
        ("events", f"{span[0]:,}..{span[1]:,} ({stats.events:,} events)"),
        ("payload bytes", human_bytes(stats.bytes)),
        ("first date", date_cell(stats.first_date)),
        ("last date", date_cell(stats.last_date)),
        ("events without a date", f"{stats.undated:,} (boot)"),
        ("events that are not nouns", f"{stats.not_nouns:,} (their payload does not decode:"
                                      " see bookfs verify --nouns)"),
        ("events in the ram encoding", f"{stats.ram:,} (vere ml/bob)"),
        ("card tags", ", ".join(f"{t} {n:,}" for t, n in stats.tags.most_common())),
    ]
    rows = "\n".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in summary)
    top = "\n".join(
        f"<tr><td>{ev}</td><td>{e(t)}</td><td>{s:,}</td><td>{e(human_size(s))}</td>"
        f"<td>{e(date_cell(d))}</td></tr>" for ev, s, t, d in stats.largest())
    images = "\n".join(f'<p><img src="{name}" alt="{name}"></p>' for name in IMAGES)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bookfs report: {e(source_name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:left}} img{{max-width:100%}}</style>
</head><body>
<h1>bookfs report: {e(source_name)}</h1>
<h2>Summary</h2>
<table id="summary">
{rows}
</table>
<h2>Pictures</h2>
{images}
<h2>Largest events</h2>
<table id="largest">
<tr><th>event</th><th>card</th><th>bytes</th><th>size</th><th>date</th></tr>
{top}
</table>
</body></html>
"""


def check_out(out: str) -> bool:
    """Refuse an ``--out`` that is a file, has no parent, or holds files that are not an
    earlier report's (:class:`UsageError`, one line); True when it holds an earlier
    report (which is replaced)."""
    from bookfs.cli.breakdown_html import BY_IMAGES

    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} is a file; expected a directory (it is created "
                         "if missing)")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise UsageError(f"--out {out}: its parent directory does not exist")
    mine = {"index.html", *IMAGES, *BY_IMAGES}
    others = sorted(set(os.listdir(out)) - mine) if os.path.isdir(out) else []
    if others:  # a report never writes over files that are not an earlier report's
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3
                                         else "")
        raise UsageError(f"--out {out} holds other files ({shown}); expected a new or "
                         "empty directory, or an earlier report to replace")
    return os.path.isdir(out) and bool(os.listdir(out))


class ChartStats:
    """:class:`Stats` fed by ``report --by``'s pass (:mod:`bookfs.cli.heads`): its time
    bin chosen from the dates of the first and last dated events of ``ships``."""

    def __init__(self, ships, window):
        from bookfs.cli.heads import Decoder
        from bookfs.formats.info import DATE_SEARCH

        decode = Decoder()
        ends = [None, None]
        for ship in ships:
            first, last = window.events(*ship.range) if ship.range[1] else (1, 0)
            if last < first:
                continue
            for i, events in enumerate((range(first, min(last, first + DATE_SEARCH - 1) + 1),
                                        range(last, max(first, last - DATE_SEARCH) , -1))):
                for e in events:
                    d = next(iter(ship.heads(decode, e, e))).date
                    if d is not None:
                        ends[i] = d if ends[i] is None else (min if i == 0 else max)(ends[i], d)
                        break
        self.stats = Stats()
        _place_bins(self.stats, *ends)
        self.rng = random.Random(0)

    def add_head(self, h) -> None:
        self.stats.add(h.event, h.size, h.date, h.tag, self.rng)


def prepare_stats(ships, window) -> ChartStats:
    return ChartStats(ships, window)


def _place_bins(stats: Stats, first: int | None, last: int | None) -> None:
    stats.bin_seconds = _bin_for(first, last)
    if first is not None and last is not None:
        start = da_to_datetime(first).timestamp()
        stats.origin = start - start % stats.bin_seconds
        end = da_to_datetime(max(first, last)).timestamp()
        stats.max_bin = int((end - stats.origin) // stats.bin_seconds)


def run(args) -> int:
    from bookfs.cli.commands import _progress_bar
    from bookfs.cli.show import open_any

    if getattr(args, "by", None) is not None:
        from bookfs.cli.report_by import run as run_by

        return run_by(args)
    for flag in ("since", "until", "top", "depth"):
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag} is for a breakdown: add --by KEY")
    if args.json:
        raise UsageError("--json is for a breakdown: add --by KEY")
    if args.out is None:
        raise UsageError("expected --out DIR (the charts), --by KEY (a breakdown), or both")
    if not os.path.exists(args.source):
        raise UsageError(f"{args.source}: no such file or directory; expected a bookfs "
                         "mount, a pier, a Book directory or an LMDB epoch")
    out = args.out
    earlier = check_out(out)
    source = open_any(args.source)
    try:
        span = source.range
        if not span[1]:
            print(f"bookfs report: {args.source} holds no events; nothing to draw",
                  file=sys.stderr)
            return 2
        with _progress_bar(span[1] - span[0] + 1, "report", unit="ev") as bar:
            stats = gather(source, progress=bar.update)
    except OSError as e:
        print(f"bookfs report: {e.filename or args.source}: {e.strerror}", file=sys.stderr)
        return 1
    finally:
        source.close()
    os.makedirs(out, exist_ok=True)
    _plots(stats, out)
    with open(os.path.join(out, "index.html"), "w") as f:
        f.write(_html(stats, os.path.abspath(args.source), span))
    bad = (f", {stats.not_nouns:,} of them not nouns (see bookfs verify --nouns)"
           if stats.not_nouns else "")
    print(f"bookfs report: {stats.events:,} events, {human_size(stats.bytes)}{bad}; wrote "
          f"{os.path.join(out, 'index.html')} and {len(IMAGES)} images"
          + (" (replacing the earlier report there)" if earlier else ""))
    return 0


def register(sub) -> None:
    from bookfs.cli.breakdown import KEYS
    from bookfs.cli.args import count

    s = sub.add_parser("report", help="draw a log, or break it down: what fills it, by "
                       "vane, wire, card, agent or ship",
                       description=__doc__ + "\n" + _by_doc(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("source", help="a bookfs mount, a fleet mount or directory, a pier, a "
                   "Book directory or an LMDB epoch")
    s.add_argument("--out", metavar="DIR",
                   help="directory for index.html and the PNG images (created if missing; "
                        "an earlier report there is replaced; a directory holding other "
                        "files is refused); with --by, the breakdown's charts too")
    s.add_argument("--by", choices=KEYS, metavar="KEY",
                   help="break the log down by KEY: " + ", ".join(KEYS)
                   + " (events, bytes, share, growth per day, biggest event per group)")
    s.add_argument("--depth", type=count(1), metavar="K",
                   help="with --by wire: group by the wire's first K segments (default 2)")
    s.add_argument("--since", metavar="N|DATE",
                   help="from event N, or from a date (2024-01-05, 2024-01-05T12:00, "
                        "~2024.1.5), inclusive")
    s.add_argument("--until", metavar="N|DATE",
                   help="up to event N, or a date (a day alone: that whole day), inclusive")
    s.add_argument("--top", type=count(1), metavar="N",
                   help="the N largest groups; the rest summed as (other)")
    s.add_argument("--json", action="store_true",
                   help="with --by: print the breakdown as JSON ({total, groups, ...})")
    s.set_defaults(func=run)


def _by_doc() -> str:
    from bookfs.cli import report_by

    return report_by.__doc__ or ""
