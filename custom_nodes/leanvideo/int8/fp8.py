"""fp8 files as users have them, read exactly: float8_e4m3fn / float8_e5m2 weights, and ComfyUI's
"scaled fp8" layout.

A scaled fp8 file stores a linear layer's weight in fp8 with a float32 ``<layer>.scale_weight`` (one
value for the tensor, or one per output channel): the true weight is ``fp8 value × scale_weight``. It
may carry ``<layer>.scale_input`` (for fp8 activations, meaningless once the weight is INT8) and a
``scaled_fp8`` marker tensor at the model's key prefix. :func:`dequantize_fp8` gives the float32 weight
(exact: every fp8 value and scale is representable in float32, and one product rounds once);
:func:`is_fp8_companion` names the keys that describe fp8 weights and are dropped with them.

:func:`quantize_fp8_weight` is how an fp8 weight becomes INT8 (on load and in ``leanvideo quantize``):
INT8 adds its rounding to fp8's, so it keeps that addition as small as it can. Row and block scales
follow the fp8 grid (:func:`~leanvideo.int8.quantize.quantize_weight`'s ``fp8_grid``: values of the
top 4 binades of a row stay exact); a layer is Hadamard-rotated, unless asked already, when that cuts
its INT8 error by :data:`ROTATION_MIN_GAIN_DB` or more: fp8 keeps relative precision for small values
next to large ones, one int8 scale per row does not, and rotation spreads outliers before the rows
are scaled.

Example::

    weight = dequantize_fp8(fp8_weight, scale_weight, where="blocks.0.attn.q.weight")
    packed = quantize_fp8_weight(weight, fp8_grid(scale_weight), Int8WeightConfig(), name="blocks.0.attn.q")
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .quantize import Int8Weight, quantize_weight, weight_sqnr_db
from .spec import Int8FormatError, Int8WeightConfig

FP8_DTYPES = ("F8_E4M3", "F8_E5M2")  # as safetensors names them
FP8_TORCH_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
E4M3_MAX = 448.0
# Rotation costs time at every step (the weight or the activations are rotated), so it has to buy
# this much SQNR against the fp8 weights.
ROTATION_MIN_GAIN_DB = 1.0
DECISION_ROWS = 512
SCALE_WEIGHT_SUFFIX = ".scale_weight"
SCALE_INPUT_SUFFIX = ".scale_input"
MARKER = "scaled_fp8"


def is_fp8_companion(key: str) -> bool:
    """Whether ``key`` is a scaled-fp8 scale or the ``scaled_fp8`` marker (not a model tensor)."""
    return key.endswith((SCALE_WEIGHT_SUFFIX, SCALE_INPUT_SUFFIX)) or key.rsplit(".", 1)[-1] == MARKER


def scale_weight_key(key: str) -> str | None:
    """The ``scale_weight`` key that goes with the weight ``key`` (None: ``key`` is no layer weight)."""
    return key.removesuffix(".weight") + SCALE_WEIGHT_SUFFIX if key.endswith(".weight") else None


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor | None, *, where: str) -> torch.Tensor:
    """The float32 values of the fp8 ``weight``, times its ``scale_weight`` when it has one.

    Raises:
        Int8FormatError: a scale that is neither one value nor one per output channel, or that is
            negative, or zero over values that are not (a damaged file: the layer would be all zeros);
            names ``where``.
    """
    values = weight.to(torch.float32)
    if scale is None:
        return values
    scale = scale.to(torch.float32)
    if scale.numel() == 1:
        scale = scale.reshape(())
    elif scale.numel() == weight.shape[0]:
        scale = scale.reshape(-1, *([1] * (weight.ndim - 1)))
    else:
        raise Int8FormatError(
            f"{where}: scale_weight has shape {tuple(scale.shape)}; expected one value or one per output "
            f"channel ({weight.shape[0]})"
        )
    # a zero scale over zero values (an all-zero row) is consistent; NaN is said as damage where checked
    if bool(((scale < 0) | ((scale == 0) & (values != 0))).any()):
        raise Int8FormatError(
            f"{where}: scale_weight has {int((scale <= 0).sum())} value(s) that are negative or zero (the "
            f"smallest is {scale.min().item():g}) over fp8 values that are not; a scaled fp8 file's scales "
            "are positive: the file is damaged, download it again"
        )
    return values * scale


def kept_dtype(scaled: bool) -> torch.dtype:
    """The dtype an fp8 tensor outside the quantization plan is kept in: bfloat16 when it has no
    ``scale_weight`` (every float8_e4m3fn and float8_e5m2 value is a bfloat16 value: exact at half
    float32's bytes; a UMT5-XXL embedding is 2.1 GB instead of 4.2), float32 when scaled (fp8 × scale
    rounds once in float32 and not exactly in bfloat16)."""
    return torch.float32 if scaled else torch.bfloat16


def fp8_grid(scale: torch.Tensor | None) -> torch.Tensor:
    """The value of one fp8 unit of a weight: its ``scale_weight`` (one or one per row), else 1."""
    return torch.ones((), dtype=torch.float32) if scale is None else scale.to(torch.float32)


def choose_fp8_config(
    weight: torch.Tensor, grid: torch.Tensor, config: Int8WeightConfig, *, name: str
) -> Int8WeightConfig:
    """``config``, rotated when that cuts the INT8 error of ``weight`` (the exact float32 of an fp8
    weight whose fp8 unit is ``grid``) by :data:`ROTATION_MIN_GAIN_DB` or more. Measured on up to
    :data:`DECISION_ROWS` evenly spaced rows: the choice needs an estimate, not every row."""
    if config.convrot or weight.shape[1] % config.convrot_group:
        return config
    step = max(1, weight.shape[0] // DECISION_ROWS)
    rows = weight[::step]
    rows_grid = grid if grid.numel() == 1 else grid.reshape(-1)[::step]
    on_grid = quantize_weight(rows, config, name=name, fp8_grid=rows_grid)
    rotated = replace(config, convrot=True)
    gain = weight_sqnr_db(rows, quantize_weight(rows, rotated, name=name)) - weight_sqnr_db(rows, on_grid)
    return rotated if gain >= ROTATION_MIN_GAIN_DB else config


def quantize_fp8_weight(
    weight: torch.Tensor, grid: torch.Tensor, config: Int8WeightConfig, *, name: str
) -> Int8Weight:
    """INT8 for ``weight``, the exact float32 of an fp8 weight (:func:`dequantize_fp8`) whose fp8
    unit is ``grid`` (:func:`fp8_grid`): scales on the fp8 grid, and a rotation where it pays
    (:func:`choose_fp8_config`). ``name`` appears in error messages."""
    chosen = choose_fp8_config(weight, grid, config, name=name)
    return quantize_weight(weight, chosen, name=name, fp8_grid=grid)


def to_fp8(
    tensors: dict[str, torch.Tensor], kind: str, prefix: str = ""
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``tensors`` as users download them in fp8, for tests and benchmarks: 2-D weights in fp8
    (``e4m3``, ``e5m2``; ``scaled``: e4m3 with an absmax ``scale_weight`` per tensor, a ``scale_input``
    and the marker, as ComfyUI v0.3.75 runs them; ``scaled_channel``: the same with one scale per output
    channel on every other weight, which v0.3.75 cannot load), the rest as they are. Returns the file's
    tensors (keys under ``prefix``) and the exact float32 weights they stand for (keys without it).
    """
    if kind not in ("e4m3", "e5m2", "scaled", "scaled_channel"):
        raise ValueError(f"fp8 kind must be e4m3, e5m2, scaled or scaled_channel, got {kind!r}")
    stored: dict[str, torch.Tensor] = {}
    exact: dict[str, torch.Tensor] = {}
    for index, (key, value) in enumerate(sorted(tensors.items())):
        if value.ndim != 2 or not key.endswith(".weight"):
            stored[prefix + key] = value
            continue
        scale: torch.Tensor | None = None
        if kind == "e5m2":
            stored[prefix + key] = value.to(torch.float8_e5m2)
        elif kind == "e4m3":
            stored[prefix + key] = value.to(torch.float8_e4m3fn)
        else:
            weight = value.to(torch.float32)
            per_channel = kind == "scaled_channel" and index % 2 == 0
            absmax = weight.abs().amax(dim=1, keepdim=True) if per_channel else weight.abs().amax()
            divisor = absmax.clamp(min=1e-12) / E4M3_MAX
            stored[prefix + key] = (weight / divisor).to(torch.float8_e4m3fn)
            scale = divisor.reshape(-1) if divisor.ndim else divisor  # per channel: [out], as ComfyUI
            stored[prefix + str(scale_weight_key(key))] = scale
            stored[prefix + key.removesuffix(".weight") + SCALE_INPUT_SUFFIX] = torch.tensor(1.0)
        exact[key] = dequantize_fp8(stored[prefix + key], scale, where=key)
    if kind.startswith("scaled"):
        stored[prefix + MARKER] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return stored, exact
