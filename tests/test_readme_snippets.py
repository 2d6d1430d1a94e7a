"""The README's "Use detens in your pipeline" snippets run as written (so they cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Use detens in your pipeline"


def pipeline_snippets() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert SECTION in text, f"README.md lacks the section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    body = re.split(r"^## ", body, maxsplit=1, flags=re.MULTILINE)[0]
    return re.findall(r"^```python\n(.*?)^```", body, flags=re.MULTILINE | re.DOTALL)


def test_section_has_the_three_snippets():
    snippets = pipeline_snippets()
    assert len(snippets) == 3
    assert (
        "fuse_results" in snippets[0] and "TorchvisionFusion" in snippets[1] and "detens.fuse(" in snippets[2]
    )


@pytest.mark.slow
@pytest.mark.parametrize("index", range(3), ids=["ultralytics", "torchvision", "tensors"])
def test_snippet_runs(index, monkeypatch):
    monkeypatch.chdir(REPO)  # the snippets use paths relative to the repository root
    code = pipeline_snippets()[index]
    namespace = {"__name__": f"readme_snippet_{index}"}
    exec(compile(code, f"README.md:pipeline-snippet-{index}", "exec"), namespace)
    assert "fused" in namespace
    if index == 0:
        assert namespace["annotated"].shape == namespace["fused"][0].orig_img.shape
        assert len(namespace["fused"][0].boxes) > 0
