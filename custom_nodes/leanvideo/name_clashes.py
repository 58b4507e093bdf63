"""Node ids this pack shares with another custom node pack. ComfyUI registers custom nodes by id in
the order it imports the packs, a later pack's node taking an earlier one's id without a word: a
workflow naming that id then runs whichever pack came last. Said as the pack registers its nodes (it
takes another's id) and once every pack is loaded (another took one of its ids).

Example::

    taken = clashes(nodes.NODE_CLASS_MAPPINGS, {"LeanVideoFreeVRAM": FreeVRAM})
    # {"LeanVideoFreeVRAM": "custom_nodes.other_pack"}: registered by another pack
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["clashes", "ours_by_id", "said_replaced", "said_taken"]


def ours_by_id(node_classes: Iterable[Any]) -> dict[str, Any]:
    """This pack's node classes by node id (their schema's ``node_id``)."""
    return {node.GET_SCHEMA().node_id: node for node in node_classes}


def clashes(registered: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, str]:
    """Each of ``ours`` (node id -> class) that ``registered`` (ComfyUI's ``NODE_CLASS_MAPPINGS``) holds
    under another class: its id -> the module of that class (``custom_nodes.other_pack``)."""
    return {
        node_id: str(getattr(registered[node_id], "RELATIVE_PYTHON_MODULE", registered[node_id].__module__))
        for node_id, node in ours.items()
        if node_id in registered and registered[node_id] is not node
    }


def said_taken(found: Mapping[str, str]) -> str:
    """What to say when this pack takes ids another pack registered first."""
    listed = ", ".join(f"{node_id} (of {module})" for node_id, module in found.items())
    return (
        f"LeanVideo: its nodes take the place of nodes another custom node pack registered under the same "
        f"id: {listed}; workflows naming them run LeanVideo's, until a pack loaded later takes them again"
    )


def said_replaced(found: Mapping[str, str]) -> str:
    """What to say when another pack, loaded later, took ids of this pack's nodes."""
    listed = ", ".join(f"{node_id} (now {module}'s)" for node_id, module in found.items())
    return (
        f"LeanVideo: a custom node pack loaded after it registers nodes under its ids and replaces them: "
        f"{listed}; workflows naming them run that pack's node, not LeanVideo's: remove or disable one "
        "of the two packs"
    )
