"""Lossless video files: the frames a workflow made, bit for bit, for comparing outputs.

ComfyUI's Save Video writes H.264 in yuv420p: its chroma is halved and its frames are quantized, so two
runs whose frames differ in the last bit can decode far apart, and a frame-quality figure taken on such
files measures the codec as much as the model. :func:`write_lossless` keeps the 8-bit RGB frames that
Save Video encodes (the same rounding) in a Matroska file: H.264 RGB at QP 0 (``libx264rgb``, lossless
and fast) where FFmpeg has it, else FFV1 (FFmpeg's own lossless codec, always built in). Any decoder reads
them back exactly.

Example::

    codec = write_lossless(images, Fraction(24), Path("output/frames_00001_.mkv"))  # "libx264rgb"
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import torch

EXTENSION = "mkv"
# Codec, options, pixel format: the first FFmpeg has is used.
CODECS: tuple[tuple[str, dict[str, str], str], ...] = (
    ("libx264rgb", {"qp": "0", "preset": "ultrafast"}, "rgb24"),
    ("ffv1", {}, "bgr0"),
)


def frames_to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Frames (``(T, H, W, 3)`` or one ``(H, W, 3)``) of floats in [0, 1] as the 8-bit frames Save Video
    encodes (same rounding)."""
    return (images * 255).clamp(0, 255).byte().cpu()


def lossless_codec() -> tuple[str, dict[str, str], str]:
    """The first of :data:`CODECS` this FFmpeg can encode."""
    import av

    for codec in CODECS:
        try:
            av.codec.Codec(codec[0], "w")
        except (ValueError, av.error.FFmpegError):  # not built into this FFmpeg
            continue
        return codec
    names = ", ".join(name for name, _, _ in CODECS)
    raise RuntimeError(f"this FFmpeg (PyAV {av.__version__}) has none of {names}")


def write_lossless(images: torch.Tensor, frame_rate: Fraction | float, path: Path | str) -> str:
    """Write ``images`` (``(T, H, W, 3)`` floats in [0, 1]) to ``path``; returns the codec used.

    Raises:
        ValueError: ``images`` is not a batch of RGB frames (its shape is named).
    """
    import av

    if images.ndim != 4 or images.shape[-1] != 3 or images.shape[0] == 0:
        raise ValueError(f"expected RGB frames shaped (frames, height, width, 3), got {tuple(images.shape)}")
    name, options, pixel_format = lossless_codec()
    rate = Fraction(round(float(frame_rate) * 1000), 1000)
    with av.open(str(path), mode="w", format="matroska") as container:
        stream = container.add_stream(name, rate=rate, options=options)
        stream.width, stream.height, stream.pix_fmt = images.shape[2], images.shape[1], pixel_format
        for image in images:  # one frame at a time, as Save Video: no copy of the whole video
            frame = frames_to_uint8(image).numpy()
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))
    return name
