"""INT8 linear layers: W8A16 (dequantize, float matmul) and W8A8 (int8 × int8 → int32, rescale).

W8A8 quantizes each activation row (token) on the fly with its own absmax scale, multiplies with
``torch._int_mm`` on CUDA and rescales by ``activation_scale × weight_scale``. Wherever the kernel
does not fit (no CUDA, block-wise scales, fewer than 17 rows, dimensions not multiples of 8),
:func:`int8_linear` falls back to W8A16. Tests drive the same W8A8 code on the CPU by passing
:func:`reference_int_mm`.

Example::

    y = int8_linear(x, packed, bias, route="w8a16")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from .hadamard import rotate_groups
from .quantize import Int8Weight, dequantize
from .spec import QMAX

# How an INT8 linear multiplies: "w8a16" dequantizes the weight, "w8a8" uses int8 matmuls, "auto" picks.
MatmulRoute = Literal["auto", "w8a16", "w8a8"]
MATMUL_ROUTES: tuple[str, ...] = ("auto", "w8a16", "w8a8")
IntMatmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_INT_MM_MIN_ROWS = 17  # torch._int_mm needs more than 16 rows on CUDA
_INT_MM_MULTIPLE = 8


def reference_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int8 × int8 → int32 matmul on any device (slow; for tests and as the W8A8 oracle)."""
    return torch.matmul(a.to(torch.int32), b.to(torch.int32))


def w8a8_fits(x: torch.Tensor, packed: Int8Weight) -> bool:
    """Whether the CUDA ``_int_mm`` kernel handles this input and weight."""
    rows = x.numel() // x.shape[-1] if x.ndim else 0
    out_features, in_features = packed.qdata.shape
    return (
        x.is_cuda
        and packed.qdata.is_cuda
        and packed.config.granularity != "block"
        and rows >= _INT_MM_MIN_ROWS
        and in_features % _INT_MM_MULTIPLE == 0
        and out_features % _INT_MM_MULTIPLE == 0
    )


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 quantization of a 2-D tensor: ``(int8 rows, float32 [rows, 1] scales)``."""
    work = x.to(torch.float32)
    scale = work.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / QMAX
    return torch.round(work / scale).clamp_(-QMAX, QMAX).to(torch.int8), scale


def linear_w8a16(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize the weight to ``x.dtype`` and run a float linear; works on every device."""
    weight = dequantize(packed.qdata.to(x.device), packed.scale, packed.config, x.dtype)
    return torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.device, x.dtype))


def linear_w8a8(
    x: torch.Tensor,
    packed: Int8Weight,
    bias: torch.Tensor | None = None,
    *,
    int_mm: IntMatmul = torch._int_mm,
) -> torch.Tensor:
    """Dynamic per-token W8A8; ``int_mm`` is the int8 kernel (``torch._int_mm`` or the reference)."""
    if packed.config.granularity == "block":
        raise ValueError("W8A8 needs per-tensor or per-row weight scales, not block-wise ones")
    in_features = x.shape[-1]
    rows = x.reshape(-1, in_features)
    if packed.config.convrot:
        rows = rotate_groups(rows, packed.config.convrot_group)
    x_q, x_scale = quantize_activations(rows)
    accumulated = int_mm(x_q, packed.qdata.to(x.device).t())
    weight_scale = packed.scale.to(device=x.device, dtype=torch.float32).reshape(1, -1)
    out = accumulated.to(torch.float32) * x_scale * weight_scale
    if bias is not None:
        out = out + bias.to(device=x.device, dtype=torch.float32)
    return out.to(x.dtype).reshape(*x.shape[:-1], packed.qdata.shape[0])


def int8_linear(
    x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None = None, *, route: MatmulRoute = "auto"
) -> torch.Tensor:
    """``x @ W.T + bias`` for an INT8 weight; ``auto`` and ``w8a8`` use W8A8 only where it fits."""
    if route not in MATMUL_ROUTES:
        raise ValueError(f"route must be one of {MATMUL_ROUTES}, not {route!r}")
    if route != "w8a16" and w8a8_fits(x, packed):
        return linear_w8a8(x, packed, bias)
    return linear_w8a16(x, packed, bias)
