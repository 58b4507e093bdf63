"""Save Video (lossless): the frames come back bit for bit, unlike Save Video's H.264 (yuv420p)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from leanvideo import video_ops
from leanvideo.video_ops import frames_to_uint8, write_lossless


def _decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


@pytest.mark.parametrize("codec", [c[0] for c in video_ops.CODECS])
def test_every_codec_gives_the_frames_back_exactly(
    codec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noise frames (the tiny models' output looks like this): the hardest case for a lossy codec."""
    images = torch.rand(5, 48, 64, 3, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(video_ops, "CODECS", tuple(c for c in video_ops.CODECS if c[0] == codec))
    path = tmp_path / "frames.mkv"
    assert write_lossless(images, 24.0, path) == codec
    assert np.array_equal(_decode(path), frames_to_uint8(images).numpy())
    with av.open(str(path)) as container:
        assert container.streams.video[0].average_rate == Fraction(24)


def test_the_frames_are_those_save_video_encodes(tmp_path: Path) -> None:
    """Same rounding as ComfyUI's Save Video (x·255, clamped, truncated), out-of-range values included."""
    images = torch.tensor([[[[-0.5, 0.0, 0.5]], [[0.999, 1.0, 1.7]]]])  # (1, 2, 1, 3)
    assert frames_to_uint8(images).tolist() == [[[[0, 0, 127]], [[254, 255, 255]]]]


def test_bad_frames_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"got \(4, 4, 3\)"):
        write_lossless(torch.zeros(4, 4, 3), 24, tmp_path / "x.mkv")
    with pytest.raises(ValueError, match=r"got \(0, 4, 4, 3\)"):
        write_lossless(torch.zeros(0, 4, 4, 3), 24, tmp_path / "x.mkv")


def test_a_ffmpeg_without_any_lossless_codec_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(video_ops, "CODECS", (("no-such-codec", {}, "rgb24"),))
    with pytest.raises(RuntimeError, match="has none of no-such-codec"):
        video_ops.lossless_codec()
