"""A damaged editor (UI) file is refused with an error naming the node or link at fault, by convert and
by every command that reads one (exit 5), never with a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from runner.cli.main import main
from runner.errors import WorkflowError
from runner.graph.convert import convert_ui_workflow
from runner.graph.ui_shape import check_ui_shape
from runner.local.ports import pick_free_port
from runner.local.server import ComfyServer
from tests.test_convert import OBJECT_INFO, UI


def damaged(change: Any) -> dict[str, Any]:
    ui = copy.deepcopy(UI)
    change(ui)
    return ui


def set_node(index: int, key: str, value: Any) -> Any:
    return lambda ui: ui["nodes"][index].__setitem__(key, value)


def set_link(index: int, value: Any) -> Any:
    return lambda ui: ui["links"].__setitem__(index, value)


CASES = [
    (set_link(0, [1, 2]), r"entry 1 of 'links' is \[1, 2\]: a link is \[id, origin node"),
    (set_link(0, None), r"entry 1 of 'links' is null, not a link"),
    (set_link(0, {"id": 1}), r"entry 1 of 'links' \(\{\"id\": 1\}\) has no origin_id, origin_slot"),
    (set_link(0, [1, 1, "zz", 2, 0, "MODEL"]), r"link 1: its origin_slot is \"zz\", not a number"),
    (set_link(0, [None, 1, 0, 2, 0, "MODEL"]), r"entry 1 of 'links': its id is null"),
    (set_link(0, [1, True, 0, 2, 0, "MODEL"]), r"link 1: its origin_id is true"),
    (lambda ui: ui.__setitem__("links", 5), r"'links' is a number \(5\), not a list of links"),
    (lambda ui: ui["nodes"][0].pop("id"), r"node #1 \(CheckpointLoaderSimple\) has no id"),
    (set_node(0, "id", None), r"node #1 \(CheckpointLoaderSimple\) has the id null, not a number"),
    (set_node(0, "id", 3.5), r"node #1 \(CheckpointLoaderSimple\) has the id 3.5, not an integer"),
    (set_link(0, [1, 1, 0.5, 2, 0, "MODEL"]), r"link 1: its origin_slot is 0.5, not an integer"),
    (lambda ui: ui.pop("links"), r"'links' is missing, yet node 2 \(Reroute\) input #1 takes link 1"),
    (
        lambda ui: ui.__setitem__("links", None),
        r"'links' is null, yet node 2 \(Reroute\) input #1 takes link 1",
    ),
    (set_node(3, "inputs", None), r"the inputs of node 4 \(KSampler\) are null, not a list"),
    (set_node(3, "inputs", "oops"), r"the inputs of node 4 \(KSampler\) are a text \(\"oops\"\), not a list"),
    (set_node(3, "inputs", ["model"]), r"input #1 of node 4 \(KSampler\) is a text"),
    (set_node(3, "outputs", {"a": 1}), r"the outputs of node 4 \(KSampler\) are an object"),
    (
        lambda ui: ui["nodes"][3]["inputs"][0].__setitem__("link", "zz"),
        r"node 4 \(KSampler\) input 'model': link \"zz\" is not a link id",
    ),
    (
        lambda ui: ui["nodes"].__setitem__(2, "node"),
        r"node #3 in 'nodes' is a text \(\"node\"\), not an object",
    ),
    (lambda ui: ui.__setitem__("definitions", []), r"'definitions' is a list"),
    (
        lambda ui: ui.__setitem__("definitions", {"subgraphs": "x"}),
        r"the subgraphs of 'definitions' are a text \(\"x\"\), not a list",
    ),
    (
        lambda ui: ui.__setitem__("definitions", {"subgraphs": [5]}),
        r"subgraph #1 of 'definitions' is a number \(5\), not an object",
    ),
    (
        lambda ui: ui.__setitem__("definitions", {"subgraphs": [{"id": "s1", "nodes": [5]}]}),
        r"node #1 in 'nodes' of subgraph s1 is a number",
    ),
    (
        lambda ui: ui.__setitem__("definitions", {"subgraphs": [{"id": "s1", "inputs": "x"}]}),
        r"the inputs of subgraph s1 are a text",
    ),
    (
        lambda ui: ui["nodes"][0].__setitem__("type", ["CheckpointLoaderSimple"]),
        r'node 1 has the type \["CheckpointLoaderSimple"\], not a node type name',
    ),
    (lambda ui: ui["nodes"][0].pop("type"), r"node 1 has no type"),
    (lambda ui: ui["links"].append(list(ui["links"][0])), r"link 1 is in 'links' twice"),
    (
        lambda ui: ui["nodes"][0].__setitem__("widgets_values", 5),
        r"the widgets_values of node 1 \(CheckpointLoaderSimple\) are a number \(5\), not a list or",
    ),
]


@pytest.mark.parametrize(("change", "said"), CASES)
def test_a_damaged_file_names_the_node_or_link(change: Any, said: str) -> None:
    ui = damaged(change)
    with pytest.raises(WorkflowError, match=said) as caught:
        convert_ui_workflow(ui, OBJECT_INFO)
    assert "the file is damaged; save it again from the editor" in str(caught.value)


def test_the_shapes_the_editor_writes_pass() -> None:
    check_ui_shape(UI)  # list and object links, null links, a node with no inputs
    as_text = damaged(lambda ui: ui["links"].__setitem__(0, ["1", "1", "0", "2", "0", "MODEL"]))
    check_ui_shape(as_text)  # integers as text, which the converter reads the same way
    assert convert_ui_workflow(as_text, OBJECT_INFO)["4"]["inputs"]["model"] == ["1", 0]
    shipped = sorted(Path("workflows").glob("**/*.json"))
    checked = 0
    for path in shipped:
        document = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(document, dict) and "nodes" in document and "links" in document:
            check_ui_shape(document)
            checked += 1
    assert checked >= 1


@pytest.mark.integration
def test_every_command_that_reads_an_editor_file_refuses_a_damaged_one_with_exit_5(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(damaged(set_link(0, [1, 2]))), encoding="utf-8")
    server = ["--server", comfy_server.url]
    for command in (
        ["workflow", "convert", str(path)],
        ["workflow", "validate", str(path)],
        ["run", str(path)],
    ):
        code = main(
            [*command, *server, "--out", str(tmp_path / "out")]
            if command[0] == "run"
            else [*command, *server]
        )
        err = capsys.readouterr().err
        assert code == 5, (command, err)
        assert f"{path}: entry 1 of 'links' is [1, 2]" in err, err
        assert "Traceback" not in err
    assert main(["workflow", "diff", str(path), str(path), *server]) == 5
    assert "entry 1 of 'links' is [1, 2]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [["workflow", "convert"], ["workflow", "validate"], ["run"], ["workflow", "diff"]],
    ids=lambda command: " ".join(command),
)
def test_a_damaged_file_is_said_as_such_before_any_server_is_asked(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No server answers here: the damage is what is wrong (exit 5), not an unreachable server (4)."""
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(damaged(set_link(0, [1, 2]))), encoding="utf-8")
    files = [str(path), str(path)] if command[-1] == "diff" else [str(path)]
    nobody = ["--server", f"http://127.0.0.1:{pick_free_port()}", "--retries", "0"]
    out = ["--out", str(tmp_path / "out")] if command == ["run"] else []
    assert main([*command, *files, *nobody, *out]) == 5
    err = capsys.readouterr().err
    assert f"{path}: entry 1 of 'links' is [1, 2]" in err and "cannot reach" not in err, err
