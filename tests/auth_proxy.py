"""A loopback HTTP reverse proxy that asks for a token, to put in front of a real server.

ComfyUI has no authentication of its own; behind a reverse proxy that has, every request (HTTP and the
``/ws`` websocket handshake) must carry ``Authorization: Bearer <token>`` or the ``X-Api-Key`` header.
:class:`AuthProxy` forwards what carries either to ``target`` (without them: the server never sees a
credential) and answers 401 to the rest, counting them in ``refused``; ``seen`` lists each request's
``METHOD PATH``.

Example::

    with AuthProxy("http://127.0.0.1:8188", token="s3cret", api_key="k3y") as proxy:
        httpx.get(f"{proxy.url}/system_stats", headers={"Authorization": "Bearer s3cret"})
    print(proxy.refused)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from tests.loop_thread import LoopThread

# Set per hop, or credentials: not forwarded either way
_HOP_HEADERS = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer"}
)
_CREDENTIALS = frozenset({"authorization", "x-api-key"})


class AuthProxy(LoopThread):
    """Forwards ``127.0.0.1:<port>`` to ``target`` for requests with the token or the API key."""

    call_timeout_s = 30.0

    def __init__(self, target: str, *, token: str, api_key: str | None = None) -> None:
        super().__init__()
        self.target = target.rstrip("/")
        self.token = token
        self.api_key = api_key
        self.refused = 0
        self.seen: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __enter__(self) -> AuthProxy:
        self.start_loop()
        port = self.call(self._serve())
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.call(self._shutdown())
        self.stop_loop()

    async def _serve(self) -> int:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        return int(server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        for _ in range(3):  # closed transports let go of their sockets in callbacks on this loop
            await asyncio.sleep(0)

    def _allowed(self, request: web.Request) -> bool:
        bearer = request.headers.get("Authorization") == f"Bearer {self.token}"
        return bearer or (self.api_key is not None and request.headers.get("X-Api-Key") == self.api_key)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(f"{request.method} {request.path}")
        if not self._allowed(request):
            self.refused += 1
            return web.Response(status=401, text="401: Unauthorized", headers={"WWW-Authenticate": "Bearer"})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS | _CREDENTIALS}
        if request.path == "/ws" and request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        assert self._session is not None
        async with self._session.request(
            request.method, self.target + request.path_qs, headers=headers, data=await request.read()
        ) as upstream:
            body = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
            return web.Response(status=upstream.status, body=body, headers=kept)

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        assert self._session is not None
        client = web.WebSocketResponse()
        await client.prepare(request)
        url = self.target.replace("http", "ws", 1) + request.path_qs
        async with self._session.ws_connect(url) as upstream:

            async def pump(source: Any, sink: Any) -> None:
                async for message in source:
                    if message.type == WSMsgType.TEXT:
                        await sink.send_str(message.data)
                    elif message.type == WSMsgType.BINARY:
                        await sink.send_bytes(message.data)

            tasks = [
                asyncio.ensure_future(pump(client, upstream)),
                asyncio.ensure_future(pump(upstream, client)),
            ]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await task
        await client.close()
        return client
