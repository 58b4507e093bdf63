"""GET /leanvideo/queue on the real pinned server: a POST /free stays pending while a prompt runs and
is applied between prompts, which is what the benchmark's cache defeat waits for."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from benchmarks.protocol import defeat_cache
from runner.local.server import ComfyServer
from runner.transport.client import ComfyClient

pytestmark = pytest.mark.integration


def _pending(url: str) -> list[str]:
    answer = httpx.get(f"{url}/leanvideo/queue", timeout=10).json()
    return list(answer["pending_flags"])


def _running(url: str) -> bool:
    return bool(httpx.get(f"{url}/queue", timeout=10).json()["queue_running"])


def test_a_free_request_is_pending_until_the_running_prompt_ends(
    comfy_server: ComfyServer, tiny_workflow: dict[str, Any]
) -> None:
    url = comfy_server.url
    assert _pending(url) == []
    # A prompt long enough (a few seconds on CPU) to send /free while it runs.
    tiny_workflow["3"]["inputs"]["text"] += f" ({uuid.uuid4().hex})"
    tiny_workflow["8"]["inputs"].update(width=256, height=256, length=25)
    tiny_workflow["9"]["inputs"]["steps"] = 20
    with ComfyClient(url) as client:
        prompt_id = client.submit(tiny_workflow)
        deadline = time.monotonic() + 120
        while not _running(url):
            assert time.monotonic() < deadline, "the prompt never started"
            time.sleep(0.02)
        httpx.post(f"{url}/free", json={"free_memory": True, "unload_models": True}, timeout=10)
        assert _pending(url) == ["free_memory", "unload_models"]  # the worker is busy with the prompt

        defeat_cache(client, "cold")  # returns once the worker has applied both requests
        assert _pending(url) == []
        assert client.history_entry(prompt_id) is not None  # …which it did after the prompt ended
