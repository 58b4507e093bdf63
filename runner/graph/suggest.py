"""Name suggestions for an unknown name: the nearest known names, else what is known.

Example::

    close_hint("KSamplr", ["KSampler", "VAEDecode"])  # '; close matches: KSampler'
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

MODEL_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".sft", ".onnx")
FIXTURE_PREFIX = "LeanVideoFixture"  # the tiny models' helper nodes, loaded by serve --fixture-nodes


PACK_PREFIX = "LeanVideo"  # the node pack's own nodes


def unknown_node_hint(class_type: str, known: Iterable[str] = ()) -> str | None:
    """What to do about an unknown node type that is one of the tiny models' helper nodes, or one of
    the node pack's while the server has none of them (``known``: its node types), else None."""
    if class_type.startswith(FIXTURE_PREFIX):
        return (
            ": it is the tiny models' helper node, which a server loads when started with leanvideo serve "
            "--fixture-nodes (a bench's own servers: fixtures = true in its matrix's [bench])"
        )
    pack_nodes = (
        str(k) for k in known if str(k).startswith(PACK_PREFIX) and not str(k).startswith(FIXTURE_PREFIX)
    )
    if class_type.startswith(PACK_PREFIX) and next(pack_nodes, None) is None:
        return (
            ": it is a LeanVideo node and the server has none of them: the node pack is not installed "
            "there, or it failed to load (its log says IMPORT FAILED, or the pack's models folders "
            "are gone)"
        )
    return None


# How the editor names a subgraph's node type: its definition's id, a UUID
SUBGRAPH_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def missing_type_hint(class_type: str, known: Iterable[str], properties: Any = None) -> str:
    """Why the server lacks node type ``class_type`` (``known``: its types) and what to do: one of
    LeanVideo's (:func:`unknown_node_hint`), a subgraph left without its definition, a node of the
    custom pack an editor file's node names in its ``properties`` (``cnr_id``, ``aux_id``), the
    closest types the server has, else a pack not installed there."""
    names = [str(name) for name in known]
    ours = unknown_node_hint(class_type, names)
    if ours:
        return ours
    if SUBGRAPH_ID.fullmatch(class_type):
        return (
            ": it is a subgraph's id, and the file's definitions.subgraphs has no subgraph of that id "
            "(save the workflow again from the editor)"
        )
    listed = properties if isinstance(properties, dict) else {}
    pack = next((str(listed[k]) for k in ("cnr_id", "aux_id") if isinstance(listed.get(k), str)), None)
    if pack == "comfy-core":  # saved by a newer ComfyUI (its "ver": the ComfyUI version)
        version = f" {listed['ver']}" if isinstance(listed.get("ver"), str) else ""
        return (
            f": a core node of ComfyUI{version} (its properties say comfy-core), which the server's "
            "ComfyUI is too old to have: run it on a ComfyUI that has it"
        )
    if pack:
        return (
            f": a node of the custom node pack {pack!r} (its properties say so), which the server does not "
            "have: install it there (ComfyUI-Manager), or read the server's log for IMPORT FAILED"
        )
    return close_hint(class_type, names, listed=()) or (
        ": the server has no node of that name: a custom node pack not installed there, or one that failed "
        "to load (its log says IMPORT FAILED)"
    )


def close_hint(
    word: str,
    candidates: Iterable[object],
    label: str = "matches",
    known: str = "the server has",
    listed: Iterable[object] | None = None,
) -> str:
    """``; close matches: …`` (up to five, nearest first), else ``; the server has: …`` (the first
    dozen of ``listed``, by default the candidates, sorted). Names are compared in lower case, and file
    names without their extension: every ``.safetensors`` name is a little alike."""
    names = sorted({str(c) for c in candidates})
    shown = names if listed is None else sorted({str(c) for c in listed})
    stems = {name: _stem(name) for name in names}
    ranked = difflib.get_close_matches(_stem(word), list(dict.fromkeys(stems.values())), n=5, cutoff=0.6)
    close = [name for stem in ranked for name in names if stems[name] == stem][:5]
    if close:
        return f"; close {label}: {', '.join(close)}"
    return f"; {known}: {', '.join(shown[:12])}{'…' if len(shown) > 12 else ''}" if shown else ""


def _stem(name: str) -> str:
    """``name`` as names are compared: without a model file's extension, and in lower case (a name in
    another case is the likeliest mistake of all, and ComfyUI reads names with their case)."""
    lower = name.lower()
    return next((lower.removesuffix(suffix) for suffix in MODEL_SUFFIXES if lower.endswith(suffix)), lower)
