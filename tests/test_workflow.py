"""--set overrides and validation against an /object_info excerpt (no server)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from runner.errors import WorkflowError
from runner.graph.validate import find_cycles, validate_workflow
from runner.graph.workflow import apply_overrides, find_seeds, load_workflow, parse_override

OBJECT_INFO: dict[str, Any] = {
    "CheckpointLoaderSimple": {
        "input": {"required": {"ckpt_name": [["ltxv-tiny.safetensors"], {}]}},
        "output": ["MODEL", "CLIP", "VAE"],
    },
    "CLIPTextEncode": {
        "input": {"required": {"text": ["STRING", {"multiline": True}], "clip": ["CLIP", {}]}},
        "output": ["CONDITIONING"],
    },
    "KSampler": {
        "input": {
            "required": {
                "model": ["MODEL", {}],
                "seed": ["INT", {"min": 0, "max": 2**64 - 1}],
                "steps": ["INT", {"min": 1, "max": 10000}],
                "cfg": ["FLOAT", {"min": 0.0, "max": 100.0}],
                "positive": ["CONDITIONING", {}],
                "sampler_name": ["COMBO", {"options": ["euler", "dpmpp_2m"]}],
            },
            "optional": {"add_noise": ["BOOLEAN", {}]},
        },
        "output": ["LATENT"],
    },
    "SaveLatent": {
        "input": {"required": {"samples": ["LATENT", {}], "filename_prefix": ["STRING", {}]}},
        "output": [],
        "output_node": True,
    },
}
WORKFLOW: dict[str, Any] = {
    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "ltxv-tiny.safetensors"}},
    "3": {
        "class_type": "CLIPTextEncode",
        "inputs": {"text": "a fox", "clip": ["1", 1]},
        "_meta": {"title": "Positive"},
    },
    "4": {
        "class_type": "CLIPTextEncode",
        "inputs": {"text": "blur", "clip": ["1", 1]},
        "_meta": {"title": "Negative"},
    },
    "5": {
        "class_type": "KSampler",
        "inputs": {
            "model": ["1", 0],
            "seed": 1,
            "steps": 8,
            "cfg": 3.0,
            "positive": ["3", 0],
            "sampler_name": "euler",
        },
        "_meta": {"title": "Sample"},
    },
    "6": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": "fox"}},
}


@pytest.fixture
def workflow() -> dict[str, Any]:
    return copy.deepcopy(WORKFLOW)


def test_overrides_by_id_title_and_unique_class_are_typed(workflow: dict[str, Any]) -> None:
    applied = apply_overrides(
        workflow,
        [
            "KSampler.seed=42",
            "5.steps=4",
            "Sample.cfg=2",
            "Positive.text=123",
            "Sample.add_noise=false",
            "KSampler.sampler_name=dpmpp_2m",
        ],
        OBJECT_INFO,
    )
    inputs = workflow["5"]["inputs"]
    assert (inputs["seed"], inputs["steps"], inputs["cfg"], inputs["add_noise"]) == (42, 4, 2.0, False)
    assert isinstance(inputs["cfg"], float) and inputs["sampler_name"] == "dpmpp_2m"
    assert workflow["3"]["inputs"]["text"] == "123"
    assert [(o.node_id, o.input_name, o.previous) for o in applied[:2]] == [
        ("5", "seed", 1),
        ("5", "steps", 8),
    ]
    assert find_seeds(workflow) == {"5.seed": 42}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("CLIPTextEncode.text=x", r"several nodes \(3, 4\)"),
        ("KSamplr.seed=1", "close matches: KSampler"),
        ("Sample.sed=1", "has no input 'sed'; close inputs: seed"),
        ("Sample.steps=0", "below the minimum 1"),
        ("Sample.steps=2.5", "expects an integer"),
        ("Sample.cfg=abc", "expects a finite number"),
        ("Sample.cfg=NaN", "expects a finite number, got 'NaN'"),
        ("Sample.cfg=Infinity", "expects a finite number"),
        ("Sample.add_noise=1", "expects true or false"),
        ("Sample.sampler_name=eulr", "not one of the choices; close matches: euler"),
        ("Sample.model=3", "takes its MODEL from a link"),
        ("Sample.seed", "expected NODE.input=VALUE"),
        ("seed=3", "expected NODE.input=VALUE"),
        ("99.steps=3", r"^--set '99.steps=3': no node '99' in the workflow"),
        ("Sample.seed=true", r"expects an integer, got true$"),  # said as JSON, as it was typed
        ("Sample.steps=1e400", r"expects an integer, got Infinity$"),
        ("Sample.sampler_name=null", r": null is not one of the choices"),
    ],
)
def test_bad_overrides_are_rejected_with_what_is_wrong(
    workflow: dict[str, Any], spec: str, message: str
) -> None:
    with pytest.raises(WorkflowError, match=message):
        apply_overrides(workflow, [spec], OBJECT_INFO)


def test_parse_override_keeps_dots_in_node_ids_and_equals_in_values() -> None:
    assert parse_override("406.0.0.428.text=a=b") == ("406.0.0.428", "text", "a=b")
    assert parse_override("Load Checkpoint (v1.5).ckpt_name=x.safetensors") == (
        "Load Checkpoint (v1.5)",
        "ckpt_name",
        "x.safetensors",
    )


def test_a_text_linked_into_a_dropdown_is_refused_as_the_server_refuses_it(workflow: dict[str, Any]) -> None:
    """A dropdown (a list of choices, or COMBO) takes no STRING output: the server answers
    return_type_mismatch, so validate says it first; an any-type output (*) still feeds anything."""
    info = OBJECT_INFO | {
        "PrimitiveString": {"input": {"required": {"value": ["STRING", {}]}}, "output": ["STRING"]},
        "AnySwitch": {"input": {"required": {"value": ["*", {}]}}, "output": ["*"]},
    }
    workflow["30"] = {"class_type": "PrimitiveString", "inputs": {"value": "ltxv-tiny.safetensors"}}
    workflow["31"] = {"class_type": "PrimitiveString", "inputs": {"value": "euler"}}
    workflow["1"]["inputs"]["ckpt_name"] = ["30", 0]
    workflow["5"]["inputs"]["sampler_name"] = ["31", 0]
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert problems == {
        ("1", "ckpt_name"): "expects a dropdown of 1 choice(s) but node 30 output 0 is STRING",
        ("5", "sampler_name"): "expects COMBO but node 31 output 0 is STRING",
    }
    workflow["32"] = {"class_type": "AnySwitch", "inputs": {"value": ["30", 0]}}
    workflow["1"]["inputs"]["ckpt_name"] = workflow["5"]["inputs"]["sampler_name"] = ["32", 0]
    assert validate_workflow(workflow, info) == []


def test_validate_names_the_node_of_every_problem(workflow: dict[str, Any]) -> None:
    workflow["1"]["inputs"]["ckpt_name"] = "missing-model.safetensors"
    workflow["4"]["class_type"] = "CLIPTextEncod"
    del workflow["5"]["inputs"]["steps"]
    workflow["5"]["inputs"]["positive"] = ["1", 0]
    workflow["5"]["inputs"]["model"] = ["9", 0]
    workflow["5"]["inputs"]["cfg"] = 500.0
    workflow["5"]["inputs"]["denoise"] = 1.0
    problems = {
        (p.node_id, p.input_name, p.kind): p.message for p in validate_workflow(workflow, OBJECT_INFO)
    }
    assert "model file 'missing-model.safetensors' does not exist" in problems[("1", "ckpt_name", "error")]
    assert "unknown node type; close matches: CLIPTextEncode" in problems[("4", None, "error")]
    assert problems[("5", "steps", "error")] == "required input is missing"
    assert "expects CONDITIONING but node 1 output 0 is MODEL" in problems[("5", "positive", "error")]
    assert "node 9, which is not in the workflow" in problems[("5", "model", "error")]
    assert "above the maximum 100.0" in problems[("5", "cfg", "error")]
    assert ("5", "denoise", "warning") in problems
    workflow["5"]["inputs"]["cfg_scale"] = 7  # the closest inputs named (it said "ignored" alone)
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, OBJECT_INFO)}
    assert problems[("5", "cfg_scale")] == "not an input of this node; ignored; close inputs: cfg"
    assert validate_workflow(copy.deepcopy(WORKFLOW), OBJECT_INFO) == []


def test_an_unknown_node_lists_titles_and_classes_nearest_first(workflow: dict[str, Any]) -> None:
    with pytest.raises(
        WorkflowError, match=r"no node 'Zebra' in the workflow; its nodes' titles and classes: "
    ):
        apply_overrides(workflow, ["Zebra.seed=1"], OBJECT_INFO)
    with pytest.raises(WorkflowError, match=r"close matches: KSampler\b"):  # the nearest first
        apply_overrides(workflow, ["KSamplr.seed=1"], OBJECT_INFO)


def test_file_suggestions_ignore_the_extension_and_fixture_nodes_name_the_flag(
    workflow: dict[str, Any],
) -> None:
    """Every ``.safetensors`` name shares 12 characters: alike only in that, a file is no close match."""
    info = copy.deepcopy(OBJECT_INFO)
    info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] = [
        "clip_l.safetensors",
        "ltxv-tiny.safetensors",
    ]
    workflow["1"]["inputs"]["ckpt_name"] = "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
    workflow["4"]["class_type"] = "LeanVideoFixtureAttentionMask"
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert problems[("1", "ckpt_name")].endswith(
        "does not exist on the server; the server has: clip_l.safetensors, ltxv-tiny.safetensors"
    )
    assert "leanvideo serve --fixture-nodes" in problems[("4", None)]
    assert "a bench's own servers: fixtures = true in its matrix's [bench]" in problems[("4", None)]
    workflow["1"]["inputs"]["ckpt_name"] = "LTXV-Tiny.SAFETENSORS"  # another case: the likeliest mistake
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert problems[("1", "ckpt_name")].endswith("; close matches: ltxv-tiny.safetensors")
    # a node of the pack on a server that has none of the pack's nodes: the pack is not loaded there
    workflow["4"]["class_type"] = "LeanVideoCheckpointLoaderINT8"
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert (
        "a LeanVideo node and the server has none of them: the node pack is not installed"
        in problems[("4", None)]
    )
    info["LeanVideoFixtureAttentionMask"] = {"input": {}}  # the tiny models' helper is no pack node
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert "the node pack is not installed" in problems[("4", None)]
    info["LeanVideoFreeVRAM"] = {"input": {}, "output_node": True}  # the pack is there: a plain typo
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert "the node pack is not installed" not in problems[("4", None)]
    del info["LeanVideoFreeVRAM"]
    workflow["4"]["class_type"] = "CLIPTextEncode"
    workflow["1"]["inputs"]["ckpt_name"] = "ltxv-tiny.sft"
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert problems[("1", "ckpt_name")].endswith("close matches: ltxv-tiny.safetensors")
    # VAELoader's choices on a server with no VAE file: its built-in entry is no file to list
    info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] = ["pixel_space"]
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, info)}
    assert problems[("1", "ckpt_name")].endswith(
        "does not exist on the server; the server has no model file for this input"
    )


def test_load_workflow_rejects_editor_format_with_a_hint(tmp_path: Path) -> None:
    ui = tmp_path / "ui.json"
    ui.write_text(json.dumps({"nodes": [], "links": [], "version": 0.4}))
    with pytest.raises(WorkflowError, match=r"editor \(UI\) workflow"):
        load_workflow(ui)


def test_load_workflow_mentions_the_convert_command(tmp_path: Path) -> None:
    ui = tmp_path / "ui.json"
    ui.write_text(json.dumps({"nodes": [], "links": []}))
    with pytest.raises(WorkflowError, match="leanvideo workflow convert"):
        load_workflow(ui)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is a folder, not a file"),
        ("{}".encode("utf-16"), r"is not UTF-8 text \(byte 0\)"),
        (b'{"1": {"class_type": "KSampler", "inputs": {"cfg": NaN}}}', "NaN is not a JSON number"),
        (
            b'{"1": {"class_type": "KSampler", "inputs": {"cfg": -Infinity}}}',
            "-Infinity is not a JSON number",
        ),
        (b"{", "is not valid JSON"),
        (b'{"1": {"class_type": "KSampler", "inputs": {"seed": ' + b"9" * 5000 + b"}}}", "over 4300 digits"),
    ],
)
def test_unreadable_workflow_files_are_named(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "wf.json"
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(WorkflowError, match=message) as caught:
        load_workflow(path)
    assert str(path) in str(caught.value)


def test_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(WORKFLOW).encode())
    assert load_workflow(path) == WORKFLOW


def test_numeric_strings_validate_as_comfyui_converts_them(workflow: dict[str, Any]) -> None:
    workflow["5"]["inputs"].update(steps="4", cfg=" 3.5")
    assert validate_workflow(workflow, OBJECT_INFO) == []
    workflow["5"]["inputs"]["steps"] = "3.5"  # int("3.5") fails on the server too
    problems = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, OBJECT_INFO)}
    assert problems == {("5", "steps"): "expects an integer, got '3.5'"}


def test_a_workflow_without_an_output_node_is_invalid(workflow: dict[str, Any]) -> None:
    del workflow["6"]
    (problem,) = validate_workflow(workflow, OBJECT_INFO)
    assert problem.kind == "error" and str(problem).startswith("no output node")
    assert [str(p) for p in validate_workflow({}, OBJECT_INFO)] == [str(problem)]
    workflow["4"]["class_type"] = "Unknown"  # an unknown node may be an output: said as unknown only
    assert [p.node_id for p in validate_workflow(workflow, OBJECT_INFO)] == ["4"]


@pytest.mark.parametrize("typed", ["1e5", "1.50", '{"b":2,  "a":1}', "null", "[1]", '"quoted"', "007"])
def test_a_text_input_takes_the_value_exactly_as_typed(workflow: dict[str, Any], typed: str) -> None:
    apply_overrides(workflow, [f"Positive.text={typed}", f"6.filename_prefix={typed}"], OBJECT_INFO)
    assert workflow["3"]["inputs"]["text"] == typed
    assert workflow["6"]["inputs"]["filename_prefix"] == typed


@pytest.mark.parametrize(
    ("choices", "typed", "expected"),
    [(["1.5", "1.50"], "1.50", "1.50"), (["1.5", "1.50"], "1.5", "1.5"), (["true", "x"], "true", "true"),
     (["007.safetensors", "7"], "7", "7"), ([8, 16], "16", 16)],
)  # fmt: skip
def test_a_choice_is_taken_as_typed_where_the_server_spells_it_so(
    workflow: dict[str, Any], choices: list[Any], typed: str, expected: Any
) -> None:
    info = copy.deepcopy(OBJECT_INFO)
    info["KSampler"]["input"]["required"]["sampler_name"] = ["COMBO", {"options": choices}]
    apply_overrides(workflow, [f"Sample.sampler_name={typed}"], info)
    assert workflow["5"]["inputs"]["sampler_name"] == expected
    assert type(workflow["5"]["inputs"]["sampler_name"]) is type(expected)


def test_a_text_input_of_a_node_the_server_does_not_describe_stays_text(workflow: dict[str, Any]) -> None:
    apply_overrides(workflow, ["Positive.text=1.50", "Sample.steps=4"], {})
    assert workflow["3"]["inputs"]["text"] == "1.50"
    assert workflow["5"]["inputs"]["steps"] == 4


def test_a_key_given_twice_in_a_workflow_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.json"
    path.write_text('{"1": {"class_type": "A", "inputs": {}}, "1": {"class_type": "B", "inputs": {}}}')
    with pytest.raises(WorkflowError, match=r"twice\.json: key '1' appears twice in one object"):
        load_workflow(path)


def test_a_workflow_file_nested_too_deeply_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(WorkflowError, match=r"deep\.json is not a workflow: its JSON is nested too deeply"):
        load_workflow(path)


def test_a_list_that_is_no_link_is_a_problem(workflow: dict[str, Any]) -> None:
    workflow["3"]["inputs"]["text"] = [[[[1]]]]
    workflow["5"]["inputs"]["seed"] = [5, 0]  # a node id must be a string
    found = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, OBJECT_INFO)}
    said = '[[[[1]]]] is neither a value nor a link ["node id", output index]'
    assert found[("3", "text")].startswith(said)
    workflow["3"]["inputs"]["text"] = {"__value__": "a fox"}  # a value as the editor wraps lists
    assert ("3", "text") not in {(p.node_id, p.input_name) for p in validate_workflow(workflow, OBJECT_INFO)}
    assert found[("5", "seed")].startswith("[5, 0] is neither a value nor a link")


def test_dependency_cycles_are_named_node_by_node(workflow: dict[str, Any]) -> None:
    assert find_cycles(workflow) == []
    workflow["3"]["inputs"]["clip"] = ["5", 0]  # 3 waits on 5, which waits on 3 (positive)
    workflow["4"]["inputs"]["clip"] = ["4", 0]  # 4 waits on itself
    cycles = sorted(find_cycles(workflow))
    assert cycles == [["3", "5", "3"], ["4", "4"]]
    messages = [
        str(p) for p in validate_workflow(workflow, OBJECT_INFO) if p.message.startswith("dependency")
    ]
    assert sorted(messages) == [
        "dependency cycle: node 3 (CLIPTextEncode) → 5 (KSampler) → 3 (each takes an input from the next, so "
        "none can run first): remove one of these links",
        "dependency cycle: node 4 (CLIPTextEncode) → 4 (each takes an input from the next, so none can run "
        "first): remove one of these links",
    ]


def test_a_long_chain_is_walked_without_recursion() -> None:
    chain = {str(i): {"class_type": "X", "inputs": {"a": [str(i - 1), 0]} if i else {}} for i in range(5000)}
    assert find_cycles(chain) == []
    chain["0"]["inputs"] = {"a": ["4999", 0]}
    (cycle,) = find_cycles(chain)
    assert len(cycle) == 5001 and cycle[0] == cycle[-1]


@pytest.mark.parametrize(
    ("node", "said"),
    [
        (
            {"class_type": "KSampler", "inputs": "oops"},
            r'node 5 \(KSampler\): inputs must be an object .* not "oops"',
        ),
        ({"class_type": "KSampler", "inputs": None}, r"node 5 \(KSampler\): inputs must be an object"),
        ({"class_type": 5, "inputs": {}}, r"node 5: class_type 5 is not a node type name"),
        ({"class_type": "", "inputs": {}}, r'node 5: class_type "" is not a node type name'),
        ({"inputs": {}}, r"node 5 has no class_type \(API format is node id -> \{class_type, inputs\}\)"),
        (None, r"node 5 is null, not a node \(API format"),
        ("KSampler", r'node 5 is a text \("KSampler"\), not a node'),
    ],
)
def test_a_malformed_api_node_is_named(tmp_path: Path, node: Any, said: str) -> None:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps({**WORKFLOW, "5": node}), encoding="utf-8")
    with pytest.raises(WorkflowError, match=f"workflow file {path}: {said}"):
        load_workflow(path)


def test_validate_reports_inputs_that_are_no_object_given_in_memory(workflow: dict[str, Any]) -> None:
    workflow["5"]["inputs"] = ["model"]
    found = {(p.node_id, p.input_name): p.message for p in validate_workflow(workflow, OBJECT_INFO)}
    assert found[("5", None)].startswith("inputs must be an object")


@pytest.mark.parametrize(
    ("typed", "seed"),
    [("12345678901234567.0", 12345678901234567), ("1.2345678901234567e16", 12345678901234567), ("7.0", 7)],
)
def test_an_integer_typed_with_a_decimal_point_keeps_every_digit(
    workflow: dict[str, Any], typed: str, seed: int
) -> None:
    """JSON reads 12345678901234567.0 as the float 12345678901234568.0: the seed run was not the one
    typed. The typed text is read exactly."""
    apply_overrides(workflow, [f"Sample.seed={typed}"], OBJECT_INFO)
    assert workflow["5"]["inputs"]["seed"] == seed


def test_a_float_seed_in_a_file_past_exact_integers_is_refused_naming_the_value_run(
    workflow: dict[str, Any],
) -> None:
    workflow["5"]["inputs"]["seed"] = 12345678901234567.0  # as json.loads reads it from a file
    (problem,) = [p for p in validate_workflow(workflow, OBJECT_INFO) if p.kind == "error"]
    assert problem.input_name == "seed"
    assert "read as the nearest float, 12345678901234568; write the integer digits alone" in problem.message
    workflow["5"]["inputs"]["seed"] = 2.0**53  # still exact: taken, as the server takes it
    assert not [p for p in validate_workflow(workflow, OBJECT_INFO) if p.kind == "error"]


@pytest.mark.parametrize("prefix", ["../../escape", "/tmp/fox", "a/../../b"])
def test_a_filename_prefix_outside_the_output_folder_is_refused_as_the_server_would(
    workflow: dict[str, Any], prefix: str
) -> None:
    workflow["6"]["inputs"]["filename_prefix"] = prefix
    (problem,) = validate_workflow(workflow, OBJECT_INFO)
    assert (problem.node_id, problem.input_name, problem.kind) == ("6", "filename_prefix", "error")
    assert problem.message.startswith(f"{prefix!r} saves outside the server's output folder")


@pytest.mark.parametrize("prefix", ["fox", "video/fox", "a/../b", "%year%-%month%/fox", ".."])
def test_a_filename_prefix_inside_the_output_folder_passes(workflow: dict[str, Any], prefix: str) -> None:
    workflow["6"]["inputs"]["filename_prefix"] = prefix
    assert validate_workflow(workflow, OBJECT_INFO) == []


def test_values_of_the_editors_own_widgets_pass_as_the_server_takes_them() -> None:
    """Record Audio, Webcam Capture and Load 3D take a value the editor's extensions draw (a recording, a
    frame, a scene): never a link, so a value there is no mistake; a MODEL value still is."""
    object_info: dict[str, Any] = {
        "RecordAudio": {"input": {"required": {"audio": ["AUDIO_RECORD", {}]}}, "output": ["AUDIO"]},
        "WebcamCapture": {
            "input": {"required": {"image": ["WEBCAM", {}], "width": ["INT", {"min": 0}]}},
            "output": ["IMAGE"],
        },
        "Load3D": {"input": {"required": {"image": ["LOAD_3D", {}]}}, "output": ["IMAGE"]},
        "Merge": {
            "input": {"required": {"audio": ["AUDIO", {}], "a": ["IMAGE", {}], "b": ["IMAGE", {}]}},
            "output": [],
            "output_node": True,
        },
    }
    workflow: dict[str, Any] = {
        "1": {"class_type": "RecordAudio", "inputs": {"audio": "rec.wav"}},
        "2": {"class_type": "WebcamCapture", "inputs": {"image": "webcam/f.png [temp]", "width": 0}},
        "3": {"class_type": "Load3D", "inputs": {"image": {"image": "3d/x.png", "mask": "3d/m.png"}}},
        "4": {"class_type": "Merge", "inputs": {"audio": ["1", 0], "a": ["2", 0], "b": ["3", 0]}},
    }
    assert validate_workflow(workflow, object_info) == []
    assert apply_overrides(workflow, ["1.audio=take2.wav"], object_info)[0].value == "take2.wav"
    workflow["4"]["inputs"]["a"] = "frame.png"
    problems = validate_workflow(workflow, object_info)
    assert [(p.node_id, p.input_name) for p in problems] == [("4", "a")]
    assert "takes its IMAGE from a link, not a value" in problems[0].message


def test_the_editors_own_widget_inputs_are_not_warned_about() -> None:
    """The editor submits ``audioUI: ""`` for Load Audio (and convert writes it too): the server ignores
    it, and so does validation; an input no one declares is still a warning."""
    object_info: dict[str, Any] = {
        "LoadAudio": {"input": {"required": {"audio": [["a.wav"], {}]}}, "output": ["AUDIO"]},
        "PreviewAudio": {
            "input": {"required": {"audio": ["AUDIO", {}]}},
            "output": [],
            "output_node": True,
        },
    }
    workflow: dict[str, Any] = {
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "a.wav", "audioUI": ""}},
        "2": {"class_type": "PreviewAudio", "inputs": {"audio": ["1", 0], "audioUI": ""}},
    }
    assert validate_workflow(workflow, object_info) == []
    # the editor's video preview, on any node that showed a video (exported after a run)
    workflow["2"]["inputs"]["video-preview"] = ""
    assert validate_workflow(workflow, object_info) == []
    workflow["1"]["inputs"]["preview"] = ""
    assert [(p.node_id, p.input_name, p.kind) for p in validate_workflow(workflow, object_info)] == [
        ("1", "preview", "warning")
    ]


def test_an_image_not_in_the_input_folder_names_where_a_leanvideo_server_reads_it() -> None:
    """A server that `leanvideo serve` started reads images from its own folder, not from the input/
    of the ComfyUI it runs (a user's own ComfyUI included), which was all the message named."""
    object_info = {
        "LoadImage": {"input": {"required": {"image": [[], {"image_upload": True}]}}, "output": ["IMAGE"]},
        "PreviewImage": {"input": {"required": {"images": ["IMAGE"]}}, "output_node": True},
    }
    workflow = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "start.png"}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    [problem] = validate_workflow(workflow, object_info)
    assert str(problem).startswith(
        "node 1 (LoadImage) input 'image': file 'start.png' does not exist in the server's input folder"
    )
    assert "a server leanvideo started has its own, .workspace/servers/<port>/base/input/" in str(problem)


def test_a_png_comfyui_saved_gives_its_workflow_and_standard_input_is_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ComfyUI's SaveImage writes them (PIL text chunks; iTXt for text beyond Latin-1): the API
    workflow that ran, else the editor's graph. A PNG was "not UTF-8 text (byte 0)"."""
    import io
    import sys

    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from runner.graph.workflow_file import read_json_file

    ran = {"1": {"class_type": "CLIPTextEncode", "inputs": {"text": "一只狐狸 🦊"}}}
    graph = {"nodes": [], "links": []}
    for keys, expected in ((("prompt", "workflow"), ran), (("workflow",), graph)):
        info = PngInfo()
        for key in keys:
            info.add_text(key, json.dumps(ran if key == "prompt" else graph), zip=key == "workflow")
        path = tmp_path / f"{'-'.join(keys)}.png"
        Image.new("RGB", (4, 4)).save(path, pnginfo=info)
        assert read_json_file(path) == expected
    Image.new("RGB", (4, 4)).save(tmp_path / "plain.png")
    with pytest.raises(WorkflowError, match=r"plain.png is a PNG image with no ComfyUI workflow in it"):
        read_json_file(tmp_path / "plain.png")
    # a broken text chunk of another key, and the image data cut short after the workflow: still read
    info = PngInfo()
    info.add_text("prompt", json.dumps(ran))
    Image.new("RGB", (64, 64)).save(tmp_path / "ok.png", pnginfo=info)
    raw = (tmp_path / "ok.png").read_bytes()
    comment = b"Comment\x00\x00" + b"not zlib"  # a zTXt chunk that does not decompress
    chunk = len(comment).to_bytes(4, "big") + b"zTXt" + comment + bytes(4)
    (tmp_path / "odd.png").write_bytes(raw[:33] + chunk + raw[33:-20])  # after IHDR; cut at its end
    assert read_json_file(tmp_path / "odd.png") == ran
    both = tmp_path / "prompt-workflow.png"
    assert read_json_file(both, png_keys=("workflow", "prompt")) == graph  # convert: the editor's first
    info = PngInfo()
    info.add_text("prompt", "{oops")
    Image.new("RGB", (4, 4)).save(tmp_path / "bad.png", pnginfo=info)
    with pytest.raises(WorkflowError, match=r"bad.png \(its PNG text 'prompt'\) is not valid JSON"):
        read_json_file(tmp_path / "bad.png")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(ran).encode())))
    assert read_json_file(Path("-")) == ran
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n")))
    with pytest.raises(WorkflowError, match=r"^workflow file standard input is empty$"):
        read_json_file(Path("-"))
    monkeypatch.setattr(sys, "stdin", None)  # `<&-`: it was an AttributeError traceback
    with pytest.raises(WorkflowError, match=r"standard input\): it is closed; pipe the workflow into it"):
        read_json_file(Path("-"))
    terminal = io.TextIOWrapper(io.BytesIO())
    monkeypatch.setattr(terminal, "isatty", lambda: True)  # it waited in silence for typed JSON
    monkeypatch.setattr(sys, "stdin", terminal)
    with pytest.raises(WorkflowError, match=r"it is a terminal; pipe the workflow into it"):
        read_json_file(Path("-"))


@pytest.mark.parametrize(
    ("start", "kind"),
    [
        (b"\xff\xd8\xff\xe0", "a JPEG image"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "a WebP image"),
        (b"\x00\x00\x00\x18ftypmp42", "an MP4/MOV video"),
    ],
)
def test_an_image_or_video_given_as_a_workflow_is_named(tmp_path: Path, start: bytes, kind: str) -> None:
    """They were "not UTF-8 text (byte 0)"."""
    from runner.graph.workflow_file import read_json_file

    path = tmp_path / "out.bin"
    path.write_bytes(start + bytes(64))
    with pytest.raises(WorkflowError, match=f"workflow file {path} is {kind}, not a workflow"):
        read_json_file(path)


def test_a_run_record_given_as_a_workflow_names_the_workflow_it_ran(tmp_path: Path) -> None:
    """It was "node #1 (None) has no id: the file is damaged" (a record has a "nodes" list)."""
    from runner.graph.workflow_file import read_json_file

    record = {"schema": "leanvideo.run", "workflow": {"path": "/w/wf.api.json"}, "nodes": [{"node_id": "1"}]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    said = f"workflow file {path} is a LeanVideo record (leanvideo.run), not a workflow; the workflow it"
    with pytest.raises(WorkflowError, match=re.escape(said + " ran: /w/wf.api.json")):
        read_json_file(path)
    path.write_text(json.dumps({**record, "workflow": {"path": "-"}}), encoding="utf-8")  # `run -`
    with pytest.raises(WorkflowError, match=r"not a workflow; it ran a workflow from standard input$"):
        read_json_file(path)
    (tmp_path / "empty.json").write_text("  \n", encoding="utf-8")
    with pytest.raises(WorkflowError, match=r"empty\.json is empty"):
        read_json_file(tmp_path / "empty.json")


def test_a_saved_prompt_request_is_named_as_such() -> None:
    """A /prompt request body saved as a file was "node prompt has no class_type"."""
    from runner.graph.workflow import api_workflow

    body = {"prompt": {"1": {"class_type": "A", "inputs": {}}}, "client_id": "x"}
    with pytest.raises(
        WorkflowError, match=r"w.json is a request to ComfyUI's /prompt \(its workflow is under"
    ):
        api_workflow(body, Path("w.json"))


def test_the_record_of_a_workflow_from_standard_input_hashes_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run -`: the record's workflow path is "-", and a file named "-" in the current folder had its
    sha256 written as the workflow's."""
    from runner.tracking.record import build_run_record
    from runner.tracking.result import PromptResult

    monkeypatch.chdir(tmp_path)
    Path("-").write_text("not the workflow", encoding="utf-8")
    result = PromptResult("p", "success", 0.0, 0.0, 1.0)
    record = build_run_record(result, {}, Path("-"), {}, [])
    assert record["workflow"]["path"] == "-" and record["workflow"]["file_sha256"] is None
    Path("wf.json").write_text("{}", encoding="utf-8")
    assert build_run_record(result, {}, Path("wf.json"), {}, [])["workflow"]["file_sha256"] is not None
