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
import html
import os
import sys

from bookfs.cli.breakdown_html import check_out
from bookfs.cli.report_stats import (  # noqa: F401
    BIN_CHOICES,
    BIN_NAMES,
    DPI,
    HEAD_BYTES,
    IMAGES,
    MAX_TAGS,
    NOT_A_NOUN,
    SCATTER_POINTS,
    TARGET_BINS,
    TOP_K,
    UNDATED,
    Stats,
    _plots,
    gather,
)
from bookfs.errors import UsageError
from bookfs.noun import da_to_datetime, format_da
from bookfs.noun.render import human_bytes, human_size


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
    from bookfs.cli.args import count
    from bookfs.cli.breakdown import KEYS

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
