"""Load INT8 diffusion models and text encoders into ComfyUI from any supported INT8 file.

The file is read and validated completely (:func:`leanvideo.int8.formats.read_int8_file`) before
ComfyUI builds anything, so a bad file raises with nothing half-loaded. Float files are quantized
on load by the family rules of :mod:`leanvideo.int8.policy`; the family comes from ComfyUI's own
model detection.

Example::

    patcher = load_diffusion_model_int8(Path("models/diffusion_models/ltxv-int8.safetensors"))
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import comfy.model_detection
import comfy.model_management
import comfy.sd
import comfy.supported_models
import torch

from .int8 import Int8WeightConfig
from .int8.convert import quantize_state_dict
from .int8.dispatch import KernelDispatcher
from .int8.files import diffusion_model_keys, read_header
from .int8.formats import LoadedFile, read_int8_file
from .int8.fp8 import is_fp8_companion
from .int8.policy import describe_misplaced, plan_quantization
from .int8.spec import Int8FormatError
from .int8_lora import LORA_MODES, Int8ModelPatcher
from .int8_ops import make_int8_ops

logger = logging.getLogger(__name__)

# Formats without int8 weights, quantized while loading: float (bf16/fp16/fp32) and fp8 (plain or
# ComfyUI scaled, dequantized exactly first).
QUANTIZED_ON_LOAD = ("float", "fp8")

COMPUTE_DTYPES: dict[str, torch.dtype | None] = {
    "default": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
# Checked in order: subclasses before their bases.
_FAMILIES: tuple[tuple[type[Any], str], ...] = (
    (comfy.supported_models.LTXV, "ltxv"),
    (comfy.supported_models.WAN21_T2V, "wan"),
    (comfy.supported_models.HunyuanVideo, "hunyuan_video"),
    (comfy.supported_models.Flux, "flux"),
)


@dataclass(frozen=True)
class Int8LoadOptions:
    """How to load: ``compute_dtype`` (a key of :data:`COMPUTE_DTYPES`), ``matmul_route`` (auto, or a
    kernel to force: see :data:`~leanvideo.int8.linear.MATMUL_ROUTES`), whether float files are quantized
    on load, and the config used when they are. ``dispatcher`` picks the INT8 kernels (one made from
    ``matmul_route``, with no table on disk, when ``None``)."""

    compute_dtype: str = "default"
    matmul_route: str = "auto"
    quantize_on_load: bool = True
    quantize_config: Int8WeightConfig = field(default_factory=Int8WeightConfig)
    lora_mode: str = "merge"
    dispatcher: KernelDispatcher | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, not {self.compute_dtype!r}"
            )
        if self.lora_mode not in LORA_MODES:
            raise ValueError(f"lora_mode must be one of {LORA_MODES}, not {self.lora_mode!r}")


def detect_model_config(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str], *, source: str
) -> tuple[Any, str]:
    """``(ComfyUI model config, key prefix)`` of a diffusion model state dict, by ComfyUI's detection."""
    prefix = comfy.model_detection.unet_prefix_from_state_dict(tensors)
    if not any(key.startswith(prefix) for key in tensors):
        prefix = ""
    plain = {key: t for key, t in tensors.items() if not is_fp8_companion(key)}
    model_config = comfy.model_detection.model_config_from_unet(plain, prefix, metadata=dict(metadata))
    if model_config is None:
        found = describe_misplaced(tensors, source=source, wanted="diffusion model")
        raise Int8FormatError(found or f"{source}: ComfyUI does not recognise this diffusion model")
    return model_config, prefix


def detect_family(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str], *, source: str
) -> tuple[str, str]:
    """``(family, key prefix)`` of a diffusion model state dict, by ComfyUI's model detection."""
    model_config, prefix = detect_model_config(tensors, metadata, source=source)
    return family_of(model_config, source=source), prefix


def family_of(model_config: Any, *, source: str) -> str:
    """The quantization family (:data:`_FAMILIES`) of a ComfyUI model config detected in ``source``."""
    for base, family in _FAMILIES:
        if isinstance(model_config, base):
            return family
    raise Int8FormatError(
        f"{source}: model family {type(model_config).__name__!r} has no INT8 quantization rules; "
        f"supported: {[family for _, family in _FAMILIES]}"
    )


def _quantize_loaded(
    loaded: LoadedFile, family: str, prefix: str, config: Int8WeightConfig
) -> dict[str, torch.Tensor]:
    shapes = {k[len(prefix) :]: tuple(t.shape) for k, t in loaded.tensors.items() if k.startswith(prefix)}
    plan = {prefix + layer: c for layer, c in plan_quantization(shapes, family, config).items()}
    if not plan:
        wanted = "text encoder" if family == "text_encoder" else "diffusion model"
        found = describe_misplaced(loaded.tensors, source=str(loaded.path), wanted=wanted)
        raise Int8FormatError(found or f"{loaded.path}: no layer of family {family!r} to quantize")
    device = quantize_device()
    where = device or "cpu"
    logger.info("Quantizing %d %s layers of %s on load, on %s", len(plan), family, loaded.path, where)
    try:  # the read tensors go as they convert
        return quantize_state_dict(loaded.tensors, plan, consume=True, device=device)
    except Int8FormatError as error:  # a damaged weight: name the file it is in
        raise Int8FormatError(f"{loaded.path}: {error}") from error


def quantize_device() -> torch.device | None:
    """ComfyUI's GPU, where quantizing on load is tens of times faster than on the CPU (one weight at
    a time there; the int8 results come back to the CPU, where ComfyUI loads a model from); None
    where ComfyUI computes on the CPU."""
    device = comfy.model_management.get_torch_device()
    return device if device.type == "cuda" else None


def read_for_loading(path: Path, options: Int8LoadOptions, keys: list[str] | None = None) -> LoadedFile:
    """``path`` (or its ``keys``) read for a loader; a float or fp8 file needs quantize_on_load."""
    loaded = read_int8_file(path, keys)
    if loaded.format in QUANTIZED_ON_LOAD and not options.quantize_on_load:
        raise Int8FormatError(
            f"{path}: holds no INT8 weights ({loaded.format}); turn on quantize_on_load to quantize it "
            "while loading"
        )
    return loaded


def load_diffusion_model_int8(path: Path, options: Int8LoadOptions | None = None) -> Any:
    """A ComfyUI ``ModelPatcher`` for the diffusion model in ``path`` (any supported INT8 format, fp8
    or float), which may be a full checkpoint: then only its diffusion model is read."""
    options = options or Int8LoadOptions()
    keys = diffusion_model_keys(read_header(path))
    return build_diffusion_model(read_for_loading(path, options, keys), options)


def build_diffusion_model(
    loaded: LoadedFile, options: Int8LoadOptions, detected: tuple[Any, str] | None = None
) -> Any:
    """The ``ModelPatcher`` of a diffusion model read by :func:`read_int8_file` (quantized first when
    its format is one of :data:`QUANTIZED_ON_LOAD`). ``detected``: its ``(model config, key prefix)``
    when the caller already ran :func:`detect_model_config`, which is then not run again."""
    path = loaded.path
    tensors = loaded.tensors
    if loaded.format in QUANTIZED_ON_LOAD:
        if detected is None:
            family, prefix = detect_family(tensors, loaded.metadata, source=str(path))
        else:
            family, prefix = family_of(detected[0], source=str(path)), detected[1]
        tensors = _quantize_loaded(loaded, family, prefix, options.quantize_config)
    model_options: dict[str, Any] = {
        "custom_operations": make_int8_ops(options.matmul_route, options.lora_mode, options.dispatcher)
    }
    if (dtype := COMPUTE_DTYPES[options.compute_dtype]) is not None:
        model_options["dtype"] = dtype
    try:
        patcher = comfy.sd.load_diffusion_model_state_dict(
            tensors, model_options=model_options, metadata=loaded.metadata
        )
    except Int8FormatError as error:  # a layer refused its tensor: name the file it is in
        raise Int8FormatError(f"{path}: {error}") from error
    if patcher is None:
        found = describe_misplaced(tensors, source=str(path), wanted="diffusion model")
        raise Int8FormatError(found or f"{path}: ComfyUI could not detect the diffusion model type")
    logger.info("Loaded %s (%s) with matmul route %s", path, _described(loaded), options.matmul_route)
    return Int8ModelPatcher.wrap(patcher)


def _described(loaded: Any) -> str:
    """How a file was read, for the log: ``leanvideo INT8``, ``float, quantized on load`` …"""
    quantized = loaded.format in QUANTIZED_ON_LOAD
    return f"{loaded.format}, quantized on load" if quantized else f"{loaded.format} INT8"


def load_text_encoder_int8(
    paths: list[Path],
    clip_type: str,
    options: Int8LoadOptions | None = None,
    *,
    embedding_directory: Any = None,
    on_cpu: bool = False,
) -> Any:
    """A ComfyUI ``CLIP`` from INT8 (or float, quantized on load) text encoder files; ``on_cpu`` loads
    and runs it on the CPU (Load CLIP's ``device: cpu``).

    Auxiliary byte blobs stay in the state dicts handed to ComfyUI: it builds some tokenizers from
    them (``spiece_model`` for Wan's UMT5-XXL, ACE's T5, Gemma; ``tekken_model`` for Mistral).
    """
    options = options or Int8LoadOptions()
    state_dicts: list[Any] = []
    read_as: list[str] = []  # each file and how it was read, for the log
    for path in paths:
        loaded = read_for_loading(path, options)
        # by its keys, before ComfyUI would load what it recognises and leave the encoder's weights empty
        if (found := describe_misplaced(loaded.tensors, source=str(path), wanted="text encoder")) is not None:
            raise Int8FormatError(found)
        read_as.append(f"{path} ({_described(loaded)})")
        if loaded.format in QUANTIZED_ON_LOAD:
            state_dicts.append(_quantize_loaded(loaded, "text_encoder", "", options.quantize_config))
        else:
            state_dicts.append(loaded.tensors)
    kind = getattr(comfy.sd.CLIPType, clip_type.upper(), None)
    if kind is None:
        raise ValueError(f"Unknown text encoder type {clip_type!r}")
    model_options: dict[str, Any] = {
        "custom_operations": make_int8_ops(options.matmul_route, dispatcher=options.dispatcher)
    }
    if (dtype := COMPUTE_DTYPES[options.compute_dtype]) is not None:
        model_options["dtype"] = dtype
    if on_cpu:
        model_options["load_device"] = model_options["offload_device"] = torch.device("cpu")
    try:
        clip = comfy.sd.load_text_encoder_state_dicts(
            state_dicts, embedding_directory=embedding_directory, clip_type=kind, model_options=model_options
        )
    except Int8FormatError as error:  # a layer refused its tensor: name the files
        raise Int8FormatError(f"{', '.join(map(str, paths))}: {error}") from error
    _reload_measured(clip)
    logger.info("Loaded %s with matmul route %s", ", ".join(read_as), options.matmul_route)
    return clip


def _reload_measured(clip: Any) -> None:
    """Give ``clip`` an :class:`Int8ModelPatcher` whose size counts the INT8 weights.

    ComfyUI builds a text encoder, loads it at once when it starts on its load device (always on a
    CPU or when it fits in VRAM, ``comfy.sd.CLIP.__init__``), and only then loads the weights into it.
    Our layers hold no weight until then (no float placeholders), so that first load measured, and
    the patcher cached as the model's size, only the embeddings and norms: 251 MB of a 4.8 GB
    T5-XXL. VRAM decisions (what to free, what to offload) would use that size; so the first load
    is undone and, now that the weights are in, done again.
    """
    built = clip.patcher
    clip.patcher = Int8ModelPatcher.wrap(built)
    if built.loaded_size() > 0:
        built.detach()
        # ComfyUI drops the first load's entry here: it is a clone of the same model.
        comfy.model_management.load_models_gpu([clip.patcher], force_full_load=True)
