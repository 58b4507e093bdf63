"""Attention backends behind ComfyUI's ``optimized_attention_override`` hook, with a per-call fallback.

ComfyUI (``comfy/ldm/modules/attention.py``, ``wrap_attn``) calls
``transformer_options["optimized_attention_override"](func, q, k, v, heads, mask=None, attn_precision=None,
skip_reshape=False, skip_output_reshape=False, **kwargs)`` in place of every attention function, where
``func`` is the attention ComfyUI would have used. Model families pass different layouts:

==============  ==========================================  ==========================================
family          call                                        q/k/v layout in → out
==============  ==========================================  ==========================================
LTXV            ``heads`` given, mask on cross-attention    ``[B, N, H*D]`` → ``[B, N, H*D]``
Wan             ``heads=num_heads``                         ``[B, N, H*D]`` → ``[B, N, H*D]``
Wan (some)      ``skip_reshape=skip_output_reshape=True``   ``[B, H, N, D]`` → ``[B, H, N, D]``
HunyuanVideo    ``skip_reshape=True`` (flux math), mask     ``[B, H, N, D]`` → ``[B, N, H*D]``
==============  ==========================================  ==========================================

:class:`AttentionOverride` normalises to ``[B, H, N, D]``, runs the backend kernel and restores the layout
the caller asked for. A call the backend cannot do (tensor not on CUDA, head dim or dtype it does not
support, a mask it would ignore) goes to the original attention instead, and each reason is logged once.
The caller's tensors are never modified: a kernel that writes K in place (SageAttention's ``smooth_k``)
gets a copy.

Example::

    override, plan = build_override("auto")
    patched = model.clone()
    patched.model_options["transformer_options"]["optimized_attention_override"] = override
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""``kernel(q, k, v, mask)`` on ``[B, H, N, D]`` tensors, returning ``[B, H, N, D]``."""

AUTO, SDPA, SAGE = "auto", "sdpa", "sage"
SAGE_NOT_INSTALLED = "sageattention is not installed"
# SageAttention 2.x entry points, offered as modes when the installed package has them.
SAGE_VARIANTS: tuple[str, ...] = (
    "sageattn_qk_int8_pv_fp16_triton",
    "sageattn_qk_int8_pv_fp16_cuda",
    "sageattn_qk_int8_pv_fp8_cuda",
)
SAGE_HEAD_DIMS = frozenset({64, 96, 128})
HALF_DTYPES = frozenset({torch.float16, torch.bfloat16})
# SageAttention 1.x (and 2.x's Triton kernel until a fix) reads keys in blocks of 64 and counts the
# empty slots of a last, partial block in its softmax (masked loads give a score of 0, not -inf). With
# its K smoothing (mean subtracted) each real key weighs exp2(0) or more on average (Jensen), so the
# denominator grows by at most empty/keys and the output shrinks by at most empty/(keys + empty). Calls
# where empty/keys exceeds SAGE_MAX_KEY_PADDING fall back.
SAGE_KEY_BLOCK = 64
SAGE_MAX_KEY_PADDING = 0.01


@dataclass(frozen=True)
class AttentionBackend:
    """A kernel and the calls it can take; ``None`` means no limit on that property."""

    name: str
    kernel: Kernel
    needs_cuda: bool = False
    head_dims: frozenset[int] | None = None
    dtypes: frozenset[torch.dtype] | None = None
    supports_mask: bool = True
    writes_k: bool = False
    key_block: int | None = None  # keys read in blocks of this many, a partial last one miscounted
    max_key_padding: float = 0.0  # the share of empty key slots (to keys) that is still taken

    def unsupported_reason(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> str | None:
        """Why this backend cannot take the call (q/k in ``[B, H, N, D]``), or None when it can."""
        if self.needs_cuda and q.device.type != "cuda":
            return f"tensors on {q.device.type}, {self.name} needs CUDA"
        if self.head_dims is not None and q.shape[-1] not in self.head_dims:
            return f"head dim {q.shape[-1]} not in {sorted(self.head_dims)}"
        if self.dtypes is not None and q.dtype not in self.dtypes:
            return f"dtype {q.dtype} not supported by {self.name}"
        if mask is not None and not self.supports_mask:
            return f"attention mask present ({self.name} would ignore it)"
        keys = k.shape[-2]
        if self.key_block and (empty := -keys % self.key_block) > self.max_key_padding * keys:
            return (
                f"{keys} keys, not a multiple of {self.key_block}: {self.name} would count {empty} empty key "
                f"slots in its softmax (output up to {100 * empty / (keys + empty):.1f} % low)"
            )
        return None


def sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """PyTorch's fused scaled-dot-product attention, with ComfyUI's mask broadcasting."""
    if mask is not None:
        if mask.ndim == 2:  # [N, M]: add batch
            mask = mask.unsqueeze(0)
        if mask.ndim == 3:  # [B, N, M]: add heads
            mask = mask.unsqueeze(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)


def import_sage() -> tuple[Any | None, str | None]:
    """``(the sageattention package, None)``, or ``(None, why it cannot be used)``.

    Only the package itself missing means "not installed"; any other failure while importing it (a
    dependency missing, Triton or a CUDA extension failing to initialise) is reported as what it is.
    """
    try:
        return importlib.import_module("sageattention"), None
    except ModuleNotFoundError as exc:
        if exc.name == "sageattention":
            return None, SAGE_NOT_INSTALLED
        failure: Exception = exc  # one of its own dependencies is missing
    except Exception as exc:  # importing it sets up Triton and CUDA extensions, which may raise anything
        failure = exc
    reason = f"sageattention failed to import: {type(failure).__name__}: {failure}"
    logger.warning("%s", reason)
    return None, reason


def available_modes() -> list[str]:
    """Modes for the node's menu: auto, sdpa, sage, then every SageAttention variant, installed here or
    not (ComfyUI's menus are what a node accepts: a workflow saved where a variant is installed runs
    elsewhere, `leanvideo run` included, with the attention left unchanged, and the report says so)."""
    return [AUTO, SDPA, SAGE, *SAGE_VARIANTS]


def make_sage_backend(module: Any, function_name: str) -> AttentionBackend:
    """A backend calling ``module.<function_name>`` in the HND layout."""
    function = getattr(module, function_name)

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return function(q, k, v, tensor_layout="HND", is_causal=False)

    head_dims = SAGE_HEAD_DIMS if function_name == "sageattn" else frozenset({64, 128})
    # every version: 2.x's Triton kernel (its sageattn on some GPUs) had the same flaw until a fix that
    # kept the version number; a short, mostly padded call costs little to run the original way
    return AttentionBackend(
        name=function_name,
        kernel=kernel,
        needs_cuda=True,
        head_dims=head_dims,
        dtypes=HALF_DTYPES,
        supports_mask=False,
        writes_k=True,  # smooth_k subtracts K's mean in place
        key_block=SAGE_KEY_BLOCK,
        max_key_padding=SAGE_MAX_KEY_PADDING,
    )


SDPA_BACKEND = AttentionBackend(name="sdpa", kernel=sdpa_kernel)


@dataclass(frozen=True)
class AttentionPlan:
    """What a mode resolved to, and why."""

    requested: str
    backend: str
    reason: str

    def summary(self) -> str:
        line = f"attention: {self.requested} → {self.backend} ({self.reason})"
        if self.backend not in ("original", "sdpa"):  # SageAttention takes some calls: say where that is told
            line += "; a call it cannot take runs the original attention (counted per prompt in telemetry)"
        return line


def resolve_backend(
    mode: str, *, cuda_available: bool | None = None, sage: Any | None = ...
) -> tuple[AttentionBackend | None, AttentionPlan]:
    """Map a mode to a backend. None means "keep the original attention" (the plan says why).

    ``cuda_available`` and ``sage`` default to what this process has; tests pass them explicitly
    (``sage=None``: not installed).
    """
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    module, sage_missing = import_sage() if sage is ... else (sage, SAGE_NOT_INSTALLED)
    if mode == SDPA:
        return SDPA_BACKEND, AttentionPlan(mode, "sdpa", "requested")
    if mode == AUTO:
        if not cuda:
            return SDPA_BACKEND, AttentionPlan(mode, "sdpa", "no CUDA device: PyTorch SDPA")
        if module is None:
            return SDPA_BACKEND, AttentionPlan(mode, "sdpa", f"{sage_missing}: PyTorch SDPA")
        return make_sage_backend(module, "sageattn"), AttentionPlan(
            mode, "sageattn", "CUDA and sageattention"
        )
    if mode == SAGE or mode in SAGE_VARIANTS:
        function_name = "sageattn" if mode == SAGE else mode
        if module is None or not hasattr(module, function_name):
            why = f"sageattention has no {function_name}" if module is not None else sage_missing
            return None, AttentionPlan(mode, "original", f"{why}: attention left unchanged")
        return make_sage_backend(module, function_name), AttentionPlan(mode, function_name, "requested")
    raise ValueError(f"Unknown attention mode {mode!r}; expected one of {available_modes()}")


class AttentionOverride:
    """The callable ComfyUI invokes instead of its attention function (see the module docstring).

    ``previous`` is an override that was already on the model: fallbacks go through it, so patches chain.
    Copies of a model share one override (``__deepcopy__`` returns it), so each reason is logged once per
    patch, not once per clone.
    """

    def __init__(
        self,
        backend: AttentionBackend,
        previous: Callable[..., Any] | None = None,
        on_call: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.backend = backend
        self.previous = previous
        self.calls: Counter[str] = Counter()  # "backend" or a fallback reason → number of calls
        self.on_call = on_call  # told of every call: (the backend's name, False) or (why it fell back, True)
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> AttentionOverride:
        return self

    def __call__(
        self,
        func: Callable[..., torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        heads: int,
        mask: torch.Tensor | None = None,
        attn_precision: Any = None,
        skip_reshape: bool = False,
        skip_output_reshape: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        b = q.shape[0]
        if skip_reshape:
            qh, kh, vh = q, k, v
        else:  # [B, N, H*D] → [B, H, N, D] views; nothing is written through them (K is copied if needed)
            qh, kh, vh = (t.reshape(b, -1, heads, t.shape[-1] // heads).transpose(1, 2) for t in (q, k, v))
        reason = self.backend.unsupported_reason(qh, kh, mask)
        if reason is not None:
            self._count(reason)
            call = func if self.previous is None else _bind(self.previous, func)
            return call(
                q,
                k,
                v,
                heads,
                mask=mask,
                attn_precision=attn_precision,
                skip_reshape=skip_reshape,
                skip_output_reshape=skip_output_reshape,
                **kwargs,
            )
        self._count("backend")
        if self.backend.writes_k:
            kh = kh.clone()  # never let the kernel write into the caller's K
        out = self.backend.kernel(qh, kh, vh, mask)
        if skip_output_reshape:
            return out
        return out.transpose(1, 2).reshape(b, -1, heads * out.shape[-1])

    def _count(self, key: str) -> None:
        with self._lock:
            self.calls[key] += 1
            first = self.calls[key] == 1
        if first and key != "backend":
            logger.info("Patch Attention: falling back to the original attention: %s", key)
        if self.on_call is not None:
            try:
                self.on_call(self.backend.name if key == "backend" else key, key != "backend")
            except Exception:  # reporting must never break a forward pass
                logger.exception("Reporting an attention call failed")


def _bind(previous: Callable[..., Any], func: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return previous(func, *args, **kwargs)

    return call


def build_override(
    mode: str, previous: Callable[..., Any] | None = None, on_call: Callable[[str, bool], None] | None = None
) -> tuple[AttentionOverride | None, AttentionPlan]:
    """The override for ``mode`` (None when the attention stays as it is) and the plan that explains it."""
    backend, plan = resolve_backend(mode)
    return (AttentionOverride(backend, previous, on_call) if backend is not None else None), plan


def patch_attention(
    model: Any, mode: str, on_call: Callable[[str, bool], None] | None = None
) -> tuple[Any, AttentionPlan]:
    """Clone ``model`` (a ComfyUI ModelPatcher) and set the attention override on the clone; ``on_call``
    hears of every attention call: the backend's name and ``False``, or the reason it fell back and
    ``True``."""
    if not isinstance(getattr(model, "model_options", None), dict) or not hasattr(model, "clone"):
        # a link from an output of any type (Free VRAM's) lets the editor connect a VAE or a latent here
        raise TypeError(
            f"Patch Attention: model got a {type(model).__name__}, not a MODEL: connect a diffusion model"
        )
    options = model.model_options.get("transformer_options", {})
    override, plan = build_override(mode, options.get("optimized_attention_override"), on_call)
    patched = model.clone()
    if override is not None:
        patched.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    logger.info("Patch Attention on %s: %s", type(model.model).__name__, plan.summary())
    return patched, plan
