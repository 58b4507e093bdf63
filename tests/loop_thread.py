"""An asyncio loop in a daemon thread of its own, for the test servers that synchronous tests drive
(the scripted fake ComfyUI, the authenticating proxy).

Example::

    class Server(LoopThread):
        def __enter__(self) -> Server:
            self.start_loop()
            self.call(self._serve())
            return self
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any


class LoopThread:
    """Runs coroutines on a loop of its own thread; ``call`` waits for one at most ``call_timeout_s``."""

    call_timeout_s = 10.0

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start_loop(self) -> None:
        self._thread.start()

    def stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=self.call_timeout_s)  # type: ignore[arg-type]
