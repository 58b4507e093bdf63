"""Load a full release checkpoint (diffusion model + VAE in one file, config in its metadata) with the
diffusion model in INT8 and the VAE as ComfyUI builds it, reading each tensor of the file once.

LTXV 0.9.x releases are such checkpoints: ``model.diffusion_model.*``, ``vae.*`` and a ``config`` JSON
in the safetensors metadata (``transformer`` and ``vae`` objects). v0.3.75's ``VAELoader`` ignores
metadata, so the VAE has to come from the checkpoint; this loader builds it the way
``comfy.sd.load_state_dict_guess_config`` does, without loading the diffusion model a second time.

Example::

    model, vae = load_checkpoint_int8(Path("models/checkpoints/ltxv-2b-0.9.8-distilled.safetensors"))
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import comfy.sd
import comfy.utils

from .int8.files import diffusion_model_keys, read_header, read_tensors
from .int8.spec import Int8FormatError
from .int8_loading import Int8LoadOptions, build_diffusion_model, detect_model_config, read_for_loading

logger = logging.getLogger(__name__)


def load_checkpoint_int8(path: Path, options: Int8LoadOptions | None = None) -> tuple[Any, Any]:
    """``(ModelPatcher, VAE)`` of the full checkpoint ``path``: its diffusion model through the INT8
    path (INT8 files as they are, float and fp8 quantized on load), its VAE from the keys ComfyUI's
    model config names (``vae.*`` for LTXV) with the file's metadata.

    Raises :class:`Int8FormatError`, naming the file, when it holds no VAE; that is checked before
    the diffusion model is built.
    """
    options = options or Int8LoadOptions()
    header = read_header(path)
    dit_keys = diffusion_model_keys(header)
    loaded = read_for_loading(path, options, dit_keys)
    detected = detect_model_config(loaded.tensors, loaded.metadata, source=str(path))
    model_config = detected[0]
    prefixes = tuple(model_config.vae_key_prefix)
    vae_keys = [key for key in header.dtypes if key.startswith(prefixes)]
    if not vae_keys:
        raise Int8FormatError(
            f"{path}: holds no VAE (no tensor starts with {' or '.join(map(repr, prefixes))}); it is a "
            "diffusion model alone: load it with Load Diffusion Model (INT8) and its VAE with Load VAE"
        )
    model = build_diffusion_model(loaded, options, detected)
    del loaded
    vae_sd = comfy.utils.state_dict_prefix_replace(
        read_tensors(path, vae_keys), dict.fromkeys(prefixes, ""), filter_keys=True
    )
    vae = comfy.sd.VAE(sd=model_config.process_vae_state_dict(vae_sd), metadata=header.metadata)
    try:
        vae.throw_exception_if_invalid()
    except RuntimeError as error:
        raise Int8FormatError(f"{path}: ComfyUI could not build a VAE from its {prefixes} tensors") from error
    logger.info("Loaded the VAE of %s (%d tensors)", path, len(vae_keys))
    return model, vae
