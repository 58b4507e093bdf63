"""Full-size random-weight models (benchmarks/synth_models.py) and the real-size matrices that use them.

The layouts are read from the pinned ComfyUI's own classes at full size (meta tensors, seconds); the
files are written here with one DiT block at full width, because a whole 13 B / 14 B model is a job
for a GPU (benchmarks/gpu_seed_table.sh).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from benchmarks.matrix import load_matrix
from benchmarks.synth_models import (
    FAMILIES,
    Family,
    SynthError,
    is_synthetic,
    remove,
    stand_in_tokenizer,
    synthesize,
)
from runner.fixtures.layouts import read_layouts
from runner.fixtures.tensors import read_safetensors_header
from runner.graph.workflow import load_workflow, validate_workflow
from runner.local.server import ComfyServer
from runner.local.workspace import REPO_ROOT, Workspace

REAL_SIZE_MATRICES = {"seed_table.toml": "ltxv-13b", "seed_table_wan.toml": "wan-14b"}
MODEL_INPUTS = ("unet_name", "clip_name", "vae_name", "lora_name", "ckpt_name")


def _parameters(layout: Any) -> int:
    return sum(math.prod(spec.shape) for spec in layout)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("family", "expected"),
    [
        # Parameter counts of the released models (DiT, VAE, text encoder), in billions.
        ("ltxv-13b", {"dit": 13.04, "vae": 1.25, "text_encoder": 4.76}),
        ("wan-14b", {"dit": 14.29, "vae": 0.127, "text_encoder": 5.68}),
    ],
)
def test_full_size_layouts_match_the_released_models(
    family: str, expected: dict[str, float], workspace: Workspace
) -> None:
    layouts = read_layouts(workspace.comfyui_dir, FAMILIES[family].requests, python=workspace.python)
    counts = {name: _parameters(layout) / 1e9 for name, layout in layouts.items()}
    assert counts == pytest.approx(expected, rel=0.01)


@pytest.mark.integration
def test_the_synthetic_umt5_carries_a_tokenizer_comfyui_can_read(workspace: Workspace) -> None:
    """ComfyUI's Wan tokenizer reads the SentencePiece model from the UMT5 file (``spiece_model``);
    without one the text encoder fails with "invalid tokenizer"."""
    import sentencepiece

    (umt5,) = [f for f in FAMILIES["wan-14b"].files if f.layout == "text_encoder"]
    assert umt5.tokenizer and not any(f.tokenizer for f in FAMILIES["ltxv-13b"].files)
    model = stand_in_tokenizer(workspace.comfyui_dir)
    assert model.dtype == torch.uint8
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.numpy().tobytes())
    ids = processor.encode("a red fox running through fresh snow at golden hour")
    assert ids and max(ids) < 256384  # UMT5-XXL's vocabulary


def _small_wan(workspace: Workspace) -> Family:
    family = FAMILIES["wan-14b"].with_layers(1)
    keep = [f for f in family.files if f.layout != "text_encoder"]  # UMT5 alone is 11 GB
    return replace(family, files=tuple(keep))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.integration
def test_depth_cut_wan_files_load_as_comfyui_expects(tmp_path: Path, workspace: Workspace) -> None:
    family = _small_wan(workspace)
    lines: list[str] = []
    paths = synthesize(
        family,
        tmp_path,
        workspace.comfyui_dir,
        device=torch.device("cpu"),
        python=workspace.python,
        progress=lines.append,
    )
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [f.relative for f in family.files]
    assert all(is_synthetic(p) for p in paths)

    layouts = read_layouts(workspace.comfyui_dir, family.requests, python=workspace.python)
    dit_header = read_safetensors_header(paths[0])
    for spec in layouts["dit"]:  # every tensor ComfyUI's Wan model has, at its shape
        assert dit_header[spec.key]["shape"] == list(spec.shape), spec.key
    int8_weights = [k for k, v in dit_header.items() if k != "__metadata__" and v["dtype"] == "I8"]
    assert len(int8_weights) == 10  # q, k, v, o of both attentions and the two FFN layers of the block
    assert all(k.startswith("blocks.0.") for k in int8_weights)
    assert "blocks.1.self_attn.q.weight" not in dit_header

    lora_header = read_safetensors_header(paths[2])
    targets = {k.removeprefix("diffusion_model.").rsplit(".lora_", 1)[0] + ".weight" for k in lora_header}
    targets.discard("__metadata__.weight")
    assert len(targets) == 10 and targets <= {spec.key for spec in layouts["dit"]}
    assert all(
        v["shape"][0] == 32 or v["shape"][1] == 32 for k, v in lora_header.items() if k != "__metadata__"
    )

    # Current files are left alone; --force writes the very same bytes (values are seeded per tensor).
    before = {p: p.stat().st_mtime_ns for p in paths}
    synthesize(family, tmp_path, workspace.comfyui_dir, device=torch.device("cpu"), python=workspace.python)
    assert {p: p.stat().st_mtime_ns for p in paths} == before
    small = replace(family, files=tuple(f for f in family.files if f.layout == "vae"))
    vae = tmp_path / small.files[0].relative
    digest = _digest(vae)
    synthesize(
        small,
        tmp_path,
        workspace.comfyui_dir,
        device=torch.device("cpu"),
        python=workspace.python,
        force=True,
    )
    assert vae.stat().st_mtime_ns != before[vae] and _digest(vae) == digest
    assert any("wrote" in line and "B parameters" in line for line in lines)


@pytest.mark.integration
def test_a_real_model_file_is_never_overwritten_or_removed(tmp_path: Path, workspace: Workspace) -> None:
    family = _small_wan(workspace)
    real = tmp_path / family.files[1].relative  # the VAE: a user's real file under that name
    real.parent.mkdir(parents=True)
    real.write_bytes(b"not ours")
    with pytest.raises(SynthError, match=r"wan_2\.1_vae\.safetensors exists and is not a synthetic"):
        synthesize(
            family, tmp_path, workspace.comfyui_dir, device=torch.device("cpu"), python=workspace.python
        )
    assert real.read_bytes() == b"not ours"
    assert list(remove(family, tmp_path)) == []
    assert real.read_bytes() == b"not ours"


@pytest.mark.integration
@pytest.mark.parametrize("matrix_name", sorted(REAL_SIZE_MATRICES))
def test_real_size_matrix_runs_on_exactly_the_synthetic_files(
    matrix_name: str, comfy_server: ComfyServer
) -> None:
    """Every variant of the real-size matrix validates on the real server, except for the model files
    (absent here), and those are exactly the files the synthetic family writes."""
    matrix = load_matrix(REPO_ROOT / "benchmarks" / matrix_name)
    family = FAMILIES[REAL_SIZE_MATRICES[matrix_name]]
    synthetic_names = {Path(f.relative).name for f in family.files}
    object_info = dict(httpx.get(f"{comfy_server.url}/object_info", timeout=60).json())
    base = load_workflow(matrix.workflow)
    used: set[str] = set()
    for variant in matrix.variants:
        workflow = variant.build_workflow(base)
        used |= {
            value
            for node in workflow.values()
            for key, value in node["inputs"].items()
            if key in MODEL_INPUTS
        }
        problems = validate_workflow(workflow, object_info)
        unexpected = [p for p in problems if "does not exist on the server" not in p.message]
        assert unexpected == [], f"{variant.name}: " + "\n".join(map(str, unexpected))
    assert used == synthetic_names
