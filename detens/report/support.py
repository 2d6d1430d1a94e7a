"""Votes: how many ensemble members support each fused true positive and false positive.

A member supports a fused detection when it has a box of the same class with IoU ``>= iou_thr`` (0.55,
the matching IoU of the fixed fusers) with the fused box and scored at least ``min_score``. The fused
detections are labelled as COCOeval labels them at IoU 0.5 (:mod:`detens.coco_match`: top 100 per image and
class, crowd matches left out), so the histogram covers exactly the detections behind the AP50 column.

Dimension legend: N members, D fused detections of one image and class, M one member's boxes of that
image and class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from detens.coco import CocoGroundTruth, group_results_by_image
from detens.coco_match import FP, TP, coco_iou, iter_matches

__all__ = ["member_support"]


def member_support(
    truth: CocoGroundTruth,
    fused: Sequence[Mapping[str, Any]],
    members: Mapping[str, Sequence[Mapping[str, Any]]],
    image_ids: Sequence[int],
    iou_thr: float = 0.55,
    min_score: float = 0.0,
    label_iou: float = 0.5,
) -> dict[str, Any]:
    """Histogram of member support for the fused true and false positives.

    Args:
        truth (CocoGroundTruth): the ground truth.
        fused (list[dict]): one method's COCO results.
        members (dict[str, list[dict]]): each member's COCO results on the same images.
        image_ids (list[int]): the scored images.
        iou_thr (float): IoU at which a member's box supports a fused box.
        min_score (float): fused detections scored below this are left out, and member boxes below it do
            not support (0: every detection, as AP counts them).
        label_iou (float): the IoU at which fused detections are labelled true positives.

    Returns:
        dict: ``{"members": N, "tp": list[N + 1], "fp": list[N + 1], "iou_thr", "min_score", "label_iou"}``
        where ``tp[n]`` counts the true positives that exactly ``n`` members support.
    """
    names = list(members)
    by_member = [group_results_by_image([r for r in members[n] if r["score"] >= min_score]) for n in names]
    hist = {TP: np.zeros(len(names) + 1, dtype=np.int64), FP: np.zeros(len(names) + 1, dtype=np.int64)}
    for image in iter_matches(truth, fused, image_ids, label_iou):
        if not image.detections:
            continue
        boxes = np.array([d["bbox"] for d in image.detections], dtype=np.float64)  # [D, 4] xywh
        classes = np.array([d["category_id"] for d in image.detections])
        support = np.zeros(len(boxes), dtype=np.int64)
        for grouped in by_member:
            theirs = grouped.get(image.image_id, [])
            if not theirs:
                continue
            their_boxes = np.array([r["bbox"] for r in theirs], dtype=np.float64)  # [M, 4]
            their_classes = np.array([r["category_id"] for r in theirs])
            iou = coco_iou(boxes, their_boxes, np.zeros(len(theirs), dtype=bool))  # [D, M]
            same = classes[:, None] == their_classes[None, :]
            support += ((iou >= iou_thr) & same).any(axis=1)
        scores = np.array([d["score"] for d in image.detections])
        labels = np.array(image.labels)
        for label in (TP, FP):
            counted = (labels == label) & (scores >= min_score)
            hist[label] += np.bincount(support[counted], minlength=len(names) + 1)
    return {
        "members": len(names),
        "tp": hist[TP].tolist(),
        "fp": hist[FP].tolist(),
        "iou_thr": iou_thr,
        "min_score": min_score,
        "label_iou": label_iou,
    }
