"""Symmetric absmax INT8 quantization of weights: per tensor, per output row or per block.

Example::

    weight = torch.randn(64, 256) * 0.02
    packed = quantize_weight(weight, Int8WeightConfig(granularity="row"))
    restored = dequantize_weight(packed)
    sqnr_db(weight, restored)  # ≈ 43 dB on N(0, 0.02) weights; weight_sqnr_db(weight, packed) agrees

A weight made of fp8 values (``fp8_grid``: the value one fp8 unit stands for, ``1`` or the file's
``scale_weight``) gets, per row or block, the better of two scales: ``absmax / 127``, or the power of
two that lays the fp8 grid onto the int8 one. fp8 keeps 3 (e4m3) or 2 (e5m2) mantissa bits, so with
the step ``2^(e_max - 6)`` (``e_max``: the exponent of the largest fp8 value there) every value in the
top 4 (e4m3) or 5 (e5m2) binades is an exact integer, at most 120 (112), and only smaller values round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .hadamard import rotate_groups
from .spec import QMAX, Int8FormatError, Int8WeightConfig

_MIN_SCALE = 1e-12  # all-zero rows/blocks keep a finite scale
_CHUNK_ELEMENTS = 1 << 20  # values per float32 working chunk (4 MiB): temporaries stay small


@dataclass(frozen=True)
class Int8Weight:
    """An int8 weight ``[out, in]``, its float32 scale and the config that produced it."""

    qdata: torch.Tensor
    scale: torch.Tensor
    config: Int8WeightConfig

    def nbytes(self) -> int:
        return self.qdata.numel() * self.qdata.element_size() + self.scale.numel() * self.scale.element_size()

    def clone(self) -> Int8Weight:
        """A copy in new memory (timing that goes round several weights, as a model's layers do)."""
        return Int8Weight(qdata=self.qdata.clone(), scale=self.scale.clone(), config=self.config)


def expected_scale_shape(shape: tuple[int, ...], config: Int8WeightConfig) -> tuple[int, ...]:
    """The scale shape ``config`` gives a weight of ``shape`` (``[out, in]``)."""
    out_features, in_features = shape
    if config.granularity == "tensor":
        return ()
    if config.granularity == "row":
        return (out_features, 1)
    assert config.block_size is not None  # guaranteed by Int8WeightConfig
    return (out_features, in_features // config.block_size)


def check_weight_shape(shape: tuple[int, ...], config: Int8WeightConfig, *, where: str) -> None:
    """Raise :class:`Int8FormatError` (naming ``where``) when ``config`` cannot apply to ``shape``."""
    if len(shape) != 2:
        raise Int8FormatError(f"{where}: INT8 weights must be 2-D [out, in], got shape {list(shape)}")
    in_features = shape[1]
    if config.block_size is not None and in_features % config.block_size:
        raise Int8FormatError(
            f"{where}: {in_features} input columns do not split into blocks of {config.block_size}"
        )
    if config.convrot and in_features % config.convrot_group:
        raise Int8FormatError(
            f"{where}: {in_features} input columns do not split into Hadamard groups"
            f" of {config.convrot_group}"
        )


def _row_chunks(rows: int, columns: int) -> list[tuple[int, int]]:
    """Row ranges of about :data:`_CHUNK_ELEMENTS` values: float32 temporaries stay small."""
    step = max(1, _CHUNK_ELEMENTS // max(columns, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _float_rows(weight: torch.Tensor, config: Int8WeightConfig) -> torch.Tensor:
    return (
        rotate_groups(weight, config.convrot_group, config.hadamard)
        if config.convrot
        else weight.to(torch.float32)
    )


def non_finite_message(name: str, tensor: torch.Tensor) -> str:
    """What to say of ``tensor`` (named ``name``) when it holds NaN or infinite values."""
    bad = int((~torch.isfinite(tensor)).sum())
    return (
        f"{name}: {bad} of {tensor.numel()} values are NaN or infinite: the model is damaged (a NaN spreads "
        "to every frame), and quantizing it would hide that; re-download or re-export it"
    )


def check_finite(tensor: torch.Tensor, name: str) -> None:
    """:class:`Int8FormatError` when the float ``tensor`` (named ``name``) holds NaN or infinities."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise Int8FormatError(non_finite_message(name, tensor))


def quantize_weight(
    weight: torch.Tensor,
    config: Int8WeightConfig,
    *,
    name: str = "weight",
    fp8_grid: torch.Tensor | None = None,
) -> Int8Weight:
    """Quantize a float ``[out, in]`` weight; ``name`` only appears in error messages.

    ``fp8_grid`` (a scalar or one value per output row) says ``weight`` holds fp8 values times it:
    row and block scales are then chosen to fit the fp8 grid (see the module docstring); a rotated
    weight (``config.convrot``), being off that grid, and a per-tensor scale stay absmax. Works
    through the rows in chunks, so the extra memory is the int8 result plus a few float32 chunks.
    """
    check_weight_shape(tuple(weight.shape), config, where=name)
    out_features, in_features = weight.shape
    chunks = _row_chunks(out_features, in_features)
    qdata = torch.empty((out_features, in_features), dtype=torch.int8, device=weight.device)
    grid = None
    if fp8_grid is not None and not config.convrot and config.granularity != "tensor":
        grid = _row_grid(fp8_grid.to(weight.device, torch.float32), out_features, where=name)
    # amax carries a NaN or an infinity through: checked on the maxima, with one sync per weight
    finite = torch.ones((), dtype=torch.bool, device=weight.device)
    if config.granularity == "tensor":
        amax = max(float(_float_rows(weight[a:b], config).abs().amax()) for a, b in chunks)
        if not math.isfinite(amax):
            raise Int8FormatError(non_finite_message(name, weight))
        scale = torch.tensor(max(amax, _MIN_SCALE) / QMAX, dtype=torch.float32, device=weight.device)
    else:
        width = 1 if config.granularity == "row" else in_features // (config.block_size or in_features)
        scale = torch.empty((out_features, width), dtype=torch.float32, device=weight.device)
    for start, stop in chunks:
        work = _float_rows(weight[start:stop], config)
        if config.granularity == "tensor":
            q = work / scale
        else:
            blocks = _groups(work, stop - start, config.block_size or in_features)
            chosen = blocks.abs().amax(dim=2, keepdim=True)
            finite &= torch.isfinite(chosen).all()
            # by a tensor on the same device: CUDA divides by a Python number as a multiplication by its
            # reciprocal (one ulp off in 1 of 20 scales); tensor by tensor is IEEE division on any device
            chosen = chosen.clamp_min(_MIN_SCALE) / chosen.new_tensor(QMAX)
            if grid is not None:
                chosen = _choose_scales(blocks, chosen, grid[start:stop] if grid.ndim else grid)
            scale[start:stop] = chosen.squeeze(2)
            q = (blocks / chosen).reshape(stop - start, in_features)
        qdata[start:stop] = q.round_().clamp_(-QMAX, QMAX).to(torch.int8)
    if not bool(finite):
        raise Int8FormatError(non_finite_message(name, weight))
    return Int8Weight(qdata=qdata, scale=scale, config=config)


def _row_grid(grid: torch.Tensor, rows: int, *, where: str) -> torch.Tensor:
    """``grid`` as a scalar or a ``[rows, 1, 1]`` column; :class:`Int8FormatError` for another shape."""
    if grid.numel() == 1:
        return grid.reshape(())
    if grid.numel() == rows:
        return grid.reshape(rows, 1, 1)
    raise Int8FormatError(f"{where}: fp8 grid of shape {tuple(grid.shape)} is neither one value nor {rows}")


def _groups(work: torch.Tensor, rows: int, size: int) -> torch.Tensor:
    """``work`` as ``[rows, groups, size]``: the values that share one scale along the last axis."""
    return work.reshape(rows, -1, size)


def _choose_scales(groups: torch.Tensor, absmax_scale: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Per group of ``groups`` (``[rows, n, size]``, fp8 values × ``grid``), the scale among
    ``absmax_scale`` and the fp8-aligned power of two whose int8 rounding errs least."""
    largest = groups.abs().amax(dim=2, keepdim=True)
    # frexp: largest / grid = m · 2^e with m in [0.5, 1), so the top binade is 2^(e - 1) and the step
    # 2^(e - 7). The nudge keeps a power-of-two fp8 value, divided back by its grid, in its binade.
    _, exponent = torch.frexp(largest / grid * (1.0 + 2.0**-20))
    aligned = grid * torch.ldexp(torch.ones_like(largest), exponent - 7)
    aligned = torch.where(largest > 0, aligned, absmax_scale)
    better = _rounding_error(groups, aligned) < _rounding_error(groups, absmax_scale)
    return torch.where(better, aligned, absmax_scale)


def _rounding_error(groups: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Squared int8 rounding error of each group under ``scale`` (``[rows, n, 1]``)."""
    restored = (groups / scale).round_().clamp_(-QMAX, QMAX).mul_(scale)
    return restored.sub_(groups).pow_(2).sum(dim=2, keepdim=True)


def weight_sqnr_db(weight: torch.Tensor, packed: Int8Weight) -> float:
    """SQNR (dB) of ``packed`` against the float ``weight`` it came from, computed chunk by chunk."""
    signal = noise = 0.0
    rows_scale = packed.scale.ndim == 2
    for start, stop in _row_chunks(*packed.qdata.shape):
        scale = packed.scale[start:stop] if rows_scale else packed.scale
        restored = dequantize(packed.qdata[start:stop], scale, packed.config)
        reference = weight[start:stop].to(torch.float32)
        signal += float(reference.pow(2).sum(dtype=torch.float64))
        noise += float((reference - restored).pow_(2).sum(dtype=torch.float64))
    return math.inf if noise == 0 else 10.0 * math.log10(signal / noise)


def scaled(
    qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, *, one_pass: bool | None = None
) -> torch.Tensor:
    """``qdata × scale`` in ``dtype``: each product computed in float32 and rounded once to ``dtype``, the
    same bits on every device; block scales broadcast over their blocks, never repeated into a
    weight-sized tensor. ``scale`` is float32: ``[]``, ``[out, 1]`` or ``[out, in / block]``.

    On a GPU in one pass (int8 read, ``dtype`` written; converting, multiplying and converting back
    made three, with two float32 copies of the weight). On a CPU, where a multiplication of mixed dtypes
    runs element by element, as a vectorised conversion to float32 multiplied in place (2.5× faster than
    the mixed-dtype pass or a second float32 copy, measured side by side at DiT shapes). ``one_pass``
    chooses the way (default: by device), so that both are tested on a CPU."""
    shape = qdata.shape
    if scale.ndim == 2 and scale.shape[1] > 1:  # block scales: one per [rows, blocks, block] group
        rows, blocks = scale.shape
        qdata, scale = qdata.reshape(rows, blocks, -1), scale.reshape(rows, blocks, 1)
    if not (qdata.device.type != "cpu" if one_pass is None else one_pass):
        return qdata.to(torch.float32).mul_(scale).to(dtype).reshape(shape)
    out = torch.empty(qdata.shape, dtype=dtype, device=qdata.device)
    torch.mul(qdata, scale, out=out)
    return out.reshape(shape)


def dequantize_weight(packed: Int8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight ``packed`` stands for (rotation undone), in ``dtype``."""
    return dequantize(packed.qdata, packed.scale, packed.config, dtype)


def dequantize(
    qdata: torch.Tensor, scale: torch.Tensor, config: Int8WeightConfig, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Tensor-level form of :func:`dequantize_weight`."""
    scale = scale.to(device=qdata.device, dtype=torch.float32)
    if not config.convrot:
        return scaled(qdata, scale, dtype)
    weight = rotate_groups(scaled(qdata, scale, torch.float32), config.convrot_group, config.hadamard)
    return weight.to(dtype)


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: ``10·log10(‖ref‖² / ‖ref − approx‖²)``."""
    ref = reference.to(torch.float64)
    noise = (ref - approximation.to(torch.float64)).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0:
        return math.inf
    return 10.0 * math.log10(signal / noise)
