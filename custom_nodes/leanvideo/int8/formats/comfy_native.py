"""ComfyUI-native int8: ``weight_scale`` plus a per-layer ``comfy_quant`` tensor or the header
entry ``_quantization_metadata = {"format_version": "1.0", "layers": {layer: {"format": …}}}``."""

from __future__ import annotations

import json
from typing import Any

from ..files import FileHeader
from ..spec import COMFY_METADATA_KEY, CONFIG_SUFFIX, Int8FormatError

NAME = "comfy_native"


def detect(header: FileHeader) -> bool:
    return COMFY_METADATA_KEY in header.metadata or any(key.endswith(CONFIG_SUFFIX) for key in header.dtypes)


def layer_entries(header: FileHeader) -> dict[str, dict[str, Any]]:
    raw = header.metadata.get(COMFY_METADATA_KEY)
    if raw is None:
        return {}
    try:
        layers = json.loads(raw)["layers"]
    except (ValueError, KeyError, TypeError) as error:
        raise Int8FormatError(
            f"{header.path}: unreadable {COMFY_METADATA_KEY} header entry ({error})"
        ) from error
    if not isinstance(layers, dict):
        raise Int8FormatError(f"{header.path}: {COMFY_METADATA_KEY} 'layers' must be an object")
    for layer, entry in layers.items():
        name = entry.get("format", "") if isinstance(entry, dict) else ""
        if not str(name).startswith("int8"):
            raise Int8FormatError(
                f"{header.path}: layer {layer!r} uses quantization format {name!r};"
                " only int8 formats are read"
            )
    return layers
