"""The workflow ComfyUI writes into the PNG images it saves (``tEXt`` chunks ``prompt``: the API
workflow that ran, and ``workflow``: the editor's graph), read without decoding the image.

Example::

    text = png_workflow_text(Path("output/ComfyUI_00001_.png").read_bytes())  # JSON text, or None
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["PNG_SIGNATURE", "WORKFLOW_KEYS", "png_workflow_text"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The chunks ComfyUI's SaveImage writes, in the order they are taken: the API workflow is what ran
WORKFLOW_KEYS = ("prompt", "workflow")


def png_workflow_text(data: bytes, keys: tuple[str, ...] = WORKFLOW_KEYS) -> tuple[str, str] | None:
    """``(key, JSON text)`` of the workflow in the PNG ``data``, the first of ``keys`` it holds
    (``prompt`` first, else ``workflow``), or None when it holds none. The text chunks of other keys
    are not read, and a file cut short after its workflow still gives it. Raises ValueError for data
    that is not a PNG, or cut short before any of ``keys``."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG image")
    texts: dict[str, str] = {}
    at = len(PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + length]
        if len(body) < length:
            if texts:  # the workflow came first (ComfyUI writes it before the image data)
                break
            raise ValueError(f"its {kind.decode('latin-1')} chunk is cut short")
        if kind in (b"tEXt", b"iTXt", b"zTXt"):
            key, _, rest = body.partition(b"\0")
            if key.decode("latin-1") in keys:
                texts.setdefault(key.decode("latin-1"), _text(kind, rest))
        if kind == b"IEND":
            break
        at += 12 + length
    return next(((key, texts[key]) for key in keys if key in texts), None)


def _text(kind: bytes, rest: bytes) -> str:
    """A text chunk's text, after its keyword (``tEXt`` Latin-1 as PNG says, which ComfyUI fills with
    UTF-8 JSON: read as UTF-8; ``zTXt`` compressed; ``iTXt`` UTF-8, maybe compressed)."""
    if kind == b"zTXt":
        rest = zlib.decompress(rest[1:])
    elif kind == b"iTXt":
        compressed = rest[:1] == b"\1"
        rest = rest[2:].split(b"\0", 2)[-1]  # past the language tag and translated keyword
        rest = zlib.decompress(rest) if compressed else rest
    return rest.decode("utf-8", errors="replace")
