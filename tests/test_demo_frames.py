"""The demo's pieces that need no server: the lossless frame output it adds to a workflow, frame PSNR
and the contact sheet."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runner.errors import LeanVideoError, WorkflowError
from runner.jobs.demo import DEMO_WORKFLOW, INT8_DEMO_WORKFLOW, add_frame_output, load_workflow
from runner.jobs.frames import (
    SHEET_GAP,
    SHEET_LABEL_WIDTH,
    contact_sheet_size,
    psnr_db,
    read_frames,
    write_contact_sheet,
)


def _frames(seed: int, count: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, 8, 12, 3), dtype=np.uint8)


@pytest.mark.parametrize("path", [DEMO_WORKFLOW, INT8_DEMO_WORKFLOW])
def test_frame_output_saves_the_decoded_images(path: Path) -> None:
    workflow = load_workflow(path)
    extended, node_id = add_frame_output(workflow)
    decoder = next(key for key, node in workflow.items() if node["class_type"] == "VAEDecode")
    assert node_id not in workflow and set(extended) == {*workflow, node_id}
    assert extended[node_id]["class_type"] == "SaveImage"
    assert extended[node_id]["inputs"]["images"] == [decoder, 0]


def test_frame_output_needs_one_decoder() -> None:
    workflow = load_workflow(DEMO_WORKFLOW)
    without = {key: node for key, node in workflow.items() if node["class_type"] != "VAEDecode"}
    with pytest.raises(WorkflowError, match="exactly one VAEDecode"):
        add_frame_output(without)


def test_psnr_of_frames() -> None:
    reference = _frames(0)
    assert math.isinf(psnr_db(reference, reference.copy()))
    off_by_one = reference.copy()
    off_by_one[reference < 255] += 1
    off_by_one[reference == 255] -= 1
    assert psnr_db(reference, off_by_one) == pytest.approx(20 * math.log10(255), abs=1e-9)  # MSE 1
    with pytest.raises(LeanVideoError, match="shape"):
        psnr_db(reference, reference[:2])


def test_frames_round_trip_through_png_and_the_contact_sheet(tmp_path: Path) -> None:
    first, second = _frames(1), _frames(2)
    paths = []
    for index, frame in enumerate(first):
        paths.append(tmp_path / f"frame_{index:05d}.png")
        Image.fromarray(frame).save(paths[-1])
    assert np.array_equal(read_frames(paths), first)  # PNG is lossless
    sheet = write_contact_sheet([("INT8", first), ("stock", second)], tmp_path / "sheet.png")
    with Image.open(sheet) as image:
        assert image.format == "PNG" and image.size == contact_sheet_size(3, 8, 12, rows=2)
        pixels = np.asarray(image.convert("RGB"))
    # the second row's last frame, scaled 2× by repetition, sits at the bottom right
    assert np.array_equal(pixels[-8 * 2 :, -12 * 2 :][::2, ::2], second[-1])
    assert np.array_equal(pixels[: 8 * 2, SHEET_LABEL_WIDTH : SHEET_LABEL_WIDTH + 12 * 2][::2, ::2], first[0])
    assert pixels.shape[:2] == (2 * 8 * 2 + SHEET_GAP, SHEET_LABEL_WIDTH + 3 * 12 * 2 + 2 * SHEET_GAP)
    with pytest.raises(LeanVideoError, match="one shape"):
        write_contact_sheet([("a", first), ("b", second[:2])], tmp_path / "bad.png")
