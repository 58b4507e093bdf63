"""`leanvideo workflow diff`: semantic differences, not text differences."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from runner.graph.diff import Change, diff_workflows, summarize


def test_identical_workflows_have_no_changes_whatever_the_key_order(tiny_workflow: dict[str, Any]) -> None:
    reordered = {node_id: tiny_workflow[node_id] for node_id in reversed(list(tiny_workflow))}
    assert diff_workflows(tiny_workflow, reordered) == []


def test_each_kind_of_change_is_named(tiny_workflow: dict[str, Any]) -> None:
    new = copy.deepcopy(tiny_workflow)
    new["11"]["inputs"]["noise_seed"] = 7
    new["12"]["inputs"]["samples"] = ["8", 0]
    new["11"]["inputs"]["sigmas"] = 0.5
    del new["5"]
    new["6"]["_meta"]["title"] = "renamed"
    new["10"]["class_type"] = "KSamplerSelectCustom"
    new["99"] = {"class_type": "LeanVideoFreeVRAM", "inputs": {"mode": "unload all"}}
    del new["4"]["inputs"]["text"]
    new["4"]["inputs"]["extra"] = 1
    changes = diff_workflows(tiny_workflow, new)
    found = {(c.kind, c.node_id, c.input_name) for c in changes}
    assert found == {
        ("node_removed", "5", None),
        ("title_changed", "6", None),
        ("class_changed", "10", None),
        ("value_changed", "11", "noise_seed"),
        ("link_replaced", "11", "sigmas"),
        ("link_rewired", "12", "samples"),
        ("node_added", "99", None),
        ("input_removed", "4", "text"),
        ("input_added", "4", "extra"),
    }
    assert [c.node_id for c in changes] == sorted((c.node_id for c in changes), key=int)
    assert summarize(changes)["node_added"] == 1
    rewired = next(c for c in changes if c.kind == "link_rewired")
    assert str(rewired) == (
        "node 12 (VAEDecode) input 'samples': link from node 11 output 0 -> link from node 8 output 0"
    )


def _renumbered(workflow: dict[str, Any], shift: dict[str, str]) -> dict[str, Any]:
    """``workflow`` with each node id ``n`` as ``shift[n]``, its links following."""
    moved: dict[str, Any] = {}
    for node_id, node in copy.deepcopy(workflow).items():
        for name, value in node["inputs"].items():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
                node["inputs"][name] = [shift[value[0]], value[1]]
        moved[shift[node_id]] = node
    return moved


def test_a_renumbered_graph_shows_its_new_ids_and_real_changes_only(tiny_workflow: dict[str, Any]) -> None:
    """Nodes are paired by what they are, not only by id: a graph whose ids all moved (another export,
    an inserted node) is not reported as every node replaced, and its links are compared through that
    pairing."""
    shift = {node_id: str(int(node_id) + 100) for node_id in tiny_workflow}
    moved = _renumbered(tiny_workflow, shift)
    moved["111"]["inputs"]["noise_seed"] = 7
    changes = diff_workflows(tiny_workflow, moved)
    kinds = summarize(changes)
    assert kinds == {"renumbered": len(tiny_workflow), "value_changed": 1}, [str(c) for c in changes]
    assert "node 111 (SamplerCustom): was node 11" in [str(c) for c in changes]
    assert diff_workflows(tiny_workflow, copy.deepcopy(tiny_workflow)) == []


def test_expansion_and_subgraph_ids_sort_and_compare() -> None:
    a = {"54:73": {"class_type": "A", "inputs": {}}, "406.0.0.428": {"class_type": "B", "inputs": {"x": 1}}}
    b = {"406.0.0.428": {"class_type": "B", "inputs": {"x": 2}}}
    assert diff_workflows(a, b) == [
        Change("node_removed", "54:73", "A"),
        Change("value_changed", "406.0.0.428", "B", "x", old=1, new=2),
    ]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "runner.cli.main", "workflow", "diff", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_cli_exit_codes_and_json(tiny_workflow: dict[str, Any], tmp_path: Path) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(tiny_workflow))
    tiny_workflow["9"]["inputs"]["steps"] = 4
    new.write_text(json.dumps(tiny_workflow, indent=1))
    same = _cli(str(old), str(old))
    assert same.returncode == 0 and "are the same workflow" in same.stdout
    different = _cli(str(old), str(new), "--json")
    assert different.returncode == 1, different.stderr
    assert json.loads(different.stdout)["changes"] == [
        {
            "kind": "value_changed",
            "node_id": "9",
            "class_type": "LTXVScheduler",
            "input": "steps",
            "old": 8,
            "new": 4,
        }
    ]
    missing = _cli(str(old), str(tmp_path / "nope.json"))
    assert missing.returncode == 5 and "nope.json" in missing.stderr


def test_a_node_inserted_before_two_of_a_class_does_not_swap_them() -> None:
    """The usual way ids move: one node inserted, the ids after it shift by one onto another node of the
    same class. Titles pair them first, so nothing is reported swapped."""

    def encode(title: str, text: str) -> dict[str, Any]:
        return {"class_type": "CLIPTextEncode", "inputs": {"text": text}, "_meta": {"title": title}}

    a = {
        "6": encode("Positive", "a fox"),
        "7": encode("Negative", "blurry"),
        "9": {"class_type": "KSampler", "inputs": {"positive": ["6", 0], "negative": ["7", 0]}},
    }
    b = {
        "5": {"class_type": "LoraLoaderModelOnly", "inputs": {"lora_name": "x.safetensors"}},
        "7": encode("Positive", "a fox"),
        "8": encode("Negative", "blurry"),
        "9": {"class_type": "KSampler", "inputs": {"positive": ["7", 0], "negative": ["8", 0]}},
    }
    found = {(c.kind, c.node_id) for c in diff_workflows(a, b)}
    assert found == {("node_added", "5"), ("renumbered", "7"), ("renumbered", "8")}


def test_a_link_to_a_removed_node_whose_id_was_reused_shows_as_rewired() -> None:
    a = {
        "5": {"class_type": "X", "inputs": {}},
        "6": {"class_type": "X", "inputs": {}},
        "7": {"class_type": "Y", "inputs": {}},
        "9": {"class_type": "Z", "inputs": {"value": ["5", 0]}},
    }
    b = {"5": {"class_type": "Y", "inputs": {}}, "9": {"class_type": "Z", "inputs": {"value": ["5", 0]}}}
    rewired = [c for c in diff_workflows(a, b) if c.kind == "link_rewired"]
    assert [(c.node_id, c.input_name) for c in rewired] == [("9", "value")]  # X's output became Y's


def test_two_long_texts_are_shown_where_they_differ() -> None:
    """Both sides of a prompt changed in its last words were cut at 77 characters, so they read alike;
    each run of changed words is shown with three words around it."""
    text = "a cinematic shot of a red fox running through fresh snow at golden hour, shallow depth of field, "
    a = {"3": {"class_type": "CLIPTextEncode", "inputs": {"text": text + "slow motion"}}}
    b = {"3": {"class_type": "CLIPTextEncode", "inputs": {"text": text + "fast motion"}}}
    [change] = diff_workflows(a, b)
    assert str(change) == (
        'node 3 (CLIPTextEncode) input \'text\': "…of field, slow motion" -> "…of field, fast motion"'
    )
    b["3"]["inputs"]["text"] = "A" + text[1:] + "motion"  # changed at both ends: both shown
    assert str(diff_workflows(a, b)[0]) == (
        'node 3 (CLIPTextEncode) input \'text\': "a cinematic shot of…" -> "A cinematic shot of…"; '
        '"…of field, slow motion" -> "…of field, motion"'
    )
    words = " ".join(f"w{n}" for n in range(60))
    many = " ".join(f"w{n}" if n % 10 else "X" for n in range(60))  # 6 changed words, far apart
    said = str(
        diff_workflows(
            {"1": {"class_type": "T", "inputs": {"t": words}}},
            {"1": {"class_type": "T", "inputs": {"t": many}}},
        )[0]
    )
    assert said.count(" -> ") == 3 and said.endswith("(and 3 more change(s))")
    short = {"3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox"}}}
    assert str(diff_workflows(short, b)[0]).startswith("node 3 (CLIPTextEncode) input 'text': \"a fox\" -> ")


def test_nodes_of_one_class_and_title_are_paired_by_their_values_when_renumbered(
    tiny_workflow: dict[str, Any],
) -> None:
    """Two prompts under the editor's default title, renumbered so each took the other's place, were
    reported as swapped texts and rewired links; the graph is the same."""
    for node_id in ("3", "4"):
        tiny_workflow[node_id]["_meta"] = {"title": "CLIP Text Encode (Prompt)"}
    shift = {node_id: str(int(node_id) + 100) for node_id in tiny_workflow}
    shift["3"], shift["4"] = "121", "120"
    moved = _renumbered(tiny_workflow, shift)
    changes = diff_workflows(tiny_workflow, moved)
    assert summarize(changes) == {"renumbered": len(tiny_workflow)}, [str(c) for c in changes]
    assert "node 121 (CLIPTextEncode): was node 3" in [str(c) for c in changes]
    moved["121"]["inputs"]["text"] += ", blue hour"  # both edited too: paired by where each goes
    moved["120"]["inputs"]["text"] += ", watermark"
    changes = diff_workflows(tiny_workflow, moved)
    assert summarize(changes) == {"renumbered": len(tiny_workflow), "value_changed": 2}
    assert {(c.node_id, c.old) for c in changes if c.kind == "value_changed"} == {
        ("121", tiny_workflow["3"]["inputs"]["text"]),
        ("120", tiny_workflow["4"]["inputs"]["text"]),
    }


def test_a_node_muted_or_bypassed_in_an_editor_file_is_said_so_not_removed() -> None:
    """Two editor files differing in one node's mode: it was `removed` (it is not in the conversion)."""
    from runner.graph.diff import mark_modes

    a = {
        "1": {"class_type": "LoraLoaderModelOnly", "inputs": {}},
        "2": {"class_type": "SaveVideo", "inputs": {}},
    }
    b = {"2": a["2"]}
    changes = diff_workflows(a, b)
    muted = mark_modes(changes, {}, {"1": ("LoraLoaderModelOnly", 2), "2": ("SaveVideo", 0)})
    assert [str(c) for c in muted] == ["node 1 (LoraLoaderModelOnly): muted (mode 2): not run"]
    back = mark_modes(diff_workflows(b, a), {"1": ("LoraLoaderModelOnly", 4)}, {})
    assert [str(c) for c in back] == ["node 1 (LoraLoaderModelOnly): no longer bypassed"]
    assert summarize(back) == {"node_unbypassed": 1}
    assert mark_modes(changes, {}, {"1": ("Other", 2)}) == changes  # another node under that id: removed


def test_a_node_hidden_on_one_side_is_not_paired_with_another_of_its_class() -> None:
    """A muted node 6 on one side, a bypassed node 5 of the same class on the other: node 5 of A was
    paired with node 6 of B as `renumbered`, with a title and a link change; editor ids do not move."""

    mask = "LeanVideoFixtureAttentionMask"
    a = {"5": {"class_type": mask, "inputs": {"x": 1}, "_meta": {"title": "positive"}}}
    b = {"6": {"class_type": mask, "inputs": {"x": 2}, "_meta": {"title": "negative"}}}
    a_modes, b_modes = {"5": (mask, 0), "6": (mask, 2)}, {"5": (mask, 4), "6": (mask, 0)}
    changes = diff_workflows(a, b, (a_modes, b_modes))
    assert [str(c) for c in changes] == [
        f"node 5 ({mask}): bypassed (mode 4): its inputs pass through",
        f"node 6 ({mask}): no longer muted",
    ]


def test_a_change_inside_a_long_text_without_spaces_is_shown() -> None:
    """Tags joined by commas, or text in a script without spaces, was one "word": both sides printed
    the same head and tail around the change."""
    tags = ",".join(f"tag{n}" for n in range(400))
    a = {"3": {"class_type": "CLIPTextEncode", "inputs": {"text": tags}}}
    b = {"3": {"class_type": "CLIPTextEncode", "inputs": {"text": tags.replace("tag200,", "TAG200,")}}}
    said = str(diff_workflows(a, b)[0])
    shown = '"…tag197,tag198,tag199,tag200,tag201,tag202,tag203…" -> "…tag197,tag198,tag199,TAG200,tag201,'
    assert shown in said, said
    text = "日本語のテキスト" * 40
    b["3"]["inputs"]["text"] = text[:160] + "英語" + text[162:]
    a["3"]["inputs"]["text"] = text
    said = str(diff_workflows(a, b)[0])
    assert "英語" in said and len(said) < 400, said


def test_a_node_muted_on_one_side_and_bypassed_on_the_other_is_said_so() -> None:
    """Left out of both conversions, it was not mentioned at all."""
    from runner.graph.diff import mark_modes

    mask = "LeanVideoFreeVRAM"
    changes = mark_modes([], {"16": (mask, 2), "3": ("X", 2)}, {"16": (mask, 4), "3": ("X", 2)})
    assert [str(c) for c in changes] == [f"node 16 ({mask}): muted -> bypassed"]


def test_the_nodes_inside_a_muted_subgraph_node_are_said_so() -> None:
    """A muted subgraph instance leaves its inner nodes out of the conversion: they read `removed`."""
    from runner.graph.diff import mark_modes

    a = {"5:1": {"class_type": "KSampler", "inputs": {}}, "6": {"class_type": "SaveVideo", "inputs": {}}}
    b = {"6": a["6"]}
    sub = "00000000-0000-0000-0000-000000000005"
    changes = mark_modes(diff_workflows(a, b), {"5": (sub, 0)}, {"5": (sub, 2), "6": ("SaveVideo", 0)})
    assert [str(c) for c in changes] == ["node 5:1 (KSampler): not run: its subgraph node 5 is muted"]
    other = {**b, "7": {"class_type": "KSampler", "inputs": {"seed": 1}}}  # not to be paired with 5:1
    paired = diff_workflows(a, other, ({}, {"5": (sub, 2)}))
    assert {c.kind for c in paired} == {"node_muted", "node_added"}, [str(c) for c in paired]
    back = mark_modes(diff_workflows(b, a), {"5": (sub, 4)}, {"5": (sub, 0)})
    assert [str(c) for c in back] == [
        "node 5:1 (KSampler): runs again: its subgraph node 5 is no longer bypassed"
    ]
