"""Fusion in the heads' own dtype, also inside a ``torch.autocast`` region."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def without_autocast(head: nn.Module, device: torch.device) -> Iterator[None]:
    """Autocast off on ``device`` and on the devices of ``head``'s parameters and buffers.

    A pipeline that runs its detectors under ``torch.autocast`` often post-processes in the same region;
    there a head's linear layers and products would run in float16 or bfloat16 and fuse other boxes and
    scores than the head gives (torchvision's ``nms`` likewise runs in float32 under autocast).
    """
    kinds = {device.type} | {t.device.type for t in itertools.chain(head.parameters(), head.buffers())}
    with contextlib.ExitStack() as stack:
        for kind in sorted(kinds):
            try:
                stack.enter_context(torch.autocast(kind, enabled=False))
            except RuntimeError:  # a device type torch has no autocast for: nothing to turn off there
                pass
        yield
