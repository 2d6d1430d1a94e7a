"""Cross-validation folds over images: fixed by a seed, identical for every method."""

from __future__ import annotations

import random
from collections.abc import Sequence

from detens.checks import check_integer, check_integers, check_seed

__all__ = ["kfold_image_splits"]


def kfold_image_splits(
    image_ids: Sequence[int], k: int = 2, seed: int = 0, negative_ids: Sequence[int] = ()
) -> list[tuple[list[int], list[int]]]:
    """Split images into ``k`` folds; returns ``[(train_ids, test_ids)]`` for each held-out fold.

    The split depends only on the SET of image ids, ``k`` and ``seed`` (ids are sorted before shuffling),
    so every method sees identical folds. Every image is held out exactly once; no image is in both
    the train and the test side of a split.

    ``negative_ids`` (images without annotations, scored and fitted on as negative images) are shuffled
    apart, by the same seed, and dealt into the folds after ``image_ids``, continuing their round so that
    the folds' sizes differ by one at most: ``image_ids`` keep the folds of a split without them, so
    adding the negative images never moves an annotated image to another fold.

    Raises:
        TypeError: ``k`` or ``seed`` not an integer (Python or NumPy); ``seed=None`` would draw other folds
            on every run. ValueError: ``k`` < 2 or more folds than ``image_ids``, a negative ``seed``, a
            repeated image id, an id in both ``image_ids`` and ``negative_ids``.
    """
    given = check_integers(image_ids, "image_ids")
    ids = sorted(set(given))
    if len(ids) != len(given):
        raise ValueError(f"image_ids contains duplicates ({len(given) - len(ids)} repeated)")
    given_negatives = check_integers(negative_ids, "negative_ids")
    negatives = sorted(set(given_negatives))
    if len(negatives) != len(given_negatives):
        raise ValueError(f"negative_ids contains duplicates ({len(given_negatives) - len(negatives)} repeated)")
    both = sorted(set(ids) & set(negatives))
    if both:
        raise ValueError(
            f"image ids {both[:10]} are in both image_ids and negative_ids; an image is either annotated or not"
        )
    k = check_integer(k, "k", 2)
    seed = check_seed(seed)
    if k > len(ids):
        # the negative images only join folds dealt from the annotated ones, so they cannot make up the count
        without = f" with annotations (each fold needs one; the {len(negatives)} without are dealt after them)"
        raise ValueError(f"cannot make {k} folds from {len(ids)} images{without if negatives else ''}")
    random.Random(seed).shuffle(ids)
    folds = [ids[i::k] for i in range(k)]
    random.Random(seed).shuffle(negatives)
    for j, image_id in enumerate(negatives, len(ids)):
        folds[j % k].append(image_id)
    folds = [sorted(fold) for fold in folds]
    return [
        (sorted(i for j, fold in enumerate(folds) if j != held_out for i in fold), folds[held_out])
        for held_out in range(k)
    ]
