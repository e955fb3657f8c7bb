"""The HTML page of ``bookfs report SRC --by KEY --out DIR``: the breakdown as a table,
two charts of it, and the classic report's three charts (``bookfs.cli.report``) drawn
from the same pass.

* ``bytes_by_group.png``: payload bytes per time bin, stacked by group (the
  :data:`CHART_GROUPS` largest groups; the rest as ``(other)``), UTC;
* ``growth_by_group.png``: each group's growth, bytes per day over the span it covers
  (horizontal bars, log scale, the same groups), its share of the bytes written beside it.

``index.html`` shows the totals, the groups (``<table id="groups">``: key, events, bytes,
share, bytes per day, biggest event), a pier's epochs and what a chop would free
(``<table id="epochs">``), and the five images.
"""

from __future__ import annotations

import datetime as _dt
import html
import os

from bookfs.cli.breakdown import OTHER
from bookfs.cli.report_stats import IMAGES, _plots
from bookfs.errors import UsageError
from bookfs.noun.render import human_size

BY_IMAGES = ("bytes_by_group.png", "growth_by_group.png")
CHART_GROUPS = 10
DPI = 100


def check_out(out: str) -> bool:
    """Refuse an ``--out`` that is a file, has no parent, or holds files that are not an
    earlier report's (:class:`UsageError`, one line); True when it holds an earlier
    report (which is replaced)."""
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


def _stacked(bd, result: dict, path: str, key: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    names = [g["key"] for g in result["groups"] if g["key"] != OTHER][:CHART_GROUPS]
    fig, ax = plt.subplots(figsize=(11, 5), dpi=DPI)
    bins = bd.bins
    if bins is not None and bins.bins:
        lo, hi = min(bins.bins), max(bins.bins)
        span = range(lo, hi + 1)
        when = [_dt.datetime.fromtimestamp(b * bins.seconds, _dt.UTC) for b in span]
        per: dict[str, list[int]] = {n: [0] * len(span) for n in names}
        rest = [0] * len(span)
        for (b, g), n in bins.data.items():
            (per[g] if g in per else rest)[b - lo] += n
        bottom = [0] * len(span)
        cmap = plt.get_cmap("tab20")
        width = bins.seconds / 86400 * 0.9
        series = [(n, per[n]) for n in names] + ([(OTHER, rest)] if any(rest) else [])
        for i, (name, ys) in enumerate(series):
            ax.bar(when, ys, width=width, bottom=bottom, align="edge", label=name,
                   color=cmap(i % 20))
            bottom = [a + y for a, y in zip(bottom, ys)]
        ax.legend(loc="upper left", fontsize="small", ncol=2)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: human_size(int(v))))
        step = {60: "minute", 300: "5 minutes", 900: "15 minutes", 3600: "hour",
                21600: "6 hours", 86400: "day", 604800: "week"}.get(bins.seconds, "bin")
        ax.set_title(f"Payload bytes per {step}, stacked by {key} (UTC)")
    else:
        ax.set_title(f"Payload bytes over time, by {key}")
    ax.set_ylabel("bytes")
    _save(fig, ax, path, bool(bins is not None and bins.bins))


def _growth(result: dict, path: str, key: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [g for g in result["groups"] if g["bytes_per_day"]][:CHART_GROUPS + 1]
    fig, ax = plt.subplots(figsize=(11, max(3, 0.45 * len(rows) + 1.2)), dpi=DPI)
    if rows:
        ys = range(len(rows))
        ax.barh(ys, [g["bytes_per_day"] for g in rows], color="tab:blue")
        ax.set_yticks(ys, [g["key"] for g in rows], fontsize="small")
        ax.invert_yaxis()
        ax.set_xscale("log")
        for i, g in enumerate(rows):
            ax.text(g["bytes_per_day"], i, f" {human_size(g['bytes_per_day'])}/day"
                    f"  ({100 * g['share']:.1f}% of bytes)", va="center", fontsize="small")
        right = max(g["bytes_per_day"] for g in rows)
        ax.set_xlim(right=right * 30)  # room for the labels
    ax.set_title(f"Growth by {key}: bytes per day over the span each group covers")
    ax.set_xlabel("bytes per day (log scale)")
    _save(fig, ax, path, bool(rows))


def _save(fig, ax, path: str, drawn: bool) -> None:
    """Write the figure (saying "no dated events" on an empty one) and free it."""
    import matplotlib.pyplot as plt

    if not drawn:
        ax.text(0.5, 0.5, "no dated events", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _page(result: dict, source: str, stats) -> str:
    e = html.escape
    t = result["total"]
    key = result["key"]

    def rate(n):
        return "-" if n is None else f"{human_size(n)}/day"

    summary = [("source", source),
               ("events", f"{t['first_event'] or 0:,}..{t['last_event'] or 0:,} "
                          f"({t['events']:,} events)"),
               ("payload bytes", f"{human_size(t['bytes'])} ({t['bytes']:,} bytes)"),
               ("dates", f"{t['first_date'] or '-'} .. {t['last_date'] or '-'} UTC"),
               ("growth", rate(t["bytes_per_day"])),
               ("grouped by", key + (f" (first {result['depth']} segments)"
                                     if key == "wire" else ""))]
    rows = "\n".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in summary)
    groups = "\n".join(
        f"<tr><td>{e(g['key'])}</td><td>{g['events']:,}</td><td>{g['bytes']:,}</td>"
        f"<td>{e(human_size(g['bytes']))}</td><td>{100 * g['share']:.1f}%</td>"
        f"<td>{e(rate(g['bytes_per_day']))}</td>"
        f"<td>{g['biggest']['event'] if g['biggest'] else '-'}</td></tr>"
        for g in result["groups"])
    epochs = ""
    if result.get("epochs"):
        body = "\n".join(
            f"<tr><td>{e(x.get('ship', ''))} {e(x['epoch'])}</td><td>{x['events']:,}</td>"
            f"<td>{x['counted_bytes']:,}</td><td>{x['disk_bytes']:,}</td>"
            f"<td>{'yes' if x['chop_frees'] else 'no'}</td></tr>" for x in result["epochs"])
        c = result["chop"]
        epochs = (f"<h2>Epochs</h2>\n<table id=\"epochs\">\n<tr><th>epoch</th><th>events"
                  f"</th><th>payload bytes</th><th>on disk</th><th>a chop frees it</th>"
                  f"</tr>\n{body}\n</table>\n<p>A roll then a chop would free "
                  f"{e(human_size(c['frees_disk_bytes']))} now: {e(c['rule'])}.</p>")
    images = "\n".join(f'<p><img src="{n}" alt="{n}"></p>' for n in (*BY_IMAGES, *IMAGES))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bookfs report by {e(key)}: {e(source)}</title>
<link rel="icon" href="data:,">
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:left}} img{{max-width:100%}}</style>
</head><body>
<h1>What fills {e(source)}: by {e(key)}</h1>
<table id="summary">
{rows}
</table>
<h2>Groups</h2>
<table id="groups">
<tr><th>{e(key)}</th><th>events</th><th>bytes</th><th>size</th><th>share</th><th>growth</th><th>biggest event</th></tr>
{groups}
</table>
{epochs}
<h2>Pictures</h2>
{images}
</body></html>
"""


def write_page(out: str, result: dict, bd, charts, source: str) -> None:
    """Write the five images and ``index.html`` into ``out`` (created if missing)."""
    os.makedirs(out, exist_ok=True)
    _stacked(bd, result, os.path.join(out, BY_IMAGES[0]), result["key"])
    _growth(result, os.path.join(out, BY_IMAGES[1]), result["key"])
    _plots(charts.stats, out)
    with open(os.path.join(out, "index.html"), "w") as f:
        f.write(_page(result, os.path.abspath(source), charts.stats))
