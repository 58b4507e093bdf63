"""Write canonical INT8 tensors in other projects' layouts (interop, and test inputs for the readers).

Example::

    tensors, metadata = to_layout(canonical, "lightx2v")
    safetensors.torch.save_file(tensors, "wan-int8.safetensors", metadata)
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch

from .formats.common import config_from_tensor
from .spec import COMFY_METADATA_KEY, COMFY_METADATA_VERSION, CONFIG_SUFFIX, SCALE_SUFFIX

LAYOUTS = ("comfy_native", "comfy_native_header", "lightx2v", "int8_fast")


def to_layout(
    canonical: Mapping[str, torch.Tensor], layout: str, metadata: Mapping[str, str] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``canonical`` (our in-memory layout) rewritten as ``layout``: tensors and header metadata.

    ``comfy_native`` keeps per-layer ``comfy_quant`` tensors; ``comfy_native_header`` moves them to
    ``_quantization_metadata``; ``lightx2v`` and ``int8_fast`` drop them (they cannot express rotation
    or blocks, so such layers are refused).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    tensors = dict(canonical)
    meta = {k: v for k, v in (metadata or {}).items() if k not in ("leanvideo_int8", COMFY_METADATA_KEY)}
    if layout == "comfy_native":
        return tensors, meta
    layers = {}
    for key in [k for k in tensors if k.endswith(CONFIG_SUFFIX)]:
        layer = key[: -len(CONFIG_SUFFIX)]
        layers[layer] = config_from_tensor(tensors.pop(key), where=layer)
        scale = tensors[layer + SCALE_SUFFIX]
        blocks = scale.ndim == 2 and scale.shape[1] > 1
        if layout != "comfy_native_header" and (layers[layer].get("convrot") or blocks):
            raise ValueError(
                f"Layer {layer!r} uses rotation or blocks, which the {layout} layout cannot express"
            )
    if layout == "comfy_native_header":
        meta[COMFY_METADATA_KEY] = json.dumps({"format_version": COMFY_METADATA_VERSION, "layers": layers})
    return tensors, meta
