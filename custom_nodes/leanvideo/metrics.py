"""Prometheus exposition of the pack's telemetry (``GET /leanvideo/metrics``).

Everything lives in a ``CollectorRegistry`` of its own (never prometheus-client's global one), so two
servers in one process, or the tests, cannot collide. Prompt outcomes are pushed in by a
:class:`~leanvideo.telemetry.Telemetry` listener; live figures are read at scrape time by a collector.

==========================================  =========  ======================================
metric                                      type       source
==========================================  =========  ======================================
``leanvideo_prompt_duration_seconds``       histogram  each finished prompt, label ``status``
``leanvideo_prompts_total``                 counter    finished prompts, label ``status``
``leanvideo_prompt_errors_total``           counter    failed prompts, label ``exception_type``
``leanvideo_prompt_energy_joules_total``    counter    sum of per-prompt GPU energy (NVML only)
``leanvideo_queue_depth``                   gauge      queued + running prompts
``leanvideo_process_rss_bytes``             gauge      process RSS
``leanvideo_process_peak_rss_bytes``        gauge      peak RSS since the last reset
``leanvideo_cuda_memory_*_bytes``           gauge      allocated / reserved / max (CUDA only)
``leanvideo_gpu_memory_used_bytes``         gauge      NVML device memory used (NVML only)
``leanvideo_gpu_energy_joules_total``       counter    NVML total-energy counter (NVML only)
==========================================  =========  ======================================

GPU metrics are absent, not zero, where there is no CUDA or NVML.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .telemetry import PromptRecord, Telemetry

DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf"))


class _LiveCollector(Collector):
    """Reads the live figures from the telemetry object at each scrape."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def collect(self) -> Iterator[Metric]:
        snap = self.telemetry.snapshot()
        depth = snap["comfy"]["queue_depth"]
        if depth is not None:
            yield GaugeMetricFamily("leanvideo_queue_depth", "Prompts queued or running.", value=depth)
        process = snap["process"]
        yield GaugeMetricFamily("leanvideo_process_rss_bytes", "Process RSS.", value=process["rss_bytes"])
        yield GaugeMetricFamily(
            "leanvideo_process_peak_rss_bytes",
            "Peak process RSS since the last telemetry reset.",
            value=process["peak_rss_bytes"],
        )
        cuda = snap["cuda"]
        if cuda["available"]:
            for key in ("allocated", "reserved", "max_allocated", "max_reserved"):
                yield GaugeMetricFamily(
                    f"leanvideo_cuda_memory_{key}_bytes",
                    f"torch.cuda memory_{key} (max: since the last telemetry reset).",
                    value=cuda[f"{key}_bytes"],
                )
        nvml = snap["nvml"]
        if nvml["memory_used_bytes"] is not None:
            yield GaugeMetricFamily(
                "leanvideo_gpu_memory_used_bytes", "NVML device memory used.", value=nvml["memory_used_bytes"]
            )
        if nvml["energy_total_wh"] is not None:
            yield CounterMetricFamily(
                "leanvideo_gpu_energy_joules",
                "NVML total energy counter of the device.",
                value=nvml["energy_total_wh"] * 3600.0,
            )


class PromptMetrics:
    """The registry behind ``/leanvideo/metrics`` for one telemetry object.

    Example::

        metrics = PromptMetrics(telemetry)
        body, content_type = metrics.render()
    """

    def __init__(self, telemetry: Telemetry) -> None:
        self.registry = CollectorRegistry()
        self.duration = Histogram(
            "leanvideo_prompt_duration_seconds",
            "Wall time of each prompt, from the worker taking it to its history being written.",
            ["status"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.prompts = Counter("leanvideo_prompts", "Finished prompts.", ["status"], registry=self.registry)
        self.errors = Counter(
            "leanvideo_prompt_errors",
            "Failed prompts by exception type.",
            ["exception_type"],
            registry=self.registry,
        )
        self.energy: Counter | None = None  # made at the first measured prompt: absent without NVML
        self.registry.register(_LiveCollector(telemetry))
        telemetry.listeners.append(self.observe)

    def observe(self, record: PromptRecord) -> None:
        self.prompts.labels(record.status).inc()
        if record.duration_s is not None:
            self.duration.labels(record.status).observe(record.duration_s)
        if record.status == "error":
            self.errors.labels(record.error_type or "unknown").inc()
        if record.energy_wh is not None:
            if self.energy is None:
                self.energy = Counter(
                    "leanvideo_prompt_energy_joules",
                    "GPU energy used by prompts (NVML).",
                    registry=self.registry,
                )
            self.energy.inc(max(record.energy_wh * 3600.0, 0.0))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
