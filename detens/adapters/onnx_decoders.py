"""Decoders for the raw outputs of ONNX detectors: one per output layout, in the :data:`DECODERS` registry.

Dimension legend: B images in a batch, A anchor points (grid cells of every level), C classes,
K candidate boxes, H x W the network input.

A decoder turns the outputs of ONE image (the batch dimension removed) into candidate boxes before
non-maximum suppression: ``(boxes [K, 4] xyxy in network-input pixels, scores [K], classes [K])``, one
candidate per anchor with its best class (the families' own post-processing). It also checks the model's
declared output shapes before any image runs (:meth:`OnnxDecoder.check_outputs`).

- ``yolox`` — YOLOX: one output ``[B, A, 5 + C]`` of raw ``tx, ty, tw, th``, objectness and class
  scores (already sigmoid-ed), levels of stride 8, 16, 32, each row-major over ``(y, x)``;
  ``cx = (tx + x) * s``, ``w = exp(tw) * s``; score = objectness x class score.
- ``nanodet_gfl`` — NanoDet (v0.x, GFL head): three class-score outputs ``[B, A_l, C]`` (strides 8, 16,
  32, sigmoid-ed) then three box distributions ``[B, A_l, 4 (reg_max + 1)]``; centre ``((x + 0.5) s,
  (y + 0.5) s)``, each side's distance the expectation of a softmax over ``reg_max + 1`` bins, times s.
- ``ultralytics`` — ``yolo export format=onnx`` (YOLOv5u/v8/11 heads): one output ``[B, 4 + C, A]`` of
  ``cx, cy, w, h`` in input pixels and class scores, no objectness.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from detens.checks import check_integer, check_integers
from detens.registry import Registry

__all__ = [
    "DECODERS", "OnnxDecoder", "YoloxDecoder", "NanodetGflDecoder", "UltralyticsDecoder", "Dim", "check_input_size",
    "check_strides", "check_reg_max", "check_decoder_options",
]

#: One dimension of a declared ONNX shape: an int, or a name / None where the model leaves it dynamic.
Dim = int | str | None

#: decoder name → decoder class (``DECODERS.get("yolox")(input_size)``).
DECODERS: Registry[type[OnnxDecoder]] = Registry("ONNX decoder")


def _grid_size(size: int, stride: int) -> int:
    # a stride-2 convolution with padding keeps the partial last cell: ceil, not floor
    return -(-size // stride)


def check_input_size(value: Any) -> tuple[int, int]:
    """``value``, a network input ``(height, width)`` (a list, tuple or array of two integers >= 1, NumPy
    integers included), as two Python ints.

    Raises:
        TypeError: ``value`` is no list of two (a number, a string), or an entry is no integer.
        ValueError: not two entries, or one below 1.
    """
    expected = "input_size must be two positive integers (height, width)"
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{expected}, got {type(value).__name__}: {value!r}")
    if len(value) != 2:
        raise ValueError(f"{expected}, got {value!r}")
    return check_integer(value[0], "input_size height", 1), check_integer(value[1], "input_size width", 1)


def check_strides(value: Any, name: str = "strides") -> tuple[int, ...]:
    """``value``, the strides of a model's levels (a list of one or more integers >= 1), as a tuple of ints.

    A float is refused, not truncated (``8.9`` is no stride), and a string is refused, not parsed.

    Raises:
        TypeError: not a list, or an entry that is no integer (naming it).
        ValueError: an empty list, or an entry below 1.
    """
    strides = check_integers(value, name, 1)
    if not strides:
        raise ValueError(f"{name} must list the stride of each level (integers >= 1), got {value!r}")
    return tuple(strides)


def check_reg_max(value: Any, name: str = "reg_max") -> int:
    """``value``, the last bin index of a GFL box distribution (an integer >= 0; each side has ``reg_max + 1``
    bins), as an int."""
    return check_integer(value, name, 0)


#: The check of each decoder option, by argument name: ``check(value, name) -> the value to pass``.
_OPTION_CHECKS: dict[str, Callable[[Any, str], Any]] = {"strides": check_strides, "reg_max": check_reg_max}


def check_decoder_options(
    decoder: type[OnnxDecoder], options: Any, name: str = "decoder_options"
) -> dict[str, Any]:
    """``options``, the extra arguments of ``decoder`` (its ``__init__``'s, after ``input_size``), checked.

    Args:
        decoder (type[OnnxDecoder]): the decoder class they are for.
        options (Mapping[str, Any] | None): ``{argument: value}``; None: none.
        name (str): what the options are called in messages (``"decoder_options"``).

    Raises:
        TypeError: ``options`` is no mapping, or a value of the wrong type; each error names ``name.key``.
        ValueError: a key that is no argument of ``decoder`` (the error lists those it has), or a value out
            of range.
    """
    if options is None:
        return {}
    valid = [
        p.name for p in list(inspect.signature(decoder.__init__).parameters.values())[2:]  # self, input_size
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    if not isinstance(options, Mapping):
        raise TypeError(
            f"{name} must be a dict of options of the {decoder.name!r} decoder ({', '.join(valid) or 'none'}), "
            f"got {type(options).__name__}: {options!r}"
        )
    for key in options:
        if key not in valid:
            raise ValueError(
                f"{name}.{key} is not an option of the {decoder.name!r} decoder; its options: "
                f"{', '.join(valid) or 'none'}"
            )
    return {
        key: _OPTION_CHECKS[key](value, f"{name}.{key}") if key in _OPTION_CHECKS else value
        for key, value in options.items()
    }


def _level_points(input_size: tuple[int, int], strides: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per level, the cell coordinates ``(x [A_l], y [A_l])``, row-major over ``(y, x)``."""
    height, width = input_size
    points = []
    for stride in strides:
        ys, xs = np.meshgrid(
            np.arange(_grid_size(height, stride), dtype=np.float32),
            np.arange(_grid_size(width, stride), dtype=np.float32),
            indexing="ij",
        )
        points.append((xs.reshape(-1), ys.reshape(-1)))
    return points


def _format_shapes(shapes: Sequence[Sequence[Dim]]) -> str:
    return ", ".join("[" + ", ".join("?" if d is None else str(d) for d in shape) + "]" for shape in shapes)


class OnnxDecoder:
    """Base of the decoders: ``decoder(outputs) -> (boxes [K, 4], scores [K], classes [K])``.

    Args:
        input_size (tuple[int, int]): the network input ``(height, width)`` in pixels.

    Subclasses set ``name`` and ``preprocessing`` (the family's own input preparation, the defaults of
    :class:`~detens.adapters.onnx.OnnxDetector`), implement :meth:`expected_outputs` (the shapes they
    accept, given the class count), :meth:`num_classes` (read from the declared shapes) and ``__call__``.
    """

    name: str = "decoder"
    #: ``letterbox``, ``pad_value``, ``bgr_to_rgb``, ``mean``, ``std`` of the family's own preprocessing.
    preprocessing: dict[str, object] = {
        "letterbox": "top_left",
        "pad_value": 114.0,
        "bgr_to_rgb": False,
        "mean": (0.0, 0.0, 0.0),
        "std": (1.0, 1.0, 1.0),
    }

    #: the levels' strides; a network of dynamic input size takes sides that the largest divides
    strides: tuple[int, ...] = ()

    def __init__(self, input_size: tuple[int, int]) -> None:
        self.input_size = check_input_size(input_size)

    def expected_outputs(self, num_classes: int | str) -> list[tuple[Dim, ...]]:
        """The output shapes this decoder takes, ``"B"`` for the batch dimension."""
        raise NotImplementedError

    def num_classes(self, shapes: Sequence[Sequence[Dim]]) -> int | None:
        """The class count the declared shapes imply, or None when they do not say (dynamic or wrong)."""
        raise NotImplementedError

    def check_outputs(self, shapes: Sequence[Sequence[Dim]], where: str = "model") -> int:
        """Check the declared output shapes; returns the class count C.

        Dynamic dimensions (a name or None) match anything.

        Raises:
            ValueError: the shapes do not fit; names ``where`` (the file), the expected and the actual shapes.
        """
        shapes = [tuple(shape) for shape in shapes]
        num_classes = self.num_classes(shapes)
        expected = self.expected_outputs(num_classes if num_classes is not None else "C")
        fits = num_classes is None or num_classes >= 1
        fits = fits and len(shapes) == len(expected)
        if fits:
            for want, got in zip(expected, shapes, strict=True):
                if len(want) != len(got):
                    fits = False
                    break
                for w, g in zip(want, got, strict=True):
                    if isinstance(w, int) and isinstance(g, int) and w != g:
                        fits = False
        if not fits:
            expected = self.expected_outputs("C")  # a class count read from wrong shapes means nothing
            height, width = self.input_size
            raise ValueError(
                f"{where}: decoder {self.name!r} expects {len(expected)} output(s) of shape "
                f"{_format_shapes(expected)} for a {height}x{width} input (B: batch, C: classes), "
                f"the model has {len(shapes)}: {_format_shapes(shapes)}"
            )
        if num_classes is None:  # every class dimension dynamic: the first run tells
            return -1
        return num_classes

    def __call__(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decode the outputs of one image (batch dimension removed).

        Args:
            outputs (list[np.ndarray]): the model's outputs in order, each without its batch dimension.

        Returns:
            tuple[np.ndarray, np.ndarray, np.ndarray]: ``boxes (float32[A, 4])`` xyxy in network-input
            pixels, ``scores (float32[A])`` and ``classes (int64[A])``, the best class of each anchor.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(input_size={self.input_size})"


def _best_class(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(best score [A], its class [A])`` of ``scores [A, C]``."""
    classes = scores.argmax(axis=1)
    return np.take_along_axis(scores, classes[:, None], axis=1)[:, 0], classes.astype(np.int64)


@DECODERS.register("yolox")
class YoloxDecoder(OnnxDecoder):
    """YOLOX's raw head output ``[B, A, 5 + C]`` (see the module docstring).

    Args:
        input_size (tuple[int, int]): ``(height, width)``.
        strides (Sequence[int]): the levels' strides, in the order of the rows.
    """

    name = "yolox"
    # YOLOX's own ``preproc``: BGR 0..255, top-left letterbox on 114
    preprocessing = OnnxDecoder.preprocessing

    def __init__(self, input_size: tuple[int, int], strides: Sequence[int] = (8, 16, 32)) -> None:
        super().__init__(input_size)
        self.strides = check_strides(strides)
        points = _level_points(self.input_size, self.strides)
        self.grid = np.concatenate([np.stack(p, axis=1) for p in points])  # [A, 2] x, y
        self.stride = np.concatenate(
            [np.full(len(p[0]), s, dtype=np.float32) for p, s in zip(points, self.strides, strict=True)]
        )[:, None]  # [A, 1]

    def expected_outputs(self, num_classes: int | str) -> list[tuple[Dim, ...]]:
        columns = num_classes + 5 if isinstance(num_classes, int) else f"5+{num_classes}"
        return [("B", len(self.grid), columns)]

    def num_classes(self, shapes: Sequence[Sequence[Dim]]) -> int | None:
        if len(shapes) == 1 and len(shapes[0]) == 3 and isinstance(shapes[0][2], int):
            return shapes[0][2] - 5
        return None

    def __call__(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = np.asarray(outputs[0], dtype=np.float32)  # [A, 5 + C]
        centre = (rows[:, 0:2] + self.grid) * self.stride  # [A, 2]
        # exp of an untrained or corrupt output may overflow; cap it far beyond any image size
        size = np.exp(np.minimum(rows[:, 2:4], 20.0)) * self.stride  # [A, 2]
        boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
        scores, classes = _best_class(rows[:, 5:] * rows[:, 4:5])
        return boxes, scores, classes


@DECODERS.register("nanodet_gfl")
class NanodetGflDecoder(OnnxDecoder):
    """NanoDet's GFL head: class scores then distribution-focal-loss box bins, per level (module docstring).

    Args:
        input_size (tuple[int, int]): ``(height, width)``.
        strides (Sequence[int]): the levels' strides, in the order of the outputs.
        reg_max (int): the last bin index; each side has ``reg_max + 1`` bins.
    """

    name = "nanodet_gfl"
    # NanoDet's BGR mean / std; a centred letterbox on 0 (the hpc203 demo) beats a plain stretch on COCO
    preprocessing = {
        "letterbox": "center",
        "pad_value": 0.0,
        "bgr_to_rgb": False,
        "mean": (103.53, 116.28, 123.675),
        "std": (57.375, 57.12, 58.395),
    }

    def __init__(
        self, input_size: tuple[int, int], strides: Sequence[int] = (8, 16, 32), reg_max: int = 7
    ) -> None:
        super().__init__(input_size)
        self.strides = check_strides(strides)
        self.reg_max = check_reg_max(reg_max)
        points = _level_points(self.input_size, self.strides)
        # cell centres in input pixels, [A_l, 2] per level
        self.centres = [
            np.stack([(x + 0.5) * s, (y + 0.5) * s], axis=1)
            for (x, y), s in zip(points, self.strides, strict=True)
        ]
        self.bins = np.arange(self.reg_max + 1, dtype=np.float32)  # [reg_max + 1]

    def expected_outputs(self, num_classes: int | str) -> list[tuple[Dim, ...]]:
        counts = [len(c) for c in self.centres]
        sides = 4 * (self.reg_max + 1)
        return [("B", n, num_classes) for n in counts] + [("B", n, sides) for n in counts]

    def num_classes(self, shapes: Sequence[Sequence[Dim]]) -> int | None:
        if shapes and len(shapes[0]) == 3 and isinstance(shapes[0][2], int):
            return shapes[0][2]
        return None

    def __call__(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        levels = len(self.strides)
        boxes, scores = [], []
        for level, stride in enumerate(self.strides):
            cls = np.asarray(outputs[level], dtype=np.float32)  # [A_l, C]
            dist = np.asarray(outputs[levels + level], dtype=np.float32).reshape(-1, 4, self.reg_max + 1)
            dist = np.exp(dist - dist.max(axis=2, keepdims=True))  # softmax over the bins, stable
            distance = (dist / dist.sum(axis=2, keepdims=True)) @ self.bins * stride  # [A_l, 4] l, t, r, b
            centre = self.centres[level]
            boxes.append(np.concatenate([centre - distance[:, 0:2], centre + distance[:, 2:4]], axis=1))
            scores.append(cls)
        height, width = self.input_size
        box = np.concatenate(boxes)  # [A, 4]
        np.clip(box[:, 0::2], 0.0, float(width), out=box[:, 0::2])
        np.clip(box[:, 1::2], 0.0, float(height), out=box[:, 1::2])
        best, classes = _best_class(np.concatenate(scores))
        return box, best, classes


@DECODERS.register("ultralytics")
class UltralyticsDecoder(OnnxDecoder):
    """A ``yolo export format=onnx`` output ``[B, 4 + C, A]``: ``cx, cy, w, h`` and class scores.

    Exports with NMS or an end-to-end head (``[B, 300, 6]``) have another layout and fail the shape check;
    run those through :class:`~detens.adapters.ultralytics.UltralyticsDetector`.

    Args:
        input_size (tuple[int, int]): ``(height, width)``.
        strides (Sequence[int]): the levels' strides (they set A).
    """

    name = "ultralytics"
    # Ultralytics' LetterBox: centred on 114, RGB in 0..1
    preprocessing = {
        "letterbox": "center",
        "pad_value": 114.0,
        "bgr_to_rgb": True,
        "mean": (0.0, 0.0, 0.0),
        "std": (255.0, 255.0, 255.0),
    }

    def __init__(self, input_size: tuple[int, int], strides: Sequence[int] = (8, 16, 32)) -> None:
        super().__init__(input_size)
        self.strides = check_strides(strides)
        height, width = self.input_size
        self.anchors = sum(_grid_size(height, s) * _grid_size(width, s) for s in self.strides)

    def expected_outputs(self, num_classes: int | str) -> list[tuple[Dim, ...]]:
        rows = num_classes + 4 if isinstance(num_classes, int) else f"4+{num_classes}"
        return [("B", rows, self.anchors)]

    def num_classes(self, shapes: Sequence[Sequence[Dim]]) -> int | None:
        if len(shapes) == 1 and len(shapes[0]) == 3 and isinstance(shapes[0][1], int):
            return shapes[0][1] - 4
        return None

    def __call__(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = np.asarray(outputs[0], dtype=np.float32).T  # [A, 4 + C]
        centre, size = rows[:, 0:2], rows[:, 2:4]
        boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
        scores, classes = _best_class(rows[:, 4:])
        return boxes, scores, classes
