"""The calibrated head: each model's scores calibrated (MoCaE curves), then a network head fused on them.

Dimension legend: K detections of one model on one image.

Members of different families score on different scales; a network head that reads their raw scores
spends its few hundred training images learning that scale. Here the scores are first mapped by the
models' calibration curves (:class:`~detens.heads.calibration.CalibrationHead`, score → expected IoU with
the object hit), and the network head (``deep``, ``selection``, ``superlearner``, or a bagged one) is fitted
on, and applied to, the calibrated detections:

    fused = head(match(calibrate(per_model)))

Both parts are fitted on the same training images (:func:`detens.heads.fit_head` with ``calibrate: true``).
The saved file holds both parts' configs and tensors (``calibration.<tensor>``, ``head.<tensor>``); nothing
is pickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from detens.detections import Detections
from detens.heads._io import HeadFileError, check_config_keys, read_head_for, write_head_file
from detens.heads._net import NetHead
from detens.heads._registry import HEADS
from detens.heads.bagged import BaggedHead
from detens.heads.calibration import CalibrationHead

__all__ = ["CalibratedHead", "CalibratedPredictions"]

_PARTS = ("calibration", "head")
_CONFIG_KEYS = ("calibration", "head_type", "head")


@HEADS.register("calibrated")
class CalibratedHead(nn.Module):
    """A calibration of the members' scores followed by a network head (see the module docstring).

    Args:
        calibration (CalibrationHead): the members' curves (its own fuser is not used).
        head (NetHead | BaggedHead): fitted on calibrated detections of the same models.
    """

    type_name = "calibrated"
    #: the label space the head was trained in, {category id: name} (set by fit_head, saved with the head);
    #: None when unknown.
    label_space: dict[int, str] | None = None

    def __init__(self, calibration: CalibrationHead, head: NetHead | BaggedHead) -> None:
        super().__init__()
        if not isinstance(calibration, CalibrationHead):
            raise TypeError(f"calibration must be a CalibrationHead, got {type(calibration).__name__}")
        if not isinstance(head, (NetHead, BaggedHead)):
            raise TypeError(f"head must be a network head (deep, selection, superlearner) or a bagged one, got "
                            f"{type(head).__name__}")
        if sorted(calibration.model_names) != sorted(head.model_names):
            raise ValueError(f"the calibration is for models {calibration.model_names}, the head for "
                             f"{head.model_names}")
        self.calibration = calibration
        self.head = head
        self.model_names = list(head.model_names)
        self.match_iou = head.match_iou

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def head_type(self) -> str:
        return self.head.type_name

    @property
    def wrapped_head(self) -> nn.Module:
        """The head that scores the calibrated clusters (see :func:`~detens.fusers.head_methods`)."""
        return self.head

    def extra_repr(self) -> str:
        return f"head_type={self.head_type!r}, models={self.model_names}"

    def fuse_detections(self, per_model: Sequence[Detections], iou_thr: float | None = None) -> Detections:
        """Calibrate each model's scores, match, and fuse with the head.

        Args:
            per_model (list[Detections]): one per model, named by ``source`` or in the head's model order.
            iou_thr (float | None): the matching IoU (None: the head's ``match_iou``).
        """
        from detens.fusers.theta import theta_fusion

        return theta_fusion(self.calibration.calibrate(per_model), head=self.head, iou_thr=iou_thr)

    def parts(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """``(config, tensors)`` as :meth:`save` writes them."""
        calibration_config, calibration_tensors = self.calibration.parts()
        head_config, head_tensors = self.head.parts()
        config = {"calibration": calibration_config, "head_type": self.head_type, "head": head_config}
        tensors = {f"calibration.{k}": v for k, v in calibration_tensors.items()}
        tensors.update({f"head.{k}": v for k, v in head_tensors.items()})
        return config, tensors

    def save(self, path: str | Path) -> None:
        """Write both parts as ``.json`` or ``.safetensors`` (by suffix), atomically; no pickle."""
        write_head_file(path, self.type_name, self.model_names, *self.parts(), self.label_space)

    @classmethod
    def load(cls, path: str | Path, model_names: Sequence[str] | None = None) -> CalibratedHead:
        """Load a head saved by :meth:`save` (on the CPU); ``model_names`` as for every head
        (:func:`detens.heads.load_head`)."""
        stored = read_head_for(path, cls.type_name, model_names)
        where = repr(str(path))
        config, tensors = stored.config, stored.tensors
        check_config_keys(config, _CONFIG_KEYS, where, cls.type_name)
        head_type = config["head_type"]
        head_cls = HEADS.get(head_type) if isinstance(head_type, str) and head_type in HEADS else None
        if head_cls is None or not issubclass(head_cls, (NetHead, BaggedHead)):
            raise HeadFileError(f"{where}: head_type must name a network head type or 'bagged', got {head_type!r}")
        for part in ("calibration", "head"):
            if not isinstance(config[part], dict):
                raise HeadFileError(f"{where}: {part} must be a config mapping, got {type(config[part]).__name__}")
        stray = sorted(n for n in tensors if not n.startswith(tuple(f"{p}." for p in _PARTS)))
        if stray:
            raise HeadFileError(f"{where}: tensors {stray[:5]} belong to neither the calibration nor the head")

        def part_tensors(part: str) -> dict[str, Tensor]:
            return {n[len(part) + 1 :]: t for n, t in tensors.items() if n.startswith(f"{part}.")}

        calibration = CalibrationHead.from_parts(
            stored.model_names, config["calibration"], part_tensors("calibration"), f"{where} calibration"
        )
        head = head_cls.from_parts(stored.model_names, config["head"], part_tensors("head"), f"{where} head")
        try:
            calibrated = cls(calibration, head)
        except (TypeError, ValueError) as err:
            raise HeadFileError(f"{where}: {err}") from err
        calibrated.label_space = stored.label_space
        return calibrated


class CalibratedPredictions:
    """Saved predictions seen through a calibration: :meth:`per_model` gives calibrated detections.

    Args:
        predictions (EnsemblePredictions): the models' saved predictions and the ground truth.
        calibration (CalibrationHead): curves for those models.
    """

    def __init__(self, predictions: Any, calibration: CalibrationHead) -> None:
        self.predictions = predictions
        self.calibration = calibration
        self.gt = predictions.gt
        self.model_names = list(predictions.model_names)

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def image_ids(self) -> list[int]:
        return self.predictions.image_ids

    def per_model(self, image_id: int) -> list[Detections]:
        return self.calibration.calibrate(self.predictions.per_model(image_id))
