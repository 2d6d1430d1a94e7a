"""The README's result tables show what the committed reports under docs/ hold: every table that follows
a command writing ``--out docs/<name>.json`` gives, for each method row, that report's mAP to four
decimals (the mean over the seeds for a run of several seeds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
def _cells(row: str) -> list[str]:
    """A markdown row's cells, ``\\|`` (an escaped bar inside a cell) kept as ``|``."""
    inner = row.strip().strip("|")
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def result_tables(text: str) -> list[tuple[str, dict[str, str]]]:
    """``(report name, {method: mAP as printed})`` of every table that follows a command writing one report
    to ``docs/`` (with prose at most in between: no other code block or heading) and whose header has a
    ``method`` and a ``mAP`` column."""
    found = []
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```bash":
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        outs = re.findall(r"--out (docs/\S+\.json)", "\n".join(lines[index + 1 : end]))
        index = end + 1
        while index < len(lines) and not lines[index].strip().startswith(("|", "```", "#")):
            index += 1
        rows = []
        while index < len(lines) and lines[index].strip().startswith("|"):
            rows.append(lines[index])
            index += 1
        if len(outs) != 1 or len(rows) < 3:
            continue
        header = _cells(rows[0])
        if not header[0].startswith("method") or "mAP" not in header:
            continue
        column = header.index("mAP")
        found.append((outs[0], {_cells(row)[0]: _cells(row)[column] for row in rows[2:]}))
    return found


def test_the_parser_reads_a_table_after_its_command():
    text = (
        "```bash\ndetens evaluate --gt g --methods a,b \\\n    --out docs/x.json\n```\n\nprose\n\n"
        "| method | mAP | AP50 |\n|---|---:|---:|\n| a | 0.4000 | 0.5 |\n| single:m\\|tiles=2x2 | 0.3000 | 0.4 |\n"
        "\n```bash\necho no table follows\n```\n\n## next\n\n| method | mAP |\n|---|---:|\n| c | 0.1 |\n"
    )
    assert result_tables(text) == [("docs/x.json", {"a": "0.4000", "single:m|tiles=2x2": "0.3000"})]


TABLES = result_tables((REPO / "README.md").read_text(encoding="utf-8"))


def test_the_readme_has_result_tables():
    names = [name for name, _ in TABLES]
    assert "docs/results_yolo3_extra.json" in names and "docs/results_yolo3_extra_seeds.json" in names, names


@pytest.mark.parametrize(("report", "rows"), TABLES, ids=[name for name, _ in TABLES])
def test_a_result_table_shows_its_report(report, rows):
    metrics = json.loads((REPO / report).read_text(encoding="utf-8"))
    for method, shown in rows.items():
        assert method in metrics, f"{report} has no row {method!r} (it has {sorted(metrics)})"
        assert shown == f"{metrics[method]['map']:.4f}", f"{report}: {method} shows {shown}, the report {metrics[method]['map']:.4f}"
