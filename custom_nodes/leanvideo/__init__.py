"""LeanVideo node pack for ComfyUI.

ComfyUI imports this package from ``custom_nodes`` (or from the folder an extra-model-paths file names)
and awaits :func:`comfy_entrypoint`. Importing the package does nothing else, so its pure-torch parts
(for example ``leanvideo.int8``) import outside ComfyUI too. Nodes are declared in ``nodes_*.py``;
operations live in their own modules; this file only wires them up.
"""

from __future__ import annotations

from typing import Any

# The editor extension (web/reports.js): draws each node's report under it once it has run.
WEB_DIRECTORY = "./web"


async def comfy_entrypoint() -> Any:
    from .extension import create_extension

    return create_extension()
