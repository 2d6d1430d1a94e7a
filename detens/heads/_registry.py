"""The registry of fusion-head types, keyed by the ``type`` written into every saved head file."""

from __future__ import annotations

from detens.registry import Registry

__all__ = ["HEADS"]

HEADS: Registry = Registry("fusion head type")
