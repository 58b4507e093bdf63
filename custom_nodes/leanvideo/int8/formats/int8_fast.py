"""INT8-Fast / Flux2-INT8 style: int8 ``weight`` + ``weight_scale``, a scalar or ``[out, 1]``."""

from __future__ import annotations

from typing import Any

from ..files import FileHeader
from ..spec import SCALE_SUFFIX
from .lightx2v import int8_layers

NAME = "int8_fast"


def detect(header: FileHeader) -> bool:
    layers = int8_layers(header)
    return bool(layers) and all(layer + SCALE_SUFFIX in header.shapes for layer in layers)


def layer_entries(header: FileHeader) -> dict[str, dict[str, Any]]:
    return {}
