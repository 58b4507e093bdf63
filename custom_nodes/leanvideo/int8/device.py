"""The device a kernel choice is measured on, named so that a choice is never reused where it may not hold.

On a CUDA device its model; on a CPU its model, the instruction sets that decide int8 speed (torch's CPU
kernels, the VNNI/AMX flags, any ``ONEDNN_MAX_CPU_ISA`` cap, whether oneDNN is on) and torch's thread
count.

Example::

    describe_device(torch.device("cpu"))  # 'cpu:AMD EPYC [AVX512 avx512_vnni avx_vnni] (2 threads)'
"""

from __future__ import annotations

import os
import platform

import torch

# /proc/cpuinfo flags of int8 dot-product instructions (VNNI on AVX-512 and AVX, AMX tiles)
INT8_ISA_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def describe_device(device: torch.device) -> str:
    """A device's kind and model, e.g. ``cuda:NVIDIA H200`` or ``cpu:AMD EPYC [AVX512 avx512_vnni]
    (16 threads)``. On a CPU the instruction sets that decide int8 speed are part of it
    (:func:`cpu_isa`): clouds give one model name to CPUs with and without VNNI, and a table measured
    on one must not be used on the other."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{torch.cuda.get_device_name(index)}"
    return f"{device.type}:{cpu_model()} [{cpu_isa()}] ({torch.get_num_threads()} threads)"


def cpu_isa() -> str:
    """What torch's CPU kernels use (``AVX512``, ``AVX2``, …), the CPU's int8 dot-product extensions
    (``/proc/cpuinfo`` flags), any ``ONEDNN_MAX_CPU_ISA`` cap and ``onednn-off`` when oneDNN is off,
    e.g. ``AVX512 avx512_vnni amx_int8``."""
    parts = [torch.backends.cpu.get_cpu_capability()]
    flags = cpu_flags()
    parts += [flag for flag in INT8_ISA_FLAGS if flag in flags]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    if cap:
        parts.append(f"onednn<={cap}")
    if not onednn_on():
        parts.append("onednn-off")  # torch._int_mm runs its scalar loop then
    return " ".join(parts)


def onednn_on() -> bool:
    """Whether torch has oneDNN and it is switched on (``torch.backends.mkldnn``)."""
    return bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)  # type: ignore[no-untyped-call]


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where there is none)."""
    return set((_cpuinfo("flags") or "").split())


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :mod:`platform` knows."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _cpuinfo(field: str) -> str | None:
    """The value of the first ``field`` line of ``/proc/cpuinfo`` (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
