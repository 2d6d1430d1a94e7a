"""Label spaces: COCO's 80 detection classes and their category ids.

Ultralytics' COCO models number classes 0..79 (``COCO80``), torchvision's 1..90 with gaps (the category
ids themselves). detens works in ONE label space, a dataset's category ids (COCO ids by default);
adapters map their own indices onto it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from detens.checks import check_integer

__all__ = ["COCO_CATEGORY_IDS", "COCO_NAMES", "COCO_ID_TO_NAME", "coco80_to_category_id", "label_names"]

#: COCO category id of each of the 80 classes, in the standard 0..79 order.
COCO_CATEGORY_IDS: tuple[int, ...] = (
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
    21,
    22,
    23,
    24,
    25,
    27,
    28,
    31,
    32,
    33,
    34,
    35,
    36,
    37,
    38,
    39,
    40,
    41,
    42,
    43,
    44,
    46,
    47,
    48,
    49,
    50,
    51,
    52,
    53,
    54,
    55,
    56,
    57,
    58,
    59,
    60,
    61,
    62,
    63,
    64,
    65,
    67,
    70,
    72,
    73,
    74,
    75,
    76,
    77,
    78,
    79,
    80,
    81,
    82,
    84,
    85,
    86,
    87,
    88,
    89,
    90,
)

#: Class names in the same order.
COCO_NAMES: tuple[str, ...] = (
    "person",
    "bicycle",
    "car",
    "motorcycle",
    "airplane",
    "bus",
    "train",
    "truck",
    "boat",
    "traffic light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "bench",
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "backpack",
    "umbrella",
    "handbag",
    "tie",
    "suitcase",
    "frisbee",
    "skis",
    "snowboard",
    "sports ball",
    "kite",
    "baseball bat",
    "baseball glove",
    "skateboard",
    "surfboard",
    "tennis racket",
    "bottle",
    "wine glass",
    "cup",
    "fork",
    "knife",
    "spoon",
    "bowl",
    "banana",
    "apple",
    "sandwich",
    "orange",
    "broccoli",
    "carrot",
    "hot dog",
    "pizza",
    "donut",
    "cake",
    "chair",
    "couch",
    "potted plant",
    "bed",
    "dining table",
    "toilet",
    "tv",
    "laptop",
    "mouse",
    "remote",
    "keyboard",
    "cell phone",
    "microwave",
    "oven",
    "toaster",
    "sink",
    "refrigerator",
    "book",
    "clock",
    "vase",
    "scissors",
    "teddy bear",
    "hair drier",
    "toothbrush",
)

COCO_ID_TO_NAME: dict[int, str] = dict(zip(COCO_CATEGORY_IDS, COCO_NAMES, strict=True))


def coco80_to_category_id(index: int) -> int:
    """Ultralytics COCO class index 0..79 → COCO category id.

    Raises:
        TypeError: ``index`` is not an integer (``True`` included, which would read as class 1).
        ValueError: ``index`` outside ``[0, 79]``.
    """
    return COCO_CATEGORY_IDS[check_integer(index, "COCO-80 class index", 0, len(COCO_CATEGORY_IDS) - 1)]


def label_names(names: Any, what: str = "class_names") -> dict[int, str]:
    """``{label: name}`` from a mapping of integer labels, or a list or tuple whose positions are the labels.

    Args:
        what (str): names the argument in errors.

    Raises:
        TypeError: neither a mapping nor a list or tuple, a key that is not an integer, or a name that is not
            a string.
    """
    if isinstance(names, Mapping):
        items = list(names.items())
    elif isinstance(names, (list, tuple)):
        items = list(enumerate(names))
    else:
        raise TypeError(f"{what} must be a dict {{label: name}} or a list of names, got {type(names).__name__}")
    bad = [key for key, _ in items if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer))]
    if bad:
        raise TypeError(f"{what} must be keyed by integer labels, got the key {bad[0]!r}")
    # not str(name): YAML reads the names yes/no as booleans and ~ as None, which would be drawn as
    # "True" and "None"
    named = [(key, name) for key, name in items if not isinstance(name, str)]
    if named:
        key, name = named[0]
        raise TypeError(f"{what} must map each label to a string, got {type(name).__name__} {name!r} for label {key}")
    return {int(key): name for key, name in items}
