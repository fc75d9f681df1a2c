"""The README and perf/RESULTS.md stay short enough to read, and their relative links lead somewhere.

README.md: at most 12 KiB (what rocm-mla is, its status, the MI300 quick start, the support matrix,
the development set-up, links into docs/). perf/RESULTS.md: at most 40 KiB (perf/report.py keeps per
shape and provider the latest run; older runs live in the git history of the file). Every relative
link of either page names a file of the repository, and a link's #anchor a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BARS = {"README.md": 12 * 1024, "perf/RESULTS.md": 40 * 1024}

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of ``markdown`` (outside fenced code)."""
    out = set()
    for line in FENCE.sub("", markdown).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``path`` whose file (inside ``root``), or whose anchor in that file, does
    not exist."""
    text = path.read_text()
    broken = []
    for link in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:: not a file of the repository
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists() or root.resolve() not in file.parents:
            broken.append(link)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(link)
    return broken


@pytest.mark.parametrize("name", sorted(BARS))
def test_page_within_its_bar(name):
    size = len((ROOT / name).read_bytes())
    assert size <= BARS[name], f"{name}: {size} bytes, the bar is {BARS[name]}"


@pytest.mark.parametrize("name", sorted(BARS))
def test_every_relative_link_leads_to_a_file_and_heading(name):
    assert broken_links(ROOT / name) == []


def test_the_link_check_catches_what_it_should(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Sparse MLA (DeepSeek-V3.2, GLM-5.x)\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#sparse-mla-deepseek-v32-glm-5x) [web](https://example.com/x)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#nothing) [self](#a-page) [out](../x.md)\n"
        "```\n[in code](docs/c.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == ["docs/b.md", "docs/a.md#nothing", "#a-page", "../x.md"]
    assert anchors("# Use it on an MI300\n```\n# not a heading\n```\n") == {"use-it-on-an-mi300"}
