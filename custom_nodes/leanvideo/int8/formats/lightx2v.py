"""LightX2V INT8 (Wan): ``<key>_scale`` of shape ``[out, 1]`` (absmax / 127) next to each int8
``<key>``; only attention and FFN weights are quantized, the rest stays bf16."""

from __future__ import annotations

from typing import Any

from ..files import FileHeader
from ..spec import SCALE_SUFFIX, WEIGHT_SUFFIX

NAME = "lightx2v"


def int8_layers(header: FileHeader) -> list[str]:
    return [
        key[: -len(WEIGHT_SUFFIX)]
        for key, dtype in header.dtypes.items()
        if dtype == "I8" and key.endswith(WEIGHT_SUFFIX)
    ]


def detect(header: FileHeader) -> bool:
    layers = int8_layers(header)
    return bool(layers) and all(
        header.shapes.get(layer + SCALE_SUFFIX) == (*header.shapes[layer + WEIGHT_SUFFIX][:1], 1)
        for layer in layers
    )


def layer_entries(header: FileHeader) -> dict[str, dict[str, Any]]:
    return {}
