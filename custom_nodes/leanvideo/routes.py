"""HTTP routes the node pack adds to the ComfyUI server.

``GET /leanvideo/info`` says which pack is loaded, from where, and whether the server runs the ComfyUI
the project is pinned to, so a client can check it talks to the server it expects.

``GET /leanvideo/queue`` answers ``{"pending_flags": [...]}``: the ``POST /free`` requests (``free_memory``,
``unload_models``) the prompt worker has not applied yet. The worker applies them between prompts; a
prompt queued while one is pending runs *before* it, so a client that needs the reset (the benchmark's
cache defeat) waits for an empty list before it submits.

Telemetry routes (present when a :class:`~leanvideo.telemetry.Telemetry` is passed in):

=============================================  ===========================================================
route                                          answer
=============================================  ===========================================================
``GET /leanvideo/telemetry``                   live snapshot: ``process`` (rss, peak rss), ``cuda``
                                               (allocated/reserved/max since reset, or null + ``reason``),
                                               ``nvml`` (memory used, total energy Wh, or null + reason),
                                               ``comfy`` (loaded models, queue depth), ``prompts`` (counts)
``POST /leanvideo/telemetry/reset``            resets the peaks (RSS, CUDA); answers the fresh snapshot
``GET /leanvideo/telemetry/prompts``           every kept per-prompt record, oldest first
``GET /leanvideo/telemetry/prompts/{id}``      one prompt's record; 404 names the unknown id
``GET /leanvideo/metrics``                     Prometheus text exposition (503 without prometheus-client)
=============================================  ===========================================================
"""

from __future__ import annotations

import json
import os
import re
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .telemetry import Telemetry

PACK_DIR = Path(__file__).resolve().parent
PIN_FILE = PACK_DIR / "comfy_pin.json"  # package data; the installer reads the same file


def read_pin() -> dict[str, Any]:
    """The recorded ComfyUI pin (version and commit), or an empty dict when the file is absent."""
    try:
        pin = json.loads(PIN_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return {"version": pin.get("version"), "commit": pin.get("commit")}


def pack_version() -> str:
    """The version of the copy of the pack that is loaded: its repository's ``pyproject.toml`` when it
    sits in one (a ComfyUI-Manager clone, a checkout), else the installed package's."""
    pyproject = PACK_DIR.parent.parent / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        text = ""
    named = re.search(r'^name = "leanvideo"$', text, re.MULTILINE)  # not ComfyUI's own pyproject
    if named and (found := re.search(r'^version = "([^"]+)"$', text, re.MULTILINE)):
        return f"{found[1]} (from {pyproject})"
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
        "pid": os.getpid(),  # which process answers: a runner starting a server checks it is its own
    }


def register_routes(
    routes: web.RouteTableDef, telemetry: Telemetry | None = None, prompt_queue: Any = None
) -> None:
    """Add the pack's routes to the server's route table (call once, before the app starts).

    ``prompt_queue`` is ComfyUI's ``execution.PromptQueue``; without it there is no queue route.
    """

    @routes.get("/leanvideo/info")
    async def leanvideo_info(request: web.Request) -> web.Response:
        return web.json_response(build_info())

    if prompt_queue is not None:

        @routes.get("/leanvideo/queue")
        async def leanvideo_queue(request: web.Request) -> web.Response:
            pending = prompt_queue.get_flags(reset=False)  # a copy, taken under the queue's lock
            return web.json_response({"pending_flags": sorted(pending)})

    if telemetry is not None:
        register_telemetry_routes(routes, telemetry)


def register_telemetry_routes(routes: web.RouteTableDef, telemetry: Telemetry) -> None:
    """The ``/leanvideo/telemetry*`` and ``/leanvideo/metrics`` routes, served from ``telemetry``."""
    try:
        from .metrics import PromptMetrics
    except ImportError as exc:  # the pack still loads; only the metrics route says what is missing
        metrics = None
        missing = f"prometheus-client is not installed ({exc}); pip install prometheus-client"
    else:
        metrics = PromptMetrics(telemetry)
        missing = ""

    @routes.get("/leanvideo/telemetry")
    async def leanvideo_telemetry(request: web.Request) -> web.Response:
        return web.json_response(telemetry.snapshot())

    @routes.post("/leanvideo/telemetry/reset")
    async def leanvideo_telemetry_reset(request: web.Request) -> web.Response:
        return web.json_response(telemetry.reset())

    @routes.get("/leanvideo/telemetry/reset")  # else ComfyUI's static files answer 404
    async def leanvideo_telemetry_reset_get(request: web.Request) -> web.Response:
        return web.json_response(
            {"error": "reset restarts the peaks (RSS, CUDA memory): send POST /leanvideo/telemetry/reset"},
            status=405,
            headers={"Allow": "POST"},
        )

    @routes.get("/leanvideo/telemetry/prompts")
    async def leanvideo_telemetry_prompts(request: web.Request) -> web.Response:
        return web.json_response({"prompts": telemetry.records()})

    @routes.get("/leanvideo/telemetry/prompts/{prompt_id}")
    async def leanvideo_telemetry_prompt(request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        record = telemetry.record(prompt_id)
        if record is None:
            return web.json_response({"error": f"no telemetry record for prompt {prompt_id!r}"}, status=404)
        return web.json_response(record)

    @routes.get("/leanvideo/metrics")
    async def leanvideo_metrics(request: web.Request) -> web.Response:
        if metrics is None:
            return web.Response(status=503, text=missing)
        body, content_type = metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})
