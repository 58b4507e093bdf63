"""Pure-torch INT8 weights: format spec, quantize/dequantize, Hadamard rotation, linear matmul routes and
file formats. Never imports ComfyUI, so the CLI and tests use it directly. The torch-based names are
imported on first use, so the torch-free modules (``spec``, ``header``) import without torch: the
runner, which never imports torch, reads and writes safetensors headers with :mod:`.header`.

Example::

    from leanvideo.int8 import Int8WeightConfig, quantize_weight, dequantize_weight, sqnr_db

    packed = quantize_weight(weight, Int8WeightConfig(granularity="row"))
    print(sqnr_db(weight, dequantize_weight(packed)))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .spec import FORMAT_VERSION, Int8FormatError, Int8WeightConfig

if TYPE_CHECKING:
    from .dispatch import KernelDispatcher
    from .hadamard import hadamard_matrix, rotate_groups
    from .linear import (
        KERNELS,
        MATMUL_ROUTES,
        int8_linear,
        linear_w8a8,
        linear_w8a16,
        reference_int_mm,
        w8a8_fits,
    )
    from .quantize import (
        Int8Weight,
        dequantize,
        dequantize_weight,
        expected_scale_shape,
        quantize_weight,
        sqnr_db,
        weight_sqnr_db,
    )

_TORCH_MODULES = ("dispatch", "hadamard", "linear", "quantize")  # where the other names of __all__ live

__all__ = [
    "FORMAT_VERSION",
    "KERNELS",
    "MATMUL_ROUTES",
    "Int8FormatError",
    "Int8Weight",
    "Int8WeightConfig",
    "KernelDispatcher",
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


def __getattr__(name: str) -> Any:
    """A torch-based public name, imported from its module on first use (PEP 562)."""
    if name in __all__:
        for module_name in _TORCH_MODULES:
            module = importlib.import_module(f"{__name__}.{module_name}")
            if name in vars(module):
                return vars(module)[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
