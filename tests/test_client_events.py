"""The message → event table of runner.tracking.events, on scripted message streams (no server)."""

from __future__ import annotations

from typing import Any

import pytest

from runner.tracking.events import PromptTracker, class_type_of, phase_of, phase_seconds

WORKFLOW: dict[str, Any] = {
    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {}},
    "3": {"class_type": "CLIPTextEncode", "inputs": {}},
    "11": {"class_type": "SamplerCustom", "inputs": {}},
    "12": {"class_type": "VAEDecode", "inputs": {}},
    "14": {"class_type": "SaveVideo", "inputs": {}},
    "54:73": {"class_type": "KSampler", "inputs": {}},
}
PID = "p-1"


def feed(tracker: PromptTracker, script: list[tuple[float, str, dict[str, Any]]]) -> list[str]:
    kinds: list[str] = []
    for now, kind, data in script:
        kinds += [event.kind for event in tracker.handle({"type": kind, "data": data}, now)]
    return kinds


def test_a_full_stream_gives_node_step_and_server_window_timings() -> None:
    tracker = PromptTracker(PID, WORKFLOW)
    kinds = feed(
        tracker,
        [
            (0.0, "status", {"status": {}}),
            (0.1, "execution_start", {"prompt_id": PID, "timestamp": 10_000}),
            (0.1, "execution_cached", {"prompt_id": PID, "nodes": ["1", "3"]}),
            (0.2, "executing", {"prompt_id": PID, "node": "11"}),
            (0.5, "progress", {"prompt_id": PID, "node": "11", "value": 1, "max": 2}),
            (0.6, "progress", {"prompt_id": PID, "node": "11", "value": 2, "max": 2}),
            (0.7, "executing", {"prompt_id": PID, "node": "12"}),
            (1.0, "executing", {"prompt_id": PID, "node": "14"}),
            (1.2, "executed", {"prompt_id": PID, "node": "14", "output": {"images": []}}),
            (1.2, "execution_success", {"prompt_id": PID, "timestamp": 11_100}),
            (1.3, "executing", {"prompt_id": PID, "node": None}),
        ],
    )
    assert kinds == [
        "started",
        "cached",
        "cached",
        "node",
        "step",
        "step",
        "node",
        "node",
        "output",
        "success",
        "done",
    ]
    assert tracker.done and tracker.status == "success"
    assert tracker.server_seconds == 1.1
    by_id = {t.node_id: t for t in tracker.timings}
    assert by_id["1"].cached and by_id["3"].cached and by_id["1"].seconds == 0.0
    assert round(by_id["11"].seconds, 6) == 0.5 and by_id["11"].steps == 2
    assert [round(s, 6) for s in by_id["11"].step_seconds] == [0.3, 0.1]
    assert round(by_id["14"].seconds, 6) == 0.2  # until execution_success, not until done
    phases = phase_seconds(tracker.timings)
    assert phases["sampling"] == 0.5 and phases["vae_decode"] == 0.3 and phases["model_load"] == 0.0


def test_the_last_node_ends_when_the_server_says_the_prompt_did_not_when_the_news_arrives() -> None:
    """The end of a prompt can reach the client a second or more after the server finished (seen
    0.5–1.8 s): that time was the last node's, making node times add up to more than the server ran."""
    tracker = PromptTracker(PID, WORKFLOW)
    feed(
        tracker,
        [
            (0.1, "execution_start", {"prompt_id": PID, "timestamp": 10_000}),
            (0.2, "executing", {"prompt_id": PID, "node": "12"}),
            (1.0, "executing", {"prompt_id": PID, "node": "14"}),
            (2.9, "execution_success", {"prompt_id": PID, "timestamp": 11_100}),  # ended at 1.2 here
            (3.0, "executing", {"prompt_id": PID, "node": None}),
        ],
    )
    by_id = {t.node_id: t for t in tracker.timings}
    assert round(by_id["14"].seconds, 6) == 0.2 and round(by_id["12"].seconds, 6) == 0.8
    assert sum(t.seconds for t in tracker.timings) <= tracker.server_seconds
    # a reconnect after the end: ComfyUI tells the client the last node it ran, without a prompt id
    tracker.handle({"type": "executing", "data": {"node": "14"}}, 3.1)
    assert [t.node_id for t in tracker.timings] == ["12", "14"] and tracker.current_node is None
    # a server clock the client cannot map (no start timestamp) leaves the client's own times
    tracker = PromptTracker(PID, WORKFLOW)
    feed(
        tracker,
        [
            (0.2, "executing", {"prompt_id": PID, "node": "14"}),
            (2.9, "execution_success", {"prompt_id": PID, "timestamp": 11_100}),
            (3.0, "executing", {"prompt_id": PID, "node": None}),
        ],
    )
    assert round(tracker.timings[0].seconds, 6) == 2.7


def test_an_execution_error_keeps_node_id_class_and_message() -> None:
    tracker = PromptTracker(PID, WORKFLOW)
    error = {"prompt_id": PID, "node_id": "12", "node_type": "VAEDecode", "exception_type": "RuntimeError"}
    feed(
        tracker,
        [
            (0.0, "executing", {"prompt_id": PID, "node": "12"}),
            (0.4, "execution_error", {**error, "exception_message": " out of memory\n", "timestamp": 5}),
            (0.5, "executing", {"prompt_id": PID, "node": None}),
        ],
    )
    assert tracker.status == "error"
    assert tracker.error == {
        "node_id": "12",
        "class_type": "VAEDecode",
        "exception_type": "RuntimeError",
        "message": "out of memory",
    }
    assert [t.node_id for t in tracker.timings] == ["12"]


def test_history_fills_what_the_socket_missed() -> None:
    tracker = PromptTracker(PID, WORKFLOW)
    tracker.handle({"type": "executing", "data": {"prompt_id": PID, "node": "11"}}, 1.0)
    entry = {
        "outputs": {},
        "status": {
            "status_str": "error",
            "messages": [
                ["execution_start", {"prompt_id": PID, "timestamp": 1000}],
                ["execution_cached", {"prompt_id": PID, "nodes": ["1"], "timestamp": 1001}],
                ["execution_interrupted", {"prompt_id": PID, "node_id": "11", "timestamp": 3000}],
            ],
        },
    }
    tracker.apply_history(entry)
    assert tracker.done and tracker.status == "interrupted" and tracker.server_seconds == 2.0
    # the node the interrupt cut short is kept (a partial record showed no sign of the sampler)
    assert [(t.node_id, t.cached) for t in tracker.timings] == [("1", True), ("11", False)]
    assert tracker.error == {  # the node the interrupt stopped, for the run record
        "node_id": "11",
        "class_type": "SamplerCustom",  # from the workflow: the history message has no node_type
        "exception_type": None,
        "message": "interrupted on the server while node 11 (SamplerCustom) was running",
    }


def test_an_interrupt_names_the_node_it_stopped() -> None:
    tracker = PromptTracker(PID, WORKFLOW)
    tracker.handle({"type": "executing", "data": {"prompt_id": PID, "node": "11"}}, 1.0)
    data = {"prompt_id": PID, "node_id": "11", "node_type": "SamplerCustom", "timestamp": 3000}
    tracker.handle({"type": "execution_interrupted", "data": data}, 2.0)
    assert tracker.status == "interrupted" and tracker.error is not None
    assert (tracker.error["node_id"], tracker.error["class_type"]) == ("11", "SamplerCustom")
    assert tracker.error["message"] == "interrupted on the server while node 11 (SamplerCustom) was running"


def test_node_ids_of_expansions_and_subgraphs_resolve_to_their_class() -> None:
    assert class_type_of(WORKFLOW, "11.0.0.5") == "SamplerCustom"
    assert class_type_of(WORKFLOW, "54:73") == "KSampler"
    assert class_type_of(WORKFLOW, "99") == "?"
    assert [
        phase_of(c) for c in ("KSamplerSelect", "KSampler", "UNETLoader", "SaveWEBM", "CLIPTextEncode")
    ] == [
        "other",
        "sampling",
        "model_load",
        "save",
        "text_encode",
    ]


def test_ksampler_nodes_are_timed_as_sampling_but_ksampler_select_is_not() -> None:
    workflow = {
        "5": {"class_type": "KSamplerSelect", "inputs": {}},
        "6": {"class_type": "KSamplerAdvanced", "inputs": {}},
        "54:73": {"class_type": "KSampler", "inputs": {}},
    }
    tracker = PromptTracker(PID, workflow)
    feed(
        tracker,
        [
            (0.0, "executing", {"prompt_id": PID, "node": "5"}),
            (0.1, "executing", {"prompt_id": PID, "node": "54:73"}),
            (1.1, "executing", {"prompt_id": PID, "node": "6"}),
            (1.6, "executing", {"prompt_id": PID, "node": None}),
        ],
    )
    assert phase_of("KSampler") == "sampling"
    phases = phase_seconds(tracker.timings)
    assert phases["sampling"] == 1.5 and phases["other"] == 0.1


def test_a_start_heard_late_does_not_make_queue_and_execution_outlast_the_wall_time() -> None:
    """The socket delivered ``execution_start`` 0.5 s late (a busy machine): the server executed for 0.8
    s of a 1.0 s wall, so the prompt waited 0.2 s at most, not 0.7 s."""
    from runner.tracking.result import PromptResult

    late = PromptResult("p", "success", 100.0, 100.7, 101.0, server_seconds=0.8)
    assert late.queue_seconds == pytest.approx(0.2)
    assert late.queue_seconds + 0.8 <= late.wall_seconds + 1e-9
    heard_in_time = PromptResult("p", "success", 100.0, 100.1, 101.0, server_seconds=0.8)
    assert heard_in_time.queue_seconds == pytest.approx(0.1)  # the client's own figure when it fits
    skewed = PromptResult("p", "success", 100.0, 100.1, 101.0, server_seconds=1.2)  # another clock
    assert skewed.queue_seconds == 0.0
    never_ran = PromptResult("p", "error", 100.0, None, 101.0)
    assert never_ran.queue_seconds == pytest.approx(1.0)


def test_a_failure_names_the_exception_without_the_servers_package_path() -> None:
    from runner.tracking.result import PromptResult, describe_failure

    result = PromptResult(prompt_id="p", status="error", submitted_at=0.0, started_at=0.1, finished_at=1.0)
    result.error = {
        "node_id": "1",
        "class_type": "LeanVideoCheckpointLoaderINT8",
        "exception_type": "/srv/ComfyUI/custom_nodes/leanvideo.int8.spec.Int8FormatError",
        "message": "evil.ckpt: pickle checkpoints (.ckpt) are refused",
    }
    assert describe_failure(result) == (
        "prompt p failed in node 1 (LeanVideoCheckpointLoaderINT8): leanvideo.int8.spec.Int8FormatError: "
        "evil.ckpt: pickle checkpoints (.ckpt) are refused"
    )


def test_every_loader_is_model_loading_even_a_text_encoder_loader() -> None:
    loaders = (
        "LeanVideoTextEncoderLoaderINT8",
        "CLIPLoader",
        "DualCLIPLoader",
        "LeanVideoCheckpointLoaderINT8",
    )
    assert {phase_of(c) for c in loaders} == {"model_load"}
    assert phase_of("CLIPTextEncodeFlux") == "text_encode"


def test_the_failure_message_of_an_interrupted_prompt_names_the_node() -> None:
    from runner.tracking.result import PromptResult, describe_failure

    error = {
        "node_id": "11",
        "message": "interrupted on the server while node 11 (SamplerCustom) was running",
    }
    result = PromptResult(PID, "interrupted", 0.0, 0.0, 1.0, error=error)
    assert describe_failure(result) == (
        f"prompt {PID} was interrupted on the server while node 11 (SamplerCustom) was running"
    )
    assert (
        describe_failure(PromptResult(PID, "interrupted", 0.0, 0.0, 1.0)) == f"prompt {PID} was interrupted"
    )


def test_a_report_sent_again_after_its_node_ran_replaces_the_one_the_history_keeps() -> None:
    """An INT8 loader's report lists kernels as the sampler chooses them, sent as ``leanvideo.report``
    (to the submitting client, no prompt id) after the loader ran; ``/history`` keeps the first one, so
    run.json said "3 weight shape(s) not run yet" of kernels long chosen."""
    tracker = PromptTracker(PID, WORKFLOW)
    first = {"text": ["INT8 kernels: auto\n  3 weight shape(s) not run yet"], "leanvideo_report": ["t-1"]}
    later = ["INT8 kernels: auto\n  768x768 rows<=128 float32 row → onednn (measured)"]
    kinds = feed(
        tracker,
        [
            (0.1, "execution_start", {"prompt_id": PID, "timestamp": 10_000}),
            (0.2, "executing", {"prompt_id": PID, "node": "1"}),
            (0.3, "executed", {"prompt_id": PID, "node": "1", "output": first}),
            (0.4, "executing", {"prompt_id": PID, "node": "11"}),
            (0.5, "leanvideo.report", {"token": "t-1", "text": later}),
            (0.6, "leanvideo.report", {"token": "t-9", "text": ["another run's"]}),
            (0.7, "leanvideo.report", {"token": 3, "text": "junk"}),
        ],
    )
    assert kinds == ["started", "node", "output", "node"]
    history = {"1": dict(first), "14": {"images": []}}
    latest = tracker.with_latest_reports(history)
    assert latest == {"1": {"text": later, "leanvideo_report": ["t-1"]}, "14": {"images": []}}
    assert history["1"] == first  # the history entry itself is left as it came
    assert tracker.with_latest_reports(tracker.ui_outputs)["1"]["text"] == later
