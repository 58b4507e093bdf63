"""LeanVideo node pack for ComfyUI.

ComfyUI imports this package from ``custom_nodes`` (or from the folder an extra-model-paths file names)
and calls :func:`comfy_entrypoint`. Nodes are declared in their own modules; this file only wires them
up and adds the pack's HTTP routes.
"""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .routes import register_routes


class LeanVideoExtension(ComfyExtension):
    """The pack's extension object: the node list ComfyUI registers."""

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return []


async def comfy_entrypoint() -> LeanVideoExtension:
    from server import PromptServer

    register_routes(PromptServer.instance.routes)
    return LeanVideoExtension()
