"""The per-image work that both engines of ``detens fuse`` share (detens.engines.fusing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detens.detections import Detections
from detens.engines.fusing import detect_batch


class Member:
    """A detector that finds, on each image, one box whose corner is the image's mean pixel value and
    whose score is its own ``score``; it records the batches it was called with."""

    def __init__(self, name: str, score: float) -> None:
        self.name, self.score, self.calls = name, score, []

    def __call__(self, images: list[np.ndarray]) -> list[Detections]:
        self.calls.append(len(images))
        return [
            Detections(torch.tensor([[float(image.mean()), 0.0, 20.0, 20.0]]), torch.tensor([self.score]),
                       torch.tensor([1]), image_size=image.shape[:2])
            for image in images
        ]


def test_each_image_has_every_members_detections_named_after_the_member():
    members = [Member("a", 0.9), Member("b", 0.4), Member("c", 0.7)]
    arrays = [np.full((32, 48, 3), value, dtype=np.uint8) for value in (3, 5)]
    per_image, detect_ms = detect_batch(members, arrays, ["x.jpg", "y.jpg"])

    assert [member.calls for member in members] == [[2], [2], [2]]  # one call per member for the batch
    assert len(per_image) == 2
    for image, value in zip(per_image, (3, 5), strict=True):  # the slow, obvious way: member by member
        assert [det.source for det in image] == ["a", "b", "c"]
        for det, member in zip(image, members, strict=True):
            assert det.boxes[0, 0].item() == value and det.scores.item() == pytest.approx(member.score)
            assert det.image_size == (32, 48)
    assert set(detect_ms) == {"detect:a", "detect:b", "detect:c"} and all(ms >= 0 for ms in detect_ms.values())


def test_a_member_that_returns_another_count_is_named():
    class Short(Member):
        def __call__(self, images):
            return super().__call__(images)[:1]

    with pytest.raises(RuntimeError, match="'short' returned 1 results for 2 images"):
        detect_batch([Member("a", 0.5), Short("short", 0.5)], [np.zeros((8, 8, 3), np.uint8)] * 2, ["x", "y"])
