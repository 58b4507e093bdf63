"""A streaming safetensors writer: declare every tensor first, then write them one at a time.

The header (with all offsets, encoded by :func:`.header.encode_header`) is written up front, so each
tensor's bytes go straight to their place in the file and no tensor has to be kept in memory after it
is written.

Example::

    with StreamingWriter(Path("out.safetensors"), {"k": "v"}) as writer:
        writer.declare("w", torch.int8, (4, 8))
        writer.begin()
        writer.write("w", torch.zeros(4, 8, dtype=torch.int8))
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import torch

from .header import encode_header

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
}


class StreamingWriter:
    """Writes a safetensors file tensor by tensor; every declared tensor must be written exactly once."""

    def __init__(self, path: Path, metadata: dict[str, str]) -> None:
        self.path = path
        self.metadata = metadata
        self._entries: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        self._offsets: dict[str, tuple[int, int]] = {}
        self._written: set[str] = set()
        self._data_start = 0
        self._file: BinaryIO | None = None

    def declare(self, key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        if self._file is not None:
            raise RuntimeError(f"Cannot declare {key!r} after writing has begun")
        if key in self._entries:
            raise ValueError(f"Tensor {key!r} declared twice")
        self._entries[key] = (dtype, tuple(shape))

    def begin(self) -> None:
        """Write the header; after this only :meth:`write` is allowed."""
        tensors = [(key, SAFETENSORS_DTYPES[dtype], shape) for key, (dtype, shape) in self._entries.items()]
        header, self._offsets = encode_header(tensors, self.metadata)
        self._file = self.path.open("wb")
        self._file.write(header)
        self._data_start = len(header)
        data_size = max((end for _, end in self._offsets.values()), default=0)
        self._file.truncate(self._data_start + data_size)

    def write(self, key: str, tensor: torch.Tensor) -> None:
        if self._file is None:
            raise RuntimeError("Call begin() before write()")
        dtype, shape = self._entries[key]
        if tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise ValueError(
                f"Tensor {key!r} is {tensor.dtype} {list(tensor.shape)}; declared {dtype} {list(shape)}"
            )
        start, _ = self._offsets[key]
        self._file.seek(self._data_start + start)
        # numpy's buffer goes straight to the file: no extra copy of the tensor's bytes
        self._file.write(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
        self._written.add(key)

    def __enter__(self) -> StreamingWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._file is not None:
            self._file.close()
        if kind is None and self._written != set(self._entries):
            missing = sorted(set(self._entries) - self._written)
            raise RuntimeError(f"{self.path}: tensors declared but never written: {missing[:5]}")
