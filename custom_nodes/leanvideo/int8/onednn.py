"""W8A8 through oneDNN's int8 linear on a CPU (``torch.ops.onednn.qlinear_pointwise``): the ``onednn`` kernel.

torch's ``_int_mm`` reaches oneDNN only on CPUs with AVX-512 VNNI (elsewhere it multiplies element by
element, :func:`.linear.int_mm_cpu_fallback`); oneDNN's int8 linear, the op torch.compile's x86 int8
path lowers to, has no such gate: it runs oneDNN's VNNI kernels on AVX-VNNI CPUs too (Intel Core 12th
generation on), and AMX tiles where there are some. The maths are ``int_mm``'s: each activation row is
quantized with its own absmax scale to ``[-127, 127]``, the int32 products are rescaled by the
activation and weight scales. oneDNN takes unsigned activations, so the rows go in shifted by
:data:`ZERO_POINT` (``[1, 255]``) and oneDNN subtracts the shift's products itself: the outputs are
``int_mm``'s up to float rounding.

``torch.backends.mkldnn.enabled = False`` does not reach it: torch's op runs oneDNN whatever that flag
says (it stops ``torch._int_mm``'s call into oneDNN, not this one), and so does the kernel.

Without VNNI (AVX2 only, or oneDNN capped below it by ``ONEDNN_MAX_CPU_ISA``) oneDNN adds the u8 × s8
pairs in 16 bits, which saturate: 34–35 dB against the float matmul where the exact products give
38–39 dB (measured at DiT shapes); the kernel does not run there (:func:`onednn_unsupported`).

oneDNN multiplies a weight laid out in its own blocked format: :class:`OneDNNWeights` packs each int8
weight at its first use and keeps the packed copy beside it (as many bytes again as the int8 weight)
for as long as the weight lives; a weight written in place is packed again.

Example::

    weights = OneDNNWeights(traced="int_mm")
    rows_q, row_scale = quantize_activations(rows)
    y = onednn_rows(rows_q, row_scale, weights.packed(packed.qdata), weight_scale, bias, torch.float32)
"""

from __future__ import annotations

import os
import threading

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .device import INT8_ISA_FLAGS, cpu_flags

ZERO_POINT = 128  # the shift that makes a row quantized to [-127, 127] the unsigned [1, 255] oneDNN takes
# ONEDNN_MAX_CPU_ISA values below every VNNI instruction set (oneDNN's names; the others include one)
NO_VNNI_CAPS = frozenset({"SSE41", "AVX", "AVX2", "AVX512_CORE"})


def onednn_unsupported(x: torch.Tensor) -> str | None:
    """Why the ``onednn`` kernel cannot run ``x`` here, or ``None`` when it can."""
    if x.device.type != "cpu":
        return "oneDNN's int8 linear runs on a CPU only"
    mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if not mkldnn or not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return "torch was built without oneDNN's int8 linear"
    return onednn_vnni_missing()


def onednn_vnni_missing() -> str | None:
    """Why oneDNN would add int8 products in 16 bits (saturating) here, or ``None`` where it has VNNI or
    AMX (``/proc/cpuinfo``; torch's own check where there is no such file) and no cap below them."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    saturates = "oneDNN adds int8 products in 16 bits, which saturate (34–35 dB against 38–39 dB)"
    if cap in NO_VNNI_CAPS:
        return f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN below VNNI, so {saturates}"
    flags = cpu_flags()
    if flags:
        has_vnni = any(flag in flags for flag in INT8_ISA_FLAGS)
    else:
        has_vnni = bool(torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported())
    return None if has_vnni else f"this CPU has no VNNI or AMX, so {saturates}"


class OneDNNWeights:
    """oneDNN's packed copies of int8 weights ``[out, in]``, one per weight tensor, made at its first use.
    Held weakly by the weight (a copy goes when its weight does) and checked against the weight's version
    counter (a weight changed in place is packed again; an inference tensor has no counter). Thread-safe;
    one per dispatcher. ``traced`` is the kernel whose ops the ``onednn`` kernel runs when torch.compile
    traces it (``int_mm`` or ``w8a16``): a packed copy is looked up in Python, which would break the graph
    at every layer."""

    def __init__(self, traced: str = "w8a16") -> None:
        if traced not in ("int_mm", "w8a16"):
            raise ValueError(f"traced must be 'int_mm' or 'w8a16', not {traced!r}")
        self.traced = traced
        self._packed: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._lock = threading.Lock()

    def packed(self, qdata: torch.Tensor) -> torch.Tensor:
        """The packed copy of ``qdata`` (packing it now when there is none, or it changed since)."""
        version = _version(qdata)
        with self._lock:
            entry = self._packed.get(qdata)  # type: ignore[no-untyped-call]
            if entry is None or entry[0] != version:
                entry = (version, torch.ops.onednn.qlinear_prepack(qdata.contiguous(), None))
                self._packed[qdata] = entry
            return entry[1]  # type: ignore[no-any-return]

    def forget(self, qdata: torch.Tensor) -> None:
        """Drop the packed copy of ``qdata`` (the kernel lost its shape: the copy would only hold memory)."""
        with self._lock:
            self._packed.pop(qdata, None)  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self._packed)


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter; ``None`` for an inference tensor (ComfyUI loads weights under
    ``torch.inference_mode``), which has none: its packed copy stands as made. The loaders' LoRA merge
    writes a new tensor, never into a weight."""
    return None if tensor.is_inference() else tensor._version


def onednn_rows(
    rows_q: torch.Tensor,
    row_scale: torch.Tensor,
    packed_weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """W8A8 on int8 rows ``[rows, in]`` with their float32 scales ``[rows, 1]`` (as
    :func:`.linear.quantize_activations` makes them), a packed weight (:meth:`OneDNNWeights.packed`) and
    its float32 scales ``[out]``: multiply in oneDNN, rescale (+ bias), return ``dtype``."""
    # v + 128 as an unsigned byte is v's bits with the top one flipped: one pass over the int8 rows
    shifted = rows_q.view(torch.uint8).bitwise_xor(ZERO_POINT)
    zero_points = torch.zeros(weight_scale.shape[0], dtype=torch.int64)
    scaled: torch.Tensor = torch.ops.onednn.qlinear_pointwise(
        shifted, 1.0, ZERO_POINT, packed_weight, weight_scale, zero_points,
        None, 1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip
    out = scaled.mul_(row_scale)
    if bias is not None:
        out = out.add_(bias.to(torch.float32))
    return out.to(dtype)
