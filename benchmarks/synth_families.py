"""The model families :mod:`benchmarks.synth_models` writes: which files, under which names, in which form.

Each family holds the files its real-size matrix and shipped workflow load, under the names the
pinned ComfyUI templates (or, where no template has the model, its release page) give them, and in the
form those releases have, so that our loaders do what they do on a user's files (quantize on load):

- ``ltxv-13b``: ``checkpoints/ltxv-13b-0.9.7-dev.safetensors``, the release checkpoint: the 13.0 B DiT
  under ``model.diffusion_model.``, the 0.9.5+ VAE under ``vae.``, both bf16, and the DiT ``config`` in
  the metadata; ``text_encoders/t5xxl_fp16.safetensors`` (T5-XXL encoder, fp16);
  ``loras/ltxv-13b-0.9.7-distilled-lora128.safetensors`` (rank 128, bf16).
- ``wan-14b``: ``diffusion_models/wan2.1_t2v_14B_fp8_scaled.safetensors`` (14.3 B, ComfyUI scaled fp8),
  ``vae/wan_2.1_vae.safetensors`` (bf16), ``text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors``
  (scaled fp8, with a stand-in tokenizer) and LightX2V's rank-64 step-distill LoRA.
- ``wan22-14b``: Wan 2.2 T2V A14B, two experts ``wan2.2_t2v_{high,low}_noise_14B_fp8_scaled`` (each the
  Wan 2.1 14B architecture, in scaled fp8), the same VAE and UMT5, and the two LightX2V 4-step LoRAs
  ``wan2.2_t2v_lightx2v_4steps_lora_v1.1_{high,low}_noise`` (rank 64).
- ``wan22-i2v-14b``: Wan 2.2 I2V A14B, the same with ``i2v`` files; its experts take 36 input channels
  (16 latent + 4 mask + 16 image latent) and have no image embedding, which v0.3.75's detection reads
  as a Wan 2.1 ``t2v`` model with ``in_dim`` 36 (``WanImageToVideo`` feeds the extra channels).

"Scaled fp8" is ComfyUI's layout: the block projections (the layers LeanVideo's INT8 policy picks) in
float8_e4m3fn with a float32 per-tensor ``scale_weight``, everything else in the file's float dtype,
and a ``scaled_fp8`` marker tensor.

Example::

    family = FAMILIES["wan22-14b"].with_layers(1)   # full width, one block per expert
    [f.relative for f in family.files]
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from runner.fixtures.layouts import LayoutRequest
from runner.fixtures.ltxv import CHECKPOINT_DIT_PREFIX, CHECKPOINT_VAE_PREFIX

__all__ = ["FAMILIES", "FORMS", "Family", "SynthError", "SynthFile"]

FORMS = ("float", "fp8_scaled", "lora")
LTXV_13B_TRANSFORMER = {
    "num_layers": 48,
    "num_attention_heads": 32,
    "attention_head_dim": 128,
    "cross_attention_dim": 4096,
    "caption_channels": 4096,  # T5-XXL's width
    "in_channels": 128,
}
WAN_14B_DIT = {"dim": 5120, "ffn_dim": 13824, "num_layers": 40, "num_heads": 40, "in_dim": 16, "out_dim": 16}
WAN22_I2V_14B_DIT = {**WAN_14B_DIT, "in_dim": 36}
STAND_IN_TOKENIZER = "comfy/text_encoders/t5_pile_tokenizer/tokenizer.model"
STAND_IN_TOKENIZER_NOTE = f"stand-in: the pinned ComfyUI's {STAND_IN_TOKENIZER}"
WAN_LORA_RANK = 64  # LightX2V's Wan 2.1 v2 and Wan 2.2 4-step LoRAs


class SynthError(RuntimeError):
    """A synthetic model cannot be written (a real file is in the way, an unknown family …)."""


@dataclass(frozen=True)
class SynthFile:
    """One file of a family: where it goes, which layout(s) it holds and how it is stored."""

    relative: str  # path under the models folder
    layout: str  # name of a LayoutRequest of the family (for a LoRA: the DiT it adapts)
    form: str  # one of FORMS
    dtype: torch.dtype = torch.bfloat16  # the float tensors' dtype
    policy_family: str = ""  # fp8_scaled: the INT8 policy family whose layers are stored in fp8
    lora_rank: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)
    tokenizer: bool = False  # embed a SentencePiece model as ``spiece_model``, as UMT5 files do
    prefix: str = ""  # key prefix of ``layout`` in the file
    also: tuple[tuple[str, str], ...] = ()  # more (layout, key prefix) parts of the file (a checkpoint)

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise SynthError(f"{self.relative}: form must be one of {FORMS}, not {self.form!r}")
        if self.form == "fp8_scaled" and not self.policy_family:
            raise SynthError(f"{self.relative}: an fp8_scaled file needs a policy_family")

    @property
    def parts(self) -> tuple[tuple[str, str], ...]:
        """Every (layout, key prefix) the file holds, the primary one first."""
        return ((self.layout, self.prefix), *self.also)


@dataclass(frozen=True)
class Family:
    """A model family: the layouts to read from ComfyUI and the files made from them."""

    name: str
    requests: Mapping[str, LayoutRequest]
    files: tuple[SynthFile, ...]
    dit_layouts: tuple[str, ...]

    def with_layers(self, layers: int) -> Family:
        """The same family with only ``layers`` blocks per DiT (full width), for dry runs on a CPU."""
        if layers < 1:
            raise SynthError(f"--layers must be at least 1, not {layers}")
        requests = dict(self.requests)
        for name in self.dit_layouts:
            requests[name] = replace(requests[name], config={**requests[name].config, "num_layers": layers})
        files = tuple(
            replace(f, metadata=ltxv_dit_metadata(requests[f.layout].config))
            if f.metadata.get("config")
            else f
            for f in self.files
        )
        return replace(self, requests=requests, files=files)

    @property
    def dit_blocks(self) -> int:
        return int(self.requests[self.dit_layouts[0]].config["num_layers"])


def ltxv_dit_metadata(transformer: Mapping[str, object]) -> dict[str, str]:
    """The metadata entry ComfyUI reads the LTXV DiT config from, as in Lightricks' releases."""
    return {"config": json.dumps({"transformer": dict(transformer)}, sort_keys=True)}


def _umt5(relative: str) -> SynthFile:
    return SynthFile(
        relative,
        "text_encoder",
        "fp8_scaled",
        torch.float16,
        policy_family="text_encoder",
        metadata={"tokenizer": STAND_IN_TOKENIZER_NOTE},
        tokenizer=True,
    )


def _wan_requests(dits: Mapping[str, Mapping[str, int]]) -> dict[str, LayoutRequest]:
    return {
        **{name: LayoutRequest("wan_dit", config) for name, config in dits.items()},
        "vae": LayoutRequest("wan_vae", {"dim": 96}),
        "text_encoder": LayoutRequest("umt5_xxl"),
    }


def _wan22(name: str, kind: str, lora_version: str, dit: Mapping[str, int]) -> Family:
    """A Wan 2.2 A14B family: a high-noise and a low-noise expert, each with its 4-step LoRA."""
    experts = ("high", "low")
    dits = tuple(
        SynthFile(
            f"diffusion_models/wan2.2_{kind}_{e}_noise_14B_fp8_scaled.safetensors",
            e,
            "fp8_scaled",
            policy_family="wan",
        )
        for e in experts
    )
    loras = tuple(
        SynthFile(
            f"loras/wan2.2_{kind}_lightx2v_4steps_lora_{lora_version}_{e}_noise.safetensors",
            e,
            "lora",
            lora_rank=WAN_LORA_RANK,
        )
        for e in experts
    )
    return Family(
        name=name,
        requests=_wan_requests(dict.fromkeys(experts, dit)),
        files=(
            *dits,
            SynthFile("vae/wan_2.1_vae.safetensors", "vae", "float"),
            _umt5("text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
            *loras,
        ),
        dit_layouts=experts,
    )


FAMILIES: dict[str, Family] = {
    "ltxv-13b": Family(
        name="ltxv-13b",
        requests={
            "dit": LayoutRequest("ltxv_dit", LTXV_13B_TRANSFORMER),
            "vae": LayoutRequest("ltxv_vae", {"version": 2}),
            "text_encoder": LayoutRequest("t5_xxl"),
        },
        files=(
            SynthFile(
                "checkpoints/ltxv-13b-0.9.7-dev.safetensors",
                "dit",
                "float",
                metadata=ltxv_dit_metadata(LTXV_13B_TRANSFORMER),
                prefix=CHECKPOINT_DIT_PREFIX,
                also=(("vae", CHECKPOINT_VAE_PREFIX),),
            ),
            SynthFile("text_encoders/t5xxl_fp16.safetensors", "text_encoder", "float", torch.float16),
            SynthFile("loras/ltxv-13b-0.9.7-distilled-lora128.safetensors", "dit", "lora", lora_rank=128),
        ),
        dit_layouts=("dit",),
    ),
    "wan-14b": Family(
        name="wan-14b",
        requests=_wan_requests({"dit": WAN_14B_DIT}),
        files=(
            SynthFile(
                "diffusion_models/wan2.1_t2v_14B_fp8_scaled.safetensors",
                "dit",
                "fp8_scaled",
                policy_family="wan",
            ),
            SynthFile("vae/wan_2.1_vae.safetensors", "vae", "float"),
            _umt5("text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
            SynthFile(
                "loras/lightx2v_T2V_14B_cfg_step_distill_v2_lora_rank64_bf16.safetensors",
                "dit",
                "lora",
                lora_rank=WAN_LORA_RANK,
            ),
        ),
        dit_layouts=("dit",),
    ),
    "wan22-14b": _wan22("wan22-14b", "t2v", "v1.1", WAN_14B_DIT),
    "wan22-i2v-14b": _wan22("wan22-i2v-14b", "i2v", "v1", WAN22_I2V_14B_DIT),
}
