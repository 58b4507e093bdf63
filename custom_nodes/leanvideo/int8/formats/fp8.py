"""fp8 files (float8_e4m3fn, float8_e5m2, ComfyUI's scaled fp8): no int8 tensor; the loaders dequantize
each fp8 weight exactly (:func:`~leanvideo.int8.fp8.dequantize_fp8`) and quantize it to INT8 on load.

Detected when the file holds fp8 tensors and otherwise only floats, scaled-fp8 scales and marker, and
auxiliary byte blobs.
"""

from __future__ import annotations

from typing import Any

from ..files import FileHeader
from ..fp8 import FP8_DTYPES, is_fp8_companion
from ..spec import is_auxiliary
from .float import FLOAT_DTYPES

NAME = "fp8"


def detect(header: FileHeader) -> bool:
    dtypes = header.dtypes
    return any(dtype in FP8_DTYPES for dtype in dtypes.values()) and all(
        dtype in FLOAT_DTYPES or dtype in FP8_DTYPES or is_fp8_companion(key) or is_auxiliary(key, dtype)
        for key, dtype in dtypes.items()
    )


def layer_entries(header: FileHeader) -> dict[str, dict[str, Any]]:
    return {}
