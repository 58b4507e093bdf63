"""INT8 ops and loaders inside the pinned ComfyUI (imported in-process, CPU): every file layout
against the bf16 model, LoRA merge-on-patch against a float LoRA reference, exact unpatch, partial
(low-VRAM) loading, device moves, and the INT8 text encoder against the float one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import leanvideo
import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, sqnr_db
from leanvideo.int8.convert import quantize_file, quantize_state_dict
from leanvideo.int8.export import to_layout
from leanvideo.int8.files import read_header, read_tensors
from leanvideo.int8.policy import plan_quantization
from leanvideo.int8.spec import Int8FormatError
from safetensors.torch import save_file

from runner.fixtures import FixtureSet
from runner.local.workspace import Workspace

pytestmark = pytest.mark.integration

DIT_SQNR_DB = 35.0  # tiny DiT output, INT8 vs bf16 weights (measured ≈ 46 dB)
LORA_SQNR_DB = 30.0  # INT8 + merged LoRA vs float + LoRA
# INT8 from fp8 adds its rounding (≈ 43 dB against the fp8 weights) to fp8's own: at most this much worse
FP8_MARGIN_DB = 0.5
PROMPT = "a red fox running through fresh snow"


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


def test_a_weight_of_the_wrong_shape_is_refused_naming_file_tensor_and_shapes(
    comfy: SimpleNamespace, tmp_path: Path, tiny_models: FixtureSet
) -> None:
    """As the stock loader's size mismatch: not a matmul error in the sampler, naming nothing."""
    key = "model.diffusion_model.transformer_blocks.0.attn1.to_k.weight"
    for source, name in ((tiny_models.checkpoint, "cut-float"), (tiny_models.int8_checkpoint, "cut-int8")):
        tensors = read_tensors(source)
        rows, columns = tensors[key].shape
        tensors[key] = tensors[key][:, : columns // 2].contiguous()  # an int8 weight keeps its row scales
        cut = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(cut), read_header(source).metadata)  # its config: the model's other sizes
        said = rf"{name}\.safetensors: tensor 'transformer_blocks\.0\.attn1\.to_k\.weight' is "
        said += rf"{rows}×{columns // 2}, but this model's layer takes {rows}×{columns}: the file is damaged"
        with pytest.raises(Int8FormatError, match=said):
            comfy.loading.load_diffusion_model_int8(cut, comfy.loading.Int8LoadOptions(quantize_on_load=True))


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


def _w8a16(comfy: SimpleNamespace) -> Any:
    """Load options with the kernel fixed: two loads under ``auto`` measure separately and may pick
    different kernels for a shape (close timings, a busy machine), so their outputs need not be equal."""
    return comfy.loading.Int8LoadOptions(matmul_route="w8a16")


@pytest.fixture(scope="module")
def int8_clip_l(comfy: SimpleNamespace, tiny_models: FixtureSet) -> Any:
    return comfy.loading.load_text_encoder_int8([tiny_models.text_encoder], "stable_diffusion", _w8a16(comfy))


@pytest.fixture(scope="module")
def int8_clip_l_conditioning(int8_clip_l: Any) -> torch.Tensor:
    """The INT8 CLIP-L's conditioning for :data:`PROMPT`."""
    return int8_clip_l.encode_from_tokens(int8_clip_l.tokenize(PROMPT))


def test_clip_l_text_encoder_quantized_on_load(
    comfy: SimpleNamespace, tiny_models: FixtureSet, int8_clip_l: Any, int8_clip_l_conditioning: torch.Tensor
) -> None:
    float_clip = comfy.sd.load_clip(
        [str(tiny_models.text_encoder)], clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION
    )
    layer = int8_clip_l.cond_stage_model.clip_l.transformer.text_model.encoder.layers[0].self_attn.q_proj
    assert comfy.ops.is_int8(layer.weight)
    reference = float_clip.encode_from_tokens(float_clip.tokenize(PROMPT))
    measured = sqnr_db(reference, int8_clip_l_conditioning)
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


def test_a_lora_of_another_model_is_skipped_in_side_branch_mode_as_merge_skips_it(
    comfy: SimpleNamespace,
    tiny_models: FixtureSet,
    dit_inputs: tuple[torch.Tensor, ...],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its factors (rank 8 × 128 on 64-wide layers) failed in the sampler with "mat1 and mat2 shapes
    cannot be multiplied", naming neither the LoRA nor the layer; merge mode logs and skips them."""
    options = comfy.loading.Int8LoadOptions(lora_mode="side_branch")
    patcher = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model, options)
    lora = comfy.utils.load_torch_file(str(tiny_models.lora))
    # a LoRA for 128-wide layers: A [rank, 128], B [128, rank]
    wide = {
        k: torch.zeros(v.shape[0], 128) if "lora_A" in k else torch.zeros(128, v.shape[1])
        for k, v in lora.items()
    }
    before = _run_dit(patcher, dit_inputs)
    clone = patcher.clone()
    clone.add_patches(comfy.lora.load_lora(wide, comfy.lora.model_lora_keys_unet(patcher.model, {})), 1.0)
    clone.patch_model()
    module = patcher.model.diffusion_model.transformer_blocks[0].attn1.to_q
    assert module.lora_branches == []
    assert torch.equal(_run_dit(clone, dit_inputs), before)  # ran, as if without the LoRA
    assert "do not fit the layer's weight [64, 64]: skipped" in caplog.text
    clone.unpatch_model()


class _Handed(Exception):
    """Raised by the spy once it has seen the state dict: nothing after it is under test."""


def _spy_on_text_encoder_state_dicts(
    comfy: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, *, build: bool
) -> list[tuple[dict[str, torch.Tensor], Any]]:
    """Record (state dict, clip type) of every call our loader makes to ComfyUI's text encoder
    builder; ``build=False`` stops there (raises :class:`_Handed`) instead of building."""
    handed: list[tuple[dict[str, torch.Tensor], Any]] = []
    load_state_dicts = comfy.sd.load_text_encoder_state_dicts

    def spy(state_dicts: list[dict[str, torch.Tensor]], **kwargs: Any) -> Any:
        handed.append((dict(state_dicts[0]), kwargs["clip_type"]))
        if not build:
            raise _Handed
        return load_state_dicts(state_dicts, **kwargs)

    monkeypatch.setattr(comfy.sd, "load_text_encoder_state_dicts", spy)
    return handed


@pytest.fixture(scope="module")
def tokenizer_file(workspace: Workspace) -> Path:
    """A real SentencePiece model: the pinned ComfyUI's T5 tokenizer."""
    return workspace.comfyui_dir / "comfy/text_encoders/t5_pile_tokenizer/tokenizer.model"


def _blob(path: Path) -> torch.Tensor:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)


def test_text_encoder_hands_its_tokenizer_blob_to_comfyui(
    comfy: SimpleNamespace,
    tiny_models: FixtureSet,
    int8_clip_l_conditioning: torch.Tensor,
    tokenizer_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Comfy-Org's UMT5-XXL carries its SentencePiece tokenizer as the uint8 tensor ``spiece_model``;
    ComfyUI builds Wan's tokenizer from the state dict's entry. A UMT5-XXL is 11 GB, so CLIP-L with the
    blob added stands in: quantized on load, it must encode as without the blob, and the state dict
    our loader gives ComfyUI must carry the blob unchanged, enough for Wan's tokenizer to work."""
    import sentencepiece
    from comfy.text_encoders.wan import WanT5Tokenizer

    path = tmp_path / "clip_l-spiece.safetensors"
    save_file({**read_tensors(tiny_models.text_encoder), "spiece_model": _blob(tokenizer_file)}, str(path))
    handed = _spy_on_text_encoder_state_dicts(comfy, monkeypatch, build=True)
    clip = comfy.loading.load_text_encoder_int8([path], "wan", _w8a16(comfy))
    [(state_dict, clip_type)] = handed
    assert clip_type == comfy.sd.CLIPType.WAN
    assert state_dict["spiece_model"].numpy().tobytes() == tokenizer_file.read_bytes()
    assert torch.equal(clip.encode_from_tokens(clip.tokenize(PROMPT)), int8_clip_l_conditioning)

    # What load_text_encoder_state_dicts builds for CLIPType.WAN from a UMT5-XXL state dict.
    wan_tokenizer = WanT5Tokenizer(tokenizer_data={"spiece_model": state_dict["spiece_model"]})
    ids = [token for token, _ in wan_tokenizer.tokenize_with_weights(PROMPT)["umt5xxl"][0]]
    expected = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_file), add_eos=True).encode(
        PROMPT
    )
    assert ids[: len(expected)] == expected and set(ids[len(expected) :]) == {0}  # 0: padding


def test_pre_quantized_text_encoder_hands_its_tokenizer_blob_to_comfyui(
    comfy: SimpleNamespace, tokenizer_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LeanVideo INT8 text encoder file keeps the blob, and the loader hands it on unchanged."""
    source, target = tmp_path / "te.safetensors", tmp_path / "te-int8.safetensors"
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_file(
        {"encoder.block.0.layer.0.SelfAttention.q.weight": weight, "spiece_model": _blob(tokenizer_file)},
        str(source),
    )
    quantize_file(source, target, family="text_encoder")
    handed = _spy_on_text_encoder_state_dicts(comfy, monkeypatch, build=False)
    with pytest.raises(_Handed):
        comfy.loading.load_text_encoder_int8(
            [target], "wan", comfy.loading.Int8LoadOptions(quantize_on_load=False)
        )
    [(state_dict, _)] = handed
    assert state_dict["encoder.block.0.layer.0.SelfAttention.q.weight"].dtype == torch.int8
    assert state_dict["spiece_model"].numpy().tobytes() == tokenizer_file.read_bytes()


@pytest.mark.parametrize("kind", ["e4m3", "e5m2", "scaled"])
def test_an_fp8_dit_quantized_on_load_matches_stock_comfyui_running_it(
    comfy: SimpleNamespace,
    tiny_models: FixtureSet,
    float_dit: Any,
    dit_inputs: tuple[torch.Tensor, ...],
    tmp_path: Path,
    kind: str,
) -> None:
    """The tiny DiT saved as fp8 (plain e4m3fn / e5m2, or ComfyUI scaled fp8): our loader quantizes it
    to INT8 on load; stock ComfyUI (UNETLoader's path) runs the same file. Both against the bf16 DiT."""
    from leanvideo.int8.files import read_header
    from leanvideo.int8.fp8 import to_fp8

    stored, _ = to_fp8(read_tensors(tiny_models.diffusion_model), kind)
    path = tmp_path / f"dit-{kind}.safetensors"
    save_file(stored, str(path), read_header(tiny_models.diffusion_model).metadata)
    ours = comfy.loading.load_diffusion_model_int8(path)
    assert comfy.ops.is_int8(ours.model.diffusion_model.transformer_blocks[0].attn1.to_q.weight)
    sd, metadata = comfy.utils.load_torch_file(str(path), return_metadata=True)
    stock = comfy.sd.load_diffusion_model_state_dict(sd, metadata=metadata)
    reference = _run_dit(float_dit, dit_inputs)
    ours_db = sqnr_db(reference, _run_dit(ours, dit_inputs))
    stock_db = sqnr_db(reference, _run_dit(stock, dit_inputs))
    print(f"DiT output SQNR vs bf16, {kind}: stock fp8 {stock_db:.2f} dB, our INT8 of it {ours_db:.2f} dB")
    assert ours_db >= stock_db - FP8_MARGIN_DB


def test_a_per_channel_scaled_fp8_dit_loads_through_ours(
    comfy: SimpleNamespace,
    tiny_models: FixtureSet,
    float_dit: Any,
    dit_inputs: tuple[torch.Tensor, ...],
    tmp_path: Path,
) -> None:
    """Scaled fp8 with one scale per output channel: v0.3.75's own loader refuses the shapes; ours reads
    it exactly and quantizes it."""
    from leanvideo.int8.files import read_header
    from leanvideo.int8.fp8 import to_fp8

    stored, _ = to_fp8(read_tensors(tiny_models.diffusion_model), "scaled_channel")
    path = tmp_path / "dit-scaled-channel.safetensors"
    save_file(stored, str(path), read_header(tiny_models.diffusion_model).metadata)
    ours = comfy.loading.load_diffusion_model_int8(path)
    measured = sqnr_db(_run_dit(float_dit, dit_inputs), _run_dit(ours, dit_inputs))
    print(f"DiT output SQNR vs bf16, per-channel scaled fp8 → our INT8: {measured:.2f} dB")
    assert measured >= 25.0
    with pytest.raises(Int8FormatError, match="quantize_on_load"):
        comfy.loading.load_diffusion_model_int8(path, comfy.loading.Int8LoadOptions(quantize_on_load=False))


def test_a_scaled_fp8_text_encoder_loads_through_ours_like_stock(
    comfy: SimpleNamespace, tiny_models: FixtureSet, tmp_path: Path
) -> None:
    """The full-size CLIP-L saved as ComfyUI scaled fp8 (per-tensor scales, the marker): our INT8 text
    encoder loader against stock ComfyUI loading the same file, both against the fp16 original."""
    from leanvideo.int8.fp8 import to_fp8

    stored, _ = to_fp8(read_tensors(tiny_models.text_encoder), "scaled")
    path = tmp_path / "clip_l_fp8_e4m3fn_scaled.safetensors"
    save_file(stored, str(path))
    ours = comfy.loading.load_text_encoder_int8([path], "stable_diffusion")
    layer = ours.cond_stage_model.clip_l.transformer.text_model.encoder.layers[0].self_attn.q_proj
    assert comfy.ops.is_int8(layer.weight)
    kind = comfy.sd.CLIPType.STABLE_DIFFUSION
    original = comfy.sd.load_clip([str(tiny_models.text_encoder)], clip_type=kind)
    stock = comfy.sd.load_clip([str(path)], clip_type=kind)
    reference = original.encode_from_tokens(original.tokenize(PROMPT))
    ours_db = sqnr_db(reference, ours.encode_from_tokens(ours.tokenize(PROMPT)))
    stock_db = sqnr_db(reference, stock.encode_from_tokens(stock.tokenize(PROMPT)))
    print(f"CLIP-L conditioning SQNR vs fp16, scaled fp8: stock {stock_db:.2f} dB, ours {ours_db:.2f} dB")
    # v0.3.75 applies no scale_weight to a CLIP-L (≈ 0 dB here: it reads the bare fp8 values); ours does
    assert ours_db >= max(stock_db - FP8_MARGIN_DB, 20.0)


PACK_DIR = str(Path(leanvideo.__file__).parent)  # as the frames of its code name their files
# ComfyUI's CPU attention asks psutil for the free memory in every layer: a graph break (psutil reads
# /proc/meminfo), after which dynamo guards on the number returned, so when the machine's free memory
# changed between two layers that part of the trace compiled again, one graph more at random (a long
# test run failed on 14 breaks against 13 so). The traces here see a fixed free memory: none then.
FIXED_FREE_MEMORY = 8 * 1024**3


def _graph_breaks(
    comfy: SimpleNamespace, patcher: Any, inputs: tuple[torch.Tensor, ...]
) -> tuple[int, list[str], list[str]]:
    """``(graph breaks, every break's reason, those of breaks inside the pack's code)`` of one trace."""
    import torch._dynamo

    def fixed_free_memory(dev: Any = None, torch_free_too: bool = False) -> Any:
        return (FIXED_FREE_MEMORY, FIXED_FREE_MEMORY) if torch_free_too else FIXED_FREE_MEMORY

    x, timestep, context, mask = inputs
    torch._dynamo.reset()
    with torch.no_grad(), mock.patch.object(comfy.mm, "get_free_memory", fixed_free_memory):
        explained = torch._dynamo.explain(patcher.model.diffusion_model)(
            x, timestep, context, attention_mask=mask, frame_rate=24
        )
    reasons, ours = [], []
    for item in explained.break_reasons:
        frames = [f"{frame.filename}:{frame.lineno}" for frame in item.user_stack]
        reason = f"{str(item.reason)[:160]} at {frames[-1] if frames else '?'}"
        reasons.append(reason)
        if any(frame.startswith(PACK_DIR) for frame in frames):
            ours.append(reason)
    return explained.graph_break_count, reasons, ours


@pytest.mark.parametrize("route", ["w8a16", "auto", "int_mm_fused", "kitchen", "onednn"])
def test_int8_dit_traces_for_torch_compile_like_the_float_one(
    comfy: SimpleNamespace,
    tiny_models: FixtureSet,
    float_dit: Any,
    dit_inputs: tuple[torch.Tensor, ...],
    route: str,
) -> None:
    """ComfyUI's TorchCompileModel compiles the DiT: the INT8 Linear (a QuantizedTensor weight) and its
    kernel dispatch must trace into the same graphs as the float model's layers do. A graph break per
    layer would cut the model into hundreds of graphs and undo what compilation buys. With ``auto``,
    the kernels were measured first (an eager step), as in a real run."""
    from leanvideo.int8.dispatch import KernelDispatcher
    from leanvideo.int8.linear import import_kitchen

    if route == "kitchen" and import_kitchen() is None:
        pytest.skip("comfy-kitchen does not import here (pip install comfy-kitchen, or .[cuda])")
    dispatcher = KernelDispatcher(forced=None if route == "auto" else route)
    options = comfy.loading.Int8LoadOptions(matmul_route=route, dispatcher=dispatcher)
    patcher = comfy.loading.load_diffusion_model_int8(tiny_models.diffusion_model, options)
    _run_dit(patcher, dit_inputs)  # eager: measures (auto) or records (forced) each shape's kernel
    assert dispatcher.choices()
    float_breaks, _, _ = _graph_breaks(comfy, float_dit, dit_inputs)
    int8_breaks, reasons, ours = _graph_breaks(comfy, patcher, dit_inputs)
    print(f"graph breaks, tiny DiT: float {float_breaks}, INT8 ({route}) {int8_breaks}")
    assert not ours, ours  # no break inside the INT8 Linear, its kernels or their dispatch
    weights = [getattr(module, "weight", None) for module in patcher.model.modules()]
    assert sum(comfy.ops.is_int8(weight) for weight in weights if weight is not None) > 8
    assert int8_breaks <= float_breaks, reasons
