"""The pack's ComfyExtension: which node modules it registers and which routes it adds."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from comfy_api.latest import ComfyExtension, io

from .name_clashes import clashes, ours_by_id, said_replaced, said_taken
from .routes import register_routes

logger = logging.getLogger(__name__)

# Each nodes_* module declares ``NODES``: the node classes it contributes, in menu order.
NODE_MODULES: tuple[str, ...] = ("nodes_loaders", "nodes_runtime", "nodes_output")


class LeanVideoExtension(ComfyExtension):
    """The node list ComfyUI registers for this pack (none for a second copy of it: see below)."""

    def __init__(self, *, registers_nodes: bool = True) -> None:
        self.registers_nodes = registers_nodes
        self.ours: dict[str, type[io.ComfyNode]] = {}  # its nodes by id, once registered

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        import importlib

        if not self.registers_nodes:
            return []
        _check_kernel_variable()
        nodes: list[type[io.ComfyNode]] = []
        for name in NODE_MODULES:
            nodes.extend(importlib.import_module(f"{__package__}.{name}").NODES)
        self.ours = ours_by_id(nodes)
        _check_ids(self.ours, said_taken)  # registered by a pack loaded before this one
        return nodes

    async def check_replaced(self, _app: object) -> None:
        """Once every custom node pack is loaded (the server's start): say which of this pack's node ids
        a pack loaded later took."""
        _check_ids(self.ours, said_replaced)


def _check_ids(ours: dict[str, type[io.ComfyNode]], say: Callable[[dict[str, str]], str]) -> None:
    import nodes

    if found := clashes(nodes.NODE_CLASS_MAPPINGS, ours):
        logger.warning(say(found))


def _check_kernel_variable() -> None:
    """Say at start-up, not at the first INT8 load, that ``LEANVIDEO_INT8_KERNEL`` holds no kernel (every
    loader with ``path=auto`` would then fail, blamed on a node whose inputs are fine)."""
    from .int8.dispatch import forced_kernel  # torch: imported once ComfyUI loads the nodes

    try:
        forced_kernel("auto", os.environ)
    except ValueError as error:
        logger.error(
            "LeanVideo: %s; the INT8 loaders with path=auto will refuse to load until it is fixed", error
        )


def installed_as(pack_dir: Path) -> Path:
    """The entry of a ``custom_nodes`` folder that holds the pack: the pack's own folder, or the
    repository cloned around it (``custom_nodes/ComfyUI-LeanVideo`` for its ``custom_nodes/leanvideo``)."""
    entries = [folder for folder in (pack_dir, *pack_dir.parents) if folder.parent.name == "custom_nodes"]
    return entries[-1] if entries else pack_dir


def create_extension() -> LeanVideoExtension:
    """Add the pack's HTTP routes to the running server and return the extension.

    The server gets one :class:`~leanvideo.telemetry.Telemetry`, hooked into its prompt queue and kept
    as ``PromptServer.instance.leanvideo_telemetry`` so that nodes can add events to the running prompt,
    and a log handler that notes there the LoRA weights a prompt applies to nothing
    (:mod:`leanvideo.lora_notes`).
    """
    from server import PromptServer

    from .lora_notes import MESSAGE as LORA_MESSAGE
    from .lora_notes import UnappliedLoras
    from .telemetry import Telemetry

    server = PromptServer.instance
    # As ComfyUI imported it, links not followed: the custom_nodes entry a user would remove is the link
    entry = installed_as(Path(__file__).absolute().parent)
    first: Path | None = getattr(server, "leanvideo_pack_entry", None)
    if first is not None:
        # Two copies in custom_nodes (a Manager clone beside a link, two names), or two links to one:
        # the one loaded first keeps its nodes and routes (mixing them would run one copy's nodes under
        # the other's routes; routes added twice answer twice).
        fix = (
            f"remove one of the two from {entry.parent}"
            if entry.parent == first.parent
            else "it comes from another custom nodes folder ComfyUI was given (the servers leanvideo starts "
            "load the runner's own copy first); this copy is used when ComfyUI starts without it"
        )
        logger.warning(
            "LeanVideo: a second copy of the node pack, %s, is not loaded: %s was loaded first and is "
            "the one in use; %s",
            entry,
            first,
            fix,
        )
        return LeanVideoExtension(registers_nodes=False)
    server.leanvideo_pack_entry = entry
    telemetry = getattr(server, "leanvideo_telemetry", None)
    if telemetry is None:
        telemetry = Telemetry()
        telemetry.attach(server.prompt_queue)
        server.leanvideo_telemetry = telemetry

        # ComfyUI logs the LoRA weights it applies to nothing on the root logger: noted per prompt,
        # and told to the editor that queued it
        def tell(prompt_id: str, client_id: str | None, why: str, first: str) -> None:
            data = {"prompt_id": prompt_id, "reason": why, "first": first}
            server.send_sync(LORA_MESSAGE, data, client_id)

        notes = UnappliedLoras(telemetry, tell)
        telemetry.starts.append(notes.prompt_started)
        logging.getLogger().addHandler(notes)
    register_routes(server.routes, telemetry, server.prompt_queue)
    extension = LeanVideoExtension()
    server.app.on_startup.append(extension.check_replaced)  # after every custom node pack loaded
    return extension
