"""The README's links lead somewhere: every in-page link names a heading, every relative link a file."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped (letters of any script,
    digits, ``_`` and ``-`` kept), each space a ``-``."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def readme_text() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def headings(text: str) -> list[str]:
    """The Markdown headings outside fenced code blocks (a ``# comment`` in a shell block is none)."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            found.append(match[1])
    return found


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(text):
        anchor = heading_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        result.add(anchor if count == 0 else f"{anchor}-{count}")  # GitHub's suffix for a repeated heading
    return result


def test_heading_anchor_follows_githubs_rules():
    assert heading_anchor("Quick start") == "quick-start"
    assert heading_anchor("Fusion of YOLOv8n + YOLO11n + YOLO26n") == "fusion-of-yolov8n--yolo11n--yolo26n"
    assert heading_anchor("What was tried for the +1.5-point target") == "what-was-tried-for-the-15-point-target"
    assert heading_anchor("The Θ head") == "the-θ-head"
    assert heading_anchor("The report page: what fusion did") == "the-report-page-what-fusion-did"


def test_headings_skip_code_blocks():
    text = "# Title\n\n```bash\n# a comment\n```\n\n## Part\n"
    assert headings(text) == ["Title", "Part"]
    assert anchors("## A\n\n## A\n") == {"a", "a-1"}


def test_every_in_page_link_names_a_heading():
    text = readme_text()
    targets = [link[1:] for link in LINK.findall(text) if link.startswith("#")]
    assert targets, "the README's contents list has no in-page links"
    missing = sorted(set(targets) - anchors(text))
    assert not missing, f"in-page links to no heading: {missing}"


def test_every_relative_link_names_a_file():
    links = [link for link in LINK.findall(readme_text()) if not link.startswith(("#", "http://", "https://"))]
    missing = [link for link in links if not (REPO / link.split("#", 1)[0]).exists()]
    assert not missing, f"links to files that do not exist: {missing}"
