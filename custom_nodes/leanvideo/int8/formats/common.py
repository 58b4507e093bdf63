"""Shared by the format readers: turn int8 weights + scales into the canonical in-memory layout.

Canonical layout (what the ComfyUI ops load): per quantized layer ``<layer>.weight`` int8 ``[out, in]``,
``<layer>.weight_scale`` float32 (``[]``, ``[out, 1]`` or ``[out, in / block]``) and
``<layer>.comfy_quant`` (uint8 JSON of :class:`~leanvideo.int8.spec.Int8WeightConfig`). Everything
else, auxiliary byte blobs such as a tokenizer's ``spiece_model`` included, passes through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from ..quantize import check_weight_shape
from ..spec import (
    CONFIG_SUFFIX,
    INPUT_SCALE_SUFFIX,
    SCALE_SUFFIX,
    WEIGHT_SUFFIX,
    Int8FormatError,
    Int8WeightConfig,
    is_allowed_uint8,
)
from ..writer import SAFETENSORS_DTYPES

DROPPED_SUFFIXES = (INPUT_SCALE_SUFFIX,)  # static activation scales: we quantize activations dynamically


def config_to_tensor(config: Int8WeightConfig) -> torch.Tensor:
    """ComfyUI's per-layer ``comfy_quant`` entry: the JSON as a uint8 tensor."""
    return torch.tensor(list(config.to_json().encode("utf-8")), dtype=torch.uint8)


def config_from_tensor(tensor: torch.Tensor, *, where: str) -> dict[str, Any]:
    if tensor.ndim != 1:
        raise Int8FormatError(f"{where}: comfy_quant has shape {list(tensor.shape)}; expected bytes of JSON")
    try:
        entry = json.loads(bytes(tensor.to(torch.uint8).tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Int8FormatError(f"{where}: comfy_quant is not JSON ({error})") from error
    if not isinstance(entry, dict):
        raise Int8FormatError(f"{where}: comfy_quant must be a JSON object, got {entry!r}")
    return entry


def infer_config(
    weight_shape: tuple[int, ...],
    scale_shape: tuple[int, ...],
    entry: Mapping[str, Any],
    *,
    where: str,
    hadamard: str = "regular",
) -> Int8WeightConfig:
    """The config a scale of ``scale_shape`` implies for a weight of ``weight_shape``.

    Granularity comes from the scale's shape (files label it inconsistently); rotation comes from
    the per-layer ``entry`` (``convrot``, ``convrot_groupsize``, and ``hadamard`` when a layer read
    from a format-v1 LeanVideo file is handed on), its matrix otherwise from ``hadamard`` (the file's).
    """
    if len(weight_shape) != 2:
        raise Int8FormatError(f"{where}: int8 weight has shape {list(weight_shape)}; expected [out, in]")
    out_features, in_features = weight_shape
    numel = 1
    for size in scale_shape:
        numel *= size
    rotation: dict[str, Any] = {"convrot": bool(entry.get("convrot", False))}
    if rotation["convrot"]:
        rotation["hadamard"] = str(entry.get("hadamard", hadamard))
    try:
        if "convrot_groupsize" in entry:
            rotation["convrot_group"] = int(entry["convrot_groupsize"])
        if numel == 1:
            config = Int8WeightConfig(granularity="tensor", **rotation)
        elif tuple(scale_shape) in ((out_features,), (out_features, 1)):
            config = Int8WeightConfig(granularity="row", **rotation)
        elif (
            len(scale_shape) == 2
            and scale_shape[0] == out_features
            and scale_shape[1] > 0  # a block count of 0 divides nothing
            and in_features % scale_shape[1] == 0
        ):
            block = in_features // scale_shape[1]
            config = Int8WeightConfig(granularity="block", block_size=block, **rotation)
        else:
            raise Int8FormatError(
                f"{where}: weight_scale has shape {list(scale_shape)}; for weight shape {list(weight_shape)} "
                f"expected [], [1], [{out_features}, 1] or [{out_features}, {in_features} / block_size]"
            )
    except (ValueError, TypeError) as error:  # an entry's value of the wrong kind (a null group size)
        if isinstance(error, Int8FormatError):
            raise
        raise Int8FormatError(f"{where}: {error}") from error
    check_weight_shape(weight_shape, config, where=where)
    return config


# What a supported format stores, by safetensors name: float weights, int8 layers with uint8 configs and
# blobs, and fp8 weights (quantized on load)
READ_DTYPES = ("F32", "F16", "BF16", "I8", "U8", "F8_E4M3", "F8_E5M2")


def check_layout(
    dtypes: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    entries: Mapping[str, Mapping[str, Any]],
    *,
    source: str,
    hadamard: str = "regular",
) -> dict[str, Int8WeightConfig]:
    """Check a file's layout from each tensor's dtype (a safetensors name: ``I8``, ``BF16``, …) and
    shape alone, as its header gives them, and return each int8 layer's config.

    Refused, naming ``source`` and the tensor: an int8 tensor that is not a layer weight, an int8
    weight without its scale or with one of a shape its config does not give, a scale whose weight is
    missing or not int8, a uint8 tensor named like a layer tensor, a dtype no format uses. ``entries``
    maps a layer to its config entry (a layer whose entry is not known is checked as unrotated: a
    rotation only adds conditions).
    """
    configs: dict[str, Int8WeightConfig] = {}
    for key, dtype in dtypes.items():
        if dtype != "I8" or key.endswith((SCALE_SUFFIX, CONFIG_SUFFIX, *DROPPED_SUFFIXES)):
            continue
        if not key.endswith(WEIGHT_SUFFIX):
            raise Int8FormatError(f"{source}: int8 tensor {key!r} is not a layer weight")
        layer = key[: -len(WEIGHT_SUFFIX)]
        scale = shapes.get(layer + SCALE_SUFFIX)
        if scale is None:
            raise Int8FormatError(f"{source}: int8 weight {key!r} has no scale {layer + SCALE_SUFFIX!r}")
        configs[layer] = infer_config(
            shapes[key], scale, entries.get(layer, {}), where=f"{source}: {key!r}", hadamard=hadamard
        )
    for key, dtype in dtypes.items():
        if key.endswith(SCALE_SUFFIX):
            weight = dtypes.get(key[: -len(SCALE_SUFFIX)] + WEIGHT_SUFFIX)
            if weight != "I8":
                kind = "no weight" if weight is None else f"a {weight} weight"
                raise Int8FormatError(
                    f"{source}: scale {key!r} belongs to {kind}; only int8 weights are read"
                )
        elif key.endswith(DROPPED_SUFFIXES):
            continue
        elif dtype == "U8" and not is_allowed_uint8(key):
            raise Int8FormatError(
                f"{source}: uint8 tensor {key!r} is named like a layer tensor; INT8 formats store only "
                "comfy_quant configs and auxiliary byte blobs (e.g. spiece_model) as uint8"
            )
        elif dtype not in READ_DTYPES:
            raise Int8FormatError(
                f"{source}: tensor {key!r} has dtype {dtype}, which no supported format uses"
            )
    return configs


def canonicalize(
    tensors: dict[str, torch.Tensor],
    entries: Mapping[str, Mapping[str, Any]],
    *,
    source: str,
    hadamard: str = "regular",
) -> dict[str, torch.Tensor]:
    """Validate int8 layers of ``tensors`` and return them in the canonical layout.

    ``entries`` maps a layer name to its per-layer config entry (from a header); a ``comfy_quant``
    tensor in ``tensors`` overrides it. ``source`` (the file) prefixes every error message. The layout
    is checked by :func:`check_layout`, the scales' values here.
    """
    dtypes = {key: SAFETENSORS_DTYPES.get(tensor.dtype, str(tensor.dtype)) for key, tensor in tensors.items()}
    entries = dict(entries)
    for key, tensor in tensors.items():
        layer = key.removesuffix(CONFIG_SUFFIX)
        if layer != key and dtypes.get(layer + WEIGHT_SUFFIX) == "I8":
            entries[layer] = config_from_tensor(tensor, where=f"{source}: {layer}")
    shapes = {key: tuple(tensor.shape) for key, tensor in tensors.items()}
    configs = check_layout(dtypes, shapes, entries, source=source, hadamard=hadamard)
    result: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if key.endswith(SCALE_SUFFIX) or key.endswith(CONFIG_SUFFIX) or key.endswith(DROPPED_SUFFIXES):
            continue
        config = configs.get(key.removesuffix(WEIGHT_SUFFIX)) if dtypes[key] == "I8" else None
        if config is None:
            result[key] = tensor
            continue
        layer = key[: -len(WEIGHT_SUFFIX)]
        scale = tensors[layer + SCALE_SUFFIX]
        if not torch.isfinite(scale).all() or bool((scale <= 0).any()):
            raise Int8FormatError(
                f"{source}: scale {layer + SCALE_SUFFIX!r} has non-positive or non-finite values"
            )
        shape = {"tensor": (), "row": (tensor.shape[0], 1)}.get(config.granularity, tuple(scale.shape))
        result[key] = tensor
        result[layer + SCALE_SUFFIX] = scale.to(torch.float32).reshape(shape)
        result[layer + CONFIG_SUFFIX] = config_to_tensor(config)
    return result
