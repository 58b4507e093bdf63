"""INT8 ops and loaders inside the pinned ComfyUI (imported in-process, CPU): every file layout
against the bf16 model, LoRA merge-on-patch against a float LoRA reference, exact unpatch, partial
(low-VRAM) loading, device moves, and the INT8 text encoder against the float one."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, sqnr_db
from leanvideo.int8.convert import quantize_file, quantize_state_dict
from leanvideo.int8.export import to_layout
from leanvideo.int8.files import read_tensors
from leanvideo.int8.policy import plan_quantization
from leanvideo.int8.spec import Int8FormatError
from safetensors.torch import save_file

from runner.fixtures import FixtureSet
from runner.workspace import Workspace

DIT_SQNR_DB = 35.0  # tiny DiT output, INT8 vs bf16 weights (measured ≈ 46 dB)
LORA_SQNR_DB = 30.0  # INT8 + merged LoRA vs float + LoRA


@pytest.fixture(scope="module")
def comfy(workspace: Workspace, tiny_models: FixtureSet) -> SimpleNamespace:
    """ComfyUI's modules, imported in this process (on the CPU when there is no CUDA)."""
    if str(workspace.comfyui_dir) not in sys.path:
        sys.path.append(str(workspace.comfyui_dir))
    import comfy.cli_args

    comfy.cli_args.args.cpu = comfy.cli_args.args.cpu or not torch.cuda.is_available()
    import comfy.lora
    import comfy.sd
    import comfy.utils
    from leanvideo import int8_loading, int8_ops

    return SimpleNamespace(
        sd=comfy.sd, utils=comfy.utils, lora=comfy.lora, loading=int8_loading, ops=int8_ops
    )


@pytest.fixture(scope="module")
def dit_inputs() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 128, 2, 4, 4, generator=generator)
    context = torch.randn(1, 8, 768, generator=generator)
    return x, torch.tensor([0.6]), context, torch.ones(1, 8)


def _run_dit(patcher: Any, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, timestep, context, mask = inputs
    with torch.no_grad():
        return patcher.model.diffusion_model(x, timestep, context, attention_mask=mask, frame_rate=24).float()


@pytest.fixture(scope="module")
def float_dit(comfy: SimpleNamespace, tiny_models: FixtureSet) -> Any:
    sd, metadata = comfy.utils.load_torch_file(str(tiny_models.diffusion_model), return_metadata=True)
    return comfy.sd.load_diffusion_model_state_dict(sd, metadata=metadata)


def _write_layout(tiny_models: FixtureSet, directory: Path, layout: str) -> Path:
    """The tiny DiT quantized row-wise and written in ``layout``."""
    source = tiny_models.diffusion_model
    target = directory / f"dit-{layout}.safetensors"
    if layout == "leanvideo":
        quantize_file(source, target, family="ltxv", config=Int8WeightConfig(convrot=True))
        return target
    from leanvideo.int8.files import read_header

    header = read_header(source)
    if layout == "float":
        save_file(read_tensors(source), str(target), header.metadata)
        return target
    tensors = read_tensors(source)
    plan = plan_quantization({k: tuple(v.shape) for k, v in tensors.items()}, "ltxv", Int8WeightConfig())
    written, metadata = to_layout(quantize_state_dict(tensors, plan), layout, header.metadata)
    save_file(written, str(target), metadata)
    return target


@pytest.mark.parametrize("layout", ["leanvideo", "comfy_native", "comfy_native_header", "lightx2v", "float"])
def test_every_layout_loads_close_to_bf16(
    comfy: SimpleNamespace,
    tiny_models: FixtureSet,
    float_dit: Any,
    dit_inputs: tuple[torch.Tensor, ...],
    tmp_path: Path,
    layout: str,
) -> None:
    path = _write_layout(tiny_models, tmp_path, layout)
    patcher = comfy.loading.load_diffusion_model_int8(path)
    to_q = patcher.model.diffusion_model.transformer_blocks[0].attn1.to_q
    assert comfy.ops.is_int8(to_q.weight)
    assert not comfy.ops.is_int8(patcher.model.diffusion_model.proj_out.weight)  # last projection kept
    measured = sqnr_db(_run_dit(float_dit, dit_inputs), _run_dit(patcher, dit_inputs))
    print(f"tiny DiT output SQNR, {layout} INT8 vs bf16: {measured:.2f} dB")
    assert measured >= DIT_SQNR_DB


def test_lora_merges_once_matches_float_and_unpatches_exactly(
    comfy: SimpleNamespace, tiny_models: FixtureSet, float_dit: Any, dit_inputs: tuple[torch.Tensor, ...]
) -> None:
    patcher = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model)
    lora = comfy.utils.load_torch_file(str(tiny_models.lora))

    def with_lora(model: Any) -> Any:
        patched = model.clone()
        patched.add_patches(comfy.lora.load_lora(lora, comfy.lora.model_lora_keys_unet(model.model, {})), 1.0)
        return patched

    module = patcher.model.diffusion_model.transformer_blocks[0].attn1.to_q
    original = module.weight
    before = _run_dit(patcher, dit_inputs)

    float_patched = with_lora(float_dit)
    float_patched.patch_model()
    reference = _run_dit(float_patched, dit_inputs)
    float_patched.unpatch_model()

    int8_patched = with_lora(patcher)
    int8_patched.patch_model()
    assert comfy.ops.is_int8(module.weight) and module.weight is not original  # merged into new int8
    assert module.weight_function == []  # nothing left to do per step
    merged = _run_dit(int8_patched, dit_inputs)
    int8_patched.unpatch_model()

    measured = sqnr_db(reference, merged)
    print(f"tiny DiT + LoRA SQNR, INT8 merged vs float: {measured:.2f} dB")
    assert measured >= LORA_SQNR_DB
    assert sqnr_db(reference, before) < measured - 10  # the LoRA did change the output
    assert torch.equal(module.weight._qdata, original._qdata)
    assert torch.equal(module.weight._layout_params["scale"], original._layout_params["scale"])
    assert torch.equal(_run_dit(patcher, dit_inputs), before)

    # Low-VRAM: layers over the budget keep their int8 weight and apply the LoRA when used.
    int8_partial = with_lora(patcher)
    int8_partial.patch_model(device_to=torch.device("cpu"), lowvram_model_memory=1)
    assert torch.equal(module.weight._qdata, original._qdata) and len(module.weight_function) == 1
    partial = _run_dit(int8_partial, dit_inputs)
    int8_partial.unpatch_model()
    assert sqnr_db(merged, partial) > 60.0
    assert module.weight_function == []


def test_int8_weight_and_scale_move_together(comfy: SimpleNamespace, tiny_models: FixtureSet) -> None:
    patcher = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model)
    module = patcher.model.diffusion_model.transformer_blocks[0].ff.net[2]
    module.to("meta")
    assert module.weight._qdata.device.type == "meta"
    assert module.weight._layout_params["scale"].device.type == "meta"


def test_bad_files_fail_before_comfy_builds_anything(
    comfy: SimpleNamespace, tmp_path: Path, tiny_models: FixtureSet
) -> None:
    tensors = read_tensors(tiny_models.diffusion_model)
    layer = "transformer_blocks.0.attn1.to_q"
    tensors[layer + ".weight"] = torch.zeros_like(tensors[layer + ".weight"], dtype=torch.int8)
    broken = tmp_path / "no-scale.safetensors"
    save_file(tensors, str(broken))
    with pytest.raises(Int8FormatError, match=r"no-scale\.safetensors.*to_q\.weight' has no scale"):
        comfy.loading.load_diffusion_model_int8(broken)
    unknown = tmp_path / "unknown.safetensors"
    save_file({"foo.0.weight": torch.randn(8, 8), "bar.weight": torch.randn(8)}, str(unknown))
    with pytest.raises(Int8FormatError, match=r"unknown\.safetensors: ComfyUI does not recognise"):
        comfy.loading.load_diffusion_model_int8(unknown)
    with pytest.raises(Int8FormatError, match="turn on quantize_on_load"):
        comfy.loading.load_diffusion_model_int8(
            tiny_models.diffusion_model, comfy.loading.Int8LoadOptions(quantize_on_load=False)
        )


def test_clip_l_text_encoder_quantized_on_load(comfy: SimpleNamespace, tiny_models: FixtureSet) -> None:
    path = tiny_models.text_encoder
    int8_clip = comfy.loading.load_text_encoder_int8([path], "stable_diffusion")
    float_clip = comfy.sd.load_clip([str(path)], clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION)
    layer = int8_clip.cond_stage_model.clip_l.transformer.text_model.encoder.layers[0].self_attn.q_proj
    assert comfy.ops.is_int8(layer.weight)
    tokens = float_clip.tokenize("a red fox running through fresh snow")
    reference = float_clip.encode_from_tokens(tokens)
    measured = sqnr_db(reference, int8_clip.encode_from_tokens(tokens))
    print(f"CLIP-L conditioning SQNR, INT8 vs fp16: {measured:.2f} dB")
    assert measured >= 25.0


def test_lora_side_branch_is_exact_and_leaves_int8_weights_alone(
    comfy: SimpleNamespace, tiny_models: FixtureSet, float_dit: Any, dit_inputs: tuple[torch.Tensor, ...]
) -> None:
    options = comfy.loading.Int8LoadOptions(lora_mode="side_branch")
    patcher = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model, options)
    lora = comfy.utils.load_torch_file(str(tiny_models.lora))
    module = patcher.model.diffusion_model.transformer_blocks[0].attn1.to_q
    original = module.weight._qdata.clone()
    before = _run_dit(patcher, dit_inputs)

    def patched(model: Any) -> Any:
        clone = model.clone()
        clone.add_patches(comfy.lora.load_lora(lora, comfy.lora.model_lora_keys_unet(model.model, {})), 1.0)
        return clone

    float_patched = patched(float_dit)
    float_patched.patch_model()
    reference = _run_dit(float_patched, dit_inputs)
    float_patched.unpatch_model()
    merge_patcher = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model)
    merged_patched = patched(merge_patcher)
    merged_patched.patch_model()
    merged = _run_dit(merged_patched, dit_inputs)
    merged_patched.unpatch_model()

    int8_patched = patched(patcher)
    assert isinstance(int8_patched, type(patcher))  # clones keep the side-branch patcher
    int8_patched.patch_model()
    assert len(module.lora_branches) == 1 and torch.equal(module.weight._qdata, original)
    side = _run_dit(int8_patched, dit_inputs)
    int8_patched.unpatch_model()
    side_db, merged_db = sqnr_db(reference, side), sqnr_db(reference, merged)
    print(f"tiny DiT + LoRA SQNR vs float: side branch {side_db:.2f} dB, merged {merged_db:.2f} dB")
    assert side_db >= merged_db - 0.5  # no requantization error added
    assert module.lora_branches == []
    assert torch.equal(_run_dit(patcher, dit_inputs), before)
