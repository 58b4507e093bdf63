"""The safetensors header, encoded and read in one place for every file we write or parse ourselves.

A safetensors file is 8 bytes of little-endian header length, the header (compact JSON padded with
spaces to a multiple of 8: ``{"__metadata__": {str: str}, key: {"dtype", "shape", "data_offsets"}}``),
then the tensors' bytes back to back, ``data_offsets`` counting from the end of the header. Users: the
INT8 streaming writer and tensor reader (:mod:`.writer`, :mod:`.files`) and the runner's fixture files
(:mod:`runner.fixtures.tensors`). No torch on purpose (the standard library and :mod:`.spec`): the
runner, which never imports torch, uses this module too.

Example::

    header, ranges = encode_header([("w", "I8", (4, 8))], {"k": "v"})  # ranges: {'w': (0, 32)}
    Path("w.safetensors").write_bytes(header + bytes(32))
    stored = read_stored_header(Path("w.safetensors"))
    stored.metadata, stored.tensors["w"]["shape"], stored.data_start  # {'k': 'v'}, [4, 8], 96
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec import Int8FormatError

METADATA = "__metadata__"
HEADER_LIMIT = 100_000_000  # the safetensors reference implementation's limit
DTYPE_SIZES: dict[str, int] = {"U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F16": 2, "BF16": 2, "F32": 4}


class SafetensorsHeaderError(Int8FormatError):
    """A safetensors file is too short, its header is not valid, or its size disagrees with the header."""

    __module__ = "leanvideo.int8.header"  # as Int8FormatError's: named by the package, not its path


@dataclass(frozen=True)
class StoredHeader:
    """A safetensors header as a file holds it."""

    fields: dict[str, Any]  # the JSON object: tensor entries, plus "__metadata__" when the file has one
    data_start: int  # where the tensors' bytes begin: 8 + the header's length

    @property
    def metadata(self) -> dict[str, str]:
        """The ``__metadata__`` entry (empty when there is none)."""
        metadata = self.fields.get(METADATA, {})
        return dict(metadata) if isinstance(metadata, dict) else {}

    @property
    def tensors(self) -> dict[str, dict[str, Any]]:
        """The tensor entries by key, in file order."""
        return {key: entry for key, entry in self.fields.items() if key != METADATA}

    def expected_size(self) -> int:
        """The file size this header describes: where the last tensor's bytes end. Raises ``KeyError``,
        ``IndexError``, ``TypeError`` or ``ValueError`` for a malformed tensor entry."""
        ends = (int(entry["data_offsets"][1]) for entry in self.tensors.values())
        return self.data_start + max(ends, default=0)


def encode_header(
    tensors: Iterable[tuple[str, str, Sequence[int]]], metadata: Mapping[str, str]
) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The header bytes (length prefix included) for ``(key, dtype, shape)`` tensors stored back to back
    in the order given, and each tensor's ``(start, end)`` in the data that follows the header.

    The JSON keeps the tensors in the order given (``__metadata__`` first, its entries sorted: a
    metadata dict read back from a file comes in no fixed order), so the same tensors and metadata
    always give the same bytes.
    """
    fields: dict[str, Any] = {METADATA: dict(sorted(metadata.items()))}
    ranges: dict[str, tuple[int, int]] = {}
    offset = 0
    for key, dtype, shape in tensors:
        if dtype not in DTYPE_SIZES:
            raise ValueError(f"Tensor {key!r} has dtype {dtype!r}; safetensors dtypes: {sorted(DTYPE_SIZES)}")
        size = DTYPE_SIZES[dtype] * math.prod(shape)
        fields[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        ranges[key] = (offset, offset + size)
        offset += size
    encoded = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded, ranges


def read_stored_header(path: Path, *, whole: bool = True) -> StoredHeader:
    """The header of the safetensors file ``path``, without its data.

    Raises :class:`SafetensorsHeaderError` when the file is truncated, its header is not valid, or (with
    ``whole``; without it, the header of a file whose data was cut short is read too) the file's size is
    not what the header says.
    """
    with path.open("rb") as stream:
        prefix = stream.read(8)
        if len(prefix) != 8:
            raise SafetensorsHeaderError(f"{str(path)!r} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", prefix)
        if length > HEADER_LIMIT:
            raise SafetensorsHeaderError(f"{str(path)!r} declares a {length}-byte header")
        raw = stream.read(length)
    try:
        fields = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsHeaderError(f"{str(path)!r} has an unreadable header: {error}") from error
    if not isinstance(fields, dict):
        raise SafetensorsHeaderError(f"{str(path)!r} has a header that is not an object")
    stored = StoredHeader(fields=fields, data_start=8 + length)
    if not whole:
        return stored
    try:
        expected_size = stored.expected_size()
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise SafetensorsHeaderError(f"{str(path)!r} has a malformed tensor entry: {error!r}") from error
    size = path.stat().st_size
    if size != expected_size:
        raise SafetensorsHeaderError(f"{str(path)!r} is {size} bytes, its header says {expected_size}")
    return stored
