"""ONNX detectors run with onnxruntime: the network in the file, pre- and post-processing here.

Dimension legend: K boxes, A anchor points, C classes of the model, H x W the network input, h x w an image.

An ONNX export holds the network only. :class:`OnnxDetector` letterboxes each image into the input
(:class:`Letterbox`: scaled to fit, pasted top-left or centred on ``pad_value``), orders and normalizes
the channels, runs the session, turns the raw outputs into candidate boxes with a decoder of
:data:`~detens.adapters.onnx_decoders.DECODERS` (``yolox``, ``nanodet_gfl``, ``ultralytics``), keeps the
scores above ``conf``, drops the classes outside the label space, applies per-class NMS (the families' own
post-processing), keeps the best ``max_det`` boxes and maps them back to the image's pixels. Input and output
shapes are checked against the decoder when the model loads.

``onnxruntime`` is imported when a detector is built (``pip install 'detens[onnx]'``); the CUDA provider
runs first when onnxruntime offers it, the CPU otherwise.
"""

from __future__ import annotations

import ast
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import torch
from torchvision.ops import batched_nms, clip_boxes_to_image

from detens.adapters._base import BaseDetector, check_detection_options, require_nms_iou
from detens.adapters._labels import (
    apply_label_lookup,
    build_label_lookup,
    check_categories,
    check_class_map_categories,
)
from detens.adapters.onnx_decoders import DECODERS, Dim, OnnxDecoder, check_decoder_options, check_input_size
from detens.adapters.weights import resolve_weights
from detens.checks import check_flag, check_real, check_reals
from detens.detections import Detections
from detens.labels import COCO_NAMES

__all__ = ["OnnxDetector", "Letterbox", "import_onnxruntime", "select_providers"]

logger = logging.getLogger(__name__)

LetterboxMode = Literal["top_left", "center"]
_CPU, _CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def import_onnxruntime() -> Any:
    """``import onnxruntime``, or a :class:`~detens.extras.MissingExtraError` (an ImportError) that says how to
    install it."""
    from detens.extras import import_extra

    return import_extra(
        "onnxruntime",
        "the ONNX adapter needs onnxruntime, which is not installed: pip install 'detens[onnx]' "
        "(or onnxruntime-gpu for CUDA)",
    )


def select_providers(
    providers: Sequence[str] | None, device: str | None, available: Sequence[str]
) -> list[str | tuple[str, dict[str, Any]]]:
    """The execution providers of the session, in order of preference.

    Args:
        providers: explicit onnxruntime provider names; each must be in ``available``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``; None: CUDA first when available, then the CPU.
        available: ``onnxruntime.get_available_providers()``.
    """
    if providers is not None:
        missing = [p for p in providers if p not in available]
        if missing or not providers:
            raise ValueError(
                f"onnxruntime providers {missing or list(providers)} are not available here; "
                f"available: {', '.join(available)}"
            )
        return list(providers)
    if device is None:
        return [_CUDA, _CPU] if _CUDA in available else [_CPU]
    text = str(device).strip().lower()
    if text == "cpu":
        return [_CPU]
    if text == "cuda" or text.startswith("cuda:") or text.isdigit():
        if _CUDA not in available:
            raise ValueError(
                f"device {device!r} asks for CUDA, but onnxruntime offers only {', '.join(available)} "
                "(install onnxruntime-gpu)"
            )
        index = text.split(":", 1)[1] if ":" in text else (text if text.isdigit() else "0")
        return [(_CUDA, {"device_id": int(index)}), _CPU]
    raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or None, got {device!r}")


@dataclass(frozen=True)
class Letterbox:
    """Where an image sits in the network input: scaled by ``scale``, its top-left corner at ``(left, top)``.

    Args:
        scale (float): input pixels per image pixel, ``min(H / h, W / w)``.
        left (int): columns of padding left of the image.
        top (int): rows of padding above the image.
        resized (tuple[int, int]): ``(height, width)`` of the scaled image, ``round(h * scale)``, ``round(w * scale)``.
        image_size (tuple[int, int]): ``(h, w)`` of the image.

    Boxes are mapped with the gains of the resize the pixels went through, ``resized / image_size`` per
    axis (as Ultralytics maps them back): rounding the scaled size makes them differ from ``scale`` by up
    to half an input pixel over the image.
    """

    scale: float
    left: int
    top: int
    resized: tuple[int, int]
    image_size: tuple[int, int]

    @classmethod
    def fit(
        cls, image_size: tuple[int, int], input_size: tuple[int, int], mode: LetterboxMode = "top_left"
    ) -> Letterbox:
        """The letterbox of an image of ``image_size`` ``(h, w)`` in an input of ``input_size`` ``(H, W)``."""
        if mode not in ("top_left", "center"):
            raise ValueError(f"letterbox must be 'top_left' or 'center', got {mode!r}")
        height, width = image_size
        in_height, in_width = input_size
        scale = min(in_height / height, in_width / width)
        new_height = min(in_height, max(1, int(height * scale + 0.5)))
        new_width = min(in_width, max(1, int(width * scale + 0.5)))
        left, top = ((in_width - new_width) // 2, (in_height - new_height) // 2) if mode == "center" else (0, 0)
        return cls(scale, left, top, (new_height, new_width), (int(height), int(width)))

    def _gains_and_offset(self) -> tuple[np.ndarray, np.ndarray]:
        gain_x = self.resized[1] / self.image_size[1]
        gain_y = self.resized[0] / self.image_size[0]
        gains = np.array([gain_x, gain_y, gain_x, gain_y], dtype=np.float64)
        offset = np.array([self.left, self.top, self.left, self.top], dtype=np.float64)
        return gains, offset

    def to_input(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes ``(float[K, 4])`` xyxy in image pixels → network-input pixels."""
        gains, offset = self._gains_and_offset()
        return (np.asarray(boxes, dtype=np.float64) * gains + offset).astype(np.float32)

    def to_image(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes ``(float[K, 4])`` xyxy in network-input pixels → image pixels (not clipped)."""
        gains, offset = self._gains_and_offset()
        return ((np.asarray(boxes, dtype=np.float64) - offset) / gains).astype(np.float32)

    def apply(self, image: np.ndarray, input_size: tuple[int, int], pad_value: float) -> np.ndarray:
        """The image ``(uint8[h, w, 3])`` scaled and pasted on a ``float32[H, W, 3]`` canvas of ``pad_value``."""
        new_height, new_width = self.resized
        canvas = np.full((*input_size, 3), pad_value, dtype=np.float32)
        if image.shape[:2] != (new_height, new_width):
            image = cv2.resize(image, (new_width, new_height), interpolation=cv2.INTER_LINEAR)
        canvas[self.top : self.top + new_height, self.left : self.left + new_width] = image
        return canvas


def _class_names_from_metadata(session: Any) -> list[str] | None:
    """Class names an Ultralytics export stores in its metadata (``names: {0: 'person', ...}``), if any."""
    try:
        text = session.get_modelmeta().custom_metadata_map.get("names")
        names = ast.literal_eval(text) if text else None
    except (ValueError, SyntaxError, AttributeError):
        return None
    if isinstance(names, Mapping):
        return [str(names[k]) for k in sorted(names)]
    if isinstance(names, (list, tuple)):
        return [str(n) for n in names]
    return None


def _shape(dims: Sequence[Any]) -> tuple[Dim, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else (d if isinstance(d, str) else None) for d in dims)


class OnnxDetector(BaseDetector):
    """A detector exported to ONNX (network only), decoded by a family decoder, as a detens detector.

    Preprocessing, in order: :class:`Letterbox` into ``input_size`` on ``pad_value`` (0..255 pixels),
    BGR → RGB when ``bgr_to_rgb``, ``(pixel - mean) / std`` per channel (in the network's channel order),
    NCHW float32. Every preprocessing argument left None takes the decoder's family default
    (``DECODERS.get(decoder).preprocessing``).

    Args:
        weights (str | Path): the ``.onnx`` file: a path, or a name relative to the weights folder
            (``$DETENS_WEIGHTS``, see :mod:`detens.adapters.weights`). Never downloaded.
        decoder (str): the output layout, a name of :data:`~detens.adapters.onnx_decoders.DECODERS`
            (``"yolox"``, ``"nanodet_gfl"``, ``"ultralytics"``).
        input_size (Sequence[int] | None): the network input ``(height, width)``; None: the model's own
            (static) input shape. A model of dynamic input size needs sides that are multiples of the
            decoder's largest stride (32 by default).
        letterbox (str | None): ``"top_left"`` (YOLOX) or ``"center"`` (NanoDet, Ultralytics).
        pad_value (float | None): the padding's pixel value, before normalization (114, 0, ...).
        bgr_to_rgb (bool | None): feed RGB (images arrive BGR, as ``cv2.imread`` gives).
        mean (Sequence[float] | None): 3 finite numbers, subtracted per channel, in the network's channel order.
        std (Sequence[float] | None): 3 positive numbers, dividing per channel after ``mean`` (255 scales to 0..1).
        conf (float): minimum score kept.
        iou (float): per-class NMS IoU threshold, in (0, 1] (the network has no NMS of its own to fall back on).
        max_det (int): maximum boxes per image.
        device (str | None): ``"cpu"``, ``"cuda"``, ``"cuda:N"``; None: CUDA when onnxruntime offers it.
        providers (Sequence[str] | None): explicit onnxruntime providers; win over ``device``.
        name (str | None): display name; default the file's stem (``"yolox_nano"``).
        categories (dict[int, str] | None): the dataset's ``{category_id: name}`` (or its COCO ``categories``
            list, or its whole COCO annotation dict); model classes are mapped onto it by name. Default: the
            model's 80 classes in COCO order → COCO category ids.
        class_map (dict | list | None): explicit ``{class index or name: category_id}`` (unlisted classes
            are dropped), or the category id of every class by index (one per class).
        batch (int): images per call; a model with a fixed batch of 1 runs them one by one.
        agnostic_nms (bool): class-agnostic NMS.
        decoder_options (dict | None): extra arguments of the decoder: ``strides`` (integers >= 1), and
            ``reg_max`` (an integer >= 0) for ``nanodet_gfl``.
        weights_dir (str | Path | None): the default weights folder when ``$DETENS_WEIGHTS`` is unset.
        config_folder (str | Path | None): the folder of the ensemble YAML that names ``weights``: a relative
            path is looked for there instead of in the working directory (see
            :func:`~detens.adapters.weights.resolve_weights`'s ``beside``). None: a call from Python.

    Calling it returns one :class:`Detections` per image: boxes ``(Tensor[K, 4])`` xyxy in the image's
    pixels (clipped to it), scores ``(Tensor[K])``, labels ``(Tensor[K])`` in the label space.

    Raises:
        MissingExtraError: onnxruntime is missing (an ImportError).
        ValueError: an unknown decoder, shapes of the model that the decoder does not take, an ``input_size``
            that a model of dynamic input size does not take, a class map that does not fit the model's
            classes, or a bad argument (an argument of the wrong type is a ``TypeError``); at run time, a
            failure of onnxruntime, naming the file and ``input_size``.
    """

    def __init__(
        self,
        weights: str | os.PathLike[str],
        decoder: str,
        input_size: Sequence[int] | None = None,
        letterbox: LetterboxMode | None = None,
        pad_value: float | None = None,
        bgr_to_rgb: bool | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        conf: float = 0.001,
        iou: float = 0.65,
        max_det: int = 300,
        device: str | None = None,
        *,
        providers: Sequence[str] | None = None,
        name: str | None = None,
        categories: Mapping[int, str] | None = None,
        class_map: Mapping[int | str, int] | Sequence[int] | None = None,
        batch: int = 1,
        agnostic_nms: bool = False,
        decoder_options: Mapping[str, Any] | None = None,
        weights_dir: str | Path | None = None,
        config_folder: str | Path | None = None,
    ) -> None:
        # every argument is checked before the model is loaded
        conf, iou, max_det = check_detection_options(conf, iou, max_det)
        iou = require_nms_iou(iou, "the NMS after the decoder (an ONNX network has none of its own)")
        if input_size is not None:
            input_size = check_input_size(input_size)
        decoder_cls = DECODERS.get(decoder)  # unknown name: the error lists the valid ones
        decoder_kwargs = check_decoder_options(decoder_cls, decoder_options)
        defaults = decoder_cls.preprocessing
        self.letterbox: LetterboxMode = letterbox if letterbox is not None else defaults["letterbox"]  # type: ignore[assignment]
        if self.letterbox not in ("top_left", "center"):
            raise ValueError(f"letterbox must be 'top_left' or 'center', got {self.letterbox!r}")
        self.pad_value = check_real(pad_value if pad_value is not None else defaults["pad_value"], "pad_value")
        self.bgr_to_rgb = check_flag(bgr_to_rgb if bgr_to_rgb is not None else defaults["bgr_to_rgb"], "bgr_to_rgb")
        self.mean = self._channels(mean if mean is not None else defaults["mean"], "mean")
        # an infinite std would feed the network a constant channel, a zero one infinities
        self.std = self._channels(std if std is not None else defaults["std"], "std", low=0.0)
        if (self.std == 0).any():  # a std too small for float32
            raise ValueError(f"std must not contain 0, got {self.std.tolist()}")
        agnostic_nms = check_flag(agnostic_nms, "agnostic_nms")
        categories = check_categories(categories)

        self.resolved = resolve_weights(weights, "onnx", weights_dir, config_folder)
        super().__init__(name if name is not None else Path(self.resolved.value).stem, batch, categories)
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        # some exports list their initializers as graph inputs: one warning each, hundreds per load
        options.log_severity_level = 3
        self.providers = select_providers(providers, device, ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(
                self.resolved.value, sess_options=options, providers=self.providers
            )
        except Exception as err:  # onnxruntime raises its own exception types
            raise ValueError(
                f"onnxruntime could not load {self.resolved.value!r}: {type(err).__name__}: {err}"
            ) from err

        self.input_name, self.input_size, self.fixed_batch = self._check_input(input_size)
        self.decoder: OnnxDecoder = decoder_cls(self.input_size, **decoder_kwargs)
        self._check_dynamic_size()
        self.output_shapes = [_shape(o.shape) for o in self.session.get_outputs()]
        self.num_classes = self.decoder.check_outputs(self.output_shapes, where=self.resolved.value)
        self.conf, self.iou, self.max_det, self.agnostic_nms = conf, float(iou), max_det, agnostic_nms
        self._label_args = {"categories": categories, "class_map": class_map}
        self.lookup = self._build_lookup(self.num_classes) if self.num_classes > 0 else None  # dynamic: at the first run
        if self.lookup is None and categories is not None and class_map is not None:
            # the lookup waits for the first run to know the classes; the map's ids can be checked now
            check_class_map_categories(class_map, categories, self.name)
        logger.debug(
            "%s: %s, decoder %s, input %s, %s, providers %s",
            self.name,
            self.resolved.value,
            decoder,
            self.input_size,
            self.letterbox,
            self.session.get_providers(),
        )

    @staticmethod
    def _channels(values: Any, what: str, low: float = -math.inf) -> np.ndarray:
        """``values``, one finite number per channel (each above ``low``), as ``float32[3]``."""
        numbers = check_reals(values, what, low, low_open=True)
        if len(numbers) != 3:
            raise ValueError(f"{what} must have 3 values (one per channel), got {numbers}")
        return np.asarray(numbers, dtype=np.float32)

    def _check_dynamic_size(self) -> None:
        """Check ``input_size`` against the strides where the model leaves its height or width dynamic.

        An FPN neck joins each level to the upsampled coarser one, which fit only when the largest stride
        divides the side; onnxruntime would otherwise fail at the first image, on a Concat or Add node.
        """
        stride = max(self.decoder.strides, default=1)
        shape = _shape(self.session.get_inputs()[0].shape)
        sides = [i for i, dim in enumerate(shape[2:]) if not isinstance(dim, int) and self.input_size[i] % stride]
        if not sides:
            return
        names = " and ".join(("height", "width")[i] for i in sides)
        fitting = [-(-side // stride) * stride if i in sides else side for i, side in enumerate(self.input_size)]
        raise ValueError(
            f"{self.resolved.value}: input_size {list(self.input_size)} does not fit the model: its input "
            f"{names} {'are' if len(sides) > 1 else 'is'} dynamic, and must be a multiple of its largest stride, "
            f"{stride} (decoder {self.decoder.name!r}, strides {list(self.decoder.strides)}); e.g. input_size {fitting}"
        )

    def _check_input(self, input_size: Sequence[int] | None) -> tuple[str, tuple[int, int], int | None]:
        where = self.resolved.value
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise ValueError(
                f"{where}: expected 1 image input [B, 3, H, W], the model has {len(inputs)}: "
                + ", ".join(f"{i.name} {list(i.shape)}" for i in inputs)
            )
        shape = _shape(inputs[0].shape)
        declared = shape[2:] if len(shape) == 4 else ()
        if input_size is None:
            if len(declared) != 2 or not all(isinstance(d, int) for d in declared):
                raise ValueError(
                    f"{where}: the model's input {list(shape)} has no fixed height and width; pass input_size=(H, W)"
                )
            input_size = declared  # type: ignore[assignment]
        size = check_input_size(input_size)
        expected = ("B", 3, *size)
        fits = len(shape) == 4 and all(
            not (isinstance(w, int) and isinstance(g, int) and w != g)
            for w, g in zip(expected, shape, strict=True)
        )
        if not fits:
            raise ValueError(
                f"{where}: expected the input of shape [B, 3, {size[0]}, {size[1]}] (input_size {list(size)}), "
                f"the model's input {inputs[0].name!r} has shape {['?' if d is None else d for d in shape]}"
            )
        return inputs[0].name, size, shape[0] if isinstance(shape[0], int) else None

    def _build_lookup(self, num_classes: int) -> torch.Tensor:
        names = _class_names_from_metadata(self.session)
        if names is None or len(names) != num_classes:
            # no names in the file: 80 classes are COCO's in the standard order (both shipped models)
            names = (
                list(COCO_NAMES)
                if num_classes == len(COCO_NAMES)
                else [str(i) for i in range(num_classes)]
            )
        return build_label_lookup(
            names, default="coco80", where=f"{self.name} ({self.resolved.value})", **self._label_args
        )

    def preprocess(self, image: np.ndarray) -> tuple[np.ndarray, Letterbox]:
        """One BGR ``uint8[h, w, 3]`` image → the network input ``float32[3, H, W]`` and its :class:`Letterbox`."""
        box = Letterbox.fit(image.shape[:2], self.input_size, self.letterbox)
        canvas = box.apply(image, self.input_size, self.pad_value)  # [H, W, 3]
        if self.bgr_to_rgb:
            canvas = canvas[:, :, ::-1]
        canvas = (canvas - self.mean) / self.std
        return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32), box

    def _run(self, inputs: list[np.ndarray]) -> list[list[np.ndarray]]:
        """Per image, the model's outputs without the batch dimension."""
        if self.fixed_batch is not None and self.fixed_batch != len(inputs):
            return [self._run([x])[0] for x in inputs]
        try:
            outputs = self.session.run(None, {self.input_name: np.stack(inputs)})
        except Exception as err:  # onnxruntime raises its own exception types, naming a node, not the file
            raise ValueError(
                f"{self.resolved.value}: onnxruntime could not run the model on input_size {list(self.input_size)} "
                f"({len(inputs)} image(s)): {type(err).__name__}: {err}"
            ) from err
        if self.num_classes <= 0:  # dynamic shapes: check the real ones once
            num_classes = self.decoder.check_outputs([o.shape for o in outputs], where=self.resolved.value)
            # the lookup first: a call in another thread that sees the count goes on to use the lookup
            self.lookup = self._build_lookup(num_classes)
            self.num_classes = num_classes
        return [[o[i] for o in outputs] for i in range(len(inputs))]

    def _postprocess(
        self, outputs: list[np.ndarray], box: Letterbox, image_size: tuple[int, int]
    ) -> Detections:
        boxes, scores, classes = self.decoder(outputs)  # [A, 4] input pixels, [A], [A]
        keep = scores > self.conf
        boxes = torch.from_numpy(np.ascontiguousarray(box.to_image(boxes[keep])))  # [K, 4] image pixels
        scores = torch.from_numpy(np.ascontiguousarray(scores[keep], dtype=np.float32)).clamp_(0.0, 1.0)
        classes = torch.from_numpy(np.ascontiguousarray(classes[keep]))
        # classes outside the label space go first: they take no place among the max_det boxes, and suppress
        # no box of a kept class under agnostic NMS
        labels, mapped = apply_label_lookup(self.lookup, classes)  # type: ignore[arg-type]
        boxes, scores, classes, labels = boxes[mapped], scores[mapped], classes[mapped], labels[mapped]
        # NMS before clipping to the image, as every family's own post-processing does: a box reaching past
        # the border overlaps its neighbours by its full extent (a decoder clips where its family does,
        # NanoDet to the network input)
        groups = torch.zeros_like(classes) if self.agnostic_nms else classes
        order = batched_nms(boxes, scores, groups, self.iou)[: self.max_det]  # by decreasing score
        boxes = clip_boxes_to_image(boxes, image_size)
        return Detections(boxes[order], scores[order], labels[order], image_size, self.name)

    def _predict(self, images: list[np.ndarray]) -> list[Detections]:
        prepared = [self.preprocess(image) for image in images]
        outputs = self._run([x for x, _ in prepared])
        return [
            self._postprocess(out, box, image.shape[:2])
            for out, (_, box), image in zip(outputs, prepared, images, strict=True)
        ]

    def __repr__(self) -> str:
        return (
            f"OnnxDetector(name={self.name!r}, weights={self.resolved.value!r}, "
            f"decoder={self.decoder.name!r}, input_size={self.input_size})"
        )
