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


SNIPPETS = ["ultralytics", "torchvision", "tensors", "supervision", "ensemble"]


def test_section_has_the_snippets():
    snippets = pipeline_snippets()
    assert len(snippets) == len(SNIPPETS)
    assert "fuse_results" in snippets[0] and "TorchvisionFusion" in snippets[1] and "detens.fuse(" in snippets[2]
    assert "import supervision" in snippets[3] and "Ensemble(" in snippets[4]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SNIPPETS)), ids=SNIPPETS)
def test_snippet_runs(index, monkeypatch):
    if SNIPPETS[index] == "supervision":
        pytest.importorskip("supervision")
    monkeypatch.chdir(REPO)  # the snippets use paths relative to the repository root
    code = pipeline_snippets()[index]
    namespace = {"__name__": f"readme_snippet_{index}"}
    exec(compile(code, f"README.md:pipeline-snippet-{index}", "exec"), namespace)
    fused = namespace["fused"]
    if SNIPPETS[index] == "ultralytics":
        assert namespace["annotated"].shape == fused[0].orig_img.shape
        assert len(fused[0].boxes) > 0
    elif SNIPPETS[index] == "supervision":
        assert len(fused) > 0 and namespace["annotated"].shape == namespace["image"].shape
        assert len(namespace["back"].data["class_name"]) == len(namespace["det"]) > 0
    elif SNIPPETS[index] == "ensemble":
        assert namespace["ens"].names == ["yolov8n_int8", "v11"]
        assert len(fused) == len(fused.paths) > 0 and fused.skipped == {}
        assert all(len(det) > 0 for det in fused)
