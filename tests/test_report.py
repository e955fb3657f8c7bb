"""``bookfs report``: a real sample log drawn to PNGs and one HTML page, checked by
opening the images and reading the page back against the log."""

from __future__ import annotations

import html
import re

import pytest
from PIL import Image

from bookfs.formats.book import Book
from bookfs.noun import peek_event
from bookfs.cli.report import IMAGES, TOP_K
from mounting import mounted, run_bookfs

EVENTS = 2500  # past LARGE_EVERY: holds a MiB-sized ship event besides the boot ones


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("report") / "log"
    run_bookfs("sample", str(d), "--events", str(EVENTS))
    return d


def _largest(src) -> list[tuple[int, int]]:
    with Book.open(src) as book:
        sizes = [(book.payload_size(n), -n) for n in range(1, book.last + 1)]
    return [(-e, s) for s, e in sorted(sizes, reverse=True)[:TOP_K]]


def _table(page: str, table_id: str) -> list[list[str]]:
    body = page.split(f'<table id="{table_id}">')[1].split("</table>")[0]
    return [[html.unescape(c) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_report_of_a_sample_log_through_a_mount(src, tmp_path):
    out = tmp_path / "out"
    with mounted(src, tmp_path / "mnt", "-o", "ro") as mnt:
        r = run_bookfs("report", mnt, "--out", str(out))
    assert r.returncode == 0 and f"{EVENTS:,} events" in r.stdout
    for name in IMAGES:  # real PNGs with pixels, several colours (bars and points drawn)
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.width >= 600 and im.height >= 250
            assert len(im.convert("RGB").getcolors(1 << 16) or range(2 << 16)) > 4
    page = (out / "index.html").read_text()
    for name in IMAGES:
        assert f'src="{name}"' in page
    top = _table(page, "largest")[1:]
    assert [(int(r[0]), int(r[2].replace(",", ""))) for r in top] == _largest(src)
    with Book.open(src) as book:
        tags = {n: peek_event(book.read(n)[4:])[2] for n in (e for e, _ in _largest(src))}
    for row in top:
        assert row[1] == (tags[int(row[0])] or "(boot)")
    summary = dict(_table(page, "summary"))
    assert summary["events"] == f"1..{EVENTS:,} ({EVENTS:,} events)"
    assert summary["events without a date"] == "5 (boot)"
    assert summary["first date"].startswith("~2024.")


def test_report_of_a_log_directory_matches(src, tmp_path):
    out = tmp_path / "direct"
    assert run_bookfs("report", str(src), "--out", str(out)).returncode == 0
    top = _table((out / "index.html").read_text(), "largest")[1:]
    assert [(int(r[0]), int(r[2].replace(",", ""))) for r in top] == _largest(src)


@pytest.mark.parametrize("case", ["missing", "out-is-file", "no-parent", "empty"])
def test_report_bad_input_is_one_line_exit_2(case, src, tmp_path):
    source, out = str(src), str(tmp_path / "o")
    if case == "missing":
        source = str(tmp_path / "nope")
    elif case == "out-is-file":
        (tmp_path / "o").write_text("x")
    elif case == "no-parent":
        out = str(tmp_path / "a" / "b" / "o")
    else:
        with Book.open(tmp_path / "empty", writable=True, create=True):
            pass
        source = str(tmp_path / "empty")
    r = run_bookfs("report", source, "--out", out, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and r.stdout == ""
    assert case == "out-is-file" or not (tmp_path / "o").exists()


def test_report_never_writes_over_other_files(src, tmp_path):
    """Issue 23.4: ``--out`` holding files that are not an earlier report's is refused in
    one line, exit 2, those files untouched (the report used to write in among them
    without a word); an earlier report there is replaced, and the summary says so."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    r = run_bookfs("report", str(src), "--out", str(out), check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "holds other files (notes.txt)" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    again = tmp_path / "again"
    assert run_bookfs("report", str(src), "--out", str(again)).returncode == 0
    r = run_bookfs("report", str(src), "--out", str(again))
    assert r.returncode == 0 and "(replacing the earlier report there)" in r.stdout
