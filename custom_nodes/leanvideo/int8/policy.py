"""Which layers to quantize when a float file is quantized (on load or offline), per model family.

Only 2-D ``.weight`` tensors of the repeated transformer blocks' attention and MLP projections are
quantized. Embeddings, norms, the first (patchify) and last (output) projections, timestep and
modulation layers stay in high precision: they are small and quality-sensitive.

Example::

    shapes = {"transformer_blocks.0.attn1.to_q.weight": (2048, 2048)}
    list(plan_quantization(shapes, "ltxv", Int8WeightConfig()))  # ['transformer_blocks.0.attn1.to_q']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from .spec import WEIGHT_SUFFIX, Int8FormatError, Int8WeightConfig

# family → (pattern a quantized weight key must match, pattern that keeps a key in high precision)
FAMILY_RULES: dict[str, tuple[str, str]] = {
    "ltxv": (r"^transformer_blocks\.\d+\.(attn1|attn2|ff)\.", r"norm"),
    "wan": (r"^blocks\.\d+\.(self_attn|cross_attn|ffn)\.", r"norm"),
    "hunyuan_video": (
        r"^(double_blocks|single_blocks)\.\d+\.(img_attn_qkv|img_attn_proj|img_mlp|txt_attn_qkv|"
        r"txt_attn_proj|txt_mlp|linear1|linear2)",
        r"norm|_mod\.|modulation",
    ),
    "flux": (
        r"^(double_blocks|single_blocks)\.\d+\.(img_attn\.qkv|img_attn\.proj|img_mlp|txt_attn\.qkv|"
        r"txt_attn\.proj|txt_mlp|linear1|linear2)",
        r"norm|_mod\.|modulation",
    ),
    # Text encoders (CLIP, T5, UMT5, …): the transformer layers' projections.
    "text_encoder": (r"(^|\.)(layers|block)\.\d+\.", r"norm|embed|relative_attention_bias|layer_norm"),
}


def plan_quantization(
    shapes: Mapping[str, tuple[int, ...]], family: str, config: Int8WeightConfig
) -> dict[str, Int8WeightConfig]:
    """Layer name → config for every weight of ``shapes`` (key → shape) that ``family`` quantizes.

    Rotation and blocks are dropped for layers whose input width they do not divide. Raises
    :class:`Int8FormatError` for an unknown family.
    """
    if family not in FAMILY_RULES:
        raise Int8FormatError(
            f"No quantization rules for model family {family!r}; known families: {sorted(FAMILY_RULES)}"
        )
    quantized, kept = (re.compile(pattern) for pattern in FAMILY_RULES[family])
    plan: dict[str, Int8WeightConfig] = {}
    for key, shape in shapes.items():
        if len(shape) != 2 or not key.endswith(WEIGHT_SUFFIX):
            continue
        if not quantized.search(key) or kept.search(key):
            continue
        plan[key[: -len(WEIGHT_SUFFIX)]] = _fit(config, shape[1])
    return plan


def _fit(config: Int8WeightConfig, in_features: int) -> Int8WeightConfig:
    if config.convrot and in_features % config.convrot_group:
        config = replace(config, convrot=False)
    if config.block_size is not None and in_features % config.block_size:
        config = replace(config, granularity="row", block_size=None)
    return config


# Files that are not quantized, by a key only they have: (kind, pattern, what to do instead).
_NOT_QUANTIZED: tuple[tuple[str, str, str], ...] = (
    (
        "LoRA",
        # LoRA (kohya, diffusers, PEFT with its adapter name), LoHa, LoKr, and weight diffs: what
        # ComfyUI's comfy/lora.py applies as patches
        r"(\.|_)(lora_[AB]|lora_up|lora_down|lora\.up|lora\.down|lora_linear_layer\.(up|down))"
        r"(\.default)?\.weight$|\.(hada_w[12]_[ab]|hada_t[12]|lokr_w[12](_[ab])?|lokr_t2|diff|diff_b)$",
        "load it as it is with LoraLoaderModelOnly on the INT8 model (the loaders' lora_mode decides how "
        "it is applied)",
    ),
    (
        "VAE",
        # diffusers/LTXV/Hunyuan layout (conv_in, up_blocks, …) and Wan's (conv1, middle, upsamples, …)
        r"(^|\.)(decoder|encoder)\.(conv_in|conv_out|up_blocks|down_blocks|mid_block|conv1|middle|upsamples"
        r"|downsamples|head)\.",
        "VAEs stay in their own precision; load it with Load VAE",
    ),
)

# Key patterns that identify a family without ComfyUI (the CLI); loaders use ComfyUI's detection.
_FAMILY_MARKERS: tuple[tuple[str, str], ...] = (
    ("ltxv", r"(^|\.)transformer_blocks\.\d+\.attn1\.to_q\.weight$"),
    ("wan", r"(^|\.)blocks\.\d+\.self_attn\.q\.weight$"),
    ("hunyuan_video", r"(^|\.)double_blocks\.\d+\.img_attn_qkv\.weight$"),
    ("flux", r"(^|\.)double_blocks\.\d+\.img_attn\.qkv\.weight$"),
    ("text_encoder", r"(^|\.)(encoder\.layers|encoder\.block)\.\d+\."),
)


def guess_family(keys: Iterable[str], *, source: str = "state dict") -> str:
    """The family whose marker key appears in ``keys``; :class:`Int8FormatError` naming ``source`` if none
    (or when the file is a LoRA or a VAE, which are not quantized)."""
    keys = list(keys)
    refuse_unquantizable(keys, source=source, kinds=("LoRA",))
    if (family := _marked_family(keys)) is not None:
        return family
    refuse_unquantizable(keys, source=source)  # a VAE beside a diffusion model is a full checkpoint
    raise Int8FormatError(
        f"{source}: cannot tell the model family from its keys; pass one of {sorted(FAMILY_RULES)} explicitly"
    )


# With their article, as a message says them: "an LTXV checkpoint"
FAMILY_NAMES = {"ltxv": "an LTXV", "wan": "a Wan", "hunyuan_video": "a HunyuanVideo", "flux": "a Flux"}


def _marked_family(keys: list[str]) -> str | None:
    for family, marker in _FAMILY_MARKERS:
        pattern = re.compile(marker)
        if any(pattern.search(key) for key in keys):
            return family
    return None


def other_family(keys: Iterable[str], family: str, *, source: str) -> str | None:
    """What to say when ``source``, which has no layer of ``family``, holds a model of another family by
    its keys (a Wan family asked of an LTXV checkpoint), else ``None``."""
    marked = _marked_family(list(keys))
    if marked is None or marked == family:
        return None
    what = (
        "a text encoder" if marked == "text_encoder" else f"{FAMILY_NAMES.get(marked, f'a {marked}')} model"
    )
    return f"{source}: no layer of family {family!r} to quantize: it holds {what} (family {marked!r})"


def describe_misplaced(keys: Iterable[str], *, source: str, wanted: str) -> str | None:
    """What ``source`` is, by its keys, when it is not the kind of model a loader of ``wanted``
    (``"diffusion model"`` or ``"text encoder"``) takes: a LoRA, a VAE, a text encoder or a diffusion
    model, with the loader that takes it. ``None`` when its keys do not say."""
    keys = list(keys)
    if (lora := not_quantized(keys, source=source, kinds=("LoRA",))) is not None:
        return lora
    family = _marked_family(keys)
    if family is None:
        return not_quantized(keys, source=source)
    if family == "text_encoder" and wanted != "text encoder":
        return f"{source}: a text encoder; load it with Load Text Encoder (INT8)"
    if family != "text_encoder" and wanted == "text encoder":
        name = FAMILY_NAMES.get(family, f"a {family}")
        if any(key.startswith(("vae.", "first_stage_model.")) for key in keys):
            loader = "Load Checkpoint (INT8)"
            return f"{source}: {name} checkpoint (diffusion model and VAE); load it with {loader}"
        return f"{source}: {name} diffusion model; load it with Load Diffusion Model (INT8)"
    return None


def not_quantized(
    keys: Iterable[str], *, source: str, kinds: tuple[str, ...] = ("LoRA", "VAE")
) -> str | None:
    """What to say when ``source``'s keys are a LoRA's or a VAE's (of ``kinds``), else ``None``: a LoRA
    is applied to the INT8 model as it is (quantized, its weights would load without their scales), and
    a VAE is small and convolutional."""
    keys = list(keys)
    for kind, marker, advice in _NOT_QUANTIZED:
        if kind not in kinds:
            continue
        pattern = re.compile(marker)
        if (key := next((k for k in keys if pattern.search(k)), None)) is not None:
            if kind == "LoRA" and any(k.startswith(_TEXT_ENCODER_LORA) for k in keys if pattern.search(k)):
                advice = _TEXT_ENCODER_LORA_ADVICE  # LoraLoaderModelOnly has no clip input
            return f"{source}: a {kind} (key {key!r}), which is not quantized: {advice}"
    return None


# Key prefixes of a LoRA's text-encoder part (kohya's lora_te, lora_te1/2; diffusers/PEFT)
_TEXT_ENCODER_LORA = ("lora_te_", "lora_te1_", "lora_te2_", "text_encoder.", "text_encoders.", "te.")
_TEXT_ENCODER_LORA_ADVICE = (
    "load it as it is with LoraLoader, its clip input fed by Load Text Encoder (INT8) (with its model "
    "input on the diffusion model, for the rest of the LoRA)"
)


def refuse_unquantizable(
    keys: Iterable[str], *, source: str, kinds: tuple[str, ...] = ("LoRA", "VAE")
) -> None:
    """Raise :class:`Int8FormatError` with :func:`not_quantized`'s message when there is one."""
    if (message := not_quantized(keys, source=source, kinds=kinds)) is not None:
        raise Int8FormatError(message)
