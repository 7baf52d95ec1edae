"""The documentation as a reader sees it: the site built with warnings as errors, every page
rendered in headless Chromium at a 1280-pixel window, with a title and its text, and no
element wider than its container (no table or code block that scrolls sideways or sticks out
of the column). Skipped, saying why, where Chromium or Sphinx is absent (.ci/run installs
Chromium from Debian's packages)."""
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                None)
WIDTH = 1280
GENERATED = {"genindex.html", "search.html", "py-modindex.html"}  # Sphinx's, with little text

# Runs at the load event of each page: every element of the article that scrolls sideways (its
# content wider than its box) or reaches past the right edge of a container that does not clip
# it; the list goes into the DOM, which Chromium prints.
MEASURE = """
<script>
window.addEventListener("load", () => {
  const article = document.querySelector("article") || document.querySelector("main") || document.body;
  const bad = [];
  const name = (el) => el.tagName.toLowerCase() + (el.className ? "." + String(el.className).split(" ")[0] : "");
  for (const el of article.querySelectorAll("*")) {
    const style = getComputedStyle(el);
    if (style.display === "none" || style.visibility === "hidden" || el.closest("[hidden]")) continue;
    const text = (el.textContent || "").trim().slice(0, 60);
    if (["auto", "scroll"].includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1)
      bad.push(`${name(el)} scrolls sideways (${el.scrollWidth} px in ${el.clientWidth}): ${text}`);
    const parent = el.parentElement;
    if (!parent || !article.contains(parent) || getComputedStyle(parent).overflowX !== "visible") continue;
    const box = el.getBoundingClientRect(), outer = parent.getBoundingClientRect();
    if (box.width > 0 && box.right > outer.right + 1)
      bad.push(`${name(el)} is ${Math.round(box.right - outer.right)} px wider than ${name(parent)}: ${text}`);
  }
  const out = document.createElement("pre");
  out.id = "layout-report";
  const title = article.querySelector("h1");
  out.textContent = JSON.stringify({width: window.innerWidth, bad: bad,
                                    title: title ? title.textContent.trim() : "",
                                    text: (article.innerText || "").length});
  document.body.appendChild(out);
});
</script>
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium): the pages cannot be rendered")
    pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install -r requirements-docs.txt)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(ROOT / "docs"), str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def pages(site):
    return sorted(p for p in site.rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts)


# Collects the reports of every frame once all have loaded (the frames' load events run first).
COLLECT = """
<script>
window.addEventListener("load", () => {
  const reports = [...document.querySelectorAll("iframe")].map(
      (frame) => frame.contentDocument.getElementById("layout-report")?.textContent ?? null);
  const out = document.createElement("pre");
  out.id = "layout-reports";
  out.textContent = JSON.stringify(reports);
  document.body.appendChild(out);
});
</script>
"""


def render(pages) -> list:
    """The layout report of each page as Chromium renders it at WIDTH pixels: one Chromium for
    all of them (a start costs about a second), each page in a frame of WIDTH x 1000 pixels,
    its own viewport, as a window of that size would be. File pages read each other's frames
    with --allow-file-access-from-files."""
    for page in pages:
        page.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    frames = "".join(f'<iframe src="{page.as_uri()}" style="width: {WIDTH}px; height: 1000px; border: 0"></iframe>'
                     for page in pages)
    top = pages[0].parent / "all-pages-in-frames.html"
    top.write_text(f"<html><body>{frames}{COLLECT}</body></html>")
    proc = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WIDTH + 20},1000", "--virtual-time-budget=10000", "--dump-dom",
                           "--allow-file-access-from-files",
                           "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: a CDN script fails at once
                           top.as_uri()], capture_output=True, text=True, timeout=300)
    top.unlink()
    found = re.search(r'<pre id="layout-reports"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    assert found, f"Chromium printed no reports: {proc.stderr[-2000:]}"
    reports = json.loads(html.unescape(found.group(1)))
    missing = [page.name for page, report in zip(pages, reports) if report is None]
    assert not missing, f"Chromium printed no report for {missing}"
    return [json.loads(report) for report in reports]


def test_every_page_fits_a_1280_pixel_window(site):
    rendered = pages(site)
    assert len(rendered) >= 20  # every page of docs/ and docs/results/, the API, the index
    failures = {}
    for page, report in zip(rendered, render(rendered)):
        assert report["width"] == WIDTH
        bad = report["bad"][:5]
        if page.name not in GENERATED and (not report["title"] or report["text"] < 300):
            bad.append(f"a page without its content: title {report['title']!r}, {report['text']} characters")
        if bad:
            failures[str(page.relative_to(site))] = bad
    assert not failures, json.dumps(failures, indent=1, ensure_ascii=False)


def test_the_measure_finds_a_table_too_wide(tmp_path):
    """The check itself: a page with a code line and a table wider than the column fails it."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    page = tmp_path / "wide.html"
    wide = "x" * 400
    page.write_text(f"<html><body><article style='width: 600px'><p>narrow</p>"
                    f"<div style='overflow-x: auto'><pre>{wide}</pre></div>"
                    f"<table><tr><td>{'y' * 300}</td></tr></table></article></body></html>")
    bad = render([page])[0]["bad"]
    assert any("div scrolls sideways" in b for b in bad), bad
    assert any(b.startswith("table is ") and "wider than article" in b for b in bad), bad
    assert not any("narrow" in b for b in bad)
