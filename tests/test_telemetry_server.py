"""The telemetry routes on the real pinned server: a prompt shows up in the records and the metrics."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runner.local.server import ComfyServer
from runner.tracking.prompt import run_prompt
from runner.transport.client import ComfyClient

pytestmark = pytest.mark.integration


def _prompt_counts(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/leanvideo/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["leanvideo_process_rss_bytes"].samples[0].value > 0
    assert "leanvideo_queue_depth" in families
    return {
        s.labels["status"]: s.value
        for s in families["leanvideo_prompt_duration_seconds"].samples
        if s.name.endswith("_count")
    }


def test_telemetry_reflects_a_prompt(comfy_server: ComfyServer, tiny_workflow: dict[str, Any]) -> None:
    url = comfy_server.url
    wrong_method = httpx.get(f"{url}/leanvideo/telemetry/reset")
    assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")
    idle = httpx.post(f"{url}/leanvideo/telemetry/reset").json()
    assert idle["schema"] == 1 and idle["prompts"]["running"] is None
    assert idle["process"]["rss_bytes"] > 0 and idle["process"]["peak_rss_bytes"] > 0
    assert idle["cuda"]["available"] or idle["cuda"]["reason"]
    before = _prompt_counts(url)

    tiny_workflow["3"]["inputs"]["text"] += f" ({uuid.uuid4().hex})"  # encode and sample again
    client = ComfyClient(url)
    try:
        result = run_prompt(client, tiny_workflow, timeout=300)
    finally:
        client.close()

    record = httpx.get(f"{url}/leanvideo/telemetry/prompts/{result.prompt_id}").json()
    print({k: record[k] for k in ("duration_s", "rss_start_bytes", "peak_rss_bytes", "rss_end_bytes")})
    assert record["status"] == "success" and record["duration_s"] > 0
    assert record["peak_rss_bytes"] > record["rss_start_bytes"]  # the prompt's peak is above idle
    if not idle["cuda"]["available"]:
        assert record["cuda_max_allocated_bytes"] is None and record["gpu_reason"]
    after = httpx.get(f"{url}/leanvideo/telemetry").json()
    assert after["prompts"]["finished"] == idle["prompts"]["finished"] + 1
    assert after["prompts"]["last"] == result.prompt_id
    assert after["process"]["peak_rss_bytes"] >= record["peak_rss_bytes"]
    assert _prompt_counts(url).get("success", 0) == before.get("success", 0) + 1
    listed = httpx.get(f"{url}/leanvideo/telemetry/prompts").json()["prompts"]
    assert result.prompt_id in [r["prompt_id"] for r in listed]


def test_unknown_prompt_is_a_404_naming_it(comfy_server: ComfyServer) -> None:
    answer = httpx.get(f"{comfy_server.url}/leanvideo/telemetry/prompts/no-such-prompt")
    assert answer.status_code == 404 and "'no-such-prompt'" in answer.json()["error"]
