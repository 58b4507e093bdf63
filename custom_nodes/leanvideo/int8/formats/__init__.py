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
    Int8FormatError,
    is_allowed_uint8,
)
from . import comfy_native, float, fp8, int8_fast, leanvideo, lightx2v
from .common import READ_DTYPES, canonicalize, check_layout

FORMATS: dict[str, ModuleType] = {
    module.NAME: module for module in (leanvideo, comfy_native, lightx2v, int8_fast, fp8, float)
}


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
        if dtype not in READ_DTYPES:
            return f"tensor {key!r} has dtype {dtype}, which no supported INT8 format uses"
    return (
        "the tensors match no supported format (LeanVideo, ComfyUI-native, LightX2V, INT8-Fast, fp8, float)"
    )


def check_int8_header(path: Path, keys: Collection[str] | None = None) -> str:
    """The format of ``path``, its layout checked from the header alone, no tensor read
    (:func:`~.common.check_layout`): what :func:`read_int8_file` would refuse, short of the scales'
    values and the contents of ``comfy_quant`` tensors (a layer with one is checked as unrotated),
    raises :class:`Int8FormatError` alike. ``keys`` as there.
    """
    header = read_header(path)
    if keys is not None:
        header = restrict_header(header, keys)
    name = detect_format(header)
    entries = {
        layer: entry
        for layer, entry in FORMATS[name].layer_entries(header).items()
        if layer + CONFIG_SUFFIX not in header.dtypes  # the tensor's entry would win: not read here
    }
    hadamard = leanvideo.hadamard_of(header) if name == leanvideo.NAME else "regular"
    check_layout(header.dtypes, header.shapes, entries, source=str(path), hadamard=hadamard)
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
