"""Reading safetensors files safely: headers first, clear errors, pickle checkpoints refused.

Example::

    header = read_header(Path("model.safetensors"))
    header.dtypes["blocks.0.attn.q.weight"]  # 'I8'
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .header import HEADER_LIMIT, read_stored_header
from .spec import Int8FormatError
from .writer import SAFETENSORS_DTYPES

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")


@dataclass(frozen=True)
class FileHeader:
    """What a safetensors header says: metadata, and dtype (``'I8'``, ``'BF16'``, …) and shape per key."""

    path: Path
    metadata: dict[str, str]
    dtypes: dict[str, str]
    shapes: dict[str, tuple[int, ...]]


CHECKPOINT_DIT_PREFIX = "model.diffusion_model."  # a full checkpoint's diffusion model part


def diffusion_model_keys(header: FileHeader) -> list[str]:
    """The keys of the diffusion model in ``header``'s file: in a full checkpoint (LTXV releases:
    ``model.diffusion_model.*`` next to ``vae.*`` and text encoders) only the diffusion model's part,
    otherwise every key."""
    keys = [key for key in header.dtypes if key.startswith(CHECKPOINT_DIT_PREFIX)]
    return keys or list(header.dtypes)


def _check_path(path: Path) -> None:
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise Int8FormatError(
            f"{path}: pickle checkpoints ({path.suffix}) are refused because loading them can run code; "
            "convert the file to .safetensors first"
        )
    if path.is_dir():
        raise Int8FormatError(f"{path}: a folder, not a model file")
    if not path.is_file():
        if path.exists():
            raise Int8FormatError(f"{path}: not a regular file (a pipe, socket or device), not a model file")
        raise Int8FormatError(f"{path}: no such file")
    if not os.access(path, os.R_OK):
        raise Int8FormatError(f"{path}: cannot be read (permission denied for this user)")


def _pickle_hint(path: Path) -> str:
    """What a file that is not readable safetensors looks like, said so a user knows what to do: empty,
    a web page or other text saved under the model's name, cut short (an interrupted download), or a
    PyTorch pickle (a zip archive or a pickle stream: ``torch.save``'s formats) renamed to .safetensors."""
    try:
        with path.open("rb") as stream:
            start = stream.read(512)
        size = path.stat().st_size
    except OSError:
        return ""
    if size == 0:
        return "; the file is empty (0 bytes): the download or copy did not happen, get the file again"
    # A safetensors file starts with its header's length, then "{": a damaged one whose length byte
    # happens to be 0x80 is not a pickle.
    declared = int.from_bytes(start[:8].ljust(8, b"\0"), "little")
    pickled = start[:1] == b"\x80" and start[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") and declared > size
    if start.startswith(b"PK\x03\x04") or pickled:
        return (
            "; it looks like a PyTorch pickle checkpoint (.pt/.ckpt) under another name, which is refused "
            "because loading it can run code: get the .safetensors release of the model"
        )
    if start[8:9] == b"{" and 8 + declared > size and declared <= HEADER_LIMIT:
        return (
            f"; it is cut short inside its header ({size} bytes, of a header of {declared}): an interrupted "
            "download or copy, get the file again"
        )
    if start[8:9] == b"{" and (expected := _size_its_header_says(path)) is not None and size < expected:
        return (
            f"; it is cut short ({size} bytes of the {expected} its header says): an interrupted download "
            "or copy, get the file again"
        )
    text = start.lstrip().lower()
    looks_like_text = text.startswith((b"<!doctype", b"<html", b"<?xml", b"{", b"version https://git-lfs"))
    if start[8:9] != b"{" and looks_like_text:  # not a safetensors header whose length reads as text
        what = (
            "a Git LFS pointer (the repository was cloned without git lfs)"
            if text.startswith(b"version https://git-lfs")
            else "a web page or other text (often an error or login page saved by the browser)"
        )
        return f"; it is {what}, not a model: download the file itself again"
    return ""


def _size_its_header_says(path: Path) -> int | None:
    """The size a safetensors file should have by its own header (None when that cannot be read)."""
    try:
        return read_stored_header(path, whole=False).expected_size()
    except (OSError, Int8FormatError, KeyError, TypeError, ValueError, IndexError):
        return None


def read_header(path: Path) -> FileHeader:
    """The header of ``path``; raises :class:`Int8FormatError` for pickles and corrupt or truncated files."""
    _check_path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            keys = list(handle.keys())
            dtypes = {key: handle.get_slice(key).get_dtype() for key in keys}
            shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in keys}
            metadata = dict(handle.metadata() or {})
    except SafetensorError as error:
        hint = _pickle_hint(path)
        raise Int8FormatError(f"{path}: not a readable safetensors file ({error}){hint}") from error
    return FileHeader(path=path, metadata=metadata, dtypes=dtypes, shapes=shapes)


def read_tensors(path: Path, keys: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` on the CPU: all of them, or only ``keys`` (the rest are never read, so
    one part of a full checkpoint costs only its own bytes). Nothing is returned (or kept) when
    reading fails.

    Example::

        vae = read_tensors(Path("ltxv.safetensors"), [k for k in header.dtypes if k.startswith("vae.")])
    """
    _check_path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            wanted = list(handle.keys()) if keys is None else list(keys)
            return {key: handle.get_tensor(key) for key in wanted}
    except SafetensorError as error:
        hint = _pickle_hint(path)
        raise Int8FormatError(f"{path}: not a readable safetensors file ({error}){hint}") from error


def restrict_header(header: FileHeader, keys: Iterable[str]) -> FileHeader:
    """``header`` as if the file held only ``keys`` (one part of a full checkpoint); metadata kept."""
    kept = [key for key in keys if key in header.dtypes]
    return FileHeader(
        path=header.path,
        metadata=header.metadata,
        dtypes={key: header.dtypes[key] for key in kept},
        shapes={key: header.shapes[key] for key in kept},
    )


_TORCH_DTYPES: dict[str, torch.dtype] = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


class TensorReader:
    """Reads single tensors with plain file reads (no memory map), so reading a whole file one tensor
    at a time keeps only the current tensor in memory. Opened on a header :func:`read_header` validated.

    Example::

        with TensorReader(Path("model.safetensors")) as reader:
            weight = reader.get("blocks.0.attn.q.weight")
    """

    def __init__(self, path: Path) -> None:
        read_header(path)  # validation: corrupt or truncated files fail here, with the file named
        stored = read_stored_header(path)
        self.path = path
        self._entries = stored.tensors
        self._data_start = stored.data_start
        self._file = path.open("rb")

    def keys(self) -> list[str]:
        return list(self._entries)

    def get(self, key: str) -> torch.Tensor:
        entry = self._entries[key]
        dtype = _TORCH_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise Int8FormatError(f"{self.path}: tensor {key!r} has unsupported dtype {entry['dtype']}")
        start, end = entry["data_offsets"]
        if end == start:
            return torch.empty(entry["shape"], dtype=dtype)
        buffer = bytearray(end - start)
        self._file.seek(self._data_start + start)
        if self._file.readinto(buffer) != len(buffer):
            raise Int8FormatError(f"{self.path}: tensor {key!r} is cut short")
        return torch.frombuffer(buffer, dtype=dtype).reshape(entry["shape"])

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
