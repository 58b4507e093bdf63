"""The measured INT8 kernel table on disk: one JSON file, invalidated by a new torch or kernel library.

The file holds a ``fingerprint`` (schema version, torch version, comfy-kitchen version or ``null``) and
``entries``: one :class:`Choice` per shape class key (device, dtype, weight shape, row bucket, weight
layout; see :class:`ShapeClass`). A file whose fingerprint differs from the running one is
ignored and rewritten at the next measurement, so upgrading torch or comfy-kitchen measures again. A
file that cannot be read or parsed is ignored the same way (and the reason logged).

Example::

    entries = load_table(path, current_fingerprint())
    save_table(path, current_fingerprint(), entries)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .quantize import Int8Weight
    from .spec import Int8WeightConfig

logger = logging.getLogger(__name__)

TABLE_SCHEMA = "leanvideo.int8_kernels"
# bump when a kernel's maths or the measurement changes; 2: int_mm_fused; 3: not on CPUs; 4: onednn
TABLE_VERSION = 4
KITCHEN_DISTRIBUTION = "comfy-kitchen"


@dataclass(frozen=True)
class Choice:
    """The kernel chosen for one shape class and why.

    ``source`` is ``measured`` (fastest correct kernel at first use), ``forced`` (the ``path`` input
    or ``LEANVIDEO_INT8_KERNEL``) or ``fallback`` (forced kernel cannot run the shape: ``w8a16``).
    ``seconds`` holds each timed kernel's fastest call; ``rejected`` says why a kernel was not a candidate
    (unsupported, error, inaccurate, slower than ``w8a16``).
    """

    kernel: str
    source: str
    seconds: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    def ratios(self) -> dict[str, float]:
        """Each timed kernel's time as a multiple of ``w8a16``'s (empty when ``w8a16`` was not timed)."""
        base = self.seconds.get("w8a16")
        return {k: s / base for k, s in self.seconds.items()} if base else {}

    def shared_reasons(self) -> dict[str, str]:
        """Why each kernel was ruled out, said so that kernels ruled out for one reason say the same:
        each reason names the ``path`` that forces its kernel, and here says ``path=KERNEL``."""
        return {k: why.replace(f"path={k} ", "path=KERNEL ") for k, why in self.rejected.items()}

    def grouped_reasons(self) -> list[tuple[str, str]]:
        """``(kernels, why)`` per reason: on a CPU without AVX-512 VNNI every W8A8 kernel is ruled out
        for one, which the report said three times per shape; a kernel alone keeps its own words."""
        groups: dict[str, list[str]] = {}
        for kernel, why in self.shared_reasons().items():
            groups.setdefault(why, []).append(kernel)
        return [
            (kernels[0], self.rejected[kernels[0]]) if len(kernels) == 1 else (", ".join(kernels), why)
            for why, kernels in groups.items()
        ]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Choice:
        return cls(
            kernel=str(data["kernel"]),
            source=str(data["source"]),
            seconds={str(k): float(v) for k, v in data.get("seconds", {}).items()},
            rejected={str(k): str(v) for k, v in data.get("rejected", {}).items()},
        )


def layout_of(config: Int8WeightConfig) -> str:
    """The layout part of a shape class: the scales' granularity, and the rotation when there is one."""
    return config.granularity + (f"+convrot{config.convrot_group}" if config.convrot else "")


@dataclass(frozen=True)
class ShapeClass:
    """What a kernel choice is valid for; ``rows`` is the activation row count rounded up to a power of 2."""

    device: str
    dtype: str
    out_features: int
    in_features: int
    rows: int
    layout: str

    @classmethod
    def of(cls, x: torch.Tensor, packed: Int8Weight, device: str) -> ShapeClass:
        rows = max(1, x.numel() // max(1, x.shape[-1]))
        layout = layout_of(packed.config)
        out_features, in_features = packed.qdata.shape
        return cls(
            device,
            str(x.dtype).removeprefix("torch."),
            out_features,
            in_features,
            1 << (rows - 1).bit_length(),
            layout,
        )

    @property
    def weight_shape(self) -> str:
        return f"{self.out_features}x{self.in_features}"

    @property
    def key(self) -> str:
        return f"{self.device}|{self.dtype}|{self.weight_shape}|rows<={self.rows}|{self.layout}"

    @classmethod
    def from_key(cls, key: str) -> ShapeClass:
        """The shape class a :attr:`key` names; ``ValueError`` for a string that is no such key."""
        parts = key.rsplit("|", 4)
        if len(parts) != 5 or not parts[3].startswith("rows<="):
            raise ValueError(f"shape class key {key!r} is not device|dtype|OUTxIN|rows<=N|layout")
        device, dtype, shape, rows, layout = parts
        out_features, in_features = (int(n) for n in shape.split("x"))
        return cls(device, dtype, out_features, in_features, int(rows.removeprefix("rows<=")), layout)


def describe_choice(key: str, choice: Choice, said_apart: Collection[tuple[str, str]] = ()) -> str:
    """One line: the shape class, the kernel, each timed kernel relative to ``w8a16``, and why the
    others were ruled out (but the ``(kernels, why)`` of ``said_apart``, which the caller says once)."""
    shape = ShapeClass.from_key(key)
    dtype, rows, layout = shape.dtype, f"rows<={shape.rows}", shape.layout
    ratios = ", ".join(f"{k} {r:.2f}×" for k, r in choice.ratios().items())
    times = f" [{ratios} of w8a16]" if ratios else ""
    reasons = [reason for reason in choice.grouped_reasons() if reason not in said_apart]
    rejected = "; ".join(f"{names}: {why}" for names, why in reasons)
    return f"{shape.weight_shape} {rows} {dtype} {layout} → {choice.kernel} ({choice.source}){times}" + (
        f" — {rejected}" if rejected else ""
    )


def kitchen_version() -> str | None:
    """The installed comfy-kitchen version, or ``None``."""
    try:
        return version(KITCHEN_DISTRIBUTION)
    except PackageNotFoundError:
        return None


def current_fingerprint() -> dict[str, Any]:
    """What a cached table must match to be used: its schema and the torch and kernel-library versions."""
    return {
        "schema": TABLE_SCHEMA,
        "version": TABLE_VERSION,
        "torch": torch.__version__,
        "comfy_kitchen": kitchen_version(),
    }


def load_table(path: Path, fingerprint: dict[str, Any], *, quiet: bool = False) -> dict[str, Choice]:
    """The entries of the table at ``path`` when its fingerprint matches ``fingerprint``, else ``{}``;
    why a table is ignored is logged unless ``quiet`` (a re-read before a merge: said once already)."""
    log = logger.debug if quiet else logger.warning
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log("Ignoring unreadable INT8 kernel table %s: %s", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        old = data.get("fingerprint") if isinstance(data, dict) else None
        (logger.debug if quiet else logger.info)(
            "INT8 kernel table %s was measured with %s, not %s: measuring again", path, old, fingerprint
        )
        return {}
    try:
        return {str(key): Choice.from_dict(entry) for key, entry in data["entries"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log("Ignoring malformed INT8 kernel table %s: %s", path, exc)
        return {}


def save_table(path: Path, fingerprint: dict[str, Any], entries: dict[str, Choice]) -> None:
    """Write the table atomically (a reader never sees half a file); failures are logged, not raised."""
    document = {"fingerprint": fingerprint, "entries": {k: c.as_dict() for k, c in sorted(entries.items())}}
    temporary: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(document, stream, indent=1)
        os.replace(temporary, path)
    except OSError as exc:
        logger.warning("Could not write the INT8 kernel table %s: %s", path, exc)
        if temporary is not None:  # a full disk, or a folder in the table's place: no file left behind
            with contextlib.suppress(OSError):
                os.unlink(temporary)
