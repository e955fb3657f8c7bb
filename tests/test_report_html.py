"""The HTML page of ``bookfs report --by KEY --out DIR`` (issue 35) opened in a real
headless browser, Debian's ``chromium`` (``mount_scripts/setup.sh`` installs it): the page
loads with no console message, every chart is an image the browser decoded (complete,
with a natural width and height), and the screenshot is drawn."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from mount_fixtures import build_sample
from mounting import run_bookfs
from PIL import Image

from bookfs.cli.breakdown_html import BY_IMAGES
from bookfs.cli.report import IMAGES

CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--disable-extensions"]
CHECK = ('<script>window.addEventListener("load",()=>{const p=document.createElement("pre");'
         'p.id="decoded";p.textContent=[...document.images].map(i=>i.complete+":"+'
         'i.naturalWidth+"x"+i.naturalHeight).join(" ");document.body.appendChild(p);});'
         '</script></body>')


def _browser(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*CHROMIUM, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    log = build_sample(d / "log", 2500)
    out = d / "out"
    run_bookfs("report", str(log), "--by", "vane", "--out", str(out))
    return out


def test_the_page_loads_without_console_messages_and_draws(page, tmp_path):
    shot = tmp_path / "shot.png"
    r = _browser("--enable-logging=stderr", "--v=0", "--window-size=1200,3000",
                 f"--screenshot={shot}", (page / "index.html").as_uri(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line
               or "Uncaught" in line or "Failed to load" in line]
    assert console == []
    with Image.open(shot) as im:
        assert im.size == (1200, 3000)
        assert len(im.convert("RGB").getcolors(1 << 20) or range(1 << 20)) > 50


def test_every_chart_is_decoded_by_the_browser(page, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(page, copy)
    index = copy / "index.html"
    index.write_text(index.read_text().replace("</body>", CHECK))
    r = _browser("--virtual-time-budget=5000", "--dump-dom", index.as_uri(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    decoded = r.stdout.split('<pre id="decoded">')[1].split("</pre>")[0].split()
    assert len(decoded) == len(BY_IMAGES) + len(IMAGES)
    for item in decoded:
        done, size = item.split(":")
        width, height = map(int, size.split("x"))
        assert done == "true" and width >= 600 and height >= 250, decoded
    assert 'id="groups"' in r.stdout and "ames" in r.stdout
