"""ComfyUI entry point for this repository cloned straight into ``ComfyUI/custom_nodes/`` (as
ComfyUI-Manager and ``comfy node install`` do). The node pack itself is ``custom_nodes/leanvideo``;
it is imported only when ComfyUI asks for it, so importing this file outside ComfyUI does nothing.
"""

from __future__ import annotations

from typing import Any

WEB_DIRECTORY = "./custom_nodes/leanvideo/web"  # the pack's editor extension (ComfyUI serves it from here)


async def comfy_entrypoint() -> Any:
    from .custom_nodes.leanvideo import comfy_entrypoint as pack_entrypoint

    return await pack_entrypoint()
