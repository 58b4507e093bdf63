"""The INT8 weight format: versioned constants and the per-layer quantization config.

A quantized linear layer ``<layer>`` is stored as three tensors (see ``docs/int8-format.md``):

- ``<layer>.weight``: int8 ``[out, in]``, symmetric, values in ``[-127, 127]``;
- ``<layer>.weight_scale``: float32, ``[]`` (per tensor), ``[out, 1]`` (per row) or
  ``[out, in / block_size]`` (per block of ``block_size`` input columns);
- ``<layer>.comfy_quant``: uint8 bytes of a JSON :class:`Int8WeightConfig` (ComfyUI's per-layer entry).

Auxiliary byte blobs that belong to no layer (a text encoder's tokenizer, e.g. ``spiece_model``; see
:func:`is_auxiliary`) pass through reading, quantizing and loading unchanged.

Example::

    config = Int8WeightConfig(granularity="row", convrot=True)
    config.to_json()  # '{"format": "int8_rowwise", "convrot": true, "convrot_groupsize": 256}'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

FORMAT_VERSION = 2  # bump on any change to what is written to disk (2: convrot is ConvRot's regular Hadamard)
SYLVESTER_UNTIL_VERSION = 1  # LeanVideo files up to this version rotated with the Sylvester matrix
METADATA_KEY = "leanvideo_int8"  # safetensors header entry: {"format_version": 1, ...}
COMFY_METADATA_KEY = "_quantization_metadata"  # ComfyUI-native header entry
COMFY_METADATA_VERSION = "1.0"
SCALE_SUFFIX = ".weight_scale"
WEIGHT_SUFFIX = ".weight"
CONFIG_SUFFIX = ".comfy_quant"
INPUT_SCALE_SUFFIX = ".input_scale"
# Names of a layer's tensors in any format we read; a uint8 tensor named so is never auxiliary.
LAYER_SUFFIXES = (WEIGHT_SUFFIX, ".bias", SCALE_SUFFIX, CONFIG_SUFFIX, INPUT_SCALE_SUFFIX)
QMAX = 127
DEFAULT_CONVROT_GROUP = 256

Granularity = Literal["tensor", "row", "block"]
_FORMAT_OF: dict[str, str] = {"tensor": "int8_tensorwise", "row": "int8_rowwise", "block": "int8_blockwise"}
_GRANULARITY_OF: dict[str, Granularity] = {
    "int8_tensorwise": "tensor",
    "int8_rowwise": "row",
    "int8_blockwise": "block",
}


class Int8FormatError(ValueError):
    """A file or tensor does not follow an INT8 layout we can read; the message names it."""

    # ComfyUI imports the pack under its folder's path as the module name and shows errors as
    # ``module.Class`` (the editor's error dialog, /history's exception_type): the package's own name,
    # not "/home/me/ComfyUI/custom_nodes/leanvideo.int8.spec".
    __module__ = "leanvideo.int8.spec"


def is_auxiliary(key: str, dtype: str) -> bool:
    """Whether tensor ``key`` of safetensors dtype ``dtype`` (``'U8'``, ``'BF16'``, …) is an auxiliary
    byte blob: uint8 and not named like a layer tensor. Text encoder files carry their tokenizer so
    (``spiece_model`` in UMT5/T5/Gemma files, ``tekken_model`` in Mistral ones); ComfyUI reads it from
    the state dict, so it is kept byte for byte.

    Example::

        is_auxiliary("spiece_model", "U8")  # True
        is_auxiliary("blocks.0.q.weight", "U8")  # False: a layer tensor
    """
    return dtype == "U8" and not key.endswith(LAYER_SUFFIXES)


def is_allowed_uint8(key: str) -> bool:
    """Whether a uint8 tensor named ``key`` is one INT8 formats store: a layer's ``comfy_quant`` config
    or an auxiliary byte blob (:func:`is_auxiliary`); any other uint8 layer tensor is refused."""
    return key.endswith(CONFIG_SUFFIX) or is_auxiliary(key, "U8")


HADAMARD_KINDS = ("regular", "sylvester")  # regular: ConvRot's (comfy-kitchen); sylvester: format v1


def is_power_of_4(size: int) -> bool:
    """Whether ``size`` is 4, 16, 64, 256, … (the sizes of ConvRot's regular Hadamard matrices)."""
    return size >= 4 and size & (size - 1) == 0 and (size.bit_length() - 1) % 2 == 0


@dataclass(frozen=True)
class Int8WeightConfig:
    """How one weight is quantized: scale granularity, optional blocks and Hadamard rotation.

    ``block_size`` (input columns per scale) is required for ``granularity="block"`` and forbidden
    otherwise; ``convrot`` rotates groups of ``convrot_group`` input columns with a normalised
    Hadamard matrix before quantizing (outlier-heavy layers).
    """

    granularity: Granularity = "row"
    block_size: int | None = None
    convrot: bool = False
    convrot_group: int = DEFAULT_CONVROT_GROUP
    hadamard: str = "regular"  # ConvRot's matrix; "sylvester" only in LeanVideo files of format version 1

    def __post_init__(self) -> None:
        if self.granularity not in _FORMAT_OF:
            raise ValueError(f"granularity must be one of {sorted(_FORMAT_OF)}, not {self.granularity!r}")
        if self.granularity == "block":
            if self.block_size is None or self.block_size < 1:
                raise ValueError(f"granularity 'block' needs a positive block_size, not {self.block_size!r}")
        elif self.block_size is not None:
            raise ValueError(f"block_size={self.block_size} only applies to granularity 'block'")
        group = self.convrot_group
        if self.hadamard not in HADAMARD_KINDS:
            raise ValueError(f"hadamard must be one of {HADAMARD_KINDS}, not {self.hadamard!r}")
        if self.convrot and self.hadamard == "regular" and not is_power_of_4(group):
            raise ValueError(f"convrot_group must be a power of 4 (ConvRot's regular Hadamard), not {group}")
        if self.convrot and (group < 1 or group & (group - 1)):
            raise ValueError(f"convrot_group must be a power of two, not {group}")

    @property
    def format_name(self) -> str:
        """ComfyUI's per-layer ``format`` string for this config."""
        return _FORMAT_OF[self.granularity]

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"format": self.format_name}
        if self.block_size is not None:
            entry["block_size"] = self.block_size
        if self.convrot:
            entry["convrot"] = True
            entry["convrot_groupsize"] = self.convrot_group
            if self.hadamard != "regular":  # a format-v1 layer carried in memory, never written so
                entry["hadamard"] = self.hadamard
        return entry

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, entry: dict[str, Any], *, where: str) -> Int8WeightConfig:
        """Parse a ComfyUI-style per-layer entry; ``where`` names the layer for errors."""
        name = entry.get("format")
        if name not in _GRANULARITY_OF:
            raise Int8FormatError(f"{where}: unsupported quantization format {name!r}")
        try:
            return cls(
                granularity=_GRANULARITY_OF[name],
                block_size=entry.get("block_size"),
                convrot=bool(entry.get("convrot", False)),
                convrot_group=int(entry.get("convrot_groupsize", DEFAULT_CONVROT_GROUP)),
                hadamard=str(entry.get("hadamard", "regular")),
            )
        except ValueError as error:
            raise Int8FormatError(f"{where}: {error}") from error
