"""The pack's ComfyExtension: which node modules it registers and which routes it adds."""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .routes import register_routes

# Each nodes_* module declares ``NODES``: the node classes it contributes, in menu order.
NODE_MODULES: tuple[str, ...] = ("nodes_loaders", "nodes_runtime", "nodes_output")


class LeanVideoExtension(ComfyExtension):
    """The node list ComfyUI registers for this pack."""

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        import importlib

        nodes: list[type[io.ComfyNode]] = []
        for name in NODE_MODULES:
            nodes.extend(importlib.import_module(f"{__package__}.{name}").NODES)
        return nodes


def create_extension() -> LeanVideoExtension:
    """Add the pack's HTTP routes to the running server and return the extension.

    The server gets one :class:`~leanvideo.telemetry.Telemetry`, hooked into its prompt queue and kept
    as ``PromptServer.instance.leanvideo_telemetry`` so that nodes can add events to the running prompt.
    """
    from server import PromptServer

    from .telemetry import Telemetry

    server = PromptServer.instance
    telemetry = getattr(server, "leanvideo_telemetry", None)
    if telemetry is None:
        telemetry = Telemetry()
        telemetry.attach(server.prompt_queue)
        server.leanvideo_telemetry = telemetry
    register_routes(server.routes, telemetry, server.prompt_queue)
    return LeanVideoExtension()
