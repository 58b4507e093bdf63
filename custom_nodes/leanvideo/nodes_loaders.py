"""INT8 loader nodes (declarations only; the work happens in the pack's ops modules)."""

from __future__ import annotations

from comfy_api.latest import io

NODES: list[type[io.ComfyNode]] = []
