"""Side-by-sides: the images where a fused method helped most and hurt most against the best single model,
with each member's boxes and the fused boxes drawn over the image (OpenCV) and the ground truth dashed.

"Helped" is measured per image by COCO's AP50 on that image alone (the mean over the classes with ground
truth in it, COCOeval's matching and 101-point precision): fused minus best single model.

Dimension legend: P panels (members, then the fused method), H x W one panel's pixels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detens.coco import CocoGroundTruth, check_file_name_inside, coco_to_detections, group_results_by_image
from detens.coco_match import iter_matches, precision_at_recalls

__all__ = ["per_image_ap", "pick_examples", "draw_side_by_side", "read_images", "write_examples"]


def per_image_ap(
    truth: CocoGroundTruth, results: Sequence[Mapping[str, Any]], image_ids: Sequence[int], iou_thr: float = 0.5
) -> dict[int, float]:
    """COCO's AP at ``iou_thr`` of each image alone.

    Returns:
        dict[int, float]: per image the mean over its classes with ground truth that counts (not crowd) of
        the 101-point interpolated AP; an image with no such class is left out.
    """
    out = {}
    for image in iter_matches(truth, results, image_ids, iou_thr):
        positives: dict[int, int] = {}
        for annotation in image.annotations:
            if not annotation.get("iscrowd", 0):
                c = int(annotation["category_id"])
                positives[c] = positives.get(c, 0) + 1
        if not positives:
            continue
        scores = np.array([d["score"] for d in image.detections], dtype=np.float64)
        classes = np.array([d["category_id"] for d in image.detections], dtype=np.int64)
        labels = np.array(image.labels, dtype=np.int64)
        aps = [precision_at_recalls(scores[classes == c], labels[classes == c], n).mean() for c, n in positives.items()]
        out[image.image_id] = float(np.mean(aps))
    return out


def pick_examples(
    fused_ap: Mapping[int, float], single_ap: Mapping[int, float], count: int
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """The ``count`` images fusion helped most and the ``count`` it hurt most.

    Args:
        fused_ap, single_ap (dict[int, float]): :func:`per_image_ap` of the fused method and the best single.
        count (int): images per list, ``>= 0``.

    Returns:
        (helped, hurt): ``[(image_id, fused minus single AP), ...]``, largest gain (loss) first, ties by
        image id; only images with a gain (loss) at all.
    """
    deltas = sorted((fused_ap[i] - single_ap.get(i, 0.0), i) for i in fused_ap)
    helped = [(i, d) for d, i in sorted(deltas, key=lambda t: (-t[0], t[1])) if d > 0][:count]
    hurt = [(i, d) for d, i in deltas if d < 0][:count]
    return helped, hurt


def draw_side_by_side(
    image_bgr: np.ndarray,
    panels: Sequence[tuple[str, Any]],
    gt_boxes: np.ndarray,
    names: Mapping[int, str],
    conf: float,
    panel_width: int = 420,
) -> np.ndarray:
    """One row of panels, each the image with one set of detections drawn and the ground truth dashed.

    Args:
        image_bgr (np.ndarray[H, W, 3] uint8): the image.
        panels (list[(str, Detections)]): a title and the detections of each panel.
        gt_boxes (np.ndarray[G, 4]): xyxy pixels, crowds left out.
        names (dict[int, str]): class names.
        conf (float): draw detections scored at least this.
        panel_width (int): each panel is resized to this width.

    Returns:
        np.ndarray[h, P * panel_width (+ gaps), 3] uint8.

    Raises:
        ValueError: a panel's detections are for another image size than ``image_bgr``'s (their boxes would
            be drawn at the wrong scale), or ``gt_boxes`` is not ``[G, 4]`` finite xyxy.
        TypeError: ``image_bgr`` is not a uint8 array, or a panel's detections are not ``Detections``.
    """
    import cv2
    import torch

    from detens.detections import Detections
    from detens.visualize import check_boxes, check_image, draw_detections, draw_ground_truth

    check_image(image_bgr)
    gt_boxes = check_boxes(gt_boxes, "gt_boxes")
    height, width = image_bgr.shape[:2]
    for title, det in panels:
        if not isinstance(det, Detections):
            raise TypeError(f"panel {title!r}: its detections must be Detections, got {type(det).__name__}")
        if tuple(det.image_size) != (height, width):
            raise ValueError(
                f"panel {title!r}: its detections are for a {det.image_size[1]}x{det.image_size[0]} image "
                f"(width x height), but the image is {width}x{height}"
            )
    size = (panel_width, max(1, round(height * panel_width / width)))  # (w, h) for OpenCV
    # drawn on the resized image, so that lines and labels have the same size in every report
    small = cv2.resize(image_bgr, size, interpolation=cv2.INTER_AREA)
    scale = torch.tensor([size[0] / width, size[1] / height] * 2)  # [4] xyxy
    gt_small = gt_boxes * scale.double().numpy()
    row = []
    for title, det in panels:
        boxes = det.boxes * scale.to(det.boxes.device)  # a panel may be on the GPU
        det_small = Detections(boxes, det.scores, det.labels, (size[1], size[0]), det.source)
        drawn = draw_detections(small, det_small, names, conf=conf, line_width=2)
        drawn = draw_ground_truth(drawn, gt_small, line_width=1, dash=5)  # on top, so never hidden
        header = np.full((28, panel_width, 3), 255, dtype=np.uint8)
        cv2.putText(header, title, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
        row.append(np.vstack([header, drawn]))
        row.append(np.full((row[-1].shape[0], 6, 3), 255, dtype=np.uint8))  # a gap between panels
    return np.hstack(row[:-1])


def read_images(
    truth: CocoGroundTruth, images_dir: Path, image_ids: Sequence[int], pixels: bool = True
) -> dict[int, np.ndarray]:
    """The pixels of ``image_ids``, read from ``images_dir`` (their ``file_name`` relative to it), each file
    checked to be the image the ground truth describes.

    Args:
        pixels (bool): False: check the files only, and return ``{}``: how a caller checks every image it may
            draw before a long run picks them, without holding them all in memory. Each file is decoded as
            drawing decodes it (a few milliseconds an image), so a file whose header is sound and whose
            pixels are not (a truncated PNG) is refused here too.

    Returns:
        dict[int, np.ndarray[H, W, 3] uint8]: per image, BGR as OpenCV reads it.

    Raises:
        FileNotFoundError: images missing or unreadable, every one named (up to 5 per kind), at once.
        ValueError: files whose size is not the ground truth's ``width`` x ``height`` (another copy of the
            image, resized: the boxes would be drawn at the wrong scale), each named with both sizes (up
            to 5), at once; or, before any file is read, a ``file_name`` that leads outside ``images_dir``
            (:func:`~detens.coco.check_file_name_inside`).
    """
    for image_id in image_ids:
        check_file_name_inside(truth.file_name(image_id), image_id)
    read, missing, unreadable, resized = {}, [], [], []
    for image_id in image_ids:
        path = Path(images_dir) / truth.file_name(image_id)
        if not path.exists():  # a pipe or a folder of its name is there, and unreadable (read_image says why)
            missing.append(truth.file_name(image_id))
            continue
        image = _decode(path)
        if image is None:
            unreadable.append(truth.file_name(image_id))
            continue
        (height, width), (stored_height, stored_width) = truth.image_size(image_id), image.shape[:2]
        if (stored_height, stored_width) != (height, width):
            resized.append(
                f"{truth.file_name(image_id)} is {stored_width}x{stored_height}, the ground truth says {width}x{height}"
            )
        if pixels:
            read[image_id] = image
    if missing or unreadable:
        problems = [
            f"{what} {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}"
            for what, names in (("missing", missing), ("unreadable", unreadable))
            if names
        ]
        raise FileNotFoundError(
            f"{len(missing) + len(unreadable)} of the {len(image_ids)} images to draw are not usable in {images_dir} "
            f"({'; '.join(problems)}); pass the folder that holds the scored images"
        )
    if resized:
        more = f"; and {len(resized) - 5} more" if len(resized) > 5 else ""
        raise ValueError(
            f"{len(resized)} of the {len(image_ids)} images to draw in {images_dir} are not the size the ground "
            f"truth gives them (width x height): {'; '.join(resized[:5])}{more}; pass the folder of the images "
            "as annotated, not resized copies"
        )
    return read


def _decode(path: Path) -> np.ndarray | None:
    """The stored pixels of an image file (BGR), which the ground truth's boxes describe, read as ``detens
    fuse`` reads them; None where it skips the file (``cv2.imread`` would give the readable start of a
    truncated JPEG, grey below)."""
    from detens.sources import ImageReadError, read_image

    try:
        return read_image(path)
    except ImageReadError:
        return None


def write_examples(
    truth: CocoGroundTruth,
    images_dir: Path,
    fused_name: str,
    fused: Sequence[Mapping[str, Any]],
    single_name: str,
    members: Mapping[str, Sequence[Mapping[str, Any]]],
    out_dir: Path,
    pngs: Mapping[str, str],
    count: int = 3,
    conf: float = 0.3,
) -> dict[str, list[dict[str, Any]]]:
    """Pick and draw the side-by-sides of ``fused_name`` against the member ``single_name``.

    Args:
        truth (CocoGroundTruth): the scored images' ground truth.
        images_dir (Path): where the image files are (``file_name`` relative to it).
        fused_name (str), fused (list[dict]): the fused method and its pooled results.
        single_name (str): the best member, a key of ``members``.
        members (dict[str, list[dict]]): each member's results.
        out_dir (Path): the folder the PNGs go under.
        pngs (dict[str, str]): the PNG of each kind (``"helped"``, ``"hurt"``) relative to ``out_dir``,
            ``{rank}`` (1: the image helped, or hurt, most) and ``{image_id}`` to fill in
            (``"examples/helped_{rank}_{image_id}.png"``).
        count (int): images helped and images hurt.
        conf (float): draw detections scored at least this.

    Returns:
        dict: ``{"helped": [...], "hurt": [...]}``, each entry ``{"image_id", "file_name", "png" (relative to
        ``out_dir``), "delta", "ap50": {panel name: AP50 on the image}}``.

    Raises:
        ValueError: ``pngs`` does not name exactly the two kinds, or an image file to draw is not the size
            the ground truth gives it (naming the file and both sizes); raised before any PNG is written.
        FileNotFoundError: an image to draw is missing from ``images_dir`` or unreadable, naming every such
            image; raised before any PNG is written.
    """
    import cv2

    from detens.io import atomic_write_bytes

    if set(pngs) != {"helped", "hurt"}:
        raise ValueError(f"pngs must give the PNG of 'helped' and of 'hurt', got {sorted(pngs)}")
    image_ids = truth.annotated_image_ids
    single_ap = per_image_ap(truth, members[single_name], image_ids)
    fused_ap = per_image_ap(truth, fused, image_ids)
    helped, hurt = pick_examples(fused_ap, single_ap, count)
    pixels = read_images(truth, images_dir, [i for i, _ in helped + hurt])
    member_ap = {name: per_image_ap(truth, results, [i for i, _ in helped + hurt]) for name, results in members.items()}
    by_image = {name: group_results_by_image(results) for name, results in {**members, fused_name: fused}.items()}
    names = truth.category_names
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, picked in (("helped", helped), ("hurt", hurt)):
        out[kind] = []
        for rank, (image_id, delta) in enumerate(picked, 1):
            image = pixels[image_id]
            size = truth.image_size(image_id)
            aps = {name: member_ap[name].get(image_id, 0.0) for name in members}
            aps[fused_name] = fused_ap[image_id]
            panels = [
                (f"{name}  AP50 {aps[name]:.2f}", coco_to_detections(by_image[name].get(image_id, []), size, validate=False))
                for name in [*members, fused_name]
            ]
            gt = truth.detections(image_id)  # crowds left out
            drawn = draw_side_by_side(image, panels, gt.boxes.numpy(), names, conf)
            png = Path(pngs[kind].format(rank=rank, image_id=image_id))
            ok, encoded = cv2.imencode(".png", drawn)
            if not ok:
                raise RuntimeError(f"OpenCV could not encode {png}")
            atomic_write_bytes(out_dir / png, encoded.tobytes())
            out[kind].append(
                {"image_id": image_id, "file_name": truth.file_name(image_id), "png": png.as_posix(),
                 "delta": delta, "ap50": aps}
            )
    return out
