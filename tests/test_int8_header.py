"""The one safetensors header encoder and reader (leanvideo.int8.header): round trip, the bad files it
names, and that it imports without torch (the runner uses it and never imports torch)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from leanvideo.int8.header import SafetensorsHeaderError, encode_header, read_stored_header
from leanvideo.int8.spec import Int8FormatError


def _write(path: Path, header: bytes, data: bytes) -> Path:
    path.write_bytes(header + data)
    return path


def test_encoded_header_reads_back_here_and_in_safetensors(tmp_path: Path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    header, ranges = encode_header(
        [("w", "I8", (2, 3)), ("s", "F32", (2, 1)), ("e", "F16", (0,))], {"k": "v"}
    )
    assert len(header) % 8 == 0 and ranges == {"w": (0, 6), "s": (6, 14), "e": (14, 14)}
    data = np.arange(6, dtype=np.int8).tobytes() + np.array([0.5, 2.0], dtype="<f4").tobytes()
    path = _write(tmp_path / "x.safetensors", header, data)

    stored = read_stored_header(path)
    assert stored.metadata == {"k": "v"}
    assert list(stored.tensors) == ["w", "s", "e"]  # the order given
    assert stored.tensors["s"] == {"dtype": "F32", "shape": [2, 1], "data_offsets": [6, 14]}
    assert stored.data_start == len(header)
    loaded = safetensors_numpy.load_file(str(path))
    np.testing.assert_array_equal(loaded["w"], np.arange(6, dtype=np.int8).reshape(2, 3))
    assert loaded["s"].tolist() == [[0.5], [2.0]]


def test_same_tensors_give_the_same_bytes() -> None:
    tensors = [("b", "BF16", (4,)), ("a", "U8", (3,))]
    assert encode_header(tensors, {"x": "1"}) == encode_header(list(tensors), {"x": "1"})
    with pytest.raises(ValueError, match="'F64'"):
        encode_header([("d", "F64", (1,))], {})


def _json_header(fields: object) -> bytes:
    encoded = json.dumps(fields).encode()
    return struct.pack("<Q", len(encoded)) + encoded


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x05", "too short"),
        (struct.pack("<Q", 10**9), "declares a 1000000000-byte header"),
        (struct.pack("<Q", 3) + b"{no", "unreadable header"),
        (_json_header([1, 2]), "not an object"),
        (_json_header({"w": {"dtype": "I8"}}), "malformed tensor entry"),
        (
            _json_header({"w": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}}) + b"\0",
            "its header says",
        ),
    ],
)
def test_bad_files_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorsHeaderError, match=message) as caught:
        read_stored_header(path)
    assert "bad.safetensors" in str(caught.value)
    assert isinstance(caught.value, Int8FormatError) and isinstance(caught.value, ValueError)


def test_imports_without_torch() -> None:
    code = "import sys, leanvideo.int8.header; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
