"""Pure-torch INT8 weights: format spec, quantize/dequantize, Hadamard rotation, linear paths and
file formats. Never imports ComfyUI, so the CLI and tests use it directly.

Example::

    from leanvideo.int8 import Int8WeightConfig, quantize_weight, dequantize_weight, sqnr_db

    packed = quantize_weight(weight, Int8WeightConfig(granularity="row"))
    print(sqnr_db(weight, dequantize_weight(packed)))
"""

from __future__ import annotations

from .hadamard import hadamard_matrix, rotate_groups
from .linear import PATHS, int8_linear, linear_w8a8, linear_w8a16, reference_int_mm, w8a8_fits
from .quantize import (
    Int8Weight,
    dequantize,
    dequantize_weight,
    expected_scale_shape,
    quantize_weight,
    sqnr_db,
    weight_sqnr_db,
)
from .spec import FORMAT_VERSION, Int8FormatError, Int8WeightConfig

__all__ = [
    "FORMAT_VERSION",
    "PATHS",
    "Int8FormatError",
    "Int8Weight",
    "Int8WeightConfig",
    "dequantize",
    "dequantize_weight",
    "expected_scale_shape",
    "hadamard_matrix",
    "int8_linear",
    "linear_w8a8",
    "linear_w8a16",
    "quantize_weight",
    "reference_int_mm",
    "rotate_groups",
    "sqnr_db",
    "w8a8_fits",
    "weight_sqnr_db",
]
