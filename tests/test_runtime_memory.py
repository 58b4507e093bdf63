"""The Free VRAM report: its figures, JSON shape and summary lines (no ComfyUI needed)."""

from __future__ import annotations

import ctypes
import platform
from types import SimpleNamespace

import psutil
import pytest
from leanvideo.memory_ops import FreeMode, LoadedModelInfo, MemorySnapshot, ReleaseReport, trim_heap

MIB = 2**20
LTXV = LoadedModelInfo("LTXV", "diffusion_model", "cuda:0", 300 * MIB)
CLIP = LoadedModelInfo("SD1ClipModel", "text_encoder", "cuda:0", 200 * MIB)


def test_report_with_cuda_figures() -> None:
    before = MemorySnapshot(900 * MIB, 520 * MIB, 600 * MIB, None, (LTXV, CLIP))
    after = MemorySnapshot(880 * MIB, 20 * MIB, 32 * MIB, None, ())
    report = ReleaseReport(
        mode=FreeMode.ALL.value,
        before=before,
        after=after,
        unloaded=("LTXV", "SD1ClipModel"),
        kept=(),
        steps=("cuda synchronize", "unload 2 model(s)", "gc.collect", "empty cache + ipc collect"),
        seconds=0.25,
    )
    data = report.as_dict()
    assert data["before"]["loaded_bytes"] == 500 * MIB and data["after"]["loaded_bytes"] == 0
    assert data["before"]["loaded_models"][0] == {
        "name": "LTXV",
        "kind": "diffusion_model",
        "device": "cuda:0",
        "loaded_bytes": 300 * MIB,
    }
    lines = report.summary().splitlines()
    assert lines[0] == "Free VRAM (unload all): unloaded 2 model(s) in 0.25 s"
    assert "  VRAM allocated 520.0 MiB → 20.0 MiB, reserved 600.0 MiB → 32.0 MiB" in lines
    assert "  RSS 900.0 MiB → 880.0 MiB" in lines
    assert "  models on device 500.0 MiB → 0.0 MiB" in lines


def test_report_without_cuda_says_why() -> None:
    snap = MemorySnapshot(900 * MIB, None, None, "no CUDA device", ())
    report = ReleaseReport("unload all", snap, snap, (), (), ("gc.collect",), 0.0, notes=("nothing loaded",))
    assert "  VRAM: n/a (no CUDA device)" in report.summary().splitlines()
    assert report.summary().endswith("note: nothing loaded")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_heap_gives_freed_heap_pages_back_to_the_os() -> None:
    # 64 KiB blocks stay under glibc's mmap threshold, so they live on the heap; a small block after each
    # keeps the freed ones off the heap's top, which free() would give back by itself.
    blocks: list[bytearray] = []
    pins: list[bytearray] = []
    for _ in range(1024):
        blocks.append(bytearray(64 * 1024))
        pins.append(bytearray(600))
    del blocks
    process = psutil.Process()
    freed = process.memory_info().rss
    assert trim_heap() is True
    returned = freed - process.memory_info().rss
    print(f"RSS returned by malloc_trim: {returned / MIB:.1f} MiB of 64 MiB freed")
    assert returned > 32 * MIB


def test_trim_heap_without_malloc_trim_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    """A C library without malloc_trim (musl, macOS) is no error: the step is only reported as skipped."""
    monkeypatch.setattr(ctypes, "CDLL", lambda name: SimpleNamespace())
    assert trim_heap() is False
