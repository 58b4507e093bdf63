"""A scripted stand-in for ComfyUI, for the faults a real server cannot be made to produce on demand.

It speaks just enough of the API (``/ws``, ``POST /prompt``, ``/history/{id}``, ``/queue``, ``/view``,
``/interrupt``, ``/object_info``) on 127.0.0.1, and runs a test-supplied *script* for each prompt: an
async function that sends websocket messages, drops sockets, writes history, or takes the whole server
away. Everything it was asked is recorded in ``calls`` so tests can prove nothing was submitted or
downloaded twice.

Example::

    async def script(fake: FakeComfy, prompt_id: str) -> None:
        await fake.send({"type": "execution_start", "data": {"prompt_id": prompt_id, "timestamp": 1}})
        await fake.drop_sockets()
        fake.finish(prompt_id)

    with FakeComfy(script) as fake:
        result = run_prompt(ComfyClient(fake.url), WORKFLOW, timeout=10)
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from runner.local.ports import pick_free_port
from tests.loop_thread import LoopThread

Script = Callable[["FakeComfy", str], Awaitable[None]]

WORKFLOW: dict[str, Any] = {
    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}},
    "2": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "seed": 1, "steps": 3}},
    "3": {"class_type": "SaveVideo", "inputs": {"video": ["2", 0], "filename_prefix": "x"}},
}
VIDEO_BYTES = b"not really an mp4 but the bytes are what counts" * 10
OUTPUTS = {"3": {"images": [{"filename": "clip_00001_.mp4", "subfolder": "video", "type": "output"}]}}


def now_ms() -> int:
    return int(time.time() * 1000)


class FakeComfy(LoopThread):
    """The fake server; a context manager that serves on a free loopback port in a thread of its own."""

    def __init__(self, script: Script, *, history_misses: int = 0) -> None:
        super().__init__()
        self.script = script
        self.history_misses = history_misses  # answer {} this many times after finish(): the history race
        self.prompt_answer: tuple[int, str, str] | None = None  # (status, content type, body) of POST /prompt
        # What a reverse proxy in front of it does: answer the next request under a path with a status
        # and a web page of its own (taken in order, each once); refuse the websocket with a status;
        # gzip /view always ("always") or when the request accepts it ("asked"), or label it brotli ("br")
        self.proxy_answers: list[tuple[str, int]] = []
        self.proxy_json = False  # its pages are JSON (API gateways), not HTML
        self.ws_refusal: int | None = None
        self.compress_view: str | None = None
        self.history: dict[str, Any] = {}
        self.running: set[str] = set()
        self.calls: list[tuple[str, Any]] = []
        self.sockets: dict[str, web.WebSocketResponse] = {}
        self.connections = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._port = pick_free_port()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return self._port

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> FakeComfy:
        self.start_loop()
        self.call(self._serve())
        self.url = f"http://127.0.0.1:{self._port}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.call(self._shutdown())
        self.stop_loop()

    async def _stop_serving(self) -> None:
        await self.drop_sockets()
        if self._runner is None:
            return
        server = self._runner.server
        served = [h.transport for h in server.connections if h.transport] if server is not None else []
        await self._runner.cleanup()
        self._runner = None
        # A keep-alive connection the short shutdown left open would be collected unclosed later,
        # in some other test (a ResourceWarning, an error under -W error): close every one.
        for transport in served:
            if not transport.is_closing():
                transport.close()
        # close() lets go of the socket only in a callback on the loop: run it before the loop stops,
        # or the transport is still "unclosed" when it is collected
        for _ in range(3):
            await asyncio.sleep(0)

    async def _serve(self) -> None:
        app = web.Application(middlewares=[self._as_proxy])
        app.router.add_get("/ws", self._ws)
        app.router.add_post("/prompt", self._prompt)
        app.router.add_get("/history/{prompt_id}", self._history)
        app.router.add_get("/queue", self._queue)
        app.router.add_post("/queue", self._record_post)
        app.router.add_post("/interrupt", self._record_post)
        app.router.add_get("/view", self._view)
        app.router.add_get("/object_info", self._object_info)
        app.router.add_get("/system_stats", self._system_stats)
        app.router.add_get("/leanvideo/telemetry/prompts/{prompt_id}", self._telemetry)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await site.start()

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._stop_serving()

    # -- what scripts use ----------------------------------------------------------------------

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        """Send to every connected socket (there is one client)."""
        for ws in list(self.sockets.values()):
            if isinstance(message, bytes):
                await ws.send_bytes(message)
            elif isinstance(message, str):
                await ws.send_str(message)
            else:
                await ws.send_json(message)

    async def drop_sockets(self) -> None:
        for ws in list(self.sockets.values()):
            await ws.close()
        self.sockets.clear()

    async def vanish(self) -> None:
        """Stop listening altogether (the server process died)."""
        await self._stop_serving()

    async def restart(self, *, forget: bool = True) -> None:
        """Come back on the same port; ``forget`` drops history and queue like a fresh ComfyUI."""
        if forget:
            self.history.clear()
            self.running.clear()
        await self._serve()

    async def wait_for_socket(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.sockets:
            if time.monotonic() > deadline:
                raise TimeoutError("the client did not reconnect")
            await asyncio.sleep(0.01)

    def finish(
        self, prompt_id: str, *, status: str = "success", outputs: dict[str, Any] | None = None
    ) -> None:
        """Write the history entry (as task_done does) and take the prompt off the queue."""
        self.running.discard(prompt_id)
        messages = [
            ["execution_start", {"prompt_id": prompt_id, "timestamp": now_ms() - 50}],
            ["execution_cached", {"nodes": ["1"], "prompt_id": prompt_id, "timestamp": now_ms() - 49}],
            [f"execution_{status}", {"prompt_id": prompt_id, "timestamp": now_ms()}],
        ]
        self.history[prompt_id] = {
            "prompt": [0, prompt_id, {}, {}, []],
            "outputs": OUTPUTS if outputs is None else outputs,
            "status": {"status_str": status, "completed": status == "success", "messages": messages},
        }

    # -- handlers ------------------------------------------------------------------------------

    @web.middleware
    async def _as_proxy(self, request: web.Request, handler: Any) -> web.StreamResponse:
        for index, (path, status) in enumerate(self.proxy_answers):
            if request.path.startswith(path):
                del self.proxy_answers[index]
                self.calls.append((f"proxy {status}", request.path))
                moved = {"Location": f"https://comfy.example/comfy{request.path_qs}"} if status < 400 else {}
                if self.proxy_json:
                    return web.json_response({"message": "An invalid response was received"}, status=status)
                page = f"<html><body><h1>{status}</h1>nginx</body></html>"
                return web.Response(status=status, text=page, content_type="text/html", headers=moved)
        if request.path == "/ws" and self.ws_refusal is not None:
            self.calls.append((f"proxy {self.ws_refusal}", request.path))
            return web.Response(status=self.ws_refusal, text="websockets not passed on here")
        return await handler(request)  # type: ignore[no-any-return]

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        client_id = request.query.get("clientId", "")
        self.calls.append(("auth /ws", request.headers.get("Authorization")))
        self.sockets[client_id] = ws
        self.connections += 1
        await ws.send_json({"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}}})
        async for message in ws:
            if message.type == WSMsgType.ERROR:
                break
        if self.sockets.get(client_id) is ws:
            del self.sockets[client_id]
        return ws

    async def _prompt(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt_id = body["prompt_id"]
        self.calls.append(("POST /prompt", prompt_id))
        self.calls.append(("auth /prompt", request.headers.get("Authorization")))
        if self.prompt_answer is not None:  # what a proxy or firewall in between answers
            status, content_type, text = self.prompt_answer
            return web.Response(status=status, content_type=content_type, text=text)
        self.running.add(prompt_id)
        task = asyncio.get_running_loop().create_task(self.script(self, prompt_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return web.json_response({"prompt_id": prompt_id, "number": 1, "node_errors": {}})

    async def _history(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        self.calls.append(("GET /history", prompt_id))
        if prompt_id in self.history and self.history_misses > 0:
            self.history_misses -= 1
            return web.json_response({})
        return web.json_response({prompt_id: self.history[prompt_id]} if prompt_id in self.history else {})

    async def _queue(self, request: web.Request) -> web.Response:
        running = [[0, prompt_id, {}, {}, []] for prompt_id in sorted(self.running)]
        return web.json_response({"queue_running": running, "queue_pending": []})

    async def _record_post(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append((f"POST {request.path}", body))
        if request.path == "/interrupt" and body.get("prompt_id") in self.running:
            self.finish(body["prompt_id"], status="interrupted", outputs={})
        return web.Response(status=200)

    async def _view(self, request: web.Request) -> web.Response:
        self.calls.append(("GET /view", request.query.get("filename")))
        response = web.Response(body=VIDEO_BYTES, content_type="video/mp4")
        asked = "gzip" in request.headers.get("Accept-Encoding", "")
        if self.compress_view == "br":  # an encoding httpx cannot decode without brotli
            response.headers["Content-Encoding"] = "br"
        elif self.compress_view == "always" or (self.compress_view == "asked" and asked):
            response.body = gzip.compress(VIDEO_BYTES)
            response.headers["Content-Encoding"] = "gzip"
        return response

    async def _object_info(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _system_stats(self, request: web.Request) -> web.Response:
        system = {"comfyui_version": "fake", "argv": ["main.py"], "python_version": "3.11.7 (main)"}
        return web.json_response({"system": system, "devices": [{"name": "fake", "type": "cpu"}]})

    async def _telemetry(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        if prompt_id not in self.history:
            return web.json_response({"error": f"unknown prompt {prompt_id}"}, status=404)
        return web.json_response({"prompt_id": prompt_id, "peak_rss_bytes": 123456, "energy_j": None})
