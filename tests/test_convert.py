"""UI → API conversion: widgets, links, reroutes, primitives, muted and bypassed nodes, subgraphs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from runner.cli.main import main
from runner.errors import WorkflowError
from runner.graph.convert import convert_ui_workflow
from runner.graph.editor_nodes import editor_only_hints
from runner.graph.validate import validate_workflow
from runner.graph.workflow import apply_overrides
from runner.local.server import ComfyServer

OBJECT_INFO: dict[str, Any] = {
    "CheckpointLoaderSimple": {
        "input": {"required": {"ckpt_name": [["a.safetensors"], {}]}},
        "input_order": {"required": ["ckpt_name"]},
        "output": ["MODEL", "CLIP", "VAE"],
        "display_name": "Load Checkpoint",
    },
    "LoadImage": {
        "input": {"required": {"image": [["cat.png"], {"image_upload": True}]}},
        "output": ["IMAGE", "MASK"],
        "display_name": "Load Image",
    },
    "LoraLoaderModelOnly": {
        "input": {
            "required": {
                "model": ["MODEL", {}],
                "lora_name": [["l.safetensors"], {}],
                "strength": ["FLOAT", {}],
            }
        },
        "input_order": {"required": ["model", "lora_name", "strength"]},
        "output": ["MODEL"],
    },
    "KSampler": {
        "input": {
            "required": {
                "model": ["MODEL", {}],
                "seed": ["INT", {"control_after_generate": True}],
                "steps": ["INT", {}],
                "cfg": ["FLOAT", {}],
                "sampler_name": ["COMBO", {"options": ["euler"]}],
                "latent_image": ["LATENT", {}],
            },
            "optional": {"denoise": ["FLOAT", {}], "extra": ["INT", {"forceInput": True}]},
        },
        "input_order": {
            "required": ["model", "seed", "steps", "cfg", "sampler_name", "latent_image"],
            "optional": ["denoise", "extra"],
        },
        "output": ["LATENT"],
        "display_name": "KSampler",
    },
    "EmptyLatentImage": {
        "input": {"required": {"width": ["INT", {}], "height": ["INT", {}]}},
        "output": ["LATENT"],
        "display_name": "Empty Latent Image",
    },
}


def node(
    node_id: int, kind: str, widgets: Any = None, inputs: Any = (), outputs: Any = (), **extra: Any
) -> dict[str, Any]:
    return {
        "id": node_id,
        "type": kind,
        "mode": extra.pop("mode", 0),
        "widgets_values": widgets if widgets is not None else [],
        "inputs": [dict(i) for i in inputs],
        "outputs": [dict(o) for o in outputs],
        **extra,
    }


UI: dict[str, Any] = {
    "nodes": [
        node(
            1,
            "CheckpointLoaderSimple",
            ["a.safetensors"],
            outputs=[{"name": "MODEL", "type": "MODEL", "links": [1]}],
        ),
        node(
            2,
            "Reroute",
            None,
            inputs=[{"name": "", "type": "*", "link": 1}],
            outputs=[{"type": "MODEL", "links": [2]}],
        ),
        node(
            3,
            "LoraLoaderModelOnly",
            ["l.safetensors", 0.5],
            inputs=[{"name": "model", "type": "MODEL", "link": 2}],
            outputs=[{"name": "MODEL", "type": "MODEL", "links": [3]}],
            mode=4,
        ),
        node(
            4,
            "KSampler",
            [7, "randomize", 20, 3.5, "euler", 0.9],
            inputs=[
                {"name": "model", "type": "MODEL", "link": 3},
                {"name": "latent_image", "type": "LATENT", "link": 4},
                {"name": "steps", "type": "INT", "link": 5, "widget": {"name": "steps"}},
                {"name": "extra", "type": "INT", "link": 7},
            ],
            title="My Sampler",
        ),
        node(5, "EmptyLatentImage", {"width": 64, "height": 32}, outputs=[{"type": "LATENT", "links": [4]}]),
        node(
            6,
            "PrimitiveNode",
            [8, "fixed"],
            outputs=[{"type": "INT", "links": [5], "widget": {"name": "steps"}}],
        ),
        node(7, "LoadImage", ["cat.png", "image"], outputs=[{"type": "IMAGE", "links": []}], mode=2),
        node(8, "EmptyLatentImage", [1, 1], outputs=[{"type": "INT", "links": [7]}], mode=2),
        node(9, "Note", ["remember the milk"]),
        node(10, "LoadImage", ["cat.png", "image"], outputs=[{"type": "IMAGE", "links": []}]),
    ],
    "links": [
        [1, 1, 0, 2, 0, "MODEL"],
        [2, 2, 0, 3, 0, "MODEL"],
        [3, 3, 0, 4, 0, "MODEL"],
        {"id": 4, "origin_id": 5, "origin_slot": 0, "target_id": 4, "target_slot": 1, "type": "LATENT"},
        [5, 6, 0, 4, 2, "INT"],
        [7, 8, 0, 4, 3, "INT"],
    ],
}


def test_a_muted_or_bypassed_primitive_still_gives_its_value_as_the_editor_submits_it() -> None:
    """The pinned frontend's graphToPrompt applies every primitive, muted or not; its target took its own
    stale widget value here (42 for 777)."""
    for mode in (2, 4):
        ui = copy.deepcopy(UI)
        ui["nodes"][5]["mode"] = mode
        assert convert_ui_workflow(ui, OBJECT_INFO)["4"]["inputs"]["steps"] == 8


def test_an_unknown_node_type_says_what_it_is_where_the_file_tells() -> None:
    """A subgraph without its definition and a node of a pack the server lacks were both "(not in the
    server's /object_info)"; an API file's unknown type listed the server's first dozen types A to Z."""
    from runner.graph.validate import unknown_node_problem

    orphan = node(50, "00000000-0000-0000-0000-000000003039", [])
    packed = node(40, "VHS_VideoCombine", [], properties={"cnr_id": "comfyui-videohelpersuite"})
    with pytest.raises(WorkflowError) as refused:
        convert_ui_workflow({"nodes": [orphan, packed], "links": []}, OBJECT_INFO)
    said = str(refused.value)
    assert (
        "node 50: unknown node type '00000000-0000-0000-0000-000000003039': it is a subgraph's id, " in said
    )
    assert "and the file's definitions.subgraphs has no subgraph of that id" in said
    assert "node 40: unknown node type 'VHS_VideoCombine': a node of the custom node pack " in said
    assert "'comfyui-videohelpersuite' (its properties say so)" in said
    assert (
        unknown_node_problem("9", "KSamplr", OBJECT_INFO).message
        == "unknown node type; close matches: KSampler"
    )
    newer = node(41, "LTXVFutureNode", [], properties={"cnr_id": "comfy-core", "ver": "0.3.99"})
    with pytest.raises(
        WorkflowError, match=r"a core node of ComfyUI 0.3.99 \(its properties say comfy-core\)"
    ):
        convert_ui_workflow({"nodes": [newer], "links": []}, OBJECT_INFO)
    assert unknown_node_problem("9", "Zzz", OBJECT_INFO).message.startswith(
        "unknown node type: the server has no node of that name: a custom node pack not installed there"
    )


def test_a_subgraph_that_holds_an_instance_of_itself_is_refused_naming_it() -> None:
    """It was expanded 16 deep, then said "node 50:9:9:…:9: unknown node type '…'"."""
    inner = node(9, "sub-1", [], inputs=[])
    definition = {**copy.deepcopy(SUBGRAPH), "name": "Latent", "nodes": [inner], "links": []}
    ui = {"nodes": [node(50, "sub-1", [])], "links": [], "definitions": {"subgraphs": [definition]}}
    said = r"subgraph 'Latent' contains itself \(node 50:9, in subgraph 'Latent'\)"
    with pytest.raises(WorkflowError, match=said):
        convert_ui_workflow(ui, OBJECT_INFO)
    beta = {**copy.deepcopy(definition), "id": "sub-2", "name": "Beta", "nodes": [node(7, "sub-1", [])]}
    definition["nodes"] = [node(9, "sub-2", [])]  # Latent holds Beta, which holds Latent
    ui["definitions"]["subgraphs"].append(beta)
    said = r"subgraph 'Latent' contains 'Beta', which holds it \(node 50:9:7, in subgraph 'Beta'\)"
    with pytest.raises(WorkflowError, match=said):
        convert_ui_workflow(ui, OBJECT_INFO)


def test_conversion_follows_reroutes_primitives_bypass_and_mute() -> None:
    api = convert_ui_workflow(UI, OBJECT_INFO)
    assert sorted(api, key=int) == ["1", "4", "5", "10"]  # reroute, primitive, bypassed, muted, note left out
    assert api["4"] == {
        "inputs": {
            "seed": 7,  # the "randomize" control value is skipped
            "steps": 8,  # from the primitive feeding the converted widget
            "cfg": 3.5,
            "sampler_name": "euler",
            "denoise": 0.9,
            "model": ["1", 0],  # through the reroute and the bypassed LoRA
            "latent_image": ["5", 0],
        },  # "extra" came from a muted node: left out
        "class_type": "KSampler",
        "_meta": {"title": "My Sampler"},
    }
    assert (
        api["5"]["inputs"] == {"width": 64, "height": 32}
        and api["5"]["_meta"]["title"] == "Empty Latent Image"
    )
    assert api["10"]["inputs"] == {"image": "cat.png"}  # the upload button's value is not an input
    (problem,) = validate_workflow(api, OBJECT_INFO)  # every node and link valid; the graph saves nothing
    assert problem.node_id == "" and problem.message.startswith("no output node")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"mode": 2}, "node 3 (LoraLoaderModelOnly), which is muted"),
        ({"inputs": [{"name": "model", "type": "MODEL", "link": None}]}, "node 3 (LoraLoaderModelOnly), "
         "which is bypassed and has no linked MODEL input to pass on"),
    ],
)  # fmt: skip
def test_an_input_cut_by_a_muted_or_bypassed_node_says_where_its_link_came_from(
    change: dict[str, Any], said: str
) -> None:
    """The editor leaves such an input out of what it submits, and the server then says only "required
    input is missing" about an input the user sees linked: validation names the node that cut it."""
    ui = copy.deepcopy(UI)
    ui["nodes"][2].update(change)  # node 3, the bypassed LoRA between the reroute and the sampler
    cut: dict[tuple[str, str], str] = {}
    api = convert_ui_workflow(ui, OBJECT_INFO, cut)
    assert "model" not in api["4"]["inputs"]
    assert cut == {("4", "model"): said, ("4", "extra"): "node 8 (EmptyLatentImage), which is muted"}
    problems = {str(p) for p in validate_workflow(api, OBJECT_INFO, cut)}
    assert (
        f"node 4 (KSampler) input 'model': required input is missing: its link comes from {said}" in problems
    )
    assert not any("extra" in p for p in problems)  # optional: left out, as the editor does
    assert "node 4 (KSampler) input 'model': required input is missing" in {
        str(p) for p in validate_workflow(api, OBJECT_INFO)
    }


def test_a_reroute_with_nothing_linked_into_it_is_named() -> None:
    ui = copy.deepcopy(UI)
    ui["nodes"][1]["inputs"][0]["link"] = None  # the reroute feeding the bypassed LoRA
    cut: dict[tuple[str, str], str] = {}
    convert_ui_workflow(ui, OBJECT_INFO, cut)
    assert cut[("4", "model")] == "node 2 (Reroute), with nothing linked into it"


def test_unknown_nodes_and_group_nodes_are_refused_by_node_id() -> None:
    with pytest.raises(WorkflowError, match="node 1: unknown node type 'Nope'"):
        convert_ui_workflow({"nodes": [node(1, "Nope")], "links": []}, OBJECT_INFO)
    with pytest.raises(
        WorkflowError, match=r"'LeanVideoFixtureAttentionMask': .*leanvideo serve --fixture-nodes"
    ):
        convert_ui_workflow({"nodes": [node(1, "LeanVideoFixtureAttentionMask")], "links": []}, OBJECT_INFO)
    two = {"nodes": [node(1, "Nope"), node(2, "CheckpointLoaderSimple"), node(3, "AlsoNope")], "links": []}
    with pytest.raises(WorkflowError, match=r"^2 nodes of unknown types:\n  node 1: .*'Nope'.*\n  node 3: "):
        convert_ui_workflow(two, OBJECT_INFO)
    with pytest.raises(WorkflowError, match="node 2 is a group node"):
        convert_ui_workflow({"nodes": [node(2, "workflow>My group")], "links": []}, OBJECT_INFO)
    with pytest.raises(WorkflowError, match="no 'nodes' list"):
        convert_ui_workflow({"1": {"class_type": "X"}}, OBJECT_INFO)


def test_a_damaged_editor_file_is_refused_rather_than_misread() -> None:
    twice = [node(4, "CheckpointLoaderSimple"), node(4, "LoadImage")]
    said = r"two nodes have the id 4 \(CheckpointLoaderSimple and LoadImage\)"
    with pytest.raises(WorkflowError, match=said):
        convert_ui_workflow({"nodes": twice, "links": []}, OBJECT_INFO)
    with_subgraphs = {"nodes": twice, "links": [], "definitions": {"subgraphs": [{"id": "s", "nodes": []}]}}
    with pytest.raises(WorkflowError, match=said):  # the flattening of subgraphs kept only one of them
        convert_ui_workflow(with_subgraphs, OBJECT_INFO)
    spelled = {**node(5, "CheckpointLoaderSimple"), "widgets_values": "oops"}  # was read as 'o', 'o', …
    with pytest.raises(
        WorkflowError, match=r"the widgets_values of node 5 \(CheckpointLoaderSimple\) are a text"
    ):
        convert_ui_workflow({"nodes": [spelled], "links": []}, OBJECT_INFO)


def test_widget_positions_follow_the_frontend() -> None:
    info = {
        "input": {
            "required": {
                "seed": ["INT", {"control_after_generate": False}],
                "steps": ["INT", {"default": 33}],
            },
            "optional": {"mode": ["COMBO", {"options": ["a", "b"]}], "scale": ["FLOAT", {}]},
        },
        "input_order": {"required": ["seed", "steps"], "optional": ["mode", "scale"]},
    }
    # No control widget here, so the saved "randomize" lands on steps, as the editor would submit it;
    # widgets the file has no value for take their default (a combo's first option).
    assert convert_ui_workflow({"nodes": [node(1, "Odd", [5, "randomize"])]}, {"Odd": info})["1"][
        "inputs"
    ] == {
        "seed": 5,
        "steps": "randomize",
        "mode": "a",
        "scale": 0,
    }
    preview = {"input": {"required": {"source": ["*", {}]}}, "display_name": "Preview Any"}
    api = convert_ui_workflow({"nodes": [node(2, "PreviewAny")]}, {"PreviewAny": preview})
    assert api["2"]["inputs"] == {"preview": ""}  # the widget the frontend's extension adds


SUBGRAPH: dict[str, Any] = {
    "id": "sub-1",
    "inputs": [{"name": "model", "type": "MODEL"}, {"name": "strength", "type": "FLOAT"}],
    "outputs": [{"name": "MODEL", "type": "MODEL"}],
    "nodes": [
        node(
            7,
            "LoraLoaderModelOnly",
            ["l.safetensors", 1.0],
            inputs=[
                {"name": "model", "type": "MODEL", "link": 1},
                {"name": "strength", "type": "FLOAT", "link": 2, "widget": {"name": "strength"}},
            ],
        ),
        node(8, "Note", ["inside"]),
    ],
    "links": [
        {"id": 1, "origin_id": -10, "origin_slot": 0, "target_id": 7, "target_slot": 0, "type": "MODEL"},
        {"id": 2, "origin_id": -10, "origin_slot": 1, "target_id": 7, "target_slot": 1, "type": "FLOAT"},
        {"id": 3, "origin_id": 7, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "MODEL"},
    ],
}


def test_subgraphs_are_expanded_with_path_ids() -> None:
    instance = {"inputs": [{"name": "model", "type": "MODEL", "link": 1}], "outputs": [{"type": "MODEL"}]}
    ui = {
        "nodes": [
            node(1, "CheckpointLoaderSimple", ["a.safetensors"]),
            node(5, "sub-1", [0.25], **instance),
            node(6, "sub-1", [0.5], mode=2, **instance),  # muted: none of it is submitted
            node(
                4,
                "KSampler",
                [7, "fixed", 20, 3.5, "euler"],
                inputs=[{"name": "model", "type": "MODEL", "link": 2}],
            ),
        ],
        "links": [[1, 1, 0, 5, 0, "MODEL"], [2, 5, 0, 4, 0, "MODEL"]],
        "definitions": {"subgraphs": [SUBGRAPH]},
    }
    api = convert_ui_workflow(ui, OBJECT_INFO)
    assert sorted(api) == ["1", "4", "5:7"]
    assert api["5:7"]["inputs"] == {"lora_name": "l.safetensors", "strength": 0.25, "model": ["1", 0]}
    assert api["4"]["inputs"]["model"] == ["5:7", 0]  # the instance's output is the inner node's
    with pytest.raises(WorkflowError) as refused:  # the instance is no node of the submitted workflow
        apply_overrides(api, ["5.strength=1"], OBJECT_INFO, editor_only_hints(ui))
    assert str(refused.value) == (
        "--set '5.strength=1': node 5 is a subgraph of the editor file: its nodes have ids 5:<id> (5:7); "
        "its widget strength goes to 5:7.strength: set those (--set NODE.input=VALUE)"
    )


def test_promoted_values_count_every_widget_type() -> None:
    """A subgraph input of the frontend's AUDIO_RECORD widget takes its place in the instance's values,
    so the values after it stay on their inputs (convert and subgraph share one widget-type table)."""
    object_info = {**OBJECT_INFO, "RecordAudio": {"input": {"required": {"audio": ["AUDIO_RECORD", {}]}}}}
    recorder = node(
        9,
        "RecordAudio",
        [""],
        inputs=[{"name": "audio", "type": "AUDIO_RECORD", "link": 4, "widget": {"name": "audio"}}],
    )
    subgraph = {
        **SUBGRAPH,
        "inputs": [{"name": "audio", "type": "AUDIO_RECORD"}, *SUBGRAPH["inputs"]],
        "nodes": [*SUBGRAPH["nodes"], recorder],
        "links": [
            {**link, "origin_slot": link["origin_slot"] + 1} if link["origin_id"] == -10 else link
            for link in SUBGRAPH["links"]
        ]
        + [{"id": 4, "origin_id": -10, "origin_slot": 0, "target_id": 9, "target_slot": 0}],
    }
    instance = node(
        5,
        "sub-1",
        ["take-1.wav", 0.25],
        inputs=[{"name": "model", "type": "MODEL", "link": 1}],
        outputs=[{"type": "MODEL"}],
    )
    ui = {
        "nodes": [node(1, "CheckpointLoaderSimple", ["a.safetensors"]), instance],
        "links": [[1, 1, 0, 5, 1, "MODEL"]],
        "definitions": {"subgraphs": [subgraph]},
    }
    api = convert_ui_workflow(ui, object_info)
    assert api["5:9"]["inputs"] == {"audio": "take-1.wav"}
    assert api["5:7"]["inputs"]["strength"] == 0.25


@pytest.mark.integration
def test_cli_converts_the_shipped_ltxv_template(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import comfyui_workflow_templates_media_video as templates

    source = Path(templates.__file__).parent / "templates" / "ltxv_text_to_video.json"
    template = json.loads(source.read_text(encoding="utf-8"))
    prompt = next(n for n in template["nodes"] if n["type"] == "CLIPTextEncode")
    prompt["widgets_values"][0] = "一只狐狸在雪中奔跑 🦊"  # written as it is (it was \u4e00\u53ea…)
    source = tmp_path / "template.json"
    source.write_text(json.dumps(template), encoding="utf-8")
    out = tmp_path / "api.json"
    assert main(["workflow", "convert", str(source), "--server", comfy_server.url, "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert "一只狐狸在雪中奔跑 🦊" in out.read_text(encoding="utf-8")
    assert main(["workflow", "convert", str(source), "--server", comfy_server.url]) == 0
    assert "一只狐狸在雪中奔跑 🦊" in capsys.readouterr().out
    api = json.loads(out.read_text())
    sampler = next(n for n in api.values() if n["class_type"] == "SamplerCustom")
    assert sampler["inputs"]["noise_seed"] == 497797676867141 and sampler["inputs"]["cfg"] == 3
    assert sampler["inputs"]["model"] == ["44", 0] and sampler["inputs"]["negative"] == ["69", 1]
    assert {n["class_type"] for n in api.values()} >= {"CLIPLoader", "LTXVScheduler", "SaveVideo"}
    assert main(["workflow", "validate", str(out), "--server", comfy_server.url, "--json"]) == 5
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert {(p["node_id"], p["input"]) for p in problems} == {("38", "clip_name"), ("44", "ckpt_name")}
    assert all("model file" in p["message"] for p in problems)
    written = out.read_text()
    assert main(["workflow", "convert", str(source), "--server", comfy_server.url, "--out", str(out)]) == 2
    assert "refusing to overwrite it" in capsys.readouterr().err and out.read_text() == written


def test_a_list_widget_value_is_wrapped_as_the_editor_submits_it() -> None:
    listed = node(7, "CheckpointLoaderSimple", widgets=[["a.safetensors", "b.safetensors"]])
    api = convert_ui_workflow({"nodes": [listed], "links": []}, OBJECT_INFO)
    assert api["7"]["inputs"]["ckpt_name"] == {"__value__": ["a.safetensors", "b.safetensors"]}


def test_set_on_an_editor_only_node_points_to_where_its_value_goes() -> None:
    ui = copy.deepcopy(UI)
    ui["nodes"][5]["title"] = "Steps"  # the primitive feeding KSampler's steps
    api = convert_ui_workflow(ui, OBJECT_INFO)
    hints = editor_only_hints(ui)
    for target in ("6", "Steps"):
        with pytest.raises(WorkflowError) as refused:
            apply_overrides(api, [f"{target}.value=4"], OBJECT_INFO, hints)
        assert str(refused.value) == (
            f"--set '{target}.value=4': node 6 (Steps) is a primitive of the editor: its value goes to "
            "node 4 input 'steps'; set that instead (--set 4.steps=VALUE)"
        )
    with pytest.raises(WorkflowError, match=r"node 3 \(LoraLoaderModelOnly\) is bypassed in the editor file"):
        apply_overrides(api, ["3.strength=1"], OBJECT_INFO, hints)
    with pytest.raises(WorkflowError, match=r"node 9 \(Note\) is a note"):
        apply_overrides(api, ["9.text=x"], OBJECT_INFO, hints)
    with pytest.raises(WorkflowError, match="no node '42' in the workflow"):  # nothing of the editor's either
        apply_overrides(api, ["42.steps=1"], OBJECT_INFO, hints)
    apply_overrides(api, ["4.steps=4"], OBJECT_INFO, hints)
    assert api["4"]["inputs"]["steps"] == 4


def test_a_subgraph_link_from_an_input_it_does_not_have_is_a_damaged_file() -> None:
    definition = copy.deepcopy(SUBGRAPH)
    definition["inputs"] = None  # its links still come from inputs 1 and 2
    ui = {
        "nodes": [node(5, "sub-1", [0.25], inputs=[{"name": "model", "type": "MODEL", "link": None}])],
        "links": [],
        "definitions": {"subgraphs": [definition]},
    }
    with pytest.raises(
        WorkflowError, match=r"link 1 of subgraph 5 comes from its input #1, and it has 0 input"
    ):
        convert_ui_workflow(ui, OBJECT_INFO)


def test_convert_out_below_a_file_says_it_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine", encoding="utf-8")
    ui = Path(__file__).parent.parent / "workflows" / "ltxv_tiny_t2v.ui.json"
    assert main(["workflow", "convert", str(ui), "--out", str(afile / "x.json")]) == 2
    assert f"the folder {afile} is a file, not a folder" in capsys.readouterr().err
    assert afile.read_text(encoding="utf-8") == "mine"


def test_widgets_saved_by_name_that_a_file_leaves_out_take_their_defaults() -> None:
    """As the list form: a widget the file has no value for starts as a fresh widget does, not as a
    required input said to be missing."""
    info = {
        "EmptyLatentImage": {
            "input": {"required": {"width": ["INT", {"default": 512}], "height": ["INT", {}]}}
        }
    }
    sized = node(5, "EmptyLatentImage", {"height": 32, "extra": 1})
    api = convert_ui_workflow({"nodes": [sized], "links": []}, info)
    assert api["5"]["inputs"] == {"width": 512, "height": 32}
