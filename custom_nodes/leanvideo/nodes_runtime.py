"""Runtime nodes: VRAM release and attention patching (declarations only)."""

from __future__ import annotations

from comfy_api.latest import io

NODES: list[type[io.ComfyNode]] = []
