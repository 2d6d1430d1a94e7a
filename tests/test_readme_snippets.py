"""The README's "Use detens in your pipeline" snippets run as written (so they cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

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
    torch.manual_seed(0)  # the torchvision snippet's untrained weights and random images
    exec(compile(code, f"README.md:pipeline-snippet-{index}", "exec"), namespace)
    fused = namespace["fused"]
    if SNIPPETS[index] == "tensors":
        # WBF (iou_thr 0.55): a's box 0 and b's box overlap at IoU 19200 / 21184 = 0.906 (intersection
        # 96 x 200; areas 100 x 200 and 98 x 208), so they fuse into their score-weighted mean, e.g.
        # x1 = (0.9 * 10 + 0.7 * 14) / 1.6 = 11.75, scored mean(0.9, 0.7) * 2 boxes / 2 models = 0.8;
        # a's box 1 (label 3) stays alone, scored 0.4 * 1 box / 2 models = 0.2.
        assert fused.labels.tolist() == [1, 3]
        torch.testing.assert_close(fused.boxes, torch.tensor([[11.75, 19.125, 110.875, 222.625],
                                                              [300.0, 40.0, 380.0, 90.0]]), rtol=0, atol=1e-3)
        torch.testing.assert_close(fused.scores, torch.tensor([0.8, 0.2]), rtol=0, atol=1e-6)
    elif SNIPPETS[index] == "torchvision":
        assert len(fused) == len(namespace["images"]) == 2
        for out, size in zip(fused, [(480, 640), (375, 500)], strict=True):
            assert set(out) == {"boxes", "scores", "labels"}
            assert out["boxes"].shape == (len(out["scores"]), 4) and len(out["labels"]) == len(out["scores"]) > 0
            assert (out["boxes"][:, 2] <= size[1]).all() and (out["boxes"][:, 3] <= size[0]).all()
        with torch.no_grad():
            rcnn, ssd = [model(namespace["images"]) for model in namespace["models"]]
        # Untrained Faster R-CNN scores every class about 1/91, below its box_score_thresh 0.05: no box.
        # SSDlite's own class-wise NMS at IoU 0.55 leaves no two boxes of a class that WBF (iou_thr 0.55)
        # would merge: each fused box is one SSDlite box, scored by one model of two: score / 2.
        assert [len(out["boxes"]) for out in rcnn] == [0, 0]
        for out, alone in zip(fused, ssd, strict=True):
            assert_same_boxes(out, {**alone, "scores": alone["scores"] / 2})
    elif SNIPPETS[index] == "ultralytics":
        assert namespace["annotated"].shape == fused[0].orig_img.shape
        assert len(fused[0].boxes) > 0
    elif SNIPPETS[index] == "supervision":
        assert len(fused) > 0 and namespace["annotated"].shape == namespace["image"].shape
        assert len(namespace["back"].data["class_name"]) == len(namespace["det"]) > 0
    elif SNIPPETS[index] == "ensemble":
        assert namespace["ens"].names == ["yolov8n_int8", "v11"]
        assert len(fused) == len(fused.paths) > 0 and fused.skipped == {}
        assert all(len(det) > 0 for det in fused)


def assert_same_boxes(got: dict, want: dict) -> None:
    """``got`` and ``want`` (torchvision output dicts) hold the same boxes, scores and labels, in any order."""
    assert len(got["boxes"]) == len(want["boxes"])
    apart = (got["boxes"][:, None] - want["boxes"][None]).abs().amax(-1)  # [K, K] pixels
    apart[got["labels"][:, None] != want["labels"][None]] = float("inf")
    apart[(got["scores"][:, None] - want["scores"][None]).abs() > 1e-6] = float("inf")
    nearest = apart.argmin(1)
    assert apart.min(1).values.max() < 1e-3 and len(set(nearest.tolist())) == len(nearest)
