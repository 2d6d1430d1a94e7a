"""Tiled test-time views: windows, the boxes cut by inner tile edges, the merge, a tiled member run on a
detector whose answers are known, and the heads' visibility features, each against a slow obvious
reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou

from detens.adapters import AugmentedDetector, View
from detens.adapters._tiles import EDGE_MARGIN, cut_by_inner_edges, merge_tiles, tile_windows
from detens.adapters.augmented import DEFAULT_OVERLAP, AugmentedView
from detens.detections import Detections
from detens.fusers import fuse


def reference_cut(boxes: torch.Tensor, window, image_size, margin=EDGE_MARGIN) -> list[bool]:
    """Box by box, edge by edge: is an edge inside the image within ``margin`` of the box's side?"""
    height, width = image_size
    x1, y1, x2, y2 = window
    out = []
    for bx1, by1, bx2, by2 in boxes.tolist():
        cut = False
        cut = cut or (x1 > 0 and bx1 <= x1 + margin)
        cut = cut or (y1 > 0 and by1 <= y1 + margin)
        cut = cut or (x2 < width and bx2 >= x2 - margin)
        cut = cut or (y2 < height and by2 >= y2 - margin)
        out.append(cut)
    return out


def reference_merge(boxes, scores, labels, iou_thr, max_det) -> list[int]:
    """Greedy NMS one box at a time: a box survives unless a kept box of its label overlaps it more."""
    kept: list[int] = []
    for i in sorted(range(len(scores)), key=lambda i: -float(scores[i])):
        if all(
            int(labels[k]) != int(labels[i]) or float(box_iou(boxes[k][None], boxes[i][None])) <= iou_thr
            for k in kept
        ):
            kept.append(i)
    return kept if max_det is None else kept[:max_det]


def random_boxes(n: int, size: tuple[int, int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    height, width = size
    xy1 = torch.rand(n, 2, generator=gen) * torch.tensor([width * 0.9, height * 0.9])
    wh = torch.rand(n, 2, generator=gen) * torch.tensor([width * 0.3, height * 0.3]) + 1
    return torch.cat([xy1, torch.minimum(xy1 + wh, torch.tensor([float(width), float(height)]))], 1)


# ------------------------------------------------------------------------------------------------ windows
@pytest.mark.parametrize("size", [(480, 640), (427, 640), (37, 53), (5, 3)])
@pytest.mark.parametrize("rows, cols, overlap", [(1, 1, 0.4), (2, 2, 0.4), (2, 3, 0.25), (3, 2, 0.0), (4, 4, 0.9)])
def test_windows_cover_the_image_with_equal_overlapping_tiles(size, rows, cols, overlap):
    height, width = size
    windows = tile_windows(size, rows, cols, overlap)
    assert len(windows) == rows * cols
    assert windows[0][:2] == (0, 0) and windows[-1][2:] == (width, height)
    assert len({(x2 - x1, y2 - y1) for x1, y1, x2, y2 in windows}) == 1  # one tile size
    covered = np.zeros(size, dtype=int)
    for x1, y1, x2, y2 in windows:
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
        covered[y1:y2, x1:x2] += 1
    assert covered.min() >= 1  # every pixel in some tile
    tile_w, tile_h = windows[0][2] - windows[0][0], windows[0][3] - windows[0][1]
    if cols > 1 and width >= 20:  # neighbours share ~overlap of the tile (whole pixels)
        shared = windows[0][2] - windows[1][0]
        assert abs(shared - overlap * tile_w) <= 2
    if rows > 1 and height >= 20:
        shared = windows[0][3] - windows[cols][1]
        assert abs(shared - overlap * tile_h) <= 2


def test_default_windows_are_five_eighths_of_the_image():
    assert View.parse("tiles=2x2").windows((480, 640)) == [
        (0, 0, 400, 300),
        (240, 0, 640, 300),
        (0, 180, 400, 480),
        (240, 180, 640, 480),
    ]


# ----------------------------------------------------------------------------------------- inner edges
@pytest.mark.parametrize("window", [(0, 0, 40, 30), (20, 0, 60, 30), (0, 15, 40, 45), (20, 15, 60, 45), (0, 0, 60, 45)])
def test_cut_by_inner_edges_matches_reference(window):
    size = (45, 60)
    boxes = random_boxes(200, size, seed=sum(window))
    x1, y1, x2, y2 = window
    boxes = torch.cat([boxes.clamp(min=torch.tensor([x1, y1, x1, y1]).float(), max=torch.tensor([x2, y2, x2, y2]).float())])
    cut = cut_by_inner_edges(boxes, window, size)
    assert cut.dtype == torch.bool and cut.tolist() == reference_cut(boxes, window, size)
    if window == (0, 0, 60, 45):
        assert not cut.any()  # the whole image: no inner edge
    else:
        assert cut.any() and not cut.all()


def test_cut_by_inner_edges_empty():
    assert cut_by_inner_edges(torch.zeros(0, 4), (10, 10, 20, 20), (30, 30)).shape == (0,)


# ----------------------------------------------------------------------------------------------- merge
@pytest.mark.parametrize("max_det", [None, 5])
def test_merge_tiles_matches_greedy_nms(max_det):
    boxes = random_boxes(60, (100, 120), seed=3)
    boxes = torch.cat([boxes, boxes + 1.5])  # near-duplicates, as overlapping tiles give
    gen = torch.Generator().manual_seed(4)
    scores = torch.rand(120, generator=gen)
    labels = torch.randint(0, 3, (120,), generator=gen) * 40 + 1  # ids far apart, as COCO's
    keep = merge_tiles(boxes, scores, labels, 0.6, max_det)
    assert keep.tolist() == reference_merge(boxes, scores, labels, 0.6, max_det)


def test_merge_tiles_empty():
    assert merge_tiles(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.7, 10).shape == (0,)


# ---------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "spec, name",
    [
        ("tiles=2x2", "tiles=2x2"),
        ("TILES=3x2 + overlap=0.25", "tiles=3x2+overlap=0.25"),
        ("hflip+tiles=2x2", "hflip+tiles=2x2"),
        (f"tiles=2x2+overlap={DEFAULT_OVERLAP}", "tiles=2x2"),
        ({"tiles": "2x3"}, "tiles=2x3"),
        ({"tiles": [2, 2], "overlap": 0.2, "vflip": True}, "vflip+tiles=2x2+overlap=0.2"),
        ("tiles=1x1", "identity"),
        ({"scale": 0.8333333}, "scale=0.8333333"),
        ({"tiles": [2, 2], "overlap": 1 / 3}, "tiles=2x2+overlap=0.3333333333333333"),
        ({"tiles": [2, 2], "overlap": 0.00001}, "tiles=2x2+overlap=0.00001"),
    ],
)
def test_tiled_view_names(spec, name):
    view = View.parse(spec)
    assert view.name == name and View.parse(view.name) == view
    assert view.is_identity == (name == "identity")


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("tiles=2", "ROWSxCOLS"),
        ("tiles=0x2", r"integer in \[1, 8\]"),
        ("tiles=9x1", r"integer in \[1, 8\]"),
        ("tiles=2x2+overlap=0.95", r"view overlap must be in \[0, 0.9\], got 0.95"),
        ("overlap=0.2", "needs tiles"),
        ({"tiles": "2x2", "stride": 3}, "unknown view option"),
        ("tile=2x2", "unknown view 'tile=2x2'"),
    ],
)
def test_bad_tiled_views(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        View.parse(spec)


@pytest.mark.parametrize(
    "spec, error, fragment",
    [
        ({"hflip": "false"}, TypeError, r"view hflip must be True or False, got str: 'false'"),
        ({"vflip": 0.0001}, TypeError, r"view vflip must be True or False, got float"),
        ({"scale": "0.5"}, TypeError, r"view scale must be a number, got str: '0.5'"),
        ({"scale": True}, TypeError, r"view scale must be a number, got bool"),
        ({"tiles": [2, 2], "overlap": "0.2"}, TypeError, r"view overlap must be a number, got str"),
    ],
)
def test_view_options_of_a_mapping_are_checked_not_converted(spec, error, fragment):
    with pytest.raises(error, match=fragment):
        View.parse(spec)


@pytest.mark.parametrize(
    "tiles, error, fragment",
    [
        ((2.0, 2), TypeError, r"view tiles rows must be an integer, got float: 2.0"),
        ((2, True), TypeError, r"view tiles cols must be an integer, got bool: True"),
        ((2, "2"), TypeError, r"view tiles cols must be an integer, got str: '2'"),
        (2, TypeError, r"view tiles must be \(rows, cols\), each an integer in \[1, 8\], got int: 2"),
        ("2x2", TypeError, r"view tiles must be \(rows, cols\), each an integer in \[1, 8\], got str: '2x2'"),
        ((2, 2, 2), ValueError, r"view tiles must be \(rows, cols\), each an integer in \[1, 8\], got \(2, 2, 2\)"),
        ((0, 2), ValueError, r"view tiles rows must be an integer in \[1, 8\], got 0"),
        ((2, np.int64(9)), ValueError, r"view tiles cols must be an integer in \[1, 8\], got (np\.int64\()?9"),
    ],
)
def test_view_tiles_of_another_type_are_a_type_error_naming_them(tiles, error, fragment):
    with pytest.raises(error, match=fragment):
        View(tiles=tiles)


def test_numpy_integer_tiles_are_the_python_ints_they_hold():
    for tiles in [(np.int64(2), np.int64(3)), [np.int32(2), 3], np.array([2, 3]).tolist()]:
        view = View.parse({"tiles": tiles})
        assert view == View(tiles=(2, 3)) and view.name == "tiles=2x3"
        assert all(type(n) is int for n in view.tiles)


def test_tiled_view_is_not_one_image():
    view = View.parse("tiles=2x2")
    with pytest.raises(ValueError, match="is tiled"):
        view.apply(np.zeros((10, 10, 3), np.uint8))
    with pytest.raises(ValueError, match="is tiled"):
        view.invert_boxes(torch.zeros(1, 4), (10, 10))


# ---------------------------------------------------------------------------------- a tiled member, run
class ScriptedDetector:
    """Answers each crop with boxes given in crop pixels: ``answers(crop_index, crop_shape)`` → (boxes, scores, labels)."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = answers
        self.crops: list[np.ndarray] = []

    def __call__(self, images):
        out = []
        for image in images:
            boxes, scores, labels = self.answers(len(self.crops), image.shape[:2])
            self.crops.append(image)
            out.append(Detections(boxes, scores, labels, image.shape[:2], self.name))
        return out


def reference_tiled(view: View, image: np.ndarray, answers, merge_iou: float, max_det: int | None) -> Detections:
    """What a tiled view must answer, tile by tile with plain loops and the greedy NMS above."""
    size = image.shape[:2]
    height, width = size
    kept_boxes, kept_scores, kept_labels = [], [], []
    for index, (x1, y1, x2, y2) in enumerate(view.windows(size)):
        boxes, scores, labels = answers(index, (y2 - y1, x2 - x1))
        for box, score, label in zip(boxes.tolist(), scores.tolist(), labels.tolist(), strict=True):
            bx1, by1, bx2, by2 = box
            if view.hflip:
                bx1, bx2 = (x2 - x1) - bx2, (x2 - x1) - bx1
            bx1, by1, bx2, by2 = bx1 + x1, by1 + y1, bx2 + x1, by2 + y1
            cut = (
                (x1 > 0 and bx1 <= x1 + EDGE_MARGIN)
                or (y1 > 0 and by1 <= y1 + EDGE_MARGIN)
                or (x2 < width and bx2 >= x2 - EDGE_MARGIN)
                or (y2 < height and by2 >= y2 - EDGE_MARGIN)
            )
            if not cut:
                kept_boxes.append([bx1, by1, bx2, by2])
                kept_scores.append(score)
                kept_labels.append(label)
    boxes = torch.tensor(kept_boxes, dtype=torch.float32).reshape(-1, 4)
    scores, labels = torch.tensor(kept_scores), torch.tensor(kept_labels, dtype=torch.int64)
    keep = reference_merge(boxes, scores, labels, merge_iou, max_det)
    return Detections(boxes[keep], scores[keep], labels[keep], size).clip()


def random_answers(crop_index: int, shape):
    boxes = random_boxes(40, shape, seed=100 + crop_index)
    gen = torch.Generator().manual_seed(200 + crop_index)
    return boxes, torch.rand(40, generator=gen), torch.randint(1, 4, (40,), generator=gen)


@pytest.mark.parametrize("spec", ["tiles=2x2", "hflip+tiles=2x3+overlap=0.25", "tiles=3x1"])
@pytest.mark.parametrize("max_det", [None, 30])
def test_tiled_member_matches_reference(spec, max_det):
    image = np.random.default_rng(0).integers(0, 255, (90, 140, 3), dtype=np.uint8)
    view = View.parse(spec)
    scripted = ScriptedDetector(random_answers)
    member = AugmentedView(scripted, view, merge_iou=0.6, max_det=max_det)
    (got,) = member([image])
    # the detector saw each window of the image, with the per-tile part of the view applied
    windows = view.windows(image.shape[:2])
    assert len(scripted.crops) == len(windows)
    for crop, (x1, y1, x2, y2) in zip(scripted.crops, windows, strict=True):
        tile = image[y1:y2, x1:x2]
        np.testing.assert_array_equal(crop, tile[:, ::-1] if view.hflip else tile)
    want = reference_tiled(view, image, random_answers, 0.6, max_det)
    assert got.source == f"scripted|{view.name}" and got.image_size == (90, 140)
    assert 0 < len(got) < 40 * len(windows)
    if max_det is not None:
        assert len(got) <= max_det
    torch.testing.assert_close(got.boxes, want.boxes)
    torch.testing.assert_close(got.scores, want.scores)
    assert got.labels.tolist() == want.labels.tolist()


def test_tiled_member_of_several_images_and_nothing_found():
    images = [np.zeros((50, 80, 3), np.uint8), np.zeros((64, 32, 3), np.uint8)]
    nothing = ScriptedDetector(lambda i, shape: (torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64)))
    tta = AugmentedDetector(nothing, ["identity", "tiles=2x2"])
    assert [m.name for m in tta] == ["scripted", "scripted|tiles=2x2"]
    results = tta(images)
    assert [[len(d) for d in per_image] for per_image in results] == [[0, 0], [0, 0]]
    assert [per_image[1].image_size for per_image in results] == [(50, 80), (64, 32)]
    # one image's answers stay with that image: a box only in the second image's first tile
    def second_image_only(index, shape):
        if index == 4:
            return torch.tensor([[1.0, 1.0, 5.0, 5.0]]), torch.tensor([0.9]), torch.tensor([7])
        return torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64)

    member = AugmentedView(ScriptedDetector(second_image_only), "tiles=2x2")
    first, second = member(images)
    assert len(first) == 0 and second.boxes.tolist() == [[1.0, 1.0, 5.0, 5.0]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_views_of_a_cuda_detector_stay_on_its_device():
    """The identity view is the detector itself: the other views must answer on its device too, or fuse
    refuses the members' Detections."""

    class OnCuda(ScriptedDetector):
        def __call__(self, images):
            return [d.to("cuda") for d in super().__call__(images)]

    image = np.random.default_rng(0).integers(0, 255, (90, 140, 3), dtype=np.uint8)
    views = ["identity", "hflip", "scale=0.5", "hflip+tiles=2x3+overlap=0.25"]
    on_gpu = AugmentedDetector(OnCuda(random_answers), views, merge_iou=0.6)([image])[0]
    on_cpu = AugmentedDetector(ScriptedDetector(random_answers), views, merge_iou=0.6)([image])[0]
    assert all(d.device.type == "cuda" for d in on_gpu)
    for gpu, cpu in zip(on_gpu, on_cpu, strict=True):
        torch.testing.assert_close(gpu.boxes.cpu(), cpu.boxes)
        torch.testing.assert_close(gpu.scores.cpu(), cpu.scores)
        assert gpu.labels.cpu().tolist() == cpu.labels.tolist()
    assert fuse(on_gpu, "wbf").device.type == "cuda"


def test_tiled_member_rejects_bad_merge_settings():
    with pytest.raises(ValueError, match="merge_iou"):
        AugmentedView(ScriptedDetector(random_answers), "tiles=2x2", merge_iou=0.0)
    with pytest.raises(ValueError, match="max_det"):
        AugmentedView(ScriptedDetector(random_answers), "tiles=2x2", max_det=0)


# ------------------------------------------------------------------------------ visibility in the heads
def tiled_clusters(num: int = 300, seed: int = 0):
    from detens.matching import Clusters

    size = (90, 140)
    gen = torch.Generator().manual_seed(seed)
    boxes = random_boxes(num, size, seed) / torch.tensor([140.0, 90.0, 140.0, 90.0])
    preds = torch.zeros(num, 3, 5)
    preds[..., :4] = boxes[:, None, :] + torch.randn(num, 3, 4, generator=gen) * 0.01
    preds[..., 4] = torch.rand(num, 3, generator=gen)
    present = torch.rand(num, 3, generator=gen) < 0.7
    present[:, 0] = True
    preds[..., 4] *= present
    return Clusters(preds, present, torch.randint(1, 4, (num,), generator=gen), torch.zeros(num, 3, dtype=torch.int64), size)


def reference_visibility(model_names, clusters) -> list[list[bool]]:
    height, width = clusters.image_size
    out = []
    for c in range(len(clusters)):
        rows = [clusters.preds[c, n, :4].double().tolist() for n in range(3) if clusters.present[c, n]]
        box = [sum(r[k] for r in rows) / len(rows) * (width if k % 2 == 0 else height) for k in range(4)]
        row = []
        for name in model_names:
            if "tiles=" not in name:
                row.append(True)
                continue
            view = View.parse(name.split("|")[1])
            seen = False
            for window in view.windows((height, width)):
                x1, y1, x2, y2 = window
                inside = box[0] >= x1 and box[1] >= y1 and box[2] <= x2 and box[3] <= y2
                seen = seen or (inside and not reference_cut(torch.tensor([box]), window, (height, width))[0])
            row.append(seen)
        out.append(row)
    return out


def test_member_visibility_matches_reference():
    from detens.heads._features import has_tiled_members, member_visibility

    names = ["a", "a|tiles=2x2", "b|hflip+tiles=3x3+overlap=0.25"]
    clusters = tiled_clusters()
    got = member_visibility(names, clusters)
    assert got.dtype == torch.bool and got.shape == (len(clusters), 3)
    assert got.tolist() == reference_visibility(names, clusters)
    assert got[:, 0].all() and not got[:, 1].all() and got[:, 1].any() and not got[:, 2].all()
    assert has_tiled_members(names) and not has_tiled_members(["a", "a|hflip", "tiles|x", "a|tiles=bad"])
    assert member_visibility(["a", "a|hflip", "b"], clusters).all()  # no tiled member: every model sees all
    assert member_visibility(names, clusters[torch.zeros(0, dtype=torch.long)]).shape == (0, 3)


def test_visibility_columns():
    """Untiled: visible 1, and the two cluster columns equal frac_present and mean_score; tiled: computed
    over the models that could see the cluster."""
    from detens.heads._features import cluster_features, feature_names, member_visibility

    clusters = tiled_clusters(seed=1)
    names = feature_names(3)
    plain = cluster_features(clusters)
    assert (plain[:, [names.index(f"visible[{n}]") for n in range(3)]] == 1).all()
    torch.testing.assert_close(plain[:, names.index("frac_visible_present")], plain[:, names.index("frac_present")])
    torch.testing.assert_close(plain[:, names.index("mean_visible_score")], plain[:, names.index("mean_score")])
    visible = member_visibility(["a", "a|tiles=2x2", "b|tiles=3x3"], clusters)
    tiled = cluster_features(clusters, visible=visible)
    base = [i for i, name in enumerate(names) if not name.startswith(("visible", "frac_visible", "mean_visible"))]
    torch.testing.assert_close(tiled[:, base], plain[:, base])  # the other columns do not move
    for c in range(len(clusters)):
        seen = [n for n in range(3) if visible[c, n]]
        present = [n for n in seen if clusters.present[c, n]]
        assert float(tiled[c, names.index("frac_visible_present")]) == pytest.approx(len(present) / len(seen))
        mean = sum(float(clusters.preds[c, n, 4]) for n in present) / len(seen)
        assert float(tiled[c, names.index("mean_visible_score")]) == pytest.approx(mean, abs=1e-6)


def test_heads_read_visibility_only_with_tiled_members():
    from detens.heads import HEADS
    from detens.heads._features import VISIBILITY_GROUPS
    from detens.heads.deep import DEEP_FEATURES

    plain = HEADS.get("deep")(["a", "b"], class_ids=[1])
    tiled = HEADS.get("deep")(["a", "a|tiles=2x2"], class_ids=[1])
    assert tuple(plain.features) == tuple(g for g in plain.features if g in DEEP_FEATURES)
    assert not plain.reads_visibility and tiled.reads_visibility
    assert set(tiled.features) == set(plain.features) | set(VISIBILITY_GROUPS)
    chosen = HEADS.get("deep")(["a", "a|tiles=2x2"], features=["score"], class_ids=[1])
    assert chosen.features == ["score"] and not chosen.reads_visibility  # an explicit list is kept as is
    superlearner = HEADS.get("superlearner")(["a", "b"], class_ids=[1])
    assert not set(superlearner.features) & set(VISIBILITY_GROUPS)
    selection = HEADS.get("selection")(["a", "a|tiles=2x2"], class_ids=[1])
    assert selection.reads_visibility


def test_superlearner_reads_visibility_only_when_asked():
    from detens.heads import HEADS
    from detens.heads._features import VISIBILITY_GROUPS
    from detens.heads._net import BASE_FEATURE_GROUPS

    tiled = HEADS.get("superlearner")(["a", "a|tiles=2x2"], class_ids=[1])
    assert tuple(tiled.features) == BASE_FEATURE_GROUPS and not tiled.reads_visibility
    asked = HEADS.get("superlearner")(["a", "a|tiles=2x2"], features=["score", *VISIBILITY_GROUPS], class_ids=[1])
    assert asked.reads_visibility
