"""INT8 loader nodes (declarations only; the work happens in ``int8_loading`` and ``int8_ops``)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import folder_paths
from comfy_api.latest import io

from .int8.linear import MATMUL_ROUTES
from .int8.spec import Int8WeightConfig
from .int8_checkpoint import load_checkpoint_int8
from .int8_kernels import (
    REPORT_TOKEN,
    compute_dtype_note,
    make_dispatcher,
    report_kernels,
    text_encoder_dtype_note,
)
from .int8_loading import COMPUTE_DTYPES, Int8LoadOptions, load_diffusion_model_int8, load_text_encoder_int8
from .int8_lora import LORA_MODES
from .node_checks import file_listed, require_choices, require_prompt_choices

TEXT_ENCODER_TYPES = ["stable_diffusion", "ltxv", "wan", "flux", "hunyuan_video", "sd3", "cosmos"]


def _options(
    compute_dtype: str, matmul_route: str, quantize_on_load: bool, convrot: bool, lora_mode: str = "merge"
) -> Int8LoadOptions:
    return Int8LoadOptions(
        compute_dtype=compute_dtype,
        matmul_route=matmul_route,
        quantize_on_load=quantize_on_load,
        quantize_config=Int8WeightConfig(convrot=convrot),
        lora_mode=lora_mode,
        dispatcher=make_dispatcher(matmul_route, os.environ),
    )


def _shared_inputs(*, text_encoder: bool = False) -> list[Any]:
    held = (
        " ComfyUI runs text encoders in float32 whatever this says: here it sets how the weights that "
        "are not INT8 are held."
        if text_encoder
        else ""
    )
    return [
        io.Combo.Input(
            "compute_dtype",
            options=list(COMPUTE_DTYPES),
            default="default",
            tooltip=f"Dtype the layers compute in; 'default' lets ComfyUI pick for the device.{held}",
        ),
        io.Combo.Input(
            "path",
            options=list(MATMUL_ROUTES),
            default="auto",
            tooltip="INT8 matmul kernel. auto measures w8a16, int_mm, int_mm_fused, kitchen and onednn "
            "on each layer shape at first use and keeps the fastest correct one (never one slower than "
            "w8a16; the table is cached in the user directory). w8a16 dequantizes weights (every "
            "device); int_mm quantizes activations and multiplies with torch._int_mm; int_mm_fused is "
            "int_mm with quantizing and rescaling each compiled into one kernel by torch.compile "
            "(compiles at first use; auto measures it on a GPU only); kitchen uses comfy-kitchen's "
            "fused kernel (pip install comfy-kitchen); onednn is int_mm through oneDNN's int8 linear "
            "(a CPU with VNNI or AMX, AVX-VNNI-only ones included, where torch._int_mm is slow). A "
            "forced kernel runs w8a16 where it cannot run a shape; w8a8 is int_mm's older name. With "
            "auto, LEANVIDEO_INT8_KERNEL forces one.",
        ),
        io.Boolean.Input(
            "quantize_on_load",
            default=True,
            tooltip="Quantize plain bf16/fp16/fp32 or fp8 files to INT8 while loading (sensitive layers "
            "stay in high precision). Files already in INT8 are read as they are; off, a file that is not "
            "INT8 is refused.",
        ),
        io.Boolean.Input(
            "convrot",
            default=False,
            tooltip="When quantizing on load, rotate weight groups of 256 with a Hadamard matrix first "
            "(better for outlier-heavy layers, a little slower). Off, an fp8 file still has the layers "
            "rotated where that cuts their error by 1 dB or more.",
        ),
    ]


def _report(options: Int8LoadOptions, model: Any, note: str | None = None) -> dict[str, list[str]]:
    """A loader's UI output: the kernels (sent to the editor again as the sampler chooses them, after
    the loader ran), then ``note``."""
    token = uuid.uuid4().hex
    return {
        "text": [report_kernels(options.dispatcher, model, note=note, token=token)],
        REPORT_TOKEN: [token],
    }


def _diffusion_report(options: Int8LoadOptions, model: Any) -> dict[str, list[str]]:
    """The diffusion model loaders' UI output: the kernels, and a compute dtype ComfyUI did not honour."""
    return _report(options, model, compute_dtype_note(COMPUTE_DTYPES[options.compute_dtype], model))


def _lora_mode_input() -> Any:
    return io.Combo.Input(
        "lora_mode",
        options=list(LORA_MODES),
        default="merge",
        tooltip="How LoRAs applied to this model run: merge adds them into the INT8 weights "
        "once when the model is patched (no per-step cost); side_branch keeps the INT8 weights "
        "and adds the exact low-rank product in each layer (no requantization error, a small "
        "per-step cost).",
    )


class LeanVideoDiffusionModelLoaderINT8(io.ComfyNode):
    """Load a diffusion model as INT8 from any supported INT8 layout, or quantize a float one on load."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LeanVideoDiffusionModelLoaderINT8",
            display_name="Load Diffusion Model (INT8)",
            category="advanced/loaders",
            description="Loads a diffusion model with INT8 weights: LeanVideo, ComfyUI-native, LightX2V and "
            "INT8-Fast files are detected automatically; float files are quantized on load.",
            inputs=[
                io.Combo.Input(
                    "unet_name",
                    options=folder_paths.get_filename_list("diffusion_models"),
                    tooltip="File in models/diffusion_models (INT8 or float safetensors).",
                ),
                *_shared_inputs(),
                _lora_mode_input(),
            ],
            outputs=[io.Model.Output(tooltip="The diffusion model, its linear layers in INT8.")],
            hidden=[io.Hidden.prompt],  # not in the cache key: the other INT8 loaders are checked first
        )

    @classmethod
    def validate_inputs(cls, unet_name: str | None) -> bool | str:
        # one input only: ComfyUI repeats a failed check's message once per input the check takes
        return file_listed("diffusion_models", unet_name)

    @classmethod
    def execute(
        cls,
        unet_name: str,
        compute_dtype: str,
        path: str,
        quantize_on_load: bool,
        convrot: bool,
        lora_mode: str = "merge",
    ) -> io.NodeOutput:
        require_choices(cls, compute_dtype=compute_dtype, path=path, lora_mode=lora_mode)
        require_prompt_choices(getattr(cls.hidden, "prompt", None), LOADERS)  # before anything loads
        file = Path(folder_paths.get_full_path_or_raise("diffusion_models", unet_name))
        options = _options(compute_dtype, path, quantize_on_load, convrot, lora_mode)
        model = load_diffusion_model_int8(file, options)
        return io.NodeOutput(model, ui=_diffusion_report(options, model.model))


class LeanVideoTextEncoderLoaderINT8(io.ComfyNode):
    """Load a text encoder with INT8 linear layers (CLIPLoader's types)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LeanVideoTextEncoderLoaderINT8",
            display_name="Load Text Encoder (INT8)",
            category="advanced/loaders",
            description="Loads a text encoder with INT8 linear layers; float files are quantized on load.",
            inputs=[
                io.Combo.Input(
                    "clip_name",
                    options=folder_paths.get_filename_list("text_encoders"),
                    tooltip="File in models/text_encoders (INT8 or float safetensors).",
                ),
                io.Combo.Input(
                    "type",
                    options=TEXT_ENCODER_TYPES,
                    default="stable_diffusion",
                    tooltip="Which model the text encoder feeds (stable_diffusion: CLIP-L, ltxv: T5-XXL, "
                    "wan: UMT5-XXL); the names are ComfyUI's text encoder types (Load CLIP's, and flux and "
                    "hunyuan_video from DualCLIPLoader's), for the encoders this loader quantizes.",
                ),
                *_shared_inputs(text_encoder=True),
                io.Combo.Input(
                    "device",
                    options=["default", "cpu"],
                    default="default",
                    optional=True,
                    tooltip="cpu keeps the text encoder on the CPU (it encodes there), as in Load CLIP: "
                    "the GPU's memory stays for the diffusion model.",
                ),
            ],
            outputs=[io.Clip.Output(tooltip="The text encoder, its linear layers in INT8.")],
            hidden=[io.Hidden.prompt],
        )

    @classmethod
    def validate_inputs(cls, clip_name: str | None) -> bool | str:
        return file_listed("text_encoders", clip_name)

    @classmethod
    def execute(
        cls,
        clip_name: str,
        type: str,
        compute_dtype: str,
        path: str,
        quantize_on_load: bool,
        convrot: bool,
        device: str = "default",
    ) -> io.NodeOutput:
        require_choices(cls, type=type, compute_dtype=compute_dtype, path=path, device=device)
        require_prompt_choices(getattr(cls.hidden, "prompt", None), LOADERS)  # before anything loads
        file = Path(folder_paths.get_full_path_or_raise("text_encoders", clip_name))
        options = _options(compute_dtype, path, quantize_on_load, convrot)
        clip = load_text_encoder_int8(
            [file],
            type,
            options,
            embedding_directory=folder_paths.get_folder_paths("embeddings"),
            on_cpu=device == "cpu",
        )
        note = text_encoder_dtype_note(COMPUTE_DTYPES[options.compute_dtype])
        return io.NodeOutput(clip, ui=_report(options, clip.cond_stage_model, note))


class LeanVideoCheckpointLoaderINT8(io.ComfyNode):
    """Load a full checkpoint (diffusion model + VAE, as LTXV releases ship) with the diffusion model in
    INT8 and its VAE, reading the file once."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LeanVideoCheckpointLoaderINT8",
            display_name="Load Checkpoint (INT8)",
            category="advanced/loaders",
            description="Loads a full checkpoint: its diffusion model as INT8 (INT8 files as they are, "
            "float and fp8 ones quantized on load) and its VAE, configured from the file's metadata.",
            inputs=[
                io.Combo.Input(
                    "ckpt_name",
                    options=folder_paths.get_filename_list("checkpoints"),
                    tooltip="File in models/checkpoints holding a diffusion model and its VAE "
                    "(e.g. an LTXV release checkpoint).",
                ),
                *_shared_inputs(),
                _lora_mode_input(),
            ],
            outputs=[
                io.Model.Output(tooltip="The checkpoint's diffusion model, its linear layers in INT8."),
                io.Vae.Output(tooltip="The checkpoint's VAE, in its own precision."),
            ],
            hidden=[io.Hidden.prompt],
        )

    @classmethod
    def validate_inputs(cls, ckpt_name: str | None) -> bool | str:
        return file_listed("checkpoints", ckpt_name)

    @classmethod
    def execute(
        cls,
        ckpt_name: str,
        compute_dtype: str,
        path: str,
        quantize_on_load: bool,
        convrot: bool,
        lora_mode: str = "merge",
    ) -> io.NodeOutput:
        require_choices(cls, compute_dtype=compute_dtype, path=path, lora_mode=lora_mode)
        require_prompt_choices(getattr(cls.hidden, "prompt", None), LOADERS)  # before anything loads
        file = Path(folder_paths.get_full_path_or_raise("checkpoints", ckpt_name))
        options = _options(compute_dtype, path, quantize_on_load, convrot, lora_mode)
        model, vae = load_checkpoint_int8(file, options)
        return io.NodeOutput(model, vae, ui=_diffusion_report(options, model.model))


NODES: list[type[io.ComfyNode]] = [
    LeanVideoDiffusionModelLoaderINT8,
    LeanVideoCheckpointLoaderINT8,
    LeanVideoTextEncoderLoaderINT8,
]
# Each INT8 loader's file input and models folder: a loader checks every loader of the prompt before it loads
LOADERS: dict[type[io.ComfyNode], tuple[str, str]] = {
    LeanVideoDiffusionModelLoaderINT8: ("unet_name", "diffusion_models"),
    LeanVideoCheckpointLoaderINT8: ("ckpt_name", "checkpoints"),
    LeanVideoTextEncoderLoaderINT8: ("clip_name", "text_encoders"),
}
