"""The deterministic tiny models (runner.fixtures), the test-only mask node and the tiny workflow."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from runner.fixtures import (
    FIXTURE_NODES_DIR,
    STAMP_KEY,
    FixtureSet,
    ForeignModelError,
    LayoutError,
    fixture_set,
    write_fixtures,
)
from runner.fixtures.clip import CLIP_L_PARAMETERS
from runner.fixtures.ltxv import LORA_RANK, TRANSFORMER_CONFIG, VAE_CONFIG, lora_target_key
from runner.fixtures.tensors import (
    TensorSpec,
    encode,
    random_tensor,
    read_safetensors_header,
    seed_for,
    write_safetensors,
)
from runner.install.pin import sha256_file
from runner.local.workspace import Workspace
from tests.scratch import scratch_dir

REPO = Path(__file__).resolve().parents[1]
TINY_WORKFLOW = REPO / "workflows" / "ltxv_tiny_t2v.api.json"


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    header = read_safetensors_header(path)
    return {key: tuple(entry["shape"]) for key, entry in header.items() if key != "__metadata__"}


@pytest.fixture(scope="session")
def comfyui_dir(workspace: Workspace) -> Path:
    return workspace.comfyui_dir


@pytest.fixture(scope="module")
def fixtures(comfyui_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureSet]:
    """One write of all fixture files per module (CLIP-L alone is 247 MB), removed after it."""
    with scratch_dir(tmp_path_factory, "fixtures-a") as root:
        yield write_fixtures(root, comfyui_dir)


@pytest.fixture(scope="module")
def forced_fixtures(comfyui_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureSet]:
    """An independent second write, forced."""
    with scratch_dir(tmp_path_factory, "fixtures-b") as root:
        yield write_fixtures(root, comfyui_dir, force=True)


# --- pure helpers (no ComfyUI needed) ------------------------------------------------------------


def test_seed_is_stable_across_processes() -> None:
    code = "from runner.fixtures.tensors import seed_for; print(seed_for('ns', 'a.weight'))"
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO)}
    child = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=REPO
    )
    assert int(child.stdout) == seed_for("ns", "a.weight")
    assert seed_for("ns", "a.weight") != seed_for("ns", "b.weight")


def test_value_rules_follow_the_key() -> None:
    assert not random_tensor("t", TensorSpec("blocks.0.proj.bias", (4,))).any()
    assert (random_tensor("t", TensorSpec("blocks.0.norm1.weight", (4,))) == 1).all()
    assert (random_tensor("t", TensorSpec("stats.std-of-means", (4,))) == 1).all()
    assert not random_tensor("t", TensorSpec("stats.mean-of-means", (4,))).any()
    weight = random_tensor("t", TensorSpec("blocks.0.proj.weight", (256, 1024)))
    assert weight.std() == pytest.approx(1 / math.sqrt(1024), rel=0.05)
    embedding = random_tensor("t", TensorSpec("token_embedding.weight", (1000, 64)))
    assert embedding.std() == pytest.approx(0.02, rel=0.05)


def test_bf16_encoding_rounds_to_nearest_even() -> None:
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    values[:4] = [1.0, -2.5, 0.0, 1.00390625]  # the last one is a tie between two bf16 values
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert encode(values, "BF16") == expected


def test_writer_output_reads_back_with_safetensors(tmp_path: Path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    specs = [TensorSpec("b.weight", (3, 5)), TensorSpec("a.bias", (7,))]
    path = tmp_path / "x.safetensors"
    write_safetensors(path, specs, lambda s: random_tensor("w", s), dtype="F16", metadata={"k": "v"})
    loaded = safetensors_numpy.load_file(str(path))
    assert loaded["b.weight"].dtype == np.float16
    np.testing.assert_array_equal(loaded["b.weight"], random_tensor("w", specs[0]).astype(np.float16))
    assert read_safetensors_header(path)["__metadata__"] == {"k": "v"}
    assert list(tmp_path.iterdir()) == [path]  # no partial file left behind


def test_lora_target_key_rejects_foreign_keys() -> None:
    assert lora_target_key("diffusion_model.a.b.lora_B.weight") == "a.b.weight"
    with pytest.raises(ValueError, match="Not an LTXV LoRA key"):
        lora_target_key("lora_unet_a_b.lora_up.weight")


def test_missing_comfyui_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="Not a ComfyUI source tree"):
        write_fixtures(tmp_path / "models", tmp_path / "no-comfyui")


def test_tiny_workflow_is_wired_to_the_fixtures(tmp_path: Path) -> None:
    workflow = json.loads(TINY_WORKFLOW.read_text())
    names = fixture_set(tmp_path)
    by_type = {node["class_type"]: node for node in workflow.values()}
    assert all(node_id.isdigit() and node["_meta"]["title"] for node_id, node in workflow.items())
    for node in workflow.values():
        for value in node["inputs"].values():
            if isinstance(value, list):
                assert value[0] in workflow, f"{node['class_type']} links to missing node {value[0]}"
    assert by_type["CheckpointLoaderSimple"]["inputs"]["ckpt_name"] == names.checkpoint.name
    assert by_type["CLIPLoader"]["inputs"] == {
        "clip_name": names.text_encoder.name,
        "type": "stable_diffusion",
        "device": "default",
    }
    conditioning = by_type["LTXVConditioning"]["inputs"]
    for side in ("positive", "negative"):
        source = workflow[conditioning[side][0]]
        assert source["class_type"] == "LeanVideoFixtureAttentionMask"
        assert workflow[source["inputs"]["conditioning"][0]]["class_type"] == "CLIPTextEncode"
    latent = by_type["EmptyLTXVLatentVideo"]["inputs"]
    assert (latent["width"], latent["height"], latent["length"]) == (64, 64, 9)
    assert by_type["LTXVScheduler"]["inputs"]["steps"] == 8
    assert by_type["SaveVideo"]["inputs"]["filename_prefix"] == "leanvideo/ltxv_tiny"


# --- written fixtures (need the pinned ComfyUI for the layouts) ----------------------------------


@pytest.mark.integration
def test_writes_are_byte_identical(fixtures: FixtureSet, forced_fixtures: FixtureSet) -> None:
    for first, second in zip(fixtures.paths(), forced_fixtures.paths(), strict=True):
        assert first.name == second.name
        assert sha256_file(first) == sha256_file(second), first.name


@pytest.mark.integration
def test_second_call_is_cheap_and_rewrites_nothing(fixtures: FixtureSet, comfyui_dir: Path) -> None:
    before = {path: path.stat().st_mtime_ns for path in fixtures.paths()}
    started = time.perf_counter()
    again = write_fixtures(fixtures.models_dir, comfyui_dir)
    elapsed = time.perf_counter() - started
    print(f"current-fixtures check took {elapsed * 1000:.1f} ms")
    assert again == fixtures
    assert {path: path.stat().st_mtime_ns for path in again.paths()} == before
    assert elapsed < 1.0


@pytest.mark.integration
def test_files_a_killed_writer_left_are_removed(fixtures: FixtureSet, comfyui_dir: Path) -> None:
    before = {path: path.stat().st_mtime_ns for path in fixtures.paths()}
    leftovers = [
        fixtures.int8_checkpoint.with_name(f".{fixtures.int8_checkpoint.name}.773170a8.partial"),
        fixtures.text_encoder.with_name(f".{fixtures.text_encoder.name}.4242.partial"),
    ]
    for leftover in leftovers:
        leftover.write_bytes(b"half a model")
    theirs = fixtures.checkpoint.with_name(".other-model.safetensors.1.partial")  # not a fixture's
    theirs.write_bytes(b"kept")
    write_fixtures(fixtures.models_dir, comfyui_dir)
    assert not any(leftover.exists() for leftover in leftovers) and theirs.read_bytes() == b"kept"
    assert {path: path.stat().st_mtime_ns for path in fixtures.paths()} == before
    theirs.unlink()


@pytest.mark.integration
def test_damaged_file_is_rewritten(forced_fixtures: FixtureSet, comfyui_dir: Path) -> None:
    lora = forced_fixtures.lora
    expected = sha256_file(lora)
    untouched = {path: path.stat().st_mtime_ns for path in forced_fixtures.paths() if path != lora}
    with lora.open("r+b") as stream:
        stream.truncate(lora.stat().st_size - 10)
    write_fixtures(forced_fixtures.models_dir, comfyui_dir)
    assert sha256_file(lora) == expected
    assert {path: path.stat().st_mtime_ns for path in untouched} == untouched


def test_a_model_of_the_users_under_a_fixture_name_is_never_written_over(tmp_path: Path) -> None:
    # A real CLIP-L in a ComfyUI models folder is named clip_l.safetensors, like the tiny one.
    fixtures = fixture_set(tmp_path / "models")
    fixtures.text_encoder.parent.mkdir(parents=True)
    weights = {"text_model.embeddings.token_embedding.weight": np.ones((10, 10), np.float32)}
    save_file(weights, str(fixtures.text_encoder), metadata={"format": "pt"})
    fixtures.int8_checkpoint.parent.mkdir(parents=True)
    fixtures.int8_checkpoint.write_bytes(b"not even safetensors")
    fixtures.lora.parent.mkdir(parents=True)
    fixtures.lora.symlink_to(fixtures.text_encoder)
    hidden = tmp_path / "models" / "unet" / fixtures.diffusion_model.name  # ComfyUI's other DiT folder
    hidden.parent.mkdir(parents=True)
    save_file(weights, str(hidden))
    before = {path: path.read_bytes() for path in (fixtures.text_encoder, fixtures.int8_checkpoint, hidden)}
    for force in (False, True):
        with pytest.raises(ForeignModelError) as raised:
            write_fixtures(fixtures.models_dir, tmp_path / "no-comfyui", force=force)
        assert raised.value.exit_code == 2
        assert raised.value.paths == {
            fixtures.text_encoder: "not written by `leanvideo fixtures` (no 'leanvideo_fixture' stamp in its "
            "metadata)",
            fixtures.lora: "a link, which is not written through",
            fixtures.int8_checkpoint: "damaged, unreadable or not safetensors: it cannot be told from a tiny "
            "model, so it is kept",
            hidden: "a model of yours that ComfyUI would no longer load: it finds the tiny one of that name "
            "first",
        }
        assert str(fixtures.text_encoder) in str(raised.value)
        assert {path: path.read_bytes() for path in before} == before
        assert not fixtures.checkpoint.exists() and not fixtures.diffusion_model.exists()


@pytest.mark.integration
def test_checkpoint_holds_dit_vae_and_config(fixtures: FixtureSet) -> None:
    header = read_safetensors_header(fixtures.checkpoint)
    config = json.loads(header["__metadata__"]["config"])
    assert config == {"transformer": TRANSFORMER_CONFIG, "vae": VAE_CONFIG}
    assert json.loads(header["__metadata__"][STAMP_KEY])["format"] >= 1
    keys = [key for key in header if key != "__metadata__"]
    assert all(key.startswith(("model.diffusion_model.", "vae.")) for key in keys)
    # The keys ComfyUI's detection looks for (model_detection.py, sd.py).
    assert "model.diffusion_model.adaln_single.emb.timestep_embedder.linear_1.bias" in header
    assert "vae.decoder.up_blocks.0.res_blocks.0.conv1.conv.weight" in header
    block_prefix = "model.diffusion_model.transformer_blocks."
    blocks = {key.split(".")[3] for key in keys if key.startswith(block_prefix)}
    assert len(blocks) == TRANSFORMER_CONFIG["num_layers"]


@pytest.mark.integration
def test_dit_file_is_the_checkpoint_dit(fixtures: FixtureSet) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch = pytest.importorskip("torch")
    dit = safetensors_torch.load_file(str(fixtures.diffusion_model))
    checkpoint = safetensors_torch.load_file(str(fixtures.checkpoint))
    assert json.loads(read_safetensors_header(fixtures.diffusion_model)["__metadata__"]["config"]) == {
        "transformer": TRANSFORMER_CONFIG
    }
    for key, value in dit.items():
        assert torch.equal(value, checkpoint[f"model.diffusion_model.{key}"]), key


@pytest.mark.integration
def test_lora_keys_map_onto_dit_weights(fixtures: FixtureSet) -> None:
    dit = _shapes(fixtures.diffusion_model)
    lora = _shapes(fixtures.lora)
    modules = {key.rsplit(".lora_", 1)[0] for key in lora}
    assert len(lora) == 2 * len(modules)
    for module in modules:
        down = lora[f"{module}.lora_A.weight"]
        up = lora[f"{module}.lora_B.weight"]
        target = lora_target_key(f"{module}.lora_A.weight")
        assert down[0] == up[1] == LORA_RANK
        assert (up[0], down[1]) == dit[target], target
    assert any(".attn1.to_q" in module for module in modules)
    assert any(".ff.net.2" in module for module in modules)


@pytest.mark.integration
def test_all_values_are_finite_and_lora_b_is_not_zero(fixtures: FixtureSet) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    for path in fixtures.paths():
        for key, value in safetensors_torch.load_file(str(path)).items():
            assert value.float().isfinite().all(), f"{path.name}: {key}"
            if key.endswith("lora_B.weight"):
                assert value.abs().sum() > 0, key


@pytest.mark.integration
def test_clip_l_is_full_size_fp16_in_hf_layout(fixtures: FixtureSet) -> None:
    header = read_safetensors_header(fixtures.text_encoder)
    entries = {key: entry for key, entry in header.items() if key != "__metadata__"}
    parameters = sum(math.prod(entry["shape"]) for entry in entries.values())
    size_mb = fixtures.text_encoder.stat().st_size / 1e6
    print(f"CLIP-L parameters: {parameters / 1e6:.2f} M, file {size_mb:.1f} MB")
    assert parameters == CLIP_L_PARAMETERS
    assert {entry["dtype"] for entry in entries.values()} == {"F16"}
    assert all(key.startswith("text_model.") or key == "text_projection.weight" for key in entries)
    assert entries["text_model.embeddings.token_embedding.weight"]["shape"] == [49408, 768]
    assert "text_model.encoder.layers.11.mlp.fc1.weight" in entries


# --- the test-only node pack, inside ComfyUI (child process) -------------------------------------

_NODE_PROBE = textwrap.dedent(
    """
    import json, sys
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    from comfy.cli_args import args
    args.cpu = True
    import torch
    import leanvideo_fixture_nodes as pack

    schema = pack.LeanVideoFixtureAttentionMask.define_schema()
    cond = torch.zeros(1, 77, 768)
    zeros = torch.zeros(1, 77, dtype=torch.long)
    given = [[cond, {"pooled_output": None}], [cond, {"attention_mask": zeros}]]
    out = pack.LeanVideoFixtureAttentionMask.execute(given).result[0]
    print(json.dumps({
        "node_id": schema.node_id,
        "display_name": schema.display_name,
        "category": schema.category,
        "tooltips": [i.tooltip for i in schema.inputs],
        "input_untouched": "attention_mask" not in given[0][1],
        "mask_dtype": str(out[0][1]["attention_mask"].dtype),
        "mask_shape": list(out[0][1]["attention_mask"].shape),
        "mask_all_ones": bool(out[0][1]["attention_mask"].eq(1).all()),
        "existing_mask_kept": bool(out[1][1]["attention_mask"].eq(0).all()),
        "tensor_shared": out[0][0] is cond,
    }))
    """
)


@pytest.mark.integration
def test_mask_node_adds_an_all_ones_mask_without_mutating_input(comfyui_dir: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _NODE_PROBE, str(comfyui_dir), str(FIXTURE_NODES_DIR)],
        cwd=comfyui_dir,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    probe = json.loads(child.stdout.strip().splitlines()[-1])
    assert probe == {
        "node_id": "LeanVideoFixtureAttentionMask",
        "display_name": "Add Attention Mask (tiny-model fixture)",
        "category": "leanvideo/testing",
        "tooltips": [probe["tooltips"][0]],
        "input_untouched": True,
        "mask_dtype": "torch.int64",
        "mask_shape": [1, 77],
        "mask_all_ones": True,
        "existing_mask_kept": True,
        "tensor_shared": True,
    }
    assert probe["tooltips"][0]


def test_a_model_of_yours_under_a_tiny_name_in_your_comfyuis_models_is_refused(tmp_path: Path) -> None:
    """With the user's own ComfyUI, servers search its models first: a file there under a tiny model's
    name ran in the demo in place of the tiny one, whose figures it reported (41 dB instead of 45)."""
    import torch
    from safetensors.torch import save_file

    from runner.fixtures import STAMP_KEY, ShadowedFixturesError, check_not_shadowed

    check_not_shadowed(None)  # the workspace's own ComfyUI: nothing to look at
    models = tmp_path / "models"
    check_not_shadowed(models)  # none there
    (models / "text_encoders").mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(models / "text_encoders" / "clip_l.safetensors"), {STAMP_KEY: "1"})
    check_not_shadowed(models)  # a tiny model written there by `leanvideo fixtures`: fine
    (models / "unet").mkdir()
    theirs = models / "unet" / "ltxv-tiny-dit.safetensors"  # ComfyUI's other folder for diffusion models
    save_file({"w": torch.zeros(2)}, str(theirs), {"format": "pt"})
    with pytest.raises(ShadowedFixturesError) as refused:
        check_not_shadowed(models)
    assert list(refused.value.paths) == [theirs] and refused.value.exit_code == 2
    assert "nothing was run" in str(refused.value)
    theirs.unlink()
    # measured against the tiny models the servers are to load: the same one is fine; another tiny model
    # renamed (the float DiT as the INT8 checkpoint ran the demo on it) or of another version is not
    ours = fixture_set(tmp_path / "workspace-models")
    ours.text_encoder.parent.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(ours.text_encoder), {STAMP_KEY: "1"})
    check_not_shadowed(models, ours)
    save_file({"w": torch.zeros(2)}, str(ours.text_encoder), {STAMP_KEY: "2"})
    with pytest.raises(ShadowedFixturesError, match=r"clip_l.safetensors: another tiny model than"):
        check_not_shadowed(models, ours)
    # the folders of that ComfyUI's extra_model_paths.yaml are searched before the workspace's too: a
    # cut-short copy there under a tiny model's name failed the demo's prompt (exit 6, not refused)
    shared = tmp_path / "shared" / "checkpoints"
    shared.mkdir(parents=True)
    (shared / "ltxv-tiny.safetensors").write_bytes(b"cut short")
    check_not_shadowed(None, ours, {"loras": [shared]})  # not a folder of checkpoints
    with pytest.raises(ShadowedFixturesError) as refused:
        check_not_shadowed(None, ours, {"checkpoints": [shared]})
    assert list(refused.value.paths) == [shared / "ltxv-tiny.safetensors"]


def test_a_full_disk_while_writing_a_tiny_model_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fixtures` and `demo` on a full disk said only `error: No space left on device`: a write's
    OSError names no file. Nothing of the file is left (it is written beside and renamed)."""
    import errno

    import runner.fixtures as fixtures_module
    from runner.cli.main import main

    def full_disk(source: Path, copy: Path, *, family: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    models = tmp_path / "models"
    monkeypatch.setattr(fixtures_module, "_write_float_fixtures", lambda *args: None)
    monkeypatch.setattr(fixtures_module, "int8_copy_is_current", lambda source, copy: False)
    monkeypatch.setattr(fixtures_module, "write_int8_copy", full_disk)
    assert main(["fixtures", str(models)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    first_copy = fixtures_module.fixture_set(models).int8_checkpoint
    assert "No space left on device" in err and str(first_copy) in err, err
