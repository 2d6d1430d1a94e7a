"""Properties every registered fuser keeps on any valid input (hypothesis), with its default options.

Dimension legend: N models, K boxes of one model, C clusters.

Inputs mix the awkward cases: empty models, boxes of zero width, boxes partly or wholly outside the image,
scores of 0, 1 and 1e-45, class ids at both ends of the valid range, zero and tiny model weights.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuser_contract import params_for

from detens import Detections, fuse, match
from detens.detections import MAX_LABEL
from detens.fusers import FUSERS

# Drawn boxes may all fall within [0, 1] on this image: valid input, of which detens.fuse rightly warns.
pytestmark = pytest.mark.filterwarnings("ignore:every box lies within:UserWarning")

HEIGHT, WIDTH = 60, 80
LABELS = [0, 1, MAX_LABEL]
#: fusers whose boxes are averages over the clusters of ``detens.match``
MATCHED = {"mean", "vote", "random_k", "theta"}
WEIGHTED = {"wbf", "nms", "soft_nms", "refine", "mean", "vote"}
SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

coordinate = st.one_of(st.floats(-20, WIDTH + 20, width=32), st.sampled_from([0.0, float(WIDTH), -1e6, 1e6]))
score = st.one_of(st.floats(0, 1, width=32), st.sampled_from([0.0, 1.0, 1.4e-45]))


@st.composite
def box(draw):
    x = sorted([draw(coordinate), draw(coordinate)])
    y = sorted([draw(coordinate), draw(coordinate)])
    if draw(st.booleans()):  # most boxes overlap the image centre, so clusters form
        x = [min(x[0], 30.0), max(x[1], 40.0)]
        y = [min(y[0], 20.0), max(y[1], 30.0)]
    return [x[0], y[0], x[1], y[1]]


@st.composite
def ensembles(draw, distinct_scores: bool = False):
    """(per_model, weights): 1-3 models of 0-6 boxes each, and None or one weight per model."""
    num_models = draw(st.integers(1, 3))
    sizes = [draw(st.integers(0, 6)) for _ in range(num_models)]
    total = sum(sizes)
    if distinct_scores:  # no ties: the methods are symmetric in the models only then
        scores = draw(st.lists(st.floats(2**-6, 1, width=32), min_size=total, max_size=total, unique=True))
    else:
        scores = draw(st.lists(score, min_size=total, max_size=total))
    per_model, start = [], 0
    for n, size in enumerate(sizes):
        boxes = draw(st.lists(box(), min_size=size, max_size=size))
        labels = draw(st.lists(st.sampled_from(LABELS), min_size=size, max_size=size))
        per_model.append(
            Detections(torch.tensor(boxes).reshape(-1, 4), scores[start : start + size], labels, (HEIGHT, WIDTH), f"m{n}")
        )
        start += size
    weights = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.0, 1.4e-45, 0.5, 1.0, 3.0]),
                                                 min_size=num_models, max_size=num_models)))
    if weights is not None and not any(weights):
        weights[0] = 1.0
    return per_model, weights


def options(name: str, num_models: int, weights) -> dict:
    params = params_for(name, num_models)
    if weights is not None and name in WEIGHTED:
        params["weights"] = weights
    return params


def hull(boxes: torch.Tensor) -> torch.Tensor:
    """Tensor[4]: the smallest x1, y1 and the largest x2, y2 of ``boxes (Tensor[K, 4])``."""
    return torch.cat([boxes[:, :2].min(0).values, boxes[:, 2:].max(0).values])


def inside(inner: torch.Tensor, outer: torch.Tensor, tol: float = 1e-3) -> bool:
    return bool((inner[:2] >= outer[:2] - tol).all() and (inner[2:] <= outer[2:] + tol).all())


@SETTINGS
@given(case=ensembles(), name=st.sampled_from(FUSERS.names()))
def test_output_is_valid_and_inside_the_inputs(case, name):
    per_model, weights = case
    fused = fuse(per_model, name, **options(name, len(per_model), weights))
    assert torch.isfinite(fused.boxes).all() and torch.isfinite(fused.scores).all()
    assert ((fused.scores >= 0) & (fused.scores <= 1)).all()
    assert (fused.scores[:-1] >= fused.scores[1:]).all()
    assert (fused.boxes[:, 0::2] >= 0).all() and (fused.boxes[:, 0::2] <= WIDTH).all()
    assert (fused.boxes[:, 1::2] >= 0).all() and (fused.boxes[:, 1::2] <= HEIGHT).all()
    assert (fused.boxes[:, 2:] >= fused.boxes[:, :2]).all()
    clipped = Detections.concat([d.clip() for d in per_model])
    for fused_box, label in zip(fused.boxes, fused.labels.tolist(), strict=True):
        same = clipped.boxes[clipped.labels == label]
        assert len(same), f"label {label} is not among the inputs"
        assert inside(fused_box, hull(same)), f"{fused_box.tolist()} outside the {label} boxes' hull"


@SETTINGS
@given(case=ensembles(), name=st.sampled_from(sorted(MATCHED)))
def test_matched_fusers_stay_inside_their_cluster(case, name):
    per_model, weights = case
    params = options(name, len(per_model), weights)
    fused = fuse(per_model, name, **params)
    clusters = match(per_model, iou_thr=0.55)
    scale = clusters.scale()
    hulls = [hull(clusters.preds[c, clusters.present[c], :4] * scale) for c in range(len(clusters))]
    for fused_box, label in zip(fused.boxes, fused.labels.tolist(), strict=True):
        assert any(
            inside(fused_box, h) for h, c_label in zip(hulls, clusters.labels.tolist(), strict=True) if c_label == label
        ), f"{fused_box.tolist()} is inside no cluster of class {label}"


def as_rows(det: Detections) -> list[tuple]:
    rows = torch.cat([det.boxes, det.scores[:, None], det.labels[:, None].double()], 1)
    return sorted(tuple(round(v, 3) for v in row.tolist()) for row in rows)


@SETTINGS
@given(case=ensembles(distinct_scores=True), name=st.sampled_from(FUSERS.names()), data=st.data())
def test_independent_of_the_model_order(case, name, data):
    per_model, weights = case
    order = data.draw(st.permutations(range(len(per_model))))
    shuffled_weights = None if weights is None else [weights[i] for i in order]
    forward = fuse(per_model, name, **options(name, len(per_model), weights))
    shuffled = fuse([per_model[i] for i in order], name, **options(name, len(per_model), shuffled_weights))
    assert as_rows(forward) == as_rows(shuffled)
