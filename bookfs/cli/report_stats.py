"""The classic report's pass and charts (``bookfs report SOURCE --out DIR``, and the three
charts of ``report --by KEY --out DIR``): :class:`Stats` gathers, with bounded memory,
events per time bin and card tag, a reservoir sample of sizes and the largest events;
:func:`gather` fills it in one pass over a source (each payload checked as a noun);
:class:`ChartStats` fills it from ``report --by``'s pass instead (no check); :func:`_plots`
draws its three PNGs (:data:`IMAGES`).  ``bookfs.cli.report`` documents what they show."""

from __future__ import annotations

import datetime as _dt
import heapq
import os
import random
from collections import Counter
from dataclasses import dataclass, field

from bookfs.noun import da_to_datetime, peek_event
from bookfs.noun.render import human_size

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


# --- drawing -------------------------------------------------------------------------------


def _plots(stats: Stats, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    def when(t: float) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(t, _dt.UTC)

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
