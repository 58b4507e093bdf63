"""Full-size random-weight models (benchmarks/synth_models.py) and the real-size matrices that use them.

The layouts are read from the pinned ComfyUI's own classes at full size (meta tensors, seconds); the
files are written here with one DiT block at full width, because a whole 13 B / 14 B model is a job
for a GPU (benchmarks/gpu_seed_table.sh). The dry run on a CPU: the depth-cut Wan files have every
tensor ComfyUI's model has, in the release forms (scaled fp8 experts, bf16 VAE, rank-64 LoRAs); a Wan
2.2 I2V expert goes through our INT8 loader with its LoRA and denoises a 36-channel latent; the LTXV
release checkpoint form loads through our checkpoint loader and stock ComfyUI's; every variant of each
real-size matrix, overrides applied, validates on the real server with exactly the synthetic files
missing; and each shipped full-size workflow loads exactly one family's files.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
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
from runner.fixtures.layouts import LayoutRequest, Layouts, read_layouts
from runner.fixtures.ltxv import LTXV_CONFIG, TRANSFORMER_CONFIG, VAE_CONFIG
from runner.fixtures.tensors import read_safetensors_header
from runner.graph.models import required_models
from runner.graph.validate import validate_workflow
from runner.graph.workflow import apply_overrides, load_workflow
from runner.local.server import ComfyServer
from runner.local.workspace import REPO_ROOT, WORKFLOWS_DIR, Workspace
from tests.scratch import scratch_dir

REAL_SIZE_MATRICES = {
    "seed_table.toml": "ltxv-13b",
    "seed_table_wan.toml": "wan-14b",
    "seed_table_wan22.toml": "wan22-14b",
}
SHIPPED_FAMILIES = {
    "ltxv_t2v_int8.api.json": "ltxv-13b",
    "wan21_t2v_int8.api.json": "wan-14b",
    "wan22_t2v_int8.api.json": "wan22-14b",
    "wan22_i2v_int8.api.json": "wan22-i2v-14b",
}
MODEL_INPUTS = ("unet_name", "clip_name", "vae_name", "lora_name", "ckpt_name")
WAN_BLOCK_PROJECTIONS = 10  # q, k, v, o of both attentions and the two FFN layers
Synthesized = tuple[Family, list[Path]]
DEPTH_CUT = ("wan-14b", "wan22-14b", "wan22-i2v-14b")  # the families written one block deep here


@pytest.fixture(scope="module")
def layouts(workspace: Workspace) -> Callable[[Family], Layouts]:
    """The layouts of every family, at full size and depth-cut, read from ComfyUI in one child process:
    a read takes ~10 s, nearly all of it ComfyUI's import, and all of them together ~12 s."""
    forms = [*FAMILIES.values(), *(_small(name) for name in DEPTH_CUT)]
    requests = {
        f"{index}/{name}": request
        for index, family in enumerate(forms)
        for name, request in family.requests.items()
    }
    read = read_layouts(workspace.comfyui_dir, requests, python=workspace.python)

    def of(family: Family) -> Layouts:
        index = forms.index(family)  # a family this fixture did not read is a ValueError here: a test bug
        return {name: read[f"{index}/{name}"] for name in family.requests}

    return of


def _parameters(layout: Any) -> int:
    return sum(math.prod(spec.shape) for spec in layout)


def _dtypes(header: dict[str, Any], dtype: str) -> list[str]:
    return [k for k, v in header.items() if k != "__metadata__" and v["dtype"] == dtype]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("family", "expected"),
    [
        # Parameter counts of the released models (DiT(s), VAE, text encoder), in billions.
        ("ltxv-13b", {"dit": 13.04, "vae": 1.25, "text_encoder": 4.76}),
        ("wan-14b", {"dit": 14.29, "vae": 0.127, "text_encoder": 5.68}),
        ("wan22-14b", {"high": 14.29, "low": 14.29, "vae": 0.127, "text_encoder": 5.68}),
        ("wan22-i2v-14b", {"high": 14.29, "low": 14.29, "vae": 0.127, "text_encoder": 5.68}),
    ],
)
def test_full_size_layouts_match_the_released_models(
    family: str, expected: dict[str, float], layouts: Callable[[Family], Layouts]
) -> None:
    counts = {name: _parameters(layout) / 1e9 for name, layout in layouts(FAMILIES[family]).items()}
    assert counts == pytest.approx(expected, rel=0.01)


@pytest.mark.integration
def test_the_synthetic_umt5_carries_a_tokenizer_comfyui_can_read(workspace: Workspace) -> None:
    """ComfyUI's Wan tokenizer reads the SentencePiece model from the UMT5 file (``spiece_model``);
    without one the text encoder fails with "invalid tokenizer"."""
    import sentencepiece

    for name in ("wan-14b", "wan22-14b", "wan22-i2v-14b"):
        (umt5,) = [f for f in FAMILIES[name].files if f.layout == "text_encoder"]
        assert umt5.tokenizer and umt5.form == "fp8_scaled", name
    assert not any(f.tokenizer for f in FAMILIES["ltxv-13b"].files)
    model = stand_in_tokenizer(workspace.comfyui_dir)
    assert model.dtype == torch.uint8
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.numpy().tobytes())
    ids = processor.encode("a red fox running through fresh snow at golden hour")
    assert ids and max(ids) < 256384  # UMT5-XXL's vocabulary


def _small(name: str) -> Family:
    """One block per DiT at full width, without the text encoder (UMT5 alone is 6.7 GB in fp8)."""
    family = FAMILIES[name].with_layers(1)
    return replace(family, files=tuple(f for f in family.files if f.layout != "text_encoder"))


@pytest.fixture(scope="module")
def depth_cut(
    workspace: Workspace,
    tmp_path_factory: pytest.TempPathFactory,
    layouts: Callable[[Family], Layouts],
) -> Iterator[Callable[[str], Synthesized]]:
    """The depth-cut files of a family, written once and kept until another family is asked for (one
    family on disk at a time: up to 1.9 GB; the tests that share a family follow each other), from the
    layouts the module read at once."""
    held: dict[str, tuple[Synthesized, ExitStack]] = {}

    def get(name: str) -> Synthesized:
        if name not in held:
            for _, stack in held.values():
                stack.close()
            held.clear()
            stack = ExitStack()
            root = stack.enter_context(scratch_dir(tmp_path_factory, name))
            family = _small(name)
            paths = synthesize(
                family,
                root,
                workspace.comfyui_dir,
                device=torch.device("cpu"),
                python=workspace.python,
                layouts=layouts(family),
            )
            held[name] = ((family, paths), stack)
        return held[name][0]

    yield get
    for _, stack in held.values():
        stack.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.integration
def test_current_files_are_kept_and_force_writes_the_same_bytes(
    depth_cut: Callable[[str], Synthesized], workspace: Workspace, layouts: Callable[[Family], Layouts]
) -> None:
    family, paths = depth_cut("wan-14b")
    root = paths[0].parents[1]
    lines: list[str] = []
    before = {p: p.stat().st_mtime_ns for p in paths}
    synthesize(
        family,
        root,
        workspace.comfyui_dir,
        device=torch.device("cpu"),
        python=workspace.python,
        progress=lines.append,
    )
    assert {p: p.stat().st_mtime_ns for p in paths} == before and lines == []
    small = replace(family, files=tuple(f for f in family.files if f.layout == "vae"))
    vae = root / small.files[0].relative
    digest = _digest(vae)
    synthesize(
        small,
        root,
        workspace.comfyui_dir,
        device=torch.device("cpu"),
        python=workspace.python,
        force=True,
        progress=lines.append,
        layouts=layouts(family),  # the VAE's among them
    )
    assert vae.stat().st_mtime_ns != before[vae] and _digest(vae) == digest  # values are seeded per tensor
    assert any("wrote" in line and "B parameters" in line for line in lines)


@pytest.mark.integration
@pytest.mark.parametrize("name", DEPTH_CUT)
def test_depth_cut_wan_files_are_the_release_forms_comfyui_expects(
    name: str, depth_cut: Callable[[str], Synthesized], layouts: Callable[[Family], Layouts]
) -> None:
    family, paths = depth_cut(name)
    assert all(p.as_posix().endswith(f.relative) for p, f in zip(paths, family.files, strict=True))
    assert all(is_synthetic(p) for p in paths)
    layout = layouts(family)
    for path, file in zip(paths, family.files, strict=True):
        header = read_safetensors_header(path)
        if file.form == "fp8_scaled":  # a DiT in ComfyUI's scaled fp8, as the templates' files are
            for spec in layout[file.layout]:  # every tensor ComfyUI's Wan model has, at its shape
                assert header[spec.key]["shape"] == list(spec.shape), spec.key
            fp8 = [k for k in _dtypes(header, "F8_E4M3") if k != "scaled_fp8"]
            assert len(fp8) == WAN_BLOCK_PROJECTIONS and all(k.startswith("blocks.0.") for k in fp8)
            for key in fp8:
                scale = header[key.removesuffix(".weight") + ".scale_weight"]
                assert (scale["dtype"], scale["shape"]) == ("F32", [])
            assert header["scaled_fp8"]["shape"] == [0]  # the marker v0.3.75 detects scaled fp8 by
            assert "blocks.1.self_attn.q.weight" not in header
        elif file.form == "lora":
            targets = {k.removeprefix("diffusion_model.").rsplit(".lora_", 1)[0] + ".weight" for k in header}
            targets.discard("__metadata__.weight")
            assert len(targets) == WAN_BLOCK_PROJECTIONS
            assert targets <= {spec.key for spec in layout[file.layout]}
            assert all(64 in v["shape"] for k, v in header.items() if k != "__metadata__")  # rank 64
        else:
            assert set(header) - {"__metadata__"} == {spec.key for spec in layout[file.layout]}
    if name == "wan22-i2v-14b":  # 16 latent + 4 mask + 16 image-latent channels
        assert read_safetensors_header(paths[0])["patch_embedding.weight"]["shape"][1] == 36


@pytest.mark.integration
def test_a_wan22_i2v_expert_loads_through_the_int8_loader_and_denoises(
    depth_cut: Callable[[str], Synthesized], comfy: SimpleNamespace
) -> None:
    """The scaled-fp8 high-noise expert, quantized on load: ComfyUI's Wan model with 36 input channels,
    INT8 block projections, its 4-step LoRA applied, a finite 16-channel prediction that the LoRA moves."""
    supported_models = importlib.import_module("comfy.supported_models")
    family, paths = depth_cut("wan22-i2v-14b")
    by_name = {Path(f.relative).name: p for f, p in zip(family.files, paths, strict=True)}
    patcher = comfy.loading.load_diffusion_model_int8(
        by_name["wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors"]
    )
    config = patcher.model.model_config
    assert isinstance(config, supported_models.WAN21_T2V) and config.unet_config["in_dim"] == 36
    model = patcher.model.diffusion_model
    assert comfy.ops.is_int8(model.blocks[0].self_attn.q.weight)
    assert not comfy.ops.is_int8(model.head.head.weight)  # the output projection stays in bf16
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 36, 2, 8, 8, generator=generator)
    context = torch.randn(1, 8, 4096, generator=generator)
    timestep = torch.tensor([500.0])
    with torch.no_grad():
        plain = model(x, timestep, context).float()
    lora = comfy.utils.load_torch_file(
        str(by_name["wan2.2_i2v_lightx2v_4steps_lora_v1_high_noise.safetensors"])
    )
    patches = comfy.lora.load_lora(lora, comfy.lora.model_lora_keys_unet(patcher.model, {}))
    assert len(patches) == WAN_BLOCK_PROJECTIONS
    with_lora = patcher.clone()
    with_lora.add_patches(patches, 1.0)
    with_lora.patch_model()
    try:
        with torch.no_grad():
            adapted = with_lora.model.diffusion_model(x, timestep, context).float()
    finally:
        with_lora.unpatch_model()
    assert plain.shape == adapted.shape == (1, 16, 2, 8, 8)
    assert torch.isfinite(plain).all() and torch.isfinite(adapted).all()
    assert not torch.equal(plain, adapted)


@pytest.mark.integration
def test_the_ltxv_release_checkpoint_form_loads_as_a_release_does(
    tmp_path: Path, comfy: SimpleNamespace, workspace: Workspace
) -> None:
    """The ltxv-13b family's checkpoint file (``model.diffusion_model.*`` + ``vae.*`` + metadata
    config), written at the tiny fixture's size: our checkpoint loader and stock ComfyUI's take the DiT
    and the VAE from it."""
    from leanvideo.int8_checkpoint import load_checkpoint_int8

    supported_models = importlib.import_module("comfy.supported_models")
    checkpoint = FAMILIES["ltxv-13b"].files[0]
    assert checkpoint.relative == "checkpoints/ltxv-13b-0.9.7-dev.safetensors"
    tiny = Family(
        name="ltxv-13b",
        requests={
            "dit": LayoutRequest("ltxv_dit", TRANSFORMER_CONFIG),
            "vae": LayoutRequest("ltxv_vae", VAE_CONFIG),
        },
        files=(replace(checkpoint, metadata={"config": json.dumps(LTXV_CONFIG)}),),
        dit_layouts=("dit",),
    )
    (path,) = synthesize(
        tiny, tmp_path, workspace.comfyui_dir, device=torch.device("cpu"), python=workspace.python
    )
    header = read_safetensors_header(path)
    assert {k.split(".", 1)[0] for k in header if k != "__metadata__"} == {"model", "vae"}
    assert json.loads(header["__metadata__"]["config"])["transformer"] == TRANSFORMER_CONFIG
    model, vae = load_checkpoint_int8(path)
    assert isinstance(model.model.model_config, supported_models.LTXV)
    assert len(model.model.diffusion_model.transformer_blocks) == TRANSFORMER_CONFIG["num_layers"]
    assert comfy.ops.is_int8(model.model.diffusion_model.transformer_blocks[0].attn1.to_q.weight)
    assert vae.latent_channels == 128
    stock_model, _, stock_vae, _ = comfy.sd.load_checkpoint_guess_config(str(path), output_vae=True)
    assert stock_model is not None and stock_vae is not None


@pytest.mark.integration
def test_a_real_model_file_is_never_overwritten_or_removed(tmp_path: Path, workspace: Workspace) -> None:
    family = _small("wan-14b")
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


def test_layouts_given_without_one_the_family_needs_are_refused_before_writing(tmp_path: Path) -> None:
    family = _small("wan-14b")
    partial = {name: [] for name in family.requests if name != "vae"}
    with pytest.raises(SynthError, match=r"^the layouts given for wan-14b lack vae$"):
        synthesize(family, tmp_path, tmp_path / "no-comfyui", device=torch.device("cpu"), layouts=partial)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
@pytest.mark.parametrize("matrix_name", sorted(REAL_SIZE_MATRICES))
def test_real_size_matrix_runs_on_exactly_the_synthetic_files(
    matrix_name: str, comfy_server: ComfyServer
) -> None:
    """Every variant of the real-size matrix, its overrides applied, validates on the real server
    except for the model files (absent here), and those are exactly the files the synthetic family
    writes."""
    matrix = load_matrix(REPO_ROOT / "benchmarks" / matrix_name)
    family = FAMILIES[REAL_SIZE_MATRICES[matrix_name]]
    synthetic_names = {Path(f.relative).name for f in family.files}
    object_info = dict(httpx.get(f"{comfy_server.url}/object_info", timeout=60).json())
    base = load_workflow(matrix.workflow)
    used: set[str] = set()
    for variant in matrix.variants:
        workflow = variant.build_workflow(base)
        apply_overrides(workflow, list(variant.overrides), object_info)
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


def test_each_shipped_full_size_workflow_loads_exactly_one_familys_files() -> None:
    """So the GPU machine can run every shipped full-size workflow on synthetic files, folder and name."""
    manifest = json.loads((WORKFLOWS_DIR / "manifest.json").read_text(encoding="utf-8"))["workflows"]
    full_size = {n for n, e in manifest.items() if e["models"] == "full" and e["format"] == "api"}
    assert full_size == set(SHIPPED_FAMILIES)
    for workflow_name, family_name in SHIPPED_FAMILIES.items():
        refs = required_models(load_workflow(WORKFLOWS_DIR / workflow_name))
        loaded = {f"{ref.folder}/{ref.name}" for ref in refs}
        assert loaded == {f.relative for f in FAMILIES[family_name].files}, workflow_name
