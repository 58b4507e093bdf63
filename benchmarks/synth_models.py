"""Full-size random-weight models for benchmarking without downloads: LTXV-13B-class and Wan-14B-class.

Each family writes the files its real-size matrix (``seed_table.toml``, ``seed_table_wan.toml``) and
shipped workflow name, under the names users have them, into a models folder:

- ``ltxv-13b``: ``diffusion_models/ltxv-13b-0.9.7-dev-int8.safetensors`` (13.0 B-parameter DiT in the
  LeanVideo INT8 format, as ``leanvideo quantize`` writes it), ``vae/ltxv-13b-0.9.7-vae.safetensors``
  (the 0.9.5+ VAE, bf16), ``text_encoders/t5xxl_int8.safetensors`` (T5-XXL encoder, INT8) and
  ``loras/ltxv-13b-0.9.7-distilled-lora128.safetensors`` (rank 128, bf16);
- ``wan-14b``: ``diffusion_models/wan2.1_t2v_14B_int8.safetensors`` (14.3 B, INT8),
  ``vae/wan_2.1_vae.safetensors``, ``text_encoders/umt5_xxl_int8.safetensors`` (INT8, with a stand-in
  tokenizer, :func:`stand_in_tokenizer`) and the rank-32 LightX2V-style step-distill LoRA.

Key names and shapes come from the pinned ComfyUI's own classes (:mod:`runner.fixtures.layouts`), so
the stock loaders and ours load these files exactly as the real ones. Values are random (seeded per
tensor, :func:`runner.fixtures.tensors.init_rule`) and drawn on ``--device`` (a GPU makes a 13 B DiT
in seconds). Every file carries a ``leanvideo_synthetic`` metadata stamp; a file under one of these
names that lacks the stamp (a real model) is never overwritten or removed. ``--layers N`` keeps the
full width but only N blocks, for a dry run of the whole pipeline on a CPU.

Run: ``python -m benchmarks.synth_models ltxv-13b [--device cuda] [--models-dir DIR] [--layers N]``;
``--remove`` deletes a family's synthetic files (only stamped ones).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from leanvideo.int8 import Int8WeightConfig, quantize_weight
from leanvideo.int8.convert import declare_int8_layer, int8_metadata, write_int8_layer
from leanvideo.int8.policy import plan_quantization
from leanvideo.int8.spec import WEIGHT_SUFFIX
from leanvideo.int8.writer import StreamingWriter

from runner.fixtures.layouts import LayoutRequest, read_layouts
from runner.fixtures.ltxv import lora_specs
from runner.fixtures.tensors import TensorSpec, init_rule, read_safetensors_metadata, seed_for

STAMP_KEY = "leanvideo_synthetic"
SYNTH_FORMAT = 3  # bump when generated values or layouts change (3: INT8 text encoders)
LORA_B_STD = 0.01  # non-zero so the LoRA changes the output, small so 48 blocks stay finite

LTXV_13B_TRANSFORMER = {
    "num_layers": 48,
    "num_attention_heads": 32,
    "attention_head_dim": 128,
    "cross_attention_dim": 4096,
    "caption_channels": 4096,  # T5-XXL's width
    "in_channels": 128,
}
WAN_14B_DIT = {"dim": 5120, "ffn_dim": 13824, "num_layers": 40, "num_heads": 40, "in_dim": 16, "out_dim": 16}
STAND_IN_TOKENIZER = "comfy/text_encoders/t5_pile_tokenizer/tokenizer.model"
STAND_IN_TOKENIZER_NOTE = f"stand-in: the pinned ComfyUI's {STAND_IN_TOKENIZER}"
WAN_LORA_TARGETS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o")
WAN_LORA_TARGETS += ("cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")


class SynthError(RuntimeError):
    """A synthetic model cannot be written (a real file is in the way, an unknown family …)."""


@dataclass(frozen=True)
class SynthFile:
    """One file of a family: where it goes, which layout it holds and how it is stored."""

    relative: str  # path under the models folder
    layout: str  # name of a LayoutRequest of the family
    form: str  # "float", "int8" (LeanVideo INT8 DiT) or "lora"
    dtype: torch.dtype = torch.bfloat16
    int8_family: str = ""
    lora_rank: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)
    tokenizer: bool = False  # embed a SentencePiece model as ``spiece_model``, as UMT5 files do


@dataclass(frozen=True)
class Family:
    """A model family: the layouts to read from ComfyUI and the files made from them."""

    name: str
    requests: Mapping[str, LayoutRequest]
    files: tuple[SynthFile, ...]
    dit_layout: str

    def with_layers(self, layers: int) -> Family:
        """The same family with only ``layers`` DiT blocks (full width), for dry runs on a CPU."""
        if layers < 1:
            raise SynthError(f"--layers must be at least 1, not {layers}")
        dit = self.requests[self.dit_layout]
        requests = {
            **self.requests,
            self.dit_layout: replace(dit, config={**dit.config, "num_layers": layers}),
        }
        files = tuple(
            replace(f, metadata=_ltxv_dit_metadata(requests[self.dit_layout].config))
            if f.metadata.get("config")
            else f
            for f in self.files
        )
        return replace(self, requests=requests, files=files)


def _ltxv_dit_metadata(transformer: Mapping[str, object]) -> dict[str, str]:
    # ComfyUI reads the LTXV DiT config from this entry, as in Lightricks' releases.
    return {"config": json.dumps({"transformer": dict(transformer)}, sort_keys=True)}


FAMILIES: dict[str, Family] = {
    "ltxv-13b": Family(
        name="ltxv-13b",
        requests={
            "dit": LayoutRequest("ltxv_dit", LTXV_13B_TRANSFORMER),
            "vae": LayoutRequest("ltxv_vae", {"version": 2}),
            "text_encoder": LayoutRequest("t5_xxl"),
        },
        files=(
            SynthFile(
                "diffusion_models/ltxv-13b-0.9.7-dev-int8.safetensors",
                "dit",
                "int8",
                int8_family="ltxv",
                metadata=_ltxv_dit_metadata(LTXV_13B_TRANSFORMER),
            ),
            SynthFile("vae/ltxv-13b-0.9.7-vae.safetensors", "vae", "float"),
            SynthFile(
                "text_encoders/t5xxl_int8.safetensors",
                "text_encoder",
                "int8",
                torch.float16,
                int8_family="text_encoder",
            ),
            SynthFile("loras/ltxv-13b-0.9.7-distilled-lora128.safetensors", "dit", "lora", lora_rank=128),
        ),
        dit_layout="dit",
    ),
    "wan-14b": Family(
        name="wan-14b",
        requests={
            "dit": LayoutRequest("wan_dit", WAN_14B_DIT),
            "vae": LayoutRequest("wan_vae", {"dim": 96}),
            "text_encoder": LayoutRequest("umt5_xxl"),
        },
        files=(
            SynthFile("diffusion_models/wan2.1_t2v_14B_int8.safetensors", "dit", "int8", int8_family="wan"),
            SynthFile("vae/wan_2.1_vae.safetensors", "vae", "float"),
            SynthFile(
                "text_encoders/umt5_xxl_int8.safetensors",
                "text_encoder",
                "int8",
                torch.float16,
                int8_family="text_encoder",
                metadata={"tokenizer": STAND_IN_TOKENIZER_NOTE},
                tokenizer=True,
            ),
            SynthFile(
                "loras/Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32.safetensors",
                "dit",
                "lora",
                lora_rank=32,
            ),
        ),
        dit_layout="dit",
    ),
}


def random_value(namespace: str, spec: TensorSpec, device: torch.device) -> torch.Tensor:
    """A float32 tensor on ``device`` following :func:`init_rule`, seeded by ``namespace`` and key."""
    kind, std = init_rule(spec)
    if kind == "zeros":
        return torch.zeros(spec.shape, device=device)
    if kind == "ones":
        return torch.ones(spec.shape, device=device)
    if kind == "arange":
        return torch.arange(spec.numel, dtype=torch.float32, device=device).reshape(spec.shape)
    return _seeded_normal(namespace, spec, std, device)


def _seeded_normal(namespace: str, spec: TensorSpec, std: float, device: torch.device) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed_for(namespace, spec.key) % 2**63)
    return torch.randn(spec.shape, generator=generator, device=device).mul_(std)


def wan_lora_specs(dit_layout: Sequence[TensorSpec], rank: int) -> list[TensorSpec]:
    """``lora_down`` (rank × in) and ``lora_up`` (out × rank) per Wan block linear, LightX2V style."""
    specs = []
    for target in dit_layout:
        module = target.key.removesuffix(".weight")
        if module.startswith("blocks.") and module.endswith(WAN_LORA_TARGETS) and len(target.shape) == 2:
            out_features, in_features = target.shape
            specs.append(TensorSpec(f"diffusion_model.{module}.lora_down.weight", (rank, in_features)))
            specs.append(TensorSpec(f"diffusion_model.{module}.lora_up.weight", (out_features, rank)))
    return specs


def _lora_specs(family: Family, dit_layout: Sequence[TensorSpec], rank: int) -> list[TensorSpec]:
    return (
        lora_specs(dit_layout, rank) if family.name.startswith("ltxv") else wan_lora_specs(dit_layout, rank)
    )


def _lora_value(namespace: str, spec: TensorSpec, device: torch.device) -> torch.Tensor:
    if spec.key.endswith((".lora_B.weight", ".lora_up.weight")):
        return _seeded_normal(namespace, spec, LORA_B_STD, device)
    return random_value(namespace, spec, device)


def stamp(family: Family, file: SynthFile, layers: int) -> str:
    return json.dumps(
        {"format": SYNTH_FORMAT, "family": family.name, "file": file.relative, "dit_layers": layers},
        sort_keys=True,
    )


def _stamp_of(path: Path) -> str | None:
    """The synthetic stamp in ``path``'s metadata; ``None`` for a file without one or not readable."""
    try:
        return read_safetensors_metadata(path).get(STAMP_KEY)
    except (OSError, ValueError):
        return None


def is_synthetic(path: Path) -> bool:
    """Whether ``path`` is a file this module wrote (it carries the stamp)."""
    return _stamp_of(path) is not None


def _check_target(path: Path, expected_stamp: str, force: bool) -> bool:
    """True when ``path`` must be (re)written; refuses to touch a file without our stamp."""
    if not path.exists():
        return True
    found = _stamp_of(path)
    if found is None:
        raise SynthError(f"{path} exists and is not a synthetic LeanVideo file; refusing to overwrite it")
    return force or found != expected_stamp


def stand_in_tokenizer(comfyui_dir: Path) -> torch.Tensor:
    """The SentencePiece model a synthetic UMT5 file embeds under ``spiece_model``, as uint8 bytes.

    Release UMT5 files carry their own tokenizer there and ComfyUI's Wan tokenizer reads it from the
    file. With no download, the stand-in is the SentencePiece model the pinned ComfyUI ships for its
    Pile-T5 encoder: a 32000-piece vocabulary, all of whose ids are valid UMT5 ids (256384).
    """
    source = comfyui_dir / STAND_IN_TOKENIZER
    if not source.is_file():
        raise SynthError(f"{source} is missing; the synthetic UMT5 needs it as its tokenizer")
    return torch.frombuffer(bytearray(source.read_bytes()), dtype=torch.uint8)


def _write(
    path: Path,
    specs: Sequence[TensorSpec],
    value: Callable[[TensorSpec], torch.Tensor],
    file: SynthFile,
    metadata: dict[str, str],
    extra: Mapping[str, torch.Tensor] | None = None,
) -> None:
    plan: dict[str, Int8WeightConfig] = {}
    if file.form == "int8":
        shapes = {s.key: s.shape for s in specs}
        plan = plan_quantization(shapes, file.int8_family, Int8WeightConfig())
        metadata = int8_metadata(plan, metadata)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with StreamingWriter(partial, metadata) as writer:
            for spec in specs:
                layer = spec.key.removesuffix(WEIGHT_SUFFIX)
                if spec.key.endswith(WEIGHT_SUFFIX) and layer in plan:
                    declare_int8_layer(writer, layer, spec.shape, plan[layer])
                else:
                    writer.declare(spec.key, file.dtype, spec.shape)
            for key, tensor in (extra or {}).items():
                writer.declare(key, tensor.dtype, tuple(tensor.shape))
            writer.begin()
            for key, tensor in (extra or {}).items():
                writer.write(key, tensor)
            for spec in specs:
                tensor = value(spec)
                layer = spec.key.removesuffix(WEIGHT_SUFFIX)
                if spec.key.endswith(WEIGHT_SUFFIX) and layer in plan:
                    packed = quantize_weight(tensor.to(torch.bfloat16), plan[layer], name=spec.key)
                    write_int8_layer(writer, layer, packed)
                else:
                    writer.write(spec.key, tensor.to(file.dtype))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def synthesize(
    family: Family,
    models_dir: Path,
    comfyui_dir: Path,
    *,
    device: torch.device,
    force: bool = False,
    python: Path | None = None,
    progress: Callable[[str], None] = print,
) -> list[Path]:
    """Write the family's files under ``models_dir`` (skipping current ones) and return their paths."""
    layers = int(family.requests[family.dit_layout].config["num_layers"])
    targets = [(models_dir / f.relative, f, stamp(family, f, layers)) for f in family.files]
    stale = [(path, f, s) for path, f, s in targets if _check_target(path, s, force)]
    if stale:
        started = time.perf_counter()
        layouts = read_layouts(comfyui_dir, family.requests, python=python)
        progress(f"read {family.name} layouts from ComfyUI in {time.perf_counter() - started:.1f} s")
    for path, file, file_stamp in stale:
        started = time.perf_counter()
        namespace = f"{family.name}/{file.layout}"
        if file.form == "lora":
            specs = _lora_specs(family, layouts[file.layout], file.lora_rank)
            namespace = f"{family.name}/lora{file.lora_rank}"

            def value(spec: TensorSpec, namespace: str = namespace) -> torch.Tensor:
                return _lora_value(namespace, spec, device)

            metadata = {"rank": str(file.lora_rank)}
        else:
            specs = sorted(layouts[file.layout], key=lambda s: s.key)

            def value(spec: TensorSpec, namespace: str = namespace) -> torch.Tensor:
                return random_value(namespace, spec, device)

            metadata = dict(file.metadata)
        metadata[STAMP_KEY] = file_stamp
        extra = {"spiece_model": stand_in_tokenizer(comfyui_dir)} if file.tokenizer else None
        _write(path, specs, value, file, metadata, extra)
        seconds = time.perf_counter() - started
        size = path.stat().st_size
        parameters = sum(math.prod(s.shape) for s in specs)
        progress(
            f"wrote {path} ({parameters / 1e9:.2f} B parameters, {size / 1e9:.2f} GB) in {seconds:.1f} s "
            f"({size / 1e6 / max(seconds, 1e-9):.0f} MB/s)"
        )
    return [path for path, _, _ in targets]


def remove(family: Family, models_dir: Path) -> Iterator[Path]:
    """Delete the family's synthetic files (stamped ones only) and yield what was removed."""
    for file in family.files:
        path = models_dir / file.relative
        if path.exists() and is_synthetic(path):
            path.unlink()
            yield path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.synth_models", description=__doc__.split("\n")[0]
    )
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="default: the workspace's models folder"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--layers", type=int, default=None, help="DiT blocks to keep (full width); default all"
    )
    parser.add_argument("--force", action="store_true", help="rewrite current synthetic files too")
    parser.add_argument("--remove", action="store_true", help="delete this family's synthetic files")
    args = parser.parse_args(argv)

    from runner.local.workspace import find_workspace

    workspace = find_workspace()
    models_dir = args.models_dir or workspace.models_dir
    family = FAMILIES[args.family]
    try:
        if args.remove:
            for path in remove(family, models_dir):
                print(f"removed {path}")
            return 0
        if args.layers is not None:
            family = family.with_layers(args.layers)
        synthesize(
            family, models_dir, workspace.comfyui_dir, device=torch.device(args.device), force=args.force
        )
    except SynthError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
