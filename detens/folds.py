"""Cross-validation folds over images: fixed by a seed, identical for every method."""

from __future__ import annotations

import random
from collections.abc import Sequence

from detens.checks import check_integer, check_integers, check_seed

__all__ = ["kfold_image_splits"]


def kfold_image_splits(image_ids: Sequence[int], k: int = 2, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Split images into ``k`` folds; returns ``[(train_ids, test_ids)]`` for each held-out fold.

    The split depends only on the SET of image ids, ``k`` and ``seed`` (ids are sorted before shuffling),
    so every method sees identical folds. Every image is held out exactly once; no image is in both
    the train and the test side of a split.

    Raises:
        TypeError: ``k`` or ``seed`` not an integer (Python or NumPy); ``seed=None`` would draw other folds
            on every run. ValueError: ``k`` < 2 or more folds than images, a negative ``seed``, a repeated image id.
    """
    given = check_integers(image_ids, "image_ids")
    ids = sorted(set(given))
    if len(ids) != len(given):
        raise ValueError(f"image_ids contains duplicates ({len(given) - len(ids)} repeated)")
    k = check_integer(k, "k", 2)
    seed = check_seed(seed)
    if k > len(ids):
        raise ValueError(f"cannot make {k} folds from {len(ids)} images")
    random.Random(seed).shuffle(ids)
    folds = [sorted(ids[i::k]) for i in range(k)]
    return [
        (sorted(i for j, fold in enumerate(folds) if j != held_out for i in fold), folds[held_out])
        for held_out in range(k)
    ]
