"""Lossless frames of two runs: read them, compare them (PSNR), and lay them out as a contact sheet.

Frames are the PNGs a ``SaveImage`` node wrote from the decoded images (never a lossy video), so the
PSNR measures the models, not the codec. The contact sheet has one labelled row per run, each frame
scaled up by :data:`SHEET_SCALE` (nearest neighbour), so small frames stay visible, with a thin gap
between frames and rows.

Example::

    a, b = read_frames(int8_pngs), read_frames(stock_pngs)
    psnr_db(a, b)  # 51.8
    write_contact_sheet([("INT8", a), ("stock", b)], Path("out/sheet.png"))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from runner.errors import LeanVideoError

__all__ = [
    "SHEET_GAP",
    "SHEET_LABEL_WIDTH",
    "SHEET_SCALE",
    "contact_sheet_size",
    "psnr_db",
    "read_frames",
    "write_contact_sheet",
]

Frames = np.ndarray[Any, np.dtype[np.uint8]]  # (frames, height, width, 3)

SHEET_SCALE = 2
SHEET_LABEL_WIDTH = 120
SHEET_GAP = 2  # pixels between frames and between rows
SHEET_BACKGROUND = (24, 24, 24)
SHEET_TEXT = (235, 235, 235)


def read_frames(paths: Sequence[Path]) -> Frames:
    """The RGB frames in ``paths`` (in that order) as one ``(n, height, width, 3)`` uint8 array."""
    if not paths:
        raise LeanVideoError("no frames to read")
    frames = []
    for path in paths:
        with Image.open(path) as image:
            frames.append(np.asarray(image.convert("RGB"), dtype=np.uint8))
    shapes = {frame.shape for frame in frames}
    if len(shapes) != 1:
        raise LeanVideoError(f"frames of different sizes {sorted(shapes)} in {paths[0].parent}")
    return np.stack(frames)


def psnr_db(reference: Frames, other: Frames) -> float:
    """Peak signal-to-noise ratio in dB over all frames of two runs (``inf`` when identical)."""
    if reference.shape != other.shape:
        raise LeanVideoError(f"cannot compare frames of shape {reference.shape} with {other.shape}")
    mse = float(np.mean((reference.astype(np.float64) - other.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def contact_sheet_size(frame_count: int, height: int, width: int, rows: int) -> tuple[int, int]:
    """``(width, height)`` in pixels of the sheet :func:`write_contact_sheet` draws."""
    return (
        SHEET_LABEL_WIDTH + frame_count * (width * SHEET_SCALE + SHEET_GAP) - SHEET_GAP,
        rows * (height * SHEET_SCALE + SHEET_GAP) - SHEET_GAP,
    )


def write_contact_sheet(rows: Sequence[tuple[str, Frames]], path: Path) -> Path:
    """Write a PNG grid: one row per ``(label, frames)``, the label in a column on the left."""
    count, height, width, _ = rows[0][1].shape
    if any(frames.shape != rows[0][1].shape for _, frames in rows):
        raise LeanVideoError(f"{path}: every row of a contact sheet needs frames of one shape")
    sheet = Image.new("RGB", contact_sheet_size(count, height, width, len(rows)), SHEET_BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    cell_width, cell_height = width * SHEET_SCALE, height * SHEET_SCALE
    for row, (label, frames) in enumerate(rows):
        top = row * (cell_height + SHEET_GAP)
        draw.multiline_text((8, top + 8), label, fill=SHEET_TEXT, font=font, spacing=4)
        for index, frame in enumerate(frames):
            cell = Image.fromarray(frame).resize((cell_width, cell_height), Image.Resampling.NEAREST)
            sheet.paste(cell, (SHEET_LABEL_WIDTH + index * (cell_width + SHEET_GAP), top))
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path, format="PNG")
    return path
