"""The mid-size LTXV DiT of the INT8 end-to-end benchmark: a bf16 file and its LeanVideo INT8 copy.

The default (8 blocks, width 1024 = 16 heads × 64) has 144.1 M parameters: big enough that the
linear layers dominate sampling, small enough to run 8 steps at 384 tokens on a CPU. Key names and
shapes come from the pinned ComfyUI's own LTXV class (:mod:`runner.fixtures.layouts`); values are
seeded per tensor (:func:`runner.fixtures.tensors.random_tensor`), so the files are byte-identical on
every machine. The DiT config travels in the metadata (``config`` → ``transformer``), as in
Lightricks' files, with ``caption_channels`` 768 so the tiny workflow's CLIP-L feeds it. The INT8 copy
is written by the library quantizer, as ``leanvideo quantize`` writes it.

Both files go to ``<models>/diffusion_models/`` as ``leanvideo-bench-ltxv-mid-<L>x<D>.safetensors`` and
``…-int8.safetensors``, and carry a ``leanvideo_bench`` stamp: a file whose metadata already matches is
kept (cheap second runs); a file under that name without the stamp is never overwritten.

Example::

    files = write_mid_dit(workspace.models_dir, workspace.comfyui_dir, MidDitConfig())
    files.float_path.name, files.parameters   # ('leanvideo-bench-ltxv-mid-8x1024.safetensors', 144118912)
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.fixtures.int8 import int8_copy_is_current, write_int8_copy
from runner.fixtures.layouts import LTXV_DIT, LayoutRequest, read_layouts
from runner.fixtures.tensors import (
    FixtureFileError,
    has_metadata,
    random_tensor,
    read_safetensors_header,
    read_safetensors_metadata,
    write_safetensors,
)
from runner.install.pin import read_version

__all__ = ["MidDitConfig", "MidDitError", "MidDitFiles", "write_mid_dit"]

logger = logging.getLogger(__name__)

STAMP_KEY = "leanvideo_bench"
BENCH_FORMAT = 1  # bump whenever the generated values or layouts change
HEAD_DIM = 64
NAMESPACE = "leanvideo-bench/ltxv-mid-dit"
FILE_DTYPE = "BF16"


class MidDitError(RuntimeError):
    """The benchmark DiT cannot be written (a file that is not ours is in the way)."""


@dataclass(frozen=True)
class MidDitConfig:
    """Depth and width of the benchmark DiT; ``dim`` is heads × :data:`HEAD_DIM`."""

    layers: int = 8
    dim: int = 1024

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError(f"layers must be at least 1, got {self.layers}")
        if self.dim < HEAD_DIM or self.dim % HEAD_DIM:
            raise ValueError(f"dim must be a positive multiple of {HEAD_DIM} (the head size), got {self.dim}")

    @property
    def name(self) -> str:
        return f"leanvideo-bench-ltxv-mid-{self.layers}x{self.dim}"

    def transformer(self) -> dict[str, Any]:
        """The LTXV ``transformer`` config ComfyUI reads from the file's metadata."""
        return {
            "num_layers": self.layers,
            "num_attention_heads": self.dim // HEAD_DIM,
            "attention_head_dim": HEAD_DIM,
            "cross_attention_dim": self.dim,  # must equal heads × head_dim
            "caption_channels": 768,  # CLIP-L's width (the tiny workflow's text encoder)
            "in_channels": 128,  # fixed by the LTXV latent format
        }

    def metadata(self, comfyui_version: str) -> dict[str, str]:
        stamp = {"format": BENCH_FORMAT, "comfyui": comfyui_version, "layers": self.layers, "dim": self.dim}
        return {
            "config": json.dumps({"transformer": self.transformer()}, sort_keys=True),
            STAMP_KEY: json.dumps(stamp, sort_keys=True),
        }


@dataclass(frozen=True)
class MidDitFiles:
    """The two files and the DiT's parameter count."""

    float_path: Path
    int8_path: Path
    parameters: int


def write_mid_dit(
    models_dir: Path, comfyui_dir: Path, config: MidDitConfig, *, python: Path | None = None
) -> MidDitFiles:
    """Write the bf16 DiT and its INT8 copy under ``models_dir/diffusion_models`` unless current.

    ``comfyui_dir`` is the pinned ComfyUI tree the layout is read from (a child process run with
    ``python``). Raises :class:`MidDitError` when a file under one of the names is not ours.
    """
    folder = models_dir / "diffusion_models"
    float_path = folder / f"{config.name}.safetensors"
    int8_path = folder / f"{config.name}-int8.safetensors"
    metadata = config.metadata(read_version(comfyui_dir))
    for path in (float_path, int8_path):
        _refuse_foreign(path)
    if not has_metadata(float_path, metadata):
        started = time.perf_counter()
        layouts = read_layouts(
            comfyui_dir, {LTXV_DIT: LayoutRequest("ltxv_dit", config.transformer())}, python=python
        )
        write_safetensors(
            float_path,
            layouts[LTXV_DIT],
            lambda spec: random_tensor(NAMESPACE, spec),
            dtype=FILE_DTYPE,
            metadata=metadata,
        )
        logger.info("Wrote %s in %.1f s", float_path, time.perf_counter() - started)
    if not int8_copy_is_current(float_path, int8_path):
        started = time.perf_counter()
        write_int8_copy(float_path, int8_path, family="ltxv")
        logger.info("Wrote %s in %.1f s", int8_path, time.perf_counter() - started)
    return MidDitFiles(float_path, int8_path, _parameters(float_path))


def _refuse_foreign(path: Path) -> None:
    if not path.exists():
        return
    try:
        stamped = STAMP_KEY in read_safetensors_metadata(path)
    except (OSError, FixtureFileError):
        stamped = False  # our writers replace files atomically: an unreadable file is not ours
    if not stamped:
        raise MidDitError(f"{path} exists and is not a LeanVideo benchmark file; refusing to overwrite it")


def _parameters(path: Path) -> int:
    """Elements of every tensor in a safetensors file, from its header."""
    header = read_safetensors_header(path)
    return sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
