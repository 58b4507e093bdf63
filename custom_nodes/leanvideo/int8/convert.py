"""Quantize float state dicts and files into the LeanVideo INT8 format.

:func:`quantize_state_dict` works in memory (quantize-on-load). :func:`quantize_file` streams one
tensor at a time from a safetensors file into a new one (peak memory ≈ two copies of the largest
tensor), then re-reads the result to verify it. Per-layer SQNR is reported in the returned summary.

Example::

    report = quantize_file(Path("dit-bf16.safetensors"), Path("dit-int8.safetensors"), family="ltxv")
    report.size_ratio  # ≈ 0.52 for a DiT
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .files import FileHeader, TensorReader, read_header
from .formats.common import config_to_tensor
from .fp8 import (
    FP8_DTYPES,
    FP8_TORCH_DTYPES,
    choose_fp8_config,
    dequantize_fp8,
    fp8_grid,
    is_fp8_companion,
    kept_dtype,
    quantize_fp8_weight,
    scale_weight_key,
)
from .policy import other_family, plan_quantization, refuse_unquantizable
from .quantize import Int8Weight, check_finite, expected_scale_shape, quantize_weight, weight_sqnr_db
from .spec import (
    COMFY_METADATA_KEY,
    COMFY_METADATA_VERSION,
    CONFIG_SUFFIX,
    FORMAT_VERSION,
    METADATA_KEY,
    SCALE_SUFFIX,
    WEIGHT_SUFFIX,
    Int8FormatError,
    Int8WeightConfig,
    is_auxiliary,
)
from .target import check_target, move_without_overwriting, new_partial, remove_dead_partials
from .writer import StreamingWriter

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # (key, done, total)
FP8_GRID_SCALES = "fp8_grid"  # the header's "scales" value for a file quantized from fp8 weights


def quantize_state_dict(
    tensors: Mapping[str, torch.Tensor] | MutableMapping[str, torch.Tensor],
    plan: Mapping[str, Int8WeightConfig],
    *,
    consume: bool = False,
    device: torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """A copy of ``tensors`` with every layer of ``plan`` replaced by int8 weight + scale + config.

    fp8 tensors (and scaled fp8, whose ``scale_weight``, ``scale_input`` and marker are dropped) are
    dequantized exactly first, one at a time; those outside ``plan`` are kept exactly
    (:func:`~leanvideo.int8.fp8.kept_dtype`: bfloat16, or float32 when scaled), those in it are
    quantized by :func:`~leanvideo.int8.fp8.quantize_fp8_weight` (which may rotate a layer).

    ``consume`` (a loader's own dict): each source tensor leaves ``tensors`` as its result is made, so
    its memory goes as the INT8 model grows and the peak stays near the source's size instead of source
    plus result; ``tensors`` is empty afterwards.

    ``device`` (a GPU): each weight of ``plan`` is quantized there, one at a time, and its int8 weight
    and scale come back to the device it was on: for a float weight the same values (absmax, one
    division and rounding per value, each exact in float32 on any device); where a rotation (a matrix
    product) or an fp8 grid choice (a sum of errors) is involved, the last bits may differ. A 13 B-parameter
    bf16 DiT takes minutes of CPU.
    """
    if consume and not isinstance(tensors, MutableMapping):
        raise TypeError("consume=True needs a mutable mapping of tensors")
    result: dict[str, torch.Tensor] = {}
    source = tensors if isinstance(tensors, MutableMapping) else None  # emptied as it is read
    for key in list(tensors):
        if is_fp8_companion(key):
            continue  # read with its weight; dropped at the end
        tensor = source.pop(key) if consume and source is not None else tensors[key]
        scale_key = scale_weight_key(key) if tensor.dtype in FP8_TORCH_DTYPES else None
        fp8_scale = tensors.get(scale_key) if scale_key else None
        layer = key[: -len(WEIGHT_SUFFIX)] if key.endswith(WEIGHT_SUFFIX) else None
        if layer is None or layer not in plan:
            if tensor.dtype in FP8_TORCH_DTYPES:
                tensor = dequantize_fp8(tensor, fp8_scale, where=key).to(kept_dtype(fp8_scale is not None))
            check_finite(tensor, f"tensor {key!r}")
            result[key] = tensor
            continue
        packed = None
        if device is not None and _fits(tensor, device):
            try:
                packed = _quantize_layer(key, tensor, fp8_scale, plan[layer], device)
            except torch.OutOfMemoryError:  # the GPU filled up meanwhile: this weight where it is
                logger.info("no GPU memory left for %s: quantized on the %s", key, tensor.device)
        if packed is None:
            packed = _quantize_layer(key, tensor, fp8_scale, plan[layer], tensor.device)
        result[key] = packed.qdata.to(tensor.device)
        result[layer + SCALE_SUFFIX] = packed.scale.to(tensor.device)
        result[layer + CONFIG_SUFFIX] = config_to_tensor(packed.config)
        del tensor, packed
    if consume and source is not None:
        source.clear()
    return result


def _quantize_layer(
    key: str,
    tensor: torch.Tensor,
    fp8_scale: torch.Tensor | None,
    config: Int8WeightConfig,
    device: torch.device,
) -> Int8Weight:
    """``tensor`` (a float weight, or an fp8 one with its ``scale_weight``) quantized on ``device``."""
    weight = tensor.to(device)
    if weight.dtype not in FP8_TORCH_DTYPES:
        return quantize_weight(weight, config, name=key)
    scale = None if fp8_scale is None else fp8_scale.to(device)
    exact = dequantize_fp8(weight, scale, where=key)
    del weight
    return quantize_fp8_weight(exact, fp8_grid(scale), config, name=key)


def _fits(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether ``device`` has room for ``tensor`` and what quantizing it holds at once (an fp8 weight's
    float32 values, twice while scaled, the int8 result), twice over; a GPU that is full leaves the
    weight to be quantized where it is."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return free > 2 * tensor.numel() * (tensor.element_size() + 9) + (64 << 20)


def int8_metadata(
    plan: Mapping[str, Int8WeightConfig], extra: Mapping[str, str], *, fp8_scales: bool = False
) -> dict[str, str]:
    """Header entries for a LeanVideo INT8 file: ours, plus ComfyUI's ``_quantization_metadata``.
    ``fp8_scales`` records that scales of layers made from fp8 weights follow the fp8 grid."""
    entry: dict[str, object] = {"format_version": FORMAT_VERSION}
    if fp8_scales:
        entry["scales"] = FP8_GRID_SCALES
    return {
        **extra,
        METADATA_KEY: json.dumps(entry),
        COMFY_METADATA_KEY: json.dumps(
            {
                "format_version": COMFY_METADATA_VERSION,
                "layers": {layer: config.to_dict() for layer, config in sorted(plan.items())},
            }
        ),
    }


@dataclass
class QuantizeReport:
    """What :func:`quantize_file` did: sizes, per-layer SQNR (dB) and the verification result."""

    source: Path
    target: Path
    source_bytes: int
    target_bytes: int
    layer_sqnr_db: dict[str, float] = field(default_factory=dict)
    verified: bool = False
    fp8_tensors: int = 0  # fp8 tensors of the source, dequantized exactly (SQNR is against those values)
    rotated_layers: list[str] = field(default_factory=list)  # fp8 layers rotated because it paid
    layer_configs: dict[str, Int8WeightConfig] = field(default_factory=dict)  # as written, per layer
    removed_partials: list[Path] = field(default_factory=list)  # left by killed writers of target

    @property
    def size_ratio(self) -> float:
        return self.target_bytes / self.source_bytes if self.source_bytes else float("nan")


def quantize_file(
    source: Path,
    target: Path,
    *,
    family: str,
    config: Int8WeightConfig | None = None,
    progress: Progress | None = None,
    drop_metadata: Collection[str] = (),
) -> QuantizeReport:
    """Stream ``source`` (a float or fp8 safetensors file) into ``target`` in the LeanVideo INT8 format.

    The source's metadata entries are copied, except the keys in ``drop_metadata`` (a stamp that marks
    a generated file as such must not mark the user's new file). The hidden files of writers of
    ``target`` killed before they ended are removed first (``report.removed_partials``).

    fp8 weights are dequantized exactly and quantized by :func:`~leanvideo.int8.fp8.quantize_fp8_weight`
    (a first pass reads them to settle which layers to rotate). Refuses to overwrite ``target``. A
    key prefix such as ``model.diffusion_model.`` is kept as is; the family rules match on the key
    after it. Auxiliary uint8 blobs (a text encoder's ``spiece_model`` tokenizer, see
    :func:`~leanvideo.int8.spec.is_auxiliary`) are copied unchanged.
    """
    check_target(target)
    header = read_header(source)
    plan = _plan_file(source, header, family, config or Int8WeightConfig())
    report = QuantizeReport(source=source, target=target, source_bytes=source.stat().st_size, target_bytes=0)
    plan = _choose_fp8_layouts(source, header, plan, report)
    report.layer_configs = dict(plan)
    # A name of our own beside the target (never a file of the user's), moved into place only where
    # nothing has appeared meanwhile.
    report.removed_partials = remove_dead_partials(target)
    with new_partial(target) as partial:
        _stream_quantized(source, partial, header, plan, report, progress, drop_metadata)
        _verify(source, partial, plan)
        move_without_overwriting(partial, target)
    report.verified = True
    report.target_bytes = target.stat().st_size
    return report


def _plan_file(
    source: Path, header: FileHeader, family: str, config: Int8WeightConfig
) -> dict[str, Int8WeightConfig]:
    """``{layer (full key prefix): config}`` of the layers of ``source`` to quantize, checked."""
    weights = (key for key, dtype in header.dtypes.items() if dtype == "I8" and key.endswith(WEIGHT_SUFFIX))
    if (int8 := next(weights, None)) is not None:
        raise Int8FormatError(
            f"{source}: already INT8 (tensor {int8!r} is int8); the INT8 loaders read it as it is"
        )
    for key, dtype in header.dtypes.items():
        if dtype not in _FLOAT_DTYPES and dtype not in FP8_DTYPES and not is_auxiliary(key, dtype):
            raise Int8FormatError(
                f"{source}: tensor {key!r} is {dtype}; only float and fp8 files are quantized "
                "(auxiliary uint8 blobs such as spiece_model are copied as they are)"
            )
    refuse_unquantizable(header.dtypes, source=str(source), kinds=("LoRA",))
    prefix = _common_prefix(header.shapes)
    relative = {key[len(prefix) :]: shape for key, shape in header.shapes.items()}
    plan = {prefix + layer: c for layer, c in plan_quantization(relative, family, config).items()}
    if not plan:
        if (other := other_family(header.dtypes, family, source=str(source))) is not None:
            raise Int8FormatError(other)  # before the VAE a full checkpoint also holds
        refuse_unquantizable(header.dtypes, source=str(source))
        raise Int8FormatError(f"{source}: no layer of family {family!r} to quantize")
    return plan


def _fp8_layers(header: FileHeader, plan: Mapping[str, Int8WeightConfig]) -> list[str]:
    return [layer for layer in plan if header.dtypes[layer + WEIGHT_SUFFIX] in FP8_DTYPES]


def _choose_fp8_layouts(
    source: Path, header: FileHeader, plan: dict[str, Int8WeightConfig], report: QuantizeReport
) -> dict[str, Int8WeightConfig]:
    """``plan`` with each fp8 layer's config as :func:`~leanvideo.int8.fp8.choose_fp8_config` picks it.

    The header (ComfyUI's per-layer entries) and each layer's ``comfy_quant`` are written before any
    data, so whether a layer is rotated is settled in this first pass, one tensor at a time.
    """
    chosen = dict(plan)
    with TensorReader(source) as handle:
        for layer in _fp8_layers(header, plan):
            tensor, grid = _read_exact_with_grid(handle, header, layer + WEIGHT_SUFFIX)
            if grid is None:  # not reached: _fp8_layers lists fp8 weights only
                continue
            chosen[layer] = choose_fp8_config(tensor, grid, plan[layer], name=layer)
            if chosen[layer].convrot and not plan[layer].convrot:
                report.rotated_layers.append(layer)
    return chosen


def _stream_quantized(
    source: Path,
    partial: Path,
    header: FileHeader,
    plan: Mapping[str, Int8WeightConfig],
    report: QuantizeReport,
    progress: Progress | None,
    drop_metadata: Collection[str] = (),
) -> None:
    """Write ``partial``: the planned layers quantized (their SQNR into ``report``, against the exact
    float weight: an fp8 weight is dequantized first), fp8 tensors that stay float written exactly
    (bfloat16, or float32 when scaled), the scaled-fp8 scales and marker dropped, the rest copied."""
    keys = sorted(key for key in header.shapes if not is_fp8_companion(key))
    report.fp8_tensors = sum(1 for key in keys if header.dtypes[key] in FP8_DTYPES)
    with (
        TensorReader(source) as handle,
        StreamingWriter(
            partial,
            int8_metadata(
                dict(plan),
                {key: value for key, value in header.metadata.items() if key not in drop_metadata},
                fp8_scales=bool(_fp8_layers(header, plan)),
            ),
        ) as writer,
    ):
        for layer, layer_config in plan.items():  # declare the int8 layout before any data is written
            declare_int8_layer(writer, layer, header.shapes[layer + WEIGHT_SUFFIX], layer_config)
        for key in keys:
            if not (key.endswith(WEIGHT_SUFFIX) and key[: -len(WEIGHT_SUFFIX)] in plan):
                writer.declare(key, _kept_dtype(header, key), header.shapes[key])
        writer.begin()
        for done, key in enumerate(keys, 1):
            tensor, grid = _read_exact_with_grid(handle, header, key)
            layer = key[: -len(WEIGHT_SUFFIX)] if key.endswith(WEIGHT_SUFFIX) else ""
            where = f"{source}: tensor {key!r}"
            if layer in plan:  # quantize_weight refuses NaN and infinities itself
                packed = quantize_weight(tensor, plan[layer], name=where, fp8_grid=grid)
                report.layer_sqnr_db[layer] = weight_sqnr_db(tensor, packed)
                write_int8_layer(writer, layer, packed)
                del packed  # before the next tensor is read: peak stays ≈ one float + one int8 tensor
            else:
                check_finite(tensor, where)
                writer.write(key, tensor.to(_kept_dtype(header, key)))
            del tensor
            if progress is not None:
                progress(key, done, len(keys))


def _kept_dtype(header: FileHeader, key: str) -> torch.dtype:
    """The dtype ``key`` is written in when it is not quantized: its own, or for fp8 :func:`kept_dtype`."""
    dtype = header.dtypes[key]
    if dtype not in FP8_DTYPES:
        return _DTYPES[dtype]
    return kept_dtype(scale_weight_key(key) in header.dtypes)


def _read_exact(handle: TensorReader, header: FileHeader, key: str) -> torch.Tensor:
    """Tensor ``key`` as stored, or for an fp8 one its exact float32 value (times its scale_weight)."""
    return _read_exact_with_grid(handle, header, key)[0]


def _read_exact_with_grid(
    handle: TensorReader, header: FileHeader, key: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_read_exact`, and for an fp8 tensor its fp8 unit (:func:`~leanvideo.int8.fp8.fp8_grid`)."""
    tensor = handle.get(key)
    if header.dtypes[key] not in FP8_DTYPES:
        return tensor, None
    scale_key = scale_weight_key(key)
    scale = handle.get(scale_key) if scale_key in header.dtypes else None
    return dequantize_fp8(tensor, scale, where=f"{handle.path}: {key}"), fp8_grid(scale)


_FLOAT_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_DTYPES = {**_FLOAT_DTYPES, "U8": torch.uint8}  # U8: auxiliary blobs, copied unchanged


def declare_int8_layer(
    writer: StreamingWriter, layer: str, shape: tuple[int, ...], config: Int8WeightConfig
) -> None:
    """Declare ``layer``'s three tensors (int8 weight, float32 scale, comfy_quant config) in ``writer``."""
    writer.declare(layer + WEIGHT_SUFFIX, torch.int8, shape)
    writer.declare(layer + SCALE_SUFFIX, torch.float32, expected_scale_shape(shape, config))
    writer.declare(layer + CONFIG_SUFFIX, torch.uint8, tuple(config_to_tensor(config).shape))


def write_int8_layer(writer: StreamingWriter, layer: str, packed: Int8Weight) -> None:
    """Write the tensors :func:`declare_int8_layer` declared for ``layer``."""
    writer.write(layer + WEIGHT_SUFFIX, packed.qdata)
    writer.write(layer + SCALE_SUFFIX, packed.scale)
    writer.write(layer + CONFIG_SUFFIX, config_to_tensor(packed.config))


def _common_prefix(shapes: Mapping[str, tuple[int, ...]]) -> str:
    for prefix in ("model.diffusion_model.", "diffusion_model."):
        if any(key.startswith(prefix) for key in shapes):
            return prefix
    return ""


def _verify(source: Path, written: Path, plan: Mapping[str, Int8WeightConfig]) -> None:
    """Re-read ``written`` tensor by tensor: detected as ours, int8 layers valid, float tensors identical."""
    from .formats import detect_format
    from .formats.common import canonicalize

    if (found := detect_format(read_header(written))) != "leanvideo":
        raise Int8FormatError(f"{written}: verification read it as {found!r}, not as LeanVideo INT8")
    header = read_header(source)
    with TensorReader(source) as original, TensorReader(written) as copy:
        for key in original.keys():  # noqa: SIM118 (a reader, not a mapping)
            if is_fp8_companion(key):
                if key in copy.keys():  # noqa: SIM118 (a reader, not a mapping)
                    raise Int8FormatError(f"{written}: the scaled-fp8 tensor {key!r} was left in")
                continue
            layer = key[: -len(WEIGHT_SUFFIX)] if key.endswith(WEIGHT_SUFFIX) else ""
            if layer in plan:
                names = (key, layer + SCALE_SUFFIX, layer + CONFIG_SUFFIX)
                canonicalize({name: copy.get(name) for name in names}, {}, source=str(written))
            elif not torch.equal(copy.get(key), _read_exact(original, header, key)):
                raise Int8FormatError(f"{written}: {key!r} differs from {source} after the round trip")
