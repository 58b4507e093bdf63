"""The INT8 end-to-end benchmark (``python -m benchmarks.int8_e2e_bench``): the workflows it builds and
the kernel choices it reads (unit), and one pair on a 1-block DiT of width 128 on a real pinned server,
run as the documented command, with every field of its JSON record checked (integration)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from benchmarks.int8_e2e_bench import INT8, LOADER_NODE, STOCK, BenchSettings, build_workflow, kernel_choices
from benchmarks.mid_dit import MidDitConfig
from runner.local.workspace import REPO_ROOT, Workspace

MIN_PSNR_DB = 35.0  # INT8 against bf16 on the 1×128 DiT: measured 52.6–53.4 dB
KERNELS = {"w8a16", "int_mm", "int_mm_fused", "kitchen", "onednn"}


def test_default_dit_is_the_mid_ltxv_and_its_config_is_valid() -> None:
    config = MidDitConfig()
    transformer = config.transformer()
    assert (config.layers, config.dim, config.name) == (8, 1024, "leanvideo-bench-ltxv-mid-8x1024")
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    assert heads * head_dim == transformer["cross_attention_dim"] == 1024
    assert (transformer["in_channels"], transformer["caption_channels"]) == (128, 768)
    with pytest.raises(ValueError, match="multiple of 64"):
        MidDitConfig(dim=100)


def test_workflows_differ_only_in_the_dit_loader() -> None:
    settings = BenchSettings(kernel="int_mm")
    assert settings.tokens == 384  # 512/32 × 384/32 × ((9 - 1)/8 + 1)
    stock, stock_frames = build_workflow(settings, STOCK, "a.safetensors")
    int8, int8_frames = build_workflow(settings, INT8, "b.safetensors")
    assert stock_frames == int8_frames and stock[stock_frames]["class_type"] == "SaveImage"
    assert stock[LOADER_NODE]["class_type"] == "UNETLoader"
    assert stock[LOADER_NODE]["inputs"]["unet_name"] == "a.safetensors"
    assert int8[LOADER_NODE]["class_type"] == "LeanVideoDiffusionModelLoaderINT8"
    assert int8[LOADER_NODE]["inputs"]["path"] == "int_mm"
    classes = {node["class_type"] for node in stock.values()}
    assert not classes & {"CreateVideo", "SaveVideo"}
    differing = {k for k in stock if k not in int8 or {**stock[k], "_meta": 0} != {**int8[k], "_meta": 0}}
    assert differing == {LOADER_NODE, stock_frames}  # the loader, and the frames' file prefix
    sampler = next(node for node in stock.values() if node["class_type"] == "SamplerCustom")
    assert sampler["inputs"]["model"] == [LOADER_NODE, 0] and sampler["inputs"]["noise_seed"] == 42


def test_kernel_choices_come_from_the_loader_report_and_the_choices_made_while_sampling() -> None:
    measured = {
        "kernel": "int_mm",
        "source": "measured",
        "seconds": {"w8a16": 2.0, "int_mm": 1.0},
        "rejected": {"kitchen": "slower than w8a16"},
    }
    device = "cpu:Some CPU (2 threads)"
    telemetry = {
        "events": [
            {"kind": "free_vram", "freed": 0},
            {"kind": "int8_kernels", "choices": {f"{device}|float32|64x32|rows<=512|row": measured}},
            {"kind": "int8_kernel", "shape": f"{device}|float32|32x64|rows<=128|row", "kernel": "w8a16"}
            | {"source": "forced", "seconds": {}, "rejected": {}, "time": 1.0},
        ]
    }
    assert kernel_choices(telemetry) == [
        {
            "shape": "32x64",
            "rows": 128,
            "dtype": "float32",
            "layout": "row",
            "kernel": "w8a16",
            "source": "forced",
            "over_w8a16": {},
            "rejected": {},
        },
        {
            "shape": "64x32",
            "rows": 512,
            "dtype": "float32",
            "layout": "row",
            "kernel": "int_mm",
            "source": "measured",
            "over_w8a16": {"w8a16": 1.0, "int_mm": 0.5},
            "rejected": {"kitchen": "slower than w8a16"},
        },
    ]
    assert kernel_choices({"available": False}) == []


def _parameters(path: Path) -> int:
    with safe_open(str(path), framework="pt") as handle:
        return sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())  # noqa: SIM118


@pytest.mark.integration
def test_one_pair_on_a_small_dit_reports_every_field(
    workspace: Workspace, placed: Callable[[str], Path], tmp_path: Path
) -> None:
    for suffix in ("", "-int8"):  # the bench writes its DiT there for the server; gone after the test
        placed(f"diffusion_models/leanvideo-bench-ltxv-mid-1x128{suffix}.safetensors")
    out = tmp_path / "e2e.json"
    command = [sys.executable, "-m", "benchmarks.int8_e2e_bench", "--pairs", "1", "--layers", "1"]
    command += ["--dim", "128", "--json", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    assert "B / A: file" in done.stdout and "frame PSNR B vs A" in done.stdout
    record: dict[str, Any] = json.loads(out.read_text())
    assert (record["schema"], record["version"]) == ("leanvideo.int8_e2e_bench", 1)
    settings = record["settings"]
    assert {k: settings[k] for k in ("pairs", "kernel", "layers", "dim", "tokens", "steps")} == {
        "pairs": 1,
        "kernel": "auto",
        "layers": 1,
        "dim": 128,
        "tokens": 384,
        "steps": 8,
    }
    folder = workspace.models_dir / "diffusion_models"
    stock, int8 = record["configurations"][STOCK], record["configurations"][INT8]
    assert [stock["file"], int8["file"]] == [
        f"leanvideo-bench-ltxv-mid-1x128{s}.safetensors" for s in ("", "-int8")
    ]
    assert settings["parameters"] == _parameters(folder / stock["file"])
    for configuration in (stock, int8):
        assert configuration["file_bytes"] == (folder / configuration["file"]).stat().st_size
        assert configuration["sampling_s"]["n"] == 1 and configuration["sampling_s"]["median"] > 0
        assert configuration["peak_rss_bytes"]["median"] > 100 * 2**20  # a ComfyUI with CLIP-L loaded
        assert configuration["frames_repeatable"] is True
        assert configuration["dit_loaded_bytes"] > 0
    assert record["file_ratio"] == int8["file_bytes"] / stock["file_bytes"] < 1
    # ComfyUI computes in fp32 on a CPU: the stock DiT is held in fp32, the INT8 one mostly in int8
    assert record["dit_loaded_ratio"] == int8["dit_loaded_bytes"] / stock["dit_loaded_bytes"] < 0.5
    runs = record["runs"]
    assert [(r["configuration"], r["warmup"]) for r in runs] == [
        (STOCK, True),
        (INT8, True),
        (STOCK, False),
        (INT8, False),
    ]
    assert record["sampling_ratio"]["n"] == 1
    assert record["sampling_ratio"]["median"] == pytest.approx(runs[3]["sampling_s"] / runs[2]["sampling_s"])
    print(f"frame PSNR INT8 vs bf16: {record['frame_psnr_db']['min']:.2f} dB")
    assert record["frame_psnr_db"]["min"] >= MIN_PSNR_DB
    kernels = int8["kernels"]
    assert kernels["choices"] and {c["kernel"] for c in kernels["choices"]} <= KERNELS
    assert {c["source"] for c in kernels["choices"]} == {"measured"}
    assert sum(kernels["counts"].values()) == len(kernels["choices"])
    assert "INT8 kernels: auto" in kernels["report"]
    # auto measured in the warmup, so the measured run's sampling holds no measurement
    assert runs[1]["kernel_choices_made"] > 0 and runs[3]["kernel_choices_made"] == 0
