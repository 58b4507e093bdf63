"""Telemetry records and Prometheus exposition, driven through a stand-in for ComfyUI's prompt queue."""

from __future__ import annotations

import logging
import sys
import types
from typing import Any, NamedTuple

import pytest
import torch
from leanvideo.metrics import PromptMetrics
from leanvideo.telemetry import Nvml, PromptRecord, Telemetry, outcome_of
from prometheus_client.parser import text_string_to_metric_families


class Status(NamedTuple):
    """Shaped like ``execution.PromptQueue.ExecutionStatus``."""

    status_str: str
    completed: bool
    messages: list[tuple[str, dict[str, Any]]]


class FakeQueue:
    """The two PromptQueue methods the worker calls, with the same signatures as the pinned ComfyUI."""

    def __init__(self, prompt_ids: list[str]) -> None:
        self.items = [((n, prompt_id, {}, {}, [], {}), n) for n, prompt_id in enumerate(prompt_ids)]
        self.done: list[Any] = []

    def get(self, timeout: float | None = None) -> Any:
        return self.items.pop(0) if self.items else None

    def task_done(
        self, item_id: int, history_result: dict[str, Any], status: Any, process_item: Any = None
    ) -> None:
        self.done.append(item_id)

    def get_tasks_remaining(self) -> int:
        return len(self.items)


def run_worker(queue: FakeQueue, statuses: list[Status]) -> None:
    """What ``main.prompt_worker`` does with each queue item."""
    for status in statuses:
        item_id = queue.get(timeout=1000.0)[1]
        queue.task_done(item_id, {"outputs": {}}, status=status, process_item=lambda p: p)
    assert queue.get(timeout=0.01) is None


ERROR = Status(
    "error", False, [("execution_start", {}), ("execution_error", {"exception_type": "RuntimeError"})]
)
SUCCESS = Status("success", True, [("execution_start", {}), ("execution_success", {})])


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry(max_records=2)


def test_records_are_captured_at_prompt_start_and_end(telemetry: Telemetry) -> None:
    queue = FakeQueue(["a", "b", "c"])
    telemetry.attach(queue)
    run_worker(queue, [SUCCESS, ERROR, SUCCESS])
    assert queue.done == [0, 1, 2]  # the originals still ran
    assert telemetry.record("a") is None  # only the newest max_records are kept
    failed = telemetry.record("b")
    assert failed is not None and failed["status"] == "error" and failed["error_type"] == "RuntimeError"
    record = telemetry.record("c")
    assert record is not None and record["status"] == "success"
    assert record["duration_s"] >= 0 and record["peak_rss_bytes"] >= record["rss_start_bytes"] > 0
    if not torch.cuda.is_available():
        assert record["cuda_max_allocated_bytes"] is None and "CUDA" in record["gpu_reason"]
    snap = telemetry.snapshot()
    assert snap["prompts"] == {"kept": 2, "running": None, "last": "c", "finished": 3, "errors": 1}
    assert snap["comfy"]["queue_depth"] == 0
    if not torch.cuda.is_available():
        assert snap["cuda"]["max_allocated_bytes"] is None and snap["cuda"]["reason"]
    assert snap["process"]["peak_rss_bytes"] >= snap["process"]["rss_bytes"] > 0


def test_events_attach_to_the_running_prompt_only(telemetry: Telemetry) -> None:
    telemetry.note_event("free_vram", {"unloaded": []})  # no prompt running: dropped
    telemetry.prompt_started("p")
    telemetry.note_event("free_vram", {"unloaded": ["LTXV"]})
    telemetry.prompt_finished("p", "success")
    record = telemetry.record("p")
    assert record is not None and [e["unloaded"] for e in record["events"]] == [["LTXV"]]


def test_attaching_twice_is_refused(telemetry: Telemetry) -> None:
    queue = FakeQueue([])
    telemetry.attach(queue)
    with pytest.raises(RuntimeError, match="already attached"):
        Telemetry().attach(queue)


def test_a_failing_telemetry_never_breaks_the_worker(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(prompt_id: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(telemetry, "prompt_started", broken)
    queue = FakeQueue(["x"])
    telemetry.attach(queue)
    run_worker(queue, [SUCCESS])
    assert queue.done == [0] and telemetry.record("x") is None


def test_outcome_of_status_messages() -> None:
    assert outcome_of(SUCCESS) == ("success", None)
    assert outcome_of(ERROR) == ("error", "RuntimeError")
    assert outcome_of(Status("error", False, [("execution_interrupted", {})])) == ("interrupted", None)
    assert outcome_of(None) == ("success", None)


@pytest.mark.parametrize(
    "reported",
    [
        "/srv/ComfyUI/custom_nodes/leanvideo.int8.spec.Int8FormatError",
        "/tmp/comfy/custom_nodes/leanvideo.custom_nodes.leanvideo.int8.spec.Int8FormatError",
        "leanvideo.int8.spec.Int8FormatError",
    ],
)
def test_a_packs_error_type_is_the_same_wherever_the_pack_is_installed(reported: str) -> None:
    """One error, one metrics label: ComfyUI names a pack's module by its path on disk."""
    status = Status("error", False, [("execution_error", {"exception_type": reported})])
    assert outcome_of(status) == ("error", "leanvideo.int8.spec.Int8FormatError")


def test_nvml_absent_gives_null_fields_with_a_reason() -> None:
    nvml = Nvml()
    if nvml.reason is None:
        pytest.skip("NVML is available here")
    assert nvml.memory_used() is None and nvml.energy_mj() is None


class FakeNvmlError(Exception):
    """Shaped like ``pynvml.NVMLError``: the NVML return code is ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_pynvml(energy_failure: Exception) -> types.ModuleType:
    """A ``pynvml`` whose energy counter raises ``energy_failure``."""

    def fail(handle: object) -> int:
        raise energy_failure

    module = types.ModuleType("pynvml")
    module.__dict__.update(
        NVMLError=FakeNvmlError,
        NVML_ERROR_NOT_SUPPORTED=3,
        NVML_ERROR_FUNCTION_NOT_FOUND=13,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: f"handle {index}",
        nvmlDeviceGetTotalEnergyConsumption=fail,
    )
    return module


@pytest.mark.parametrize("code", [3, 13])
def test_a_gpu_without_energy_counter_gives_none_quietly(
    code: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(FakeNvmlError(code)))
    with caplog.at_level(logging.ERROR, logger="leanvideo.telemetry"):
        assert Nvml().energy_mj() is None
    assert caplog.records == []


def test_other_nvml_energy_failures_are_logged_naming_the_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gpu_is_lost = 15
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(FakeNvmlError(gpu_is_lost)))
    nvml = Nvml()
    with caplog.at_level(logging.ERROR, logger="leanvideo.telemetry"):
        assert nvml.energy_mj() is None
    assert [r.getMessage() for r in caplog.records] == [
        f"NVML could not read the energy counter of GPU {nvml.gpu_index}: NVML error 15"
    ]


def test_energy_errors_that_are_not_nvml_errors_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(TypeError("bad handle")))
    with pytest.raises(TypeError, match="bad handle"):
        Nvml().energy_mj()


def test_metrics_parse_with_prometheus_own_parser(telemetry: Telemetry) -> None:
    metrics = PromptMetrics(telemetry)
    queue = FakeQueue(["a", "b"])
    telemetry.attach(queue)
    run_worker(queue, [SUCCESS, ERROR])
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    counts = {
        s.labels["status"]: s.value
        for s in families["leanvideo_prompt_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"success": 1.0, "error": 1.0}
    errors = [s for s in families["leanvideo_prompt_errors"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in errors] == [({"exception_type": "RuntimeError"}, 1.0)]
    assert families["leanvideo_process_rss_bytes"].samples[0].value > 0
    assert families["leanvideo_queue_depth"].samples[0].value == 0
    # absent without CUDA, not zero
    assert ("leanvideo_cuda_memory_allocated_bytes" in families) == torch.cuda.is_available()
    assert "leanvideo_prompt_energy_joules" not in families  # no prompt was measured: absent, not 0 J
    record = PromptRecord(prompt_id="c", status="success", started_at=0.0)
    record.energy_wh = 0.5
    metrics.observe(record)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render()[0].decode())}
    [energy] = [s for s in families["leanvideo_prompt_energy_joules"].samples if s.name.endswith("_total")]
    assert energy.value == 1800.0
