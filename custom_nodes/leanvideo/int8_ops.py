"""ComfyUI layer ops for INT8 weights: a Linear that holds int8 + scale as one tensor.

An INT8 weight lives on the module as ComfyUI's own ``QuantizedTensor`` (``comfy/quant_ops.py``) with
our layout :class:`LeanVideoInt8Layout`: the int8 data and its scale are one object, so every
``.to(device)`` ComfyUI does (full load, partial load, offload) moves them together, and the
model patcher's weight backups hold both.

LoRA (stock ``LoraLoaderModelOnly``) merges once when the model is patched: ``convert_weight``
dequantizes, ComfyUI adds the patches in float32, ``set_weight`` requantizes into a new tensor. The
original tensor is kept by ComfyUI's backup, so unpatching restores it bit for bit, and sampling
steps run on plain INT8 weights (no per-step LoRA cost).

ComfyUI sizes models and layers from their state dicts, so a layer's state dict lists the scale too
(``weight_scale``, as in the file): sizes and loaded bytes count int8 data, scales and float tensors.

Ops classes are made per configuration by :func:`make_int8_ops`, as ``comfy/ops.py`` does. Each ops
class holds the :class:`~leanvideo.int8.dispatch.KernelDispatcher` that picks (by measurement) or is
forced onto the INT8 kernel of every layer shape it runs.

Example::

    ops = make_int8_ops(route="auto", dispatcher=KernelDispatcher(cache_path=table))
    comfy.sd.load_diffusion_model_state_dict(sd, model_options={"custom_operations": ops})
"""

from __future__ import annotations

import logging
from typing import Any

import comfy.model_management
import comfy.ops
import comfy.quant_ops
import torch
from comfy.quant_ops import QuantizedLayout, QuantizedTensor

from .int8 import Int8Weight, Int8WeightConfig, quantize_weight
from .int8.dispatch import KernelDispatcher
from .int8.dispatch_report import WeightShape
from .int8.formats.common import config_from_tensor, infer_config
from .int8.kernel_table import layout_of
from .int8.linear import kernel_of_route
from .int8.quantize import dequantize
from .int8.spec import CONFIG_SUFFIX, SCALE_SUFFIX, Int8FormatError
from .int8_lora import LORA_MODES, LoraBranch, apply_branches

LAYOUT = "LeanVideoInt8Layout"

logger = logging.getLogger(__name__)


class LeanVideoInt8Layout(QuantizedLayout):
    """Layout params: ``scale`` (float32 tensor), ``config`` (:class:`Int8WeightConfig`), ``orig_dtype``."""

    @classmethod
    def quantize(  # type: ignore[override]
        cls, tensor: torch.Tensor, config: Int8WeightConfig, orig_dtype: torch.dtype | None = None, **_: Any
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        packed = quantize_weight(tensor, config)
        return packed.qdata, {
            "scale": packed.scale,
            "config": config,
            "orig_dtype": orig_dtype or tensor.dtype,
        }

    @staticmethod
    def dequantize(  # type: ignore[override]
        qdata: torch.Tensor, scale: torch.Tensor, config: Int8WeightConfig, orig_dtype: torch.dtype, **_: Any
    ) -> torch.Tensor:
        return dequantize(qdata, scale, config, orig_dtype)

    @classmethod
    def get_plain_tensors(cls, qtensor: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return qtensor._qdata, qtensor._layout_params["scale"]


# ComfyUI looks layouts up by name in this table; ours has a name no upstream layout uses.
comfy.quant_ops.LAYOUTS.setdefault(LAYOUT, LeanVideoInt8Layout)


def int8_tensor(packed: Int8Weight, orig_dtype: torch.dtype) -> QuantizedTensor:
    """Wrap an INT8 weight as the tensor the ops hold."""
    params = {"scale": packed.scale, "config": packed.config, "orig_dtype": orig_dtype}
    return QuantizedTensor(packed.qdata, LAYOUT, params)


def unpack(weight: QuantizedTensor) -> Int8Weight:
    return Int8Weight(weight._qdata, weight._layout_params["scale"], weight._layout_params["config"])


def is_int8(weight: Any) -> bool:
    return isinstance(weight, QuantizedTensor) and weight._layout_type == LAYOUT


class Int8Linear(torch.nn.Module, comfy.ops.CastWeightBiasOp):
    """A Linear whose weight may be LeanVideo INT8 (``weight`` + ``weight_scale`` [+ ``comfy_quant``]);
    float weights stay float. :func:`make_int8_ops` makes a subclass per kernel dispatcher and LoRA mode."""

    dispatcher: KernelDispatcher  # set on each subclass by make_int8_ops
    lora_mode: str = "merge"
    lora_branches: list[LoraBranch] = []  # noqa: RUF012 (replaced per instance, never mutated)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.factory_dtype = dtype
        # No weight yet: allocating float placeholders for every layer would cost the full
        # float model in memory before the int8 weights arrive.
        self.register_parameter("weight", None)
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        return None

    @property
    def weight_scale(self) -> torch.Tensor | None:
        """The INT8 weight's scale (``None`` for a float weight). ComfyUI reads every
        state-dict key back as an attribute, so the key below needs this name."""
        return self.weight._layout_params["scale"] if is_int8(self.weight) else None

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        # ComfyUI sizes models and layers from their state dicts (model_management.module_size):
        # the scale lives inside the int8 tensor, so it is listed too, under its file key.
        super()._save_to_state_dict(destination, prefix, keep_vars)
        scale = self.weight_scale
        if scale is not None:
            destination[prefix + SCALE_SUFFIX.lstrip(".")] = scale if keep_vars else scale.detach()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, torch.Tensor],
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        weight = state_dict.pop(prefix + "weight", None)
        scale = state_dict.pop(prefix + SCALE_SUFFIX.lstrip("."), None)
        entry_tensor = state_dict.pop(prefix + CONFIG_SUFFIX.lstrip("."), None)
        state_dict.pop(prefix + "input_scale", None)
        layer = prefix.rstrip(".")
        expected = (self.out_features, self.in_features)
        if weight is not None and tuple(weight.shape) != expected:  # as nn.Linear would refuse it
            raise Int8FormatError(
                f"tensor {prefix + 'weight'!r} is {'×'.join(map(str, weight.shape))}, but this model's layer "
                f"takes {expected[0]}×{expected[1]}: the file is damaged or is another model's"
            )
        if weight is None:
            missing_keys.append(prefix + "weight")
            shape = (self.out_features, self.in_features)
            self.weight = torch.nn.Parameter(
                torch.empty(shape, dtype=self.factory_dtype), requires_grad=False
            )
        elif weight.dtype == torch.int8:
            if scale is None:
                raise Int8FormatError(f"int8 weight {prefix + 'weight'!r} has no scale")
            entry = {} if entry_tensor is None else config_from_tensor(entry_tensor, where=layer)
            config = infer_config(tuple(weight.shape), tuple(scale.shape), entry, where=layer)
            if config.granularity == "row":
                scale = scale.reshape(-1, 1)
            packed = Int8Weight(weight, scale.to(torch.float32), config)
            orig = self.factory_dtype if self.factory_dtype is not None else torch.float32
            self.weight = torch.nn.Parameter(int8_tensor(packed, orig), requires_grad=False)
        else:
            self.weight = torch.nn.Parameter(weight, requires_grad=False)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if prefix + "weight" in missing_keys and weight is not None:
            missing_keys.remove(prefix + "weight")

    def forward(self, input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        comfy.ops.run_every_op()
        device = input.device
        weight = self.weight
        if weight.device != device:
            weight = weight.to(device)  # int8 data and scale move as one tensor
        bias = self.bias
        if bias is not None:
            bias = bias.to(device=device, dtype=input.dtype)
        for function in self.weight_function:  # low-VRAM LoRA patches (ComfyUI's LowVramPatch)
            weight = function(weight)
        for function in self.bias_function:
            bias = function(bias)
        if is_int8(weight):
            out = self.dispatcher.linear(input, unpack(weight), bias)  # type: ignore[arg-type]
        else:
            out = torch.nn.functional.linear(input, weight.to(input.dtype), bias)
        if self.lora_branches and not self.weight_function:  # low-VRAM patches already hold the LoRA
            out = out + apply_branches(input, self.lora_branches)
        return out

    def convert_weight(self, weight: torch.Tensor, inplace: bool = False, **kwargs: Any) -> torch.Tensor:
        """The float32 weight ComfyUI's LoRA math adds patches to."""
        if is_int8(weight):
            packed = unpack(weight)  # type: ignore[arg-type]
            return dequantize(packed.qdata, packed.scale, packed.config, torch.float32)
        return weight

    def set_weight(
        self,
        weight: torch.Tensor,
        inplace_update: bool = False,
        seed: int | None = None,
        return_weight: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor | None:
        """Requantize a patched float weight into a new tensor (never in place: the patcher's
        backup of the original must stay intact for an exact unpatch)."""
        if is_int8(self.weight):
            params = self.weight._layout_params
            new = int8_tensor(quantize_weight(weight, params["config"]), params["orig_dtype"])
        else:
            new = weight.to(self.weight.dtype)
        if return_weight:
            return new
        self.weight = torch.nn.Parameter(new, requires_grad=False)
        return None


def make_int8_ops(
    route: str = "auto", lora_mode: str = "merge", dispatcher: KernelDispatcher | None = None
) -> type[comfy.ops.manual_cast]:
    """An ops family whose Linear reads int8 weights (``weight`` + ``weight_scale`` [+ ``comfy_quant``])
    and runs them on the kernels ``dispatcher`` chooses; float weights stay float. Without a
    dispatcher one is made from ``route`` (a :data:`~leanvideo.int8.linear.MATMUL_ROUTES` value: ``auto``
    measures, a kernel name forces it) with no table on disk. ``lora_mode`` is ``merge`` or
    ``side_branch`` (see :mod:`.int8_lora`). Other layers are ComfyUI's ``manual_cast`` ops. A class
    per configuration, as ``comfy/ops.py`` makes them."""
    forced = kernel_of_route(route)
    if lora_mode not in LORA_MODES:
        raise ValueError(f"lora_mode must be one of {LORA_MODES}, not {lora_mode!r}")
    if dispatcher is None:
        dispatcher = KernelDispatcher(forced=forced)
    linear = type("Linear", (Int8Linear,), {"dispatcher": dispatcher, "lora_mode": lora_mode})
    return type("Int8Ops", (comfy.ops.manual_cast,), {"Linear": linear})


def int8_weight_shapes(model: torch.nn.Module) -> set[WeightShape]:
    """The ``(out, in, layout)`` of ``model``'s INT8 Linear weights, as their kernel choices name them."""
    return {
        (int(m.weight.shape[0]), int(m.weight.shape[1]), layout_of(m.weight._layout_params["config"]))
        for m in model.modules()
        if isinstance(m, Int8Linear) and is_int8(m.weight)
    }
