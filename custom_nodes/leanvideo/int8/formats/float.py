"""Plain bf16/fp16/fp32 files: no int8 tensor at all; quantized on load by the caller's policy.

Auxiliary byte blobs (a text encoder's ``spiece_model`` tokenizer) may sit next to the float tensors.
"""

from __future__ import annotations

from typing import Any

from ..files import FileHeader
from ..spec import is_auxiliary

NAME = "float"
FLOAT_DTYPES = ("BF16", "F16", "F32")


def detect(header: FileHeader) -> bool:
    dtypes = header.dtypes
    return any(dtype in FLOAT_DTYPES for dtype in dtypes.values()) and all(
        dtype in FLOAT_DTYPES or is_auxiliary(key, dtype) for key, dtype in dtypes.items()
    )


def layer_entries(header: FileHeader) -> dict[str, dict[str, Any]]:
    return {}
