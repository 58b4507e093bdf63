"""Plain bf16/fp16/fp32 files: no int8 tensor at all; quantized on load by the caller's policy."""

from __future__ import annotations

from typing import Any

from ..files import FileHeader

NAME = "float"
FLOAT_DTYPES = ("BF16", "F16", "F32")


def detect(header: FileHeader) -> bool:
    return bool(header.dtypes) and all(dtype in FLOAT_DTYPES for dtype in header.dtypes.values())


def layer_entries(header: FileHeader) -> dict[str, dict[str, Any]]:
    return {}
