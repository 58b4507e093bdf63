"""Our own format (``docs/int8-format.md``): the canonical layout plus a ``leanvideo_int8`` header entry."""

from __future__ import annotations

import json
from typing import Any

from ..files import FileHeader
from ..spec import FORMAT_VERSION, METADATA_KEY, SYLVESTER_UNTIL_VERSION, Int8FormatError
from . import comfy_native

NAME = "leanvideo"


def detect(header: FileHeader) -> bool:
    return METADATA_KEY in header.metadata


def format_version(header: FileHeader) -> int:
    try:
        return int(json.loads(header.metadata[METADATA_KEY])["format_version"])
    except (ValueError, KeyError, TypeError) as error:
        raise Int8FormatError(f"{header.path}: unreadable {METADATA_KEY} header entry ({error})") from error


def hadamard_of(header: FileHeader) -> str:
    """The rotation matrix of the file's ``convrot`` layers: Sylvester in format version 1, else ConvRot's."""
    return "sylvester" if format_version(header) <= SYLVESTER_UNTIL_VERSION else "regular"


def layer_entries(header: FileHeader) -> dict[str, dict[str, Any]]:
    version = format_version(header)
    if version > FORMAT_VERSION:
        raise Int8FormatError(
            f"{header.path}: LeanVideo INT8 format version {version} is newer than this pack reads "
            f"({FORMAT_VERSION}); update LeanVideo"
        )
    return comfy_native.layer_entries(header)
