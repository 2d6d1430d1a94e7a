"""Conversions between :class:`~detens.detections.Detections` and other libraries' detection objects that
are optional dependencies of detens, one module per library (imported only when used):

- :mod:`detens.interop.supervision` — ``supervision.Detections`` (``pip install 'detens[supervision]'``).

The conversions for Ultralytics ``Results`` and torchvision output dicts are in :mod:`detens.convert`.
"""
