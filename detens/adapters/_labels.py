"""Mapping a detector's own class indices onto ONE label space (a dataset's category ids).

Dimension legend: M classes of the detector.

A lookup table ``Tensor[M]`` (int64) gives the category id of each detector class, or ``-1`` for a class
that has no category in the label space (its boxes are dropped).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from detens.checks import check_integer, did_you_mean, first_few
from detens.detections import MAX_LABEL
from detens.labels import COCO_CATEGORY_IDS, COCO_ID_TO_NAME, COCO_NAMES

__all__ = [
    "normalize_class_name",
    "as_categories",
    "check_categories",
    "is_background_class",
    "build_label_lookup",
    "apply_label_lookup",
    "check_category_id_map",
    "check_class_map_categories",
    "describe_label_space_difference",
    "id_ranges",
]

logger = logging.getLogger(__name__)

# Darknet / VOC spellings of COCO classes, and a few common variants.
_ALIASES = {
    "motorbike": "motorcycle",
    "aeroplane": "airplane",
    "sofa": "couch",
    "pottedplant": "potted plant",
    "diningtable": "dining table",
    "tvmonitor": "tv",
    "tv monitor": "tv",
    "hair dryer": "hair drier",
    "cellphone": "cell phone",
    "mobile phone": "cell phone",
}


def normalize_class_name(name: str) -> str:
    """Lower case, ``_``/``-`` as spaces, single spaces, known aliases resolved (``"motorbike"`` → ``"motorcycle"``)."""
    text = re.sub(r"[\s_\-]+", " ", str(name).strip().lower())
    return _ALIASES.get(text, text)


def renamed_ids(ids: Iterable[int], ours: Mapping[int, str], theirs: Mapping[int, str]) -> list[tuple[int, str, str]]:
    """``(id, our name, their name)`` for each of ``ids`` that both label spaces name, as different classes
    (names compared by :func:`normalize_class_name`; an id either side leaves unnamed is not compared)."""
    return [
        (c, ours[c], theirs[c]) for c in ids
        # names spelled alike need no normalizing, which is most of the cost of a check per image
        if c in ours and c in theirs and ours[c] != theirs[c]
        and normalize_class_name(ours[c]) != normalize_class_name(theirs[c])
    ]


def label_space_differences(
    ours: Mapping[int, str], theirs: Mapping[int, str]
) -> list[tuple[int, str | None, str | None]]:
    """``(id, our name, their name)`` of each category id, sorted, that the two label spaces do not share
    (the side that lacks it gives None) or that they name as different classes (:func:`renamed_ids`; a
    category without a name, which a ground truth gives its id as name, is compared by id alone).
    """
    from detens.heads._io import named_categories

    missing = [(c, ours.get(c), theirs.get(c)) for c in set(ours) ^ set(theirs)]
    shared = sorted(set(ours) & set(theirs))
    return sorted([*missing, *renamed_ids(shared, named_categories(ours), named_categories(theirs))])


def describe_label_space_difference(difference: tuple[int, str | None, str | None], in_ours: str, in_theirs: str) -> str:
    """One category id on which two label spaces differ, for a message, from ``(id, our name, their name)``
    as :func:`label_space_differences` and :func:`renamed_ids` give it: ``1 is 'person' in the head but 'cat'
    there``; a side without the id (None) says ``no category``: ``30 is 'dog' in the head and no category
    there``.

    Args:
        in_ours (str): where our names come from (``"in the head"``).
        in_theirs (str): where theirs come from (``"there"``, ``"in --gt"``).
    """
    category, ours, theirs = difference
    if theirs is None:
        return f"{category} is {ours!r} {in_ours} and no category {in_theirs}"
    if ours is None:
        return f"{category} is no category {in_ours} but {theirs!r} {in_theirs}"
    return f"{category} is {ours!r} {in_ours} but {theirs!r} {in_theirs}"


def as_categories(categories: Any) -> dict[int, str]:
    """``{category_id: name}`` from a mapping, a COCO ``categories`` list, or a COCO annotation dict.

    Ids are ints in ``[0, MAX_LABEL]``: a mapping's keys may be digit strings (JSON and YAML give them so),
    which become the ints they spell, as a label is looked up by int; a float or another string is refused,
    not rounded or skipped.

    Raises:
        TypeError: none of those forms, or an id that is no integer (naming it).
        ValueError: a list entry that is no COCO category, an id out of range, or an id given twice.
    """
    if isinstance(categories, Mapping) and "categories" in categories:
        categories = categories["categories"]
    if isinstance(categories, Mapping):
        entries = [  # (what the id is called, the id, the name, where it is given)
            (f"categories key {key!r}", _integer_key(key, "categories key"), name, f"key {key!r}")
            for key, name in categories.items()
        ]
    elif isinstance(categories, Sequence) and not isinstance(categories, (str, bytes)):
        entries = []
        for i, entry in enumerate(categories):
            if not isinstance(entry, Mapping) or "id" not in entry or "name" not in entry:
                raise ValueError(
                    f"categories[{i}] must be a COCO category {{'id': ..., 'name': ...}}, got {entry!r}"
                )
            entries.append((f"categories[{i}].id", entry["id"], entry["name"], f"categories[{i}]"))
    else:
        raise TypeError(
            "categories must be {id: name}, a COCO 'categories' list or a COCO annotation dict, got "
            f"{type(categories).__name__}: {categories!r}"
        )
    out: dict[int, str] = {}
    given: dict[int, str] = {}
    for what, key, value, source in entries:
        category_id = _category_id(key, what)
        if category_id in given:  # 1 and "1" are one id: which name it has would be the later one's
            raise ValueError(f"categories give category id {category_id} twice: {given[category_id]} and {source}")
        given[category_id] = source
        out[category_id] = str(value)
    return out


def check_categories(categories: Any) -> dict[int, str] | None:
    """The ``categories=`` of a detector as ``{category_id: name}`` (any form :func:`as_categories` takes);
    None stays None (the detector's default label space)."""
    return None if categories is None else as_categories(categories)


def _names_list(model_names: Mapping[int, str] | Sequence[str]) -> list[str]:
    if isinstance(model_names, Mapping):
        size = max((int(k) for k in model_names), default=-1) + 1
        names = [str(i) for i in range(size)]
        for k, v in model_names.items():
            names[int(k)] = str(v)
        return names
    return [str(n) for n in model_names]


def _integer_key(key: Any, name: str) -> int:
    """A map key that is an integer: an int, or its digits as a string (JSON and YAML keys are strings)."""
    if isinstance(key, str) and key.lstrip("-").isdigit():
        return int(key)
    return check_integer(key, f"{name} {key!r}")


def _category_id(value: Any, name: str) -> int:
    """A category id a map gives: an integer in ``[0, MAX_LABEL]`` (a float is not rounded, and a negative
    id would read as "dropped")."""
    return check_integer(value, name, 0, MAX_LABEL)


def check_category_id_map(class_map: Mapping[Any, Any], where: str) -> dict[int, int]:
    """``{saved category id: category id}`` (saved predictions' ``class_map``) with every key and value an
    integer (keys may be digit strings, as JSON and YAML give them), each id in ``[0, MAX_LABEL]``.

    Raises:
        TypeError: not a mapping, or a key or id that is not an integer (naming it; a class name as key is
            told apart, since saved predictions have no class names to look it up in).
        ValueError: an id out of range.
    """
    if not isinstance(class_map, Mapping):
        raise TypeError(
            f"{where}: class_map must be {{saved category_id: category_id}}, got {type(class_map).__name__}"
        )
    checked: dict[int, int] = {}
    given: dict[int, Any] = {}
    for key, cat in class_map.items():
        if isinstance(key, str) and any(c.isalpha() for c in key):
            # a model's class_map may be keyed by class names; a results file holds category ids only
            raise TypeError(
                f"{where}: class_map key {key!r} is a class name, but saved predictions have no class names: "
                "their class_map is keyed by the category_id values of the results file, "
                "{saved category_id: category id} such as {1: 0, 3: 1}"
            )
        saved = _category_id(_integer_key(key, f"{where}: class_map key"), f"{where}: class_map key")
        if saved in given:  # 1 and "1" are one saved id: which category it means would be the later key's
            raise ValueError(f"{where}: class_map gives saved category id {saved} twice ({given[saved]!r} and {key!r})")
        given[saved] = key
        checked[saved] = _category_id(cat, f"{where}: class_map[{key!r}]")
    return checked


def id_ranges(ids: Sequence[int], limit: int = 24) -> str:
    """Sorted integer ids as runs, ``"1-11, 13-25, 27, 28"``; at most ``limit`` runs, then a count."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in runs]
    return first_few(parts, limit, total=len(ids), noun="ids") if parts else "none"


def check_class_map_categories(
    class_map: Mapping[Any, Any] | Sequence[Any],
    category_ids: Iterable[int],
    where: str,
    label_space: str = "the label space",
) -> None:
    """Check that every category id ``class_map`` gives is one of ``category_ids``: a box mapped outside
    the label space would be written with an id that nothing (``images.json``, a YOLO label) can name.

    Args:
        class_map: ``{class index, class name or saved category id: category id}``, or a list with the
            category id of every class by index.
        category_ids (Iterable[int]): the label space's category ids.
        where (str): the member, for messages (``"model 'v8'"``).
        label_space (str): whose ids ``category_ids`` are, for messages.

    Raises:
        TypeError: ``class_map`` is neither a mapping nor a list, or an id is not an integer.
        ValueError: an id outside ``[0, MAX_LABEL]``, or not one of ``category_ids`` (naming the first
            such key and id, the other wrong ids and the valid ids).
    """
    if isinstance(class_map, Mapping):
        items = list(class_map.items())
    elif isinstance(class_map, Sequence) and not isinstance(class_map, str):
        items = list(enumerate(class_map))
    else:
        raise TypeError(
            f"{where}: class_map must be {{index or name: category_id}} or a list of category ids, "
            f"got {type(class_map).__name__}"
        )
    valid = {int(c) for c in category_ids}
    wrong = [(key, cat) for key, cat in items if _category_id(cat, f"{where}: class_map[{key!r}]") not in valid]
    if not wrong:
        return
    key, cat = wrong[0]
    others = ""
    if len(wrong) > 1:
        others = f"; neither are {', '.join(f'class_map[{k!r}] = {c}' for k, c in wrong[1:6])}" + (
            " ..." if len(wrong) > 6 else ""
        )
    raise ValueError(
        f"{where}: class_map[{key!r}] = {cat} is not one of the {len(valid)} category ids of {label_space}: "
        f"{id_ranges(sorted(valid))}{others}; map the classes onto those ids"
    )


# where a model's classes cannot be matched to the label space by name
_CLASS_MAP_HINT = (
    "give the model a class_map, {model class index or name: category id} (the member's class_map: key in "
    "an ensemble YAML, class_map= in Python)"
)


#: Normalized names of the classes that stand for no object: torchvision's COCO "__background__" and the
#: "N/A" of its unused ids, and the "no person" background of its Keypoint R-CNN weights.
_BACKGROUND_NAMES = frozenset(normalize_class_name(n) for n in ("N/A", "background", "__background__", "no person"))


def is_background_class(name: str) -> bool:
    """Whether a model's class ``name`` stands for no object (:data:`_BACKGROUND_NAMES`)."""
    return normalize_class_name(name) in _BACKGROUND_NAMES


def build_label_lookup(
    model_names: Mapping[int, str] | Sequence[str],
    *,
    default: Literal["coco80", "identity"],
    categories: Mapping[int, str] | None = None,
    class_map: Mapping[int | str, int] | Sequence[int] | None = None,
    where: str = "detector",
) -> Tensor:
    """Build the ``Tensor[M]`` lookup from detector class index to category id (``-1``: dropped).

    Args:
        model_names: the detector's class names by index.
        default: what to do without ``categories``/``class_map``: ``"coco80"`` maps indices 0..79 to COCO
            ids in the standard order (the detector must have 80 classes); ``"identity"`` keeps the index as
            the id (torchvision COCO models already predict COCO ids).
        categories: ``{category_id: name}`` of the target label space; detector classes are mapped onto it
            by name (case, ``_`` and Darknet spellings ignored). Classes without a match are dropped.
        class_map: explicit ``{detector index or class name: category id}``; wins over everything else,
            and classes it does not list are dropped. A list gives the category id of every class by index
            (``[1, 2, 3, ..., 90]``, a model card's ``coco_ids``) and must have one entry per class. With
            ``categories``, each id must be one of them (:func:`check_class_map_categories`).
        where: the detector's name, for messages.
    """
    names = _names_list(model_names)
    num = len(names)
    lookup = torch.full((num,), -1, dtype=torch.int64)
    if class_map is not None and not isinstance(class_map, Mapping):
        if isinstance(class_map, str) or not isinstance(class_map, Sequence):
            raise TypeError(
                f"{where}: class_map must be {{index or name: category_id}} or a list of category ids, "
                f"got {type(class_map).__name__}"
            )
        if len(class_map) != num:
            # a short list would silently drop the last classes; a dict says which ones on purpose
            raise ValueError(
                f"{where}: class_map lists {len(class_map)} category ids but the model has {num} classes; "
                "give one id per class, or a {index: category_id} dict to keep only some"
            )
        class_map = dict(enumerate(class_map))
    if class_map is not None:
        if categories is not None:
            check_class_map_categories(class_map, categories, where)
        by_name = {normalize_class_name(n): i for i, n in enumerate(names)}
        given: dict[int, Any] = {}
        for key, cat in class_map.items():
            if isinstance(key, str) and not key.lstrip("-").isdigit():
                index = by_name.get(normalize_class_name(key))
                if index is None:
                    raise ValueError(
                        f"{where}: class_map names class {key!r}, which the model does not have ({names[:10]}...)."
                        + did_you_mean(key, names, key=normalize_class_name)
                    )
            else:
                index = _integer_key(key, f"{where}: class_map key")
            if not 0 <= index < num:
                raise ValueError(f"{where}: class_map index {index} is outside the model's {num} classes")
            if index in given:  # by index and by name, or by two spellings: the later key would win unseen
                raise ValueError(
                    f"{where}: class_map maps class {index} ({names[index]!r}) twice, as {given[index]!r} and {key!r}"
                )
            given[index] = key
            lookup[index] = _category_id(cat, f"{where}: class_map[{key!r}]")
        return lookup
    if categories is not None:
        target: dict[str, int] = {}
        for cid, n in categories.items():
            spelled = normalize_class_name(n)
            if spelled in target and target[spelled] != int(cid):
                # a model class of that name would go to whichever id came last
                raise ValueError(
                    f"{where}: the label space names categories {target[spelled]} and {cid} alike ({n!r}), so "
                    f"classes cannot be matched to it by name; {_CLASS_MAP_HINT}"
                )
            target[spelled] = int(cid)
        unmatched = []
        for i, name in enumerate(names):
            cid = target.get(normalize_class_name(name))
            if cid is None:
                unmatched.append(name)
            else:
                lookup[i] = cid
        if (lookup < 0).all():
            raise ValueError(
                f"{where}: none of the model's classes ({names[:8]}...) matches a category name of the label space "
                f"({list(categories.values())[:8]}...); {_CLASS_MAP_HINT}"
            )
        found = set(lookup.tolist())
        unseen = [name for cid, name in categories.items() if int(cid) not in found]
        if unseen:  # most often a dataset's own names for classes the model has under others
            logger.warning(
                "%s: no class of the model has the name of the categories %s of the label space, so it gives "
                "them no box; if it has them under other names, %s", where, unseen, _CLASS_MAP_HINT,
            )
        meaningful = [
            n for n in unmatched if not is_background_class(n)
        ]
        if meaningful:
            logger.info(
                "%s: %d classes have no category in the label space and are dropped: %s",
                where,
                len(meaningful),
                meaningful,
            )
        return lookup
    if default == "identity":
        return torch.arange(num, dtype=torch.int64)
    if num != len(COCO_CATEGORY_IDS):
        raise ValueError(
            f"{where}: the model has {num} classes ({names[:8]}{'...' if num > 8 else ''}), not the 80 COCO classes; "
            "pass categories= (the dataset's categories, matched by name) or class_map={index: category_id}"
        )
    real_names = [n for n in names if not n.isdigit()]
    if real_names:
        differ = [
            (n, c)
            for n, c in zip(names, COCO_NAMES, strict=True)
            if normalize_class_name(n) != normalize_class_name(c)
        ]
        if differ:
            logger.warning(
                "%s: 80 classes whose names differ from COCO's (e.g. %r vs %r); mapping them by index in COCO order",
                where,
                differ[0][0],
                differ[0][1],
            )
    return torch.tensor(COCO_CATEGORY_IDS, dtype=torch.int64)


def apply_label_lookup(lookup: Tensor, classes: Tensor) -> tuple[Tensor, Tensor]:
    """``(labels, keep)`` for detector class indices ``classes`` (Tensor[K]); ``keep`` drops unmapped ones."""
    classes = classes.to(torch.int64).cpu()
    inside = (classes >= 0) & (classes < lookup.numel())
    labels = torch.full_like(classes, -1)
    labels[inside] = lookup[classes[inside]]
    keep = labels >= 0
    return labels, keep


def category_names(categories: Mapping[int, str] | None) -> dict[int, str]:
    """Names to draw: the label space's categories (any form :func:`as_categories` takes), COCO's by default."""
    return as_categories(categories) if categories is not None else dict(COCO_ID_TO_NAME)
