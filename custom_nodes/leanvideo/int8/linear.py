"""INT8 linear kernels: W8A16 (dequantize, float matmul) and four W8A8 ones (int8 × int8 → int32, rescale).

- ``w8a16`` dequantizes the weight to the input's dtype and runs a float matmul; every device, every
  weight layout.
- ``int_mm`` quantizes each activation row (token) with its own absmax scale, multiplies with
  ``torch._int_mm`` and rescales by ``activation_scale × weight_scale``. On CUDA the kernel needs more
  than 16 rows and both weight dimensions multiples of 8; on a CPU it takes any shape. Quantizing the
  activations and rescaling the output are a few elementwise passes each, run one after another.
- ``int_mm_fused`` is the same maths compiled by ``torch.compile`` (inductor) as one graph: quantizing
  becomes one kernel (Triton on CUDA, C++ on a CPU), ``torch._int_mm`` stays the library's, and the
  rescale one kernel more, so the passes over the activations and the output shrink to one read and one
  write each. It compiles at first use (seconds, once per process; shapes are dynamic); where compiling
  fails, the dispatcher rules it out. The dispatcher measures it on a GPU only (on a CPU it gains a few
  % per layer, not worth each server's compile); forced, it runs anywhere.
- ``kitchen`` is comfy-kitchen's ``int8_linear`` (ComfyUI's kernel library, optional: ``pip install
  .[cuda]``): the same maths with activation quantization fused into cuBLASLt/Triton kernels on CUDA and
  an eager backend elsewhere. Convrot layers rotate with comfy-kitchen's own (regular) Hadamard
  matrix, so comfy-kitchen rotates their activations itself (fused into its quantizer on CUDA at group
  256); only version-1 files' Sylvester-rotated layers have their activations rotated here first.
- ``onednn`` is ``int_mm``'s maths through oneDNN's int8 linear (:mod:`.onednn`), on a CPU with VNNI
  or AMX: the one W8A8 kernel of a CPU with AVX-VNNI but no AVX-512 VNNI, where ``torch._int_mm``
  multiplies element by element. Traced by ``torch.compile``, it runs ``int_mm``'s ops (the same
  numbers) where ``torch._int_mm`` reaches oneDNN, else ``w8a16``'s.

No W8A8 kernel takes block-wise weight scales. Which kernel runs a layer is the dispatcher's
choice (:mod:`.dispatch`); :func:`int8_linear` runs one named kernel and falls back to ``w8a16`` where
it cannot run the shape. Tests drive the W8A8 maths on any device with :func:`reference_int_mm`.

Example::

    y = int8_linear(x, packed, bias, route="int_mm")
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Literal

import torch

from .device import cpu_flags
from .hadamard import rotate_groups
from .kitchen_op import KITCHEN_MODULE, kitchen_int8_linear_op
from .onednn import OneDNNWeights, onednn_rows, onednn_unsupported
from .quantize import Int8Weight, dequantize
from .spec import QMAX

logger = logging.getLogger(__name__)

# The kernels, in the order the dispatcher tries them; "w8a16" is the baseline every other must beat.
Kernel = Literal["w8a16", "int_mm", "int_mm_fused", "kitchen", "onednn"]
KERNELS: tuple[str, ...] = ("w8a16", "int_mm", "int_mm_fused", "kitchen", "onednn")
# What the loaders' ``path`` input offers: "auto" measures, a kernel name forces that kernel, and
# "w8a8" is the older name of "int_mm" (kept so saved workflows still validate).
MatmulRoute = Literal["auto", "w8a16", "int_mm", "int_mm_fused", "kitchen", "onednn", "w8a8"]
MATMUL_ROUTES: tuple[str, ...] = ("auto", "w8a16", "int_mm", "int_mm_fused", "kitchen", "onednn", "w8a8")
ROUTE_ALIASES: dict[str, str] = {"w8a8": "int_mm"}
IntMatmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
W8A8Rows = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.dtype], torch.Tensor
]

# torch.compile modes int_mm_fused may be compiled in: inductor's default (``None``: quantizing one
# kernel, torch._int_mm the library's, the rescale one more), or max-autotune without CUDA graphs, where
# inductor also times its own Triton int8 matmuls against the library's and, when one wins, can fuse the
# rescale into it (the int32 product never written): minutes of compiling on a GPU, unmeasured there so
# far; only ``benchmarks/int8_bench.py --fused-mode`` asks for it. Compiled per shape there (static
# shapes: a kernel tuned for one shape is not reused for another; past torch's 8 recompiles per function
# a shape runs op by op). (Modes with CUDA graphs do not suit a function called once per layer with that
# layer's weight.)
FUSED_MODES: tuple[str | None, ...] = (None, "max-autotune-no-cudagraphs")
_INT_MM_MIN_ROWS = 17  # torch._int_mm needs more than 16 rows on CUDA
_INT_MM_MULTIPLE = 8


def kernel_of_route(route: str) -> str | None:
    """The kernel a ``path``/route value forces (``None`` for ``auto``); raises on an unknown value."""
    if route not in MATMUL_ROUTES:
        raise ValueError(f"route must be one of {MATMUL_ROUTES}, not {route!r}")
    return None if route == "auto" else ROUTE_ALIASES.get(route, route)


def import_kitchen() -> ModuleType | None:
    """comfy-kitchen when it is installed and imports, else ``None`` (the reason is logged)."""
    try:
        return importlib.import_module(KITCHEN_MODULE)
    except ImportError:
        logger.debug("comfy-kitchen is not installed; its INT8 kernel is not a candidate")
    except Exception:  # a broken install (wrong CUDA build, missing library) must not break loading
        logger.warning("comfy-kitchen is installed but does not import; its kernel is skipped", exc_info=True)
    return None


def reference_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int8 × int8 → int32 matmul on any device (slow; for tests and as the W8A8 oracle)."""
    return torch.matmul(a.to(torch.int32), b.to(torch.int32))


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.ndim else 0


def unsupported_reason(
    kernel: str, x: torch.Tensor, packed: Int8Weight, kitchen: ModuleType | None = None
) -> str | None:
    """Why ``kernel`` cannot run ``x @ W.T`` for this weight, or ``None`` when it can."""
    if kernel == "w8a16":
        return None
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    if packed.config.granularity == "block":
        return "W8A8 needs per-tensor or per-row weight scales, not block-wise ones"
    if x.ndim == 0 or _rows(x) == 0:
        return "empty input"
    if kernel == "kitchen":
        return "comfy-kitchen is not installed or does not import" if kitchen is None else None
    if kernel == "onednn":
        return onednn_unsupported(x)
    if kernel == "int_mm_fused" and not _compile_supported():
        return "torch.compile does not run on this Python"
    out_features, in_features = packed.qdata.shape
    if x.is_cuda and _rows(x) < _INT_MM_MIN_ROWS:
        return f"torch._int_mm on CUDA needs more than 16 rows, not {_rows(x)}"
    if x.is_cuda and (in_features % _INT_MM_MULTIPLE or out_features % _INT_MM_MULTIPLE):
        return f"torch._int_mm on CUDA needs multiples of 8, not {out_features}×{in_features}"
    return None


def int_mm_cpu_fallback() -> str | None:
    """Why ``torch._int_mm`` would run torch's scalar loop on this CPU, or ``None`` when it runs oneDNN's
    int8 GEMM. torch (its ``_int_mm_out_cpu``) calls oneDNN only where the CPU has AVX-512 VNNI and
    oneDNN is on (``torch.backends.mkldnn``); elsewhere (AVX2-only or AVX-VNNI-only CPUs) it multiplies
    element by element: 17–22× the time of a float matmul measured with oneDNN off, 27–43× on an
    AVX2-only EPYC. Every W8A8 kernel here, comfy-kitchen's eager backend included, ends in
    ``torch._int_mm`` on a CPU."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return "torch was built without oneDNN, so torch._int_mm runs its scalar loop"
    if not torch.backends.mkldnn.enabled:
        return "oneDNN is switched off in torch.backends.mkldnn, so torch._int_mm runs its scalar loop"
    vnni = getattr(torch.cpu, "_is_vnni_supported", None)  # private; the cpuinfo flag where it is gone
    if not (vnni() if vnni is not None else "avx512_vnni" in cpu_flags()):
        return "this CPU has no AVX-512 VNNI, so torch._int_mm runs its scalar loop instead of oneDNN"
    return None


def onednn_weights() -> OneDNNWeights:
    """A store of the ``onednn`` kernel's packed weights; traced by torch.compile the kernel runs
    ``int_mm``'s ops where ``torch._int_mm`` reaches oneDNN here, else ``w8a16``'s."""
    return OneDNNWeights(traced="int_mm" if int_mm_cpu_fallback() is None else "w8a16")


def _compile_supported() -> bool:
    import torch._dynamo  # torch.compile's front end, imported only when the fused kernel is asked about

    return bool(torch._dynamo.is_dynamo_supported())  # type: ignore[attr-defined]


def w8a8_fits(x: torch.Tensor, packed: Int8Weight) -> bool:
    """Whether ``torch._int_mm`` can run this input and weight (see :func:`unsupported_reason`)."""
    return unsupported_reason("int_mm", x, packed) is None


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 quantization of a 2-D tensor: ``(int8 rows, float32 [rows, 1] scales)``."""
    work = x.to(torch.float32)
    scale = work.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / QMAX
    return torch.round(work / scale).clamp_(-QMAX, QMAX).to(torch.int8), scale


def rescale_output(
    accumulated: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``int32 [rows, out] × activation scales [rows, 1] × weight scales [1, out] (+ bias)`` in float32,
    returned as ``dtype``."""
    out = accumulated.to(torch.float32) * x_scale * weight_scale
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(dtype)


def w8a8_rows(
    rows: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    int_mm: IntMatmul = torch._int_mm,
) -> torch.Tensor:
    """W8A8 on 2-D rows: quantize them, ``int_mm`` with the int8 weight ``[in, out]``, rescale by the
    weight scales ``[1, out]`` (+ bias), return ``dtype``."""
    x_q, x_scale = quantize_activations(rows)
    return rescale_output(int_mm(x_q, weight_t), x_scale, weight_scale, bias, dtype)


class FusedW8A8:
    """:func:`w8a8_rows` compiled by ``torch.compile`` with dynamic shapes. Set up at the first call
    (torch.compile's own set-up costs about a second the first time in a process); compiled code is kept
    per function by torch, so every instance after the first compiles nothing. Inside a model that
    torch.compile compiles whole, the plain function is traced into the model's graph instead. For
    inference: the inputs are detached. ``mode`` is torch.compile's (one of :data:`FUSED_MODES`)."""

    def __init__(self, mode: str | None = None) -> None:
        if mode not in FUSED_MODES:
            raise ValueError(f"int_mm_fused compile mode must be one of {FUSED_MODES}, not {mode!r}")
        self.mode = mode
        self._compiled: W8A8Rows | None = None
        self._failed: str | None = None  # why compiling failed: not tried again for every shape class

    def __call__(
        self,
        rows: torch.Tensor,
        weight_t: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return w8a8_rows(rows, weight_t, weight_scale, bias, dtype)
        if self._failed is not None:
            raise RuntimeError(f"torch.compile failed on an earlier call: {self._failed}")
        if self._compiled is None:
            # dynamic in inductor's default mode (one compile for every shape), static when autotuning
            self._compiled = torch.compile(w8a8_rows, dynamic=self.mode is None, mode=self.mode)
        # Detached: the same storage, but no longer a view. Of a view, torch.compile guards the tensor
        # it was viewed from too, which differs from layer to layer, and every new one would compile
        # again until torch's recompile limit (8 per function) left the kernel unfused.
        detached = None if bias is None else bias.detach()
        try:
            return self._compiled(rows.detach(), weight_t.detach(), weight_scale.detach(), detached, dtype)
        except torch._dynamo.exc.TorchDynamoException as exc:  # compiling (tracing, Inductor, Triton)
            self._failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            raise


def linear_w8a16(x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize the weight to ``x.dtype`` and run a float linear; works on every device."""
    weight = dequantize(packed.qdata.to(x.device), packed.scale, packed.config, x.dtype)
    return torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.device, x.dtype))


def _rotated_rows(x: torch.Tensor, packed: Int8Weight) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    config = packed.config
    return rotate_groups(rows, config.convrot_group, config.hadamard) if config.convrot else rows


def linear_w8a8(
    x: torch.Tensor,
    packed: Int8Weight,
    bias: torch.Tensor | None = None,
    *,
    int_mm: IntMatmul = torch._int_mm,
    fused: FusedW8A8 | None = None,
) -> torch.Tensor:
    """Dynamic per-token W8A8; ``int_mm`` is the int8 kernel (``torch._int_mm`` or the reference),
    ``fused`` runs the whole of it compiled (``None``: op by op)."""
    if packed.config.granularity == "block":
        raise ValueError("W8A8 needs per-tensor or per-row weight scales, not block-wise ones")
    out_features = packed.qdata.shape[0]
    # [1, out] for per-tensor scales too: one shape and layout for every weight, one compiled graph
    scale = packed.scale.to(device=x.device, dtype=torch.float32)
    weight_scale = scale.reshape(1, -1).expand(1, out_features).contiguous()
    args = (
        _rotated_rows(x, packed),
        packed.qdata.to(x.device).t(),
        weight_scale,
        None if bias is None else bias.to(x.device),
        x.dtype,
    )
    out = w8a8_rows(*args, int_mm=int_mm) if fused is None else fused(*args)
    return out.reshape(*x.shape[:-1], out_features)


def linear_kitchen(
    x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None = None, *, kitchen: ModuleType
) -> torch.Tensor:
    """comfy-kitchen's fused dynamic W8A8 (``comfy_kitchen.int8_linear``) on our weight layout."""
    if packed.config.granularity == "block":
        raise ValueError("W8A8 needs per-tensor or per-row weight scales, not block-wise ones")
    config = packed.config
    native = config.convrot and config.hadamard == "regular"  # comfy-kitchen's rotation: let it rotate
    rows = x.reshape(-1, x.shape[-1]) if native else _rotated_rows(x, packed).to(x.dtype)
    args = (
        rows,
        packed.qdata.to(x.device),
        packed.scale.to(device=x.device, dtype=torch.float32).reshape(-1),
        None if bias is None else bias.to(device=x.device, dtype=x.dtype),
    )
    if torch.compiler.is_compiling():  # one opaque op: no graph break per layer
        out: torch.Tensor = kitchen_int8_linear_op(*args, native, config.convrot_group)
    else:
        out = kitchen.int8_linear(
            *args, out_dtype=x.dtype, convrot=native, convrot_groupsize=config.convrot_group
        )
    return out.reshape(*x.shape[:-1], packed.qdata.shape[0])


def linear_onednn(
    x: torch.Tensor, packed: Int8Weight, bias: torch.Tensor | None = None, *, weights: OneDNNWeights
) -> torch.Tensor:
    """Dynamic per-token W8A8 through oneDNN's int8 linear (:mod:`.onednn`), ``weights`` holding the
    packed copies; traced by torch.compile it runs ``weights.traced``'s ops (``int_mm`` or ``w8a16``)."""
    if packed.config.granularity == "block":
        raise ValueError("W8A8 needs per-tensor or per-row weight scales, not block-wise ones")
    if torch.compiler.is_compiling():
        return linear_w8a8(x, packed, bias) if weights.traced == "int_mm" else linear_w8a16(x, packed, bias)
    out_features = packed.qdata.shape[0]
    scale = packed.scale.to(torch.float32).reshape(-1).expand(out_features).contiguous()
    rows_q, row_scale = quantize_activations(_rotated_rows(x, packed))
    out = onednn_rows(rows_q, row_scale, weights.packed(packed.qdata), scale, bias, x.dtype)
    return out.reshape(*x.shape[:-1], out_features)


def run_kernel(
    kernel: str,
    x: torch.Tensor,
    packed: Int8Weight,
    bias: torch.Tensor | None = None,
    *,
    kitchen: ModuleType | None = None,
    fused: FusedW8A8 | None = None,
    onednn: OneDNNWeights | None = None,
) -> torch.Tensor:
    """Run the named kernel as it is; raises where it cannot run the shape (see :func:`int8_linear`).
    ``kitchen`` is comfy-kitchen for ``kitchen``; ``fused`` runs ``int_mm_fused`` (make one and keep
    it: torch.compile's set-up per wrapper costs about as much as a small layer's matmul); ``onednn``
    holds the ``onednn`` kernel's packed weights (keep it too: packing costs more than a matmul)."""
    if kernel == "w8a16":
        return linear_w8a16(x, packed, bias)
    if kernel == "int_mm":
        return linear_w8a8(x, packed, bias)
    if kernel == "int_mm_fused":
        if fused is None:
            raise ValueError("the int_mm_fused kernel needs its compiled function (fused=FusedW8A8())")
        return linear_w8a8(x, packed, bias, fused=fused)
    if kernel == "kitchen":
        if kitchen is None:
            raise ValueError("the kitchen kernel needs comfy-kitchen (pip install comfy-kitchen)")
        return linear_kitchen(x, packed, bias, kitchen=kitchen)
    if kernel == "onednn":
        if onednn is None:
            raise ValueError("the onednn kernel needs its packed weights (onednn=OneDNNWeights())")
        return linear_onednn(x, packed, bias, weights=onednn)
    raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")


def int8_linear(
    x: torch.Tensor,
    packed: Int8Weight,
    bias: torch.Tensor | None = None,
    *,
    route: MatmulRoute = "w8a16",
    kitchen: ModuleType | None = None,
    fused: FusedW8A8 | None = None,
    onednn: OneDNNWeights | None = None,
) -> torch.Tensor:
    """``x @ W.T + bias`` on the kernel ``route`` names, or ``w8a16`` where that kernel cannot run the
    shape. ``auto`` (which needs measurements: :class:`.dispatch.KernelDispatcher`) runs ``w8a16`` here;
    ``onednn`` packs the weight again on every call unless given a kept :class:`.onednn.OneDNNWeights`."""
    kernel = kernel_of_route(route) or "w8a16"
    if unsupported_reason(kernel, x, packed, kitchen) is not None:
        kernel = "w8a16"
    if kernel == "onednn" and onednn is None:
        onednn = onednn_weights()  # packs the weight for this call only
    return run_kernel(kernel, x, packed, bias, kitchen=kitchen, fused=fused, onednn=onednn)
