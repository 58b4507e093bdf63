"""HTTP routes the node pack adds to the ComfyUI server.

``GET /leanvideo/info`` says which pack is loaded, from where, and whether the server runs the ComfyUI
the project is pinned to, so a client can check it talks to the server it expects.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from aiohttp import web

PACK_DIR = Path(__file__).resolve().parent
PIN_FILE = PACK_DIR.parents[1] / "runner" / "comfy_pin.json"


def read_pin() -> dict[str, Any]:
    """The recorded ComfyUI pin (version and commit), or an empty dict when the file is absent."""
    try:
        pin = json.loads(PIN_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return {"version": pin.get("version"), "commit": pin.get("commit")}


def pack_version() -> str:
    try:
        return metadata.version("leanvideo")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


def build_info() -> dict[str, Any]:
    from comfyui_version import __version__ as comfyui_version

    pin = read_pin()
    return {
        "pack": "leanvideo",
        "version": pack_version(),
        "loaded_from": str(PACK_DIR),
        "comfyui_version": comfyui_version,
        "pinned_comfyui": pin,
        "matches_pin": pin.get("version") == comfyui_version,
    }


def register_routes(routes: web.RouteTableDef) -> None:
    """Add the pack's routes to the server's route table (call once, before the app starts)."""

    @routes.get("/leanvideo/info")
    async def leanvideo_info(request: web.Request) -> web.Response:
        return web.json_response(build_info())
