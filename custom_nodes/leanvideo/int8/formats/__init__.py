"""INT8 file formats, detected automatically: a registry mapping format name → reader module.

Each reader module has ``NAME``, ``detect(header) -> bool`` and ``layer_entries(header)`` (per-layer
config entries its header carries). Detection tries them in :data:`FORMATS` order; the first match
wins. :func:`read_int8_file` returns the tensors in the canonical layout of :mod:`.common`.

Example::

    loaded = read_int8_file(Path("wan-int8.safetensors"))
    loaded.format  # 'lightx2v'
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from ..files import FileHeader, read_header, read_tensors, restrict_header
from ..spec import (
    COMFY_METADATA_KEY,
    CONFIG_SUFFIX,
    SCALE_SUFFIX,
    WEIGHT_SUFFIX,
    Int8FormatError,
    is_allowed_uint8,
)
from . import comfy_native, float, fp8, int8_fast, leanvideo, lightx2v
from .common import DROPPED_SUFFIXES, canonicalize, infer_config

FORMATS: dict[str, ModuleType] = {
    module.NAME: module for module in (leanvideo, comfy_native, lightx2v, int8_fast, fp8, float)
}


# the safetensors dtypes some supported format stores (common.READ_DTYPES, as the header names them)
HEADER_DTYPES = ("I8", "U8", "F8_E4M3", "F8_E5M2", "BF16", "F16", "F32")


@dataclass(frozen=True)
class LoadedFile:
    """A file read into the canonical layout; ``metadata`` is its header minus quantization entries."""

    path: Path
    format: str
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]


def detect_format(header: FileHeader) -> str:
    """The name of the first format in :data:`FORMATS` that recognises ``header``."""
    for name, module in FORMATS.items():
        if module.detect(header):
            return name
    raise Int8FormatError(f"{header.path}: {_describe_unknown(header)}")


def _describe_unknown(header: FileHeader) -> str:
    if not header.dtypes:
        return "the file holds no tensors"
    for key, dtype in header.dtypes.items():
        if dtype == "I8" and not key.endswith(".weight"):
            return f"int8 tensor {key!r} is not a layer weight"
        if dtype == "I8":
            layer = key.removesuffix(".weight")
            if f"{layer}.weight_scale" not in header.dtypes:
                return f"int8 weight {key!r} has no scale {layer + '.weight_scale'!r}"
        if dtype == "U8" and not is_allowed_uint8(key):
            return f"uint8 tensor {key!r} is named like a layer tensor; no supported INT8 format stores one"
        if dtype not in HEADER_DTYPES:
            return f"tensor {key!r} has dtype {dtype}, which no supported INT8 format uses"
    return (
        "the tensors match no supported format (LeanVideo, ComfyUI-native, LightX2V, INT8-Fast, fp8, float)"
    )


def check_int8_header(path: Path, keys: Collection[str] | None = None) -> str:
    """The format of ``path``, its layout checked from the header alone, no tensor read: what the loader
    would refuse before reading the weights (no format it knows, a newer format version, a dtype no
    format uses, an int8 weight without its scale or with a scale of the wrong shape) raises
    :class:`Int8FormatError` naming the file and tensor. The scales' values and ``comfy_quant`` tensors
    are checked when the file is read (:func:`read_int8_file`). ``keys`` as there.
    """
    header = read_header(path)
    if keys is not None:
        header = restrict_header(header, keys)
    name = detect_format(header)
    entries = FORMATS[name].layer_entries(header)
    hadamard = leanvideo.hadamard_of(header) if name == leanvideo.NAME else "regular"
    for key, dtype in header.dtypes.items():
        if key.endswith((SCALE_SUFFIX, *DROPPED_SUFFIXES)):
            continue  # read as float32 (a scale) or not at all, whatever their dtype
        if dtype not in HEADER_DTYPES or (dtype == "U8" and not is_allowed_uint8(key)):
            raise Int8FormatError(f"{path}: {_describe_unknown(restrict_header(header, [key]))}")
        layer = key.removesuffix(WEIGHT_SUFFIX)
        if dtype != "I8" or layer == key or layer + CONFIG_SUFFIX in header.dtypes:
            continue  # detect_format said any other int8 tensor; a config tensor is read on load
        scale = header.shapes.get(layer + SCALE_SUFFIX)
        if scale is None:
            raise Int8FormatError(f"{path}: int8 weight {key!r} has no scale {layer + SCALE_SUFFIX!r}")
        infer_config(
            header.shapes[key], scale, entries.get(layer, {}), where=f"{path}: {key!r}", hadamard=hadamard
        )
    return name


def read_int8_file(path: Path, keys: Collection[str] | None = None) -> LoadedFile:
    """Detect the format of ``path``, read it and return it canonicalized (validated).

    With ``keys`` only those tensors are detected, read and checked, the rest of the file is ignored:
    how one part of a full checkpoint (the diffusion model next to a VAE) is read.
    """
    header = read_header(path)
    if keys is not None:
        header = restrict_header(header, keys)
    name = detect_format(header)
    entries = FORMATS[name].layer_entries(header)
    hadamard = leanvideo.hadamard_of(header) if name == leanvideo.NAME else "regular"
    tensors = canonicalize(read_tensors(path, header.dtypes), entries, source=str(path), hadamard=hadamard)
    metadata = {k: v for k, v in header.metadata.items() if k != COMFY_METADATA_KEY}
    return LoadedFile(path=path, format=name, tensors=tensors, metadata=metadata)
