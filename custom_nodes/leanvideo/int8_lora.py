"""LoRA on INT8 models, two ways, chosen per model with ``lora_mode``:

- ``merge`` (default): ComfyUI's own patching. When the model is patched, each LoRA'd INT8 weight
  is dequantized, the LoRA added in float32 and the sum requantized once (``set_weight`` in
  :mod:`.int8_ops`); sampling steps then run on plain INT8 weights. Unpatching restores the
  original int8 tensor (data and scale) from ComfyUI's backup, bit for bit.
- ``side_branch``: the INT8 weight is never touched; each patched layer computes
  ``int8_linear(x) + Σ scale · (x @ A.T) @ B.T`` with the LoRA's own factors (exact, no
  requantization error, a small per-step cost proportional to the LoRA rank).

Side branches are installed by :class:`Int8ModelPatcher`, a ``ModelPatcher`` whose
``patch_weight_to_device`` attaches the factors instead of merging, for plain LoRA patches on our
INT8 layers (anything else, e.g. DoRA, LoCon or a model strength ≠ 1, is merged as usual). Its
clones stay of the same class, so ``LoraLoaderModelOnly`` and friends work unchanged.

Example::

    patcher = Int8ModelPatcher.wrap(comfy.sd.load_diffusion_model_state_dict(sd, model_options=...))
"""

from __future__ import annotations

import logging
from typing import Any

import comfy.model_patcher
import comfy.utils
import torch
from comfy.weight_adapter.lora import LoRAAdapter

LORA_MODES = ("merge", "side_branch")

logger = logging.getLogger(__name__)

LoraBranch = tuple[torch.Tensor, torch.Tensor, float]  # (down [rank, in], up [out, rank], scale)


def _branches(patches: list[tuple[Any, ...]]) -> list[LoraBranch] | None:
    """The low-rank factors of ``patches``, or ``None`` when any patch is not a plain LoRA."""
    branches: list[LoraBranch] = []
    for strength, adapter, strength_model, offset, function in patches:
        if not isinstance(adapter, LoRAAdapter) or strength_model != 1.0 or offset is not None or function:
            return None
        up, down, alpha, mid, dora_scale, reshape = adapter.weights
        if mid is not None or dora_scale is not None or reshape is not None or up.ndim != 2:
            return None
        scale = float(strength) * (float(alpha) / down.shape[0] if alpha is not None else 1.0)
        branches.append((down, up, scale))
    return branches


def _fitting(key: str, branches: list[LoraBranch], shape: tuple[int, int]) -> list[LoraBranch]:
    """The ``branches`` whose factors fit a layer of weight ``shape`` (out, in). One that does not (a
    LoRA of another model) is logged and left out, as ComfyUI's merge leaves it out in ``merge`` mode;
    it failed in the sampler with a bare matmul shape error."""
    fitting = []
    for down, up, scale in branches:
        if (up.shape[0], down.shape[1]) == shape and up.shape[1] == down.shape[0]:
            fitting.append((down, up, scale))
            continue
        logger.error(
            "ERROR lora %s: its factors %s (up) and %s (down) do not fit the layer's weight %s: skipped "
            "(a LoRA of another model?)",
            key,
            list(up.shape),
            list(down.shape),
            list(shape),
        )
    return fitting


def apply_branches(x: torch.Tensor, branches: list[LoraBranch]) -> torch.Tensor:
    """``Σ scale · (x @ down.T) @ up.T`` in ``x``'s dtype and device."""
    total: torch.Tensor | None = None
    for down, up, scale in branches:
        low = torch.nn.functional.linear(x, down.to(x.device, x.dtype))
        out = torch.nn.functional.linear(low, up.to(x.device, x.dtype)) * scale
        total = out if total is None else total + out
    assert total is not None
    return total


class Int8ModelPatcher(comfy.model_patcher.ModelPatcher):  # type: ignore[misc]
    """A ModelPatcher that installs exact LoRA side branches on INT8 layers in ``side_branch`` mode."""

    @classmethod
    def wrap(cls, patcher: comfy.model_patcher.ModelPatcher) -> Int8ModelPatcher:
        """A fresh patcher of this class for ``patcher``'s (unpatched) model. Its size is measured
        anew on first use: ``patcher`` may have measured before the INT8 weights were loaded."""
        wrapped = cls(patcher.model, patcher.load_device, patcher.offload_device)
        wrapped.is_clip = patcher.is_clip
        wrapped.hook_mode = patcher.hook_mode
        return wrapped

    def _side_branch_module(self, key: str) -> Any:
        module_name, _, param = key.rpartition(".")
        if param != "weight" or not module_name:
            return None
        module = comfy.utils.get_attr(self.model, module_name)
        return module if getattr(module, "lora_mode", "merge") == "side_branch" else None

    def patch_weight_to_device(self, key: str, device_to: Any = None, inplace_update: bool = False) -> None:
        module = self._side_branch_module(key) if key in self.patches else None
        branches = _branches(self.patches[key]) if module is not None else None
        if branches is None:
            super().patch_weight_to_device(key, device_to=device_to, inplace_update=inplace_update)
            return
        device = device_to if device_to is not None else module.weight.device
        fitting = _fitting(key, branches, (module.out_features, module.in_features))
        module.lora_branches = [(down.to(device), up.to(device), scale) for down, up, scale in fitting]

    def unpatch_model(self, device_to: Any = None, unpatch_weights: bool = True) -> None:
        super().unpatch_model(device_to=device_to, unpatch_weights=unpatch_weights)
        if unpatch_weights:
            for module in self.model.modules():
                if getattr(module, "lora_branches", None):
                    module.lora_branches = []
