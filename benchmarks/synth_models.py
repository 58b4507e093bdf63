"""Full-size random-weight models for benchmarking without downloads, written under the release names.

The families and their files (LTXV-13B, Wan 2.1 14B, Wan 2.2 A14B T2V and I2V) are in
:mod:`benchmarks.synth_families`: the release files users have (bf16/fp16, ComfyUI scaled fp8, a
release checkpoint), which our INT8 loaders quantize on load.

Key names and shapes come from the pinned ComfyUI's own classes (:mod:`runner.fixtures.layouts`), so
the stock loaders and ours load these files exactly as the real ones. Values are random (seeded per
tensor, :func:`runner.fixtures.tensors.init_rule`) and drawn on ``--device`` (a GPU makes a 13 B DiT
in seconds). Every file carries a ``leanvideo_synthetic`` metadata stamp; a file under one of these
names that lacks the stamp (a real model) is never overwritten or removed. ``--layers N`` keeps the
full width but only N blocks per DiT, for a dry run of the whole pipeline on a CPU.

Run: ``python -m benchmarks.synth_models wan22-14b [--device cuda] [--models-dir DIR] [--layers N]``;
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
from pathlib import Path

import torch
from leanvideo.int8 import Int8WeightConfig
from leanvideo.int8.fp8 import E4M3_MAX, MARKER, scale_weight_key
from leanvideo.int8.policy import plan_quantization
from leanvideo.int8.spec import WEIGHT_SUFFIX
from leanvideo.int8.writer import StreamingWriter

from benchmarks.synth_families import FAMILIES, STAND_IN_TOKENIZER, Family, SynthError, SynthFile
from runner.fixtures.layouts import Layouts, read_layouts
from runner.fixtures.ltxv import lora_specs
from runner.fixtures.tensors import TensorSpec, init_rule, read_safetensors_metadata, seed_for

__all__ = [
    "FAMILIES",
    "Family",
    "SynthError",
    "SynthFile",
    "is_synthetic",
    "remove",
    "stand_in_tokenizer",
    "synthesize",
]

STAMP_KEY = "leanvideo_synthetic"
SYNTH_FORMAT = 4  # bump when generated values or layouts change (4: release names and forms, Wan 2.2)
LORA_B_STD = 0.01  # non-zero so the LoRA changes the output, small so 48 blocks stay finite
WAN_LORA_TARGETS: tuple[str, ...] = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o")
WAN_LORA_TARGETS += ("cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")


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


Part = tuple[str, Sequence[TensorSpec], Callable[[TensorSpec], torch.Tensor]]  # key prefix, tensors, values


def _drawer(namespace: str, device: torch.device, *, lora: bool) -> Callable[[TensorSpec], torch.Tensor]:
    def value(spec: TensorSpec) -> torch.Tensor:
        return _lora_value(namespace, spec, device) if lora else random_value(namespace, spec, device)

    return value


def _fp8_layers(file: SynthFile, parts: Sequence[Part]) -> set[str]:
    """The layers (prefixed keys without ``.weight``) an fp8_scaled file stores in fp8."""
    if file.form != "fp8_scaled":
        return set()
    layers: set[str] = set()
    for prefix, specs, _ in parts:
        plan = plan_quantization({s.key: s.shape for s in specs}, file.policy_family, Int8WeightConfig())
        layers |= {prefix + layer for layer in plan}
    return layers


def _to_scaled_fp8(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``tensor`` as ComfyUI's scaled fp8 stores it: e4m3fn values and a float32 per-tensor scale (absmax
    maps to the largest e4m3 value)."""
    weight = tensor.to(torch.float32)
    scale = weight.abs().amax().clamp(min=1e-12) / E4M3_MAX
    return (weight / scale).to(torch.float8_e4m3fn), scale.reshape(())


def _write(
    path: Path,
    parts: Sequence[Part],
    file: SynthFile,
    metadata: dict[str, str],
    extra: Mapping[str, torch.Tensor] | None = None,
) -> None:
    fp8 = _fp8_layers(file, parts)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with StreamingWriter(partial, metadata) as writer:
            for prefix, specs, _ in parts:
                for spec in specs:
                    key = prefix + spec.key
                    if key.removesuffix(WEIGHT_SUFFIX) in fp8 and key.endswith(WEIGHT_SUFFIX):
                        writer.declare(key, torch.float8_e4m3fn, spec.shape)
                        writer.declare(str(scale_weight_key(key)), torch.float32, ())
                    else:
                        writer.declare(key, file.dtype, spec.shape)
            if fp8:
                writer.declare(file.prefix + MARKER, torch.float8_e4m3fn, (0,))
            for key, tensor in (extra or {}).items():
                writer.declare(key, tensor.dtype, tuple(tensor.shape))
            writer.begin()
            for key, tensor in (extra or {}).items():
                writer.write(key, tensor)
            if fp8:
                writer.write(file.prefix + MARKER, torch.empty(0, dtype=torch.float8_e4m3fn))
            for prefix, specs, value in parts:
                for spec in specs:
                    key = prefix + spec.key
                    tensor = value(spec)
                    if key.removesuffix(WEIGHT_SUFFIX) in fp8 and key.endswith(WEIGHT_SUFFIX):
                        weight, scale = _to_scaled_fp8(tensor)
                        writer.write(key, weight)
                        writer.write(str(scale_weight_key(key)), scale.to(torch.float32))
                    else:
                        writer.write(key, tensor.to(file.dtype))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _parts(family: Family, file: SynthFile, layouts: Layouts, device: torch.device) -> list[Part]:
    if file.form == "lora":
        namespace = f"{family.name}/{file.layout}/lora{file.lora_rank}"
        specs = _lora_specs(family, layouts[file.layout], file.lora_rank)
        return [("", specs, _drawer(namespace, device, lora=True))]
    return [
        (
            prefix,
            sorted(layouts[layout], key=lambda s: s.key),
            _drawer(f"{family.name}/{layout}", device, lora=False),
        )
        for layout, prefix in file.parts
    ]


def synthesize(
    family: Family,
    models_dir: Path,
    comfyui_dir: Path,
    *,
    device: torch.device,
    force: bool = False,
    python: Path | None = None,
    progress: Callable[[str], None] = print,
    layouts: Layouts | None = None,
) -> list[Path]:
    """Write the family's files under ``models_dir`` (skipping current ones) and return their paths.

    ``layouts``: the family's layouts (its ``requests`` read with :func:`read_layouts`) when the caller
    has them already: one read of several families' layouts takes about what one family's does (~10 s,
    nearly all of it ComfyUI's import). Read from ComfyUI here when not given."""
    targets = [(models_dir / f.relative, f, stamp(family, f, family.dit_blocks)) for f in family.files]
    stale = [(path, f, s) for path, f, s in targets if _check_target(path, s, force)]
    if layouts is not None:
        missing = sorted(set(family.requests) - set(layouts))
        if missing:
            raise SynthError(f"the layouts given for {family.name} lack {', '.join(missing)}")
    elif stale:
        started = time.perf_counter()
        layouts = read_layouts(comfyui_dir, family.requests, python=python)
        progress(f"read {family.name} layouts from ComfyUI in {time.perf_counter() - started:.1f} s")
    for path, file, file_stamp in stale:
        assert layouts is not None  # given, or read above as something is stale
        started = time.perf_counter()
        parts = _parts(family, file, layouts, device)
        metadata = {"rank": str(file.lora_rank)} if file.form == "lora" else dict(file.metadata)
        metadata[STAMP_KEY] = file_stamp
        extra = {"spiece_model": stand_in_tokenizer(comfyui_dir)} if file.tokenizer else None
        _write(path, parts, file, metadata, extra)
        seconds = time.perf_counter() - started
        size = path.stat().st_size
        parameters = sum(math.prod(s.shape) for _, specs, _ in parts for s in specs)
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
