"""What the node pack's INT8 loaders would refuse in a model file, read from its header before any run:
a layout they do not know, a model of another kind, or a float file while ``quantize_on_load`` is off.

Example::

    quantizes = quantize_on_load_by_node(document)  # {node id: quantize_on_load}
    loader = "LeanVideoDiffusionModelLoaderINT8"
    problem = int8_layout_problem(path, loader, quantize_on_load=quantizes.get("3", True))
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from runner.graph.subgraph import flatten_subgraphs, link_origin
from runner.graph.workflow import is_link, is_ui_workflow

logger = logging.getLogger(__name__)

__all__ = ["INT8_LOADERS", "int8_layout_problem", "quantize_on_load_by_node"]

# The node pack's INT8 loaders, and whether each reads its file's diffusion model only (a full checkpoint)
INT8_LOADERS: dict[str, bool] = {
    "LeanVideoDiffusionModelLoaderINT8": True,
    "LeanVideoCheckpointLoaderINT8": True,
    "LeanVideoTextEncoderLoaderINT8": False,
}
# Where each loader's quantize_on_load is among its widgets, as an editor file lists their values
# (its declared inputs in order: the file, the text encoder's type, compute_dtype, path, quantize_on_load)
QUANTIZE_ON_LOAD_WIDGET = {
    "LeanVideoDiffusionModelLoaderINT8": 3,
    "LeanVideoCheckpointLoaderINT8": 3,
    "LeanVideoTextEncoderLoaderINT8": 4,
}
# The editor's nodes whose value a link into a widget carries
PRIMITIVES = ("PrimitiveNode", "PrimitiveBoolean")
# The formats a loader quantizes while loading, which it refuses with quantize_on_load off
QUANTIZED_ON_LOAD = ("float", "fp8")

CHECKPOINT_LOADER = "LeanVideoCheckpointLoaderINT8"
# Where a checkpoint's VAE is, by the model configs of ComfyUI v0.3.75 (``vae_key_prefix``)
VAE_PREFIXES = ("vae.", "first_stage_model.", "pretransform.model.", "conditioner.embedders.1.encoder.")


def quantize_on_load_by_node(document: Any) -> dict[str, bool]:
    """``{node id: quantize_on_load}`` of the INT8 loaders of a workflow (API or editor format, the
    editor's subgraphs expanded as :func:`~runner.graph.subgraph.flatten_subgraphs` names their nodes)
    whose value is a boolean, also from a Boolean or primitive node linked to it; another linked or a
    missing value is not listed (the loader's default is on)."""
    found: dict[str, bool] = {}
    if not isinstance(document, dict):
        return found
    if is_ui_workflow(document):
        nodes, rows = flatten_subgraphs(document)
        by_id = {str(node.get("id")): node for node in nodes}
        origins = {int(row[0]): str(row[1]) for row in rows}
        for node in nodes:
            index = QUANTIZE_ON_LOAD_WIDGET.get(str(node.get("type")))
            values = node.get("widgets_values")
            if index is None:
                continue
            slots = [slot for slot in node.get("inputs") or [] if slot.get("name") == "quantize_on_load"]
            link = slots[0].get("link") if slots else None
            if link is not None:  # linked: the widget's own value in the file is stale
                source = link_origin(link, by_id, origins) or {}
                given = source.get("widgets_values") if source.get("type") in PRIMITIVES else None
                value = given[0] if isinstance(given, list) and given else None
            elif isinstance(values, dict):  # widgets saved by name
                value = values.get("quantize_on_load")
            else:
                value = values[index] if isinstance(values, list) and len(values) > index else None
            if isinstance(value, bool):
                found[str(node.get("id"))] = value
        return found
    for node_id, node in document.items():
        if isinstance(node, dict) and node.get("class_type") in INT8_LOADERS:
            value = (node.get("inputs") or {}).get("quantize_on_load")
            feeding = document.get(str(value[0])) if is_link(value) and value is not None else None
            if isinstance(feeding, dict) and feeding.get("class_type") == "PrimitiveBoolean":
                value = (feeding.get("inputs") or {}).get("value")  # a Boolean node feeding it
            if isinstance(value, bool):
                found[str(node_id)] = value
    return found


def int8_layout_problem(path: Path, class_type: str, *, quantize_on_load: bool = True) -> str | None:
    """What the node pack's INT8 loader ``class_type`` would refuse in ``path``'s header (a format it
    does not know or is newer than it, an int8 weight without its scale or with one of the wrong shape,
    a model of another kind: a LoRA, a VAE, a checkpoint where a text encoder goes, a float or fp8 file
    with ``quantize_on_load`` off), or None; files of other loaders are not looked into. Imports torch,
    for those files only."""
    if class_type not in INT8_LOADERS or path.suffix.lower() != ".safetensors":
        return None
    try:
        from leanvideo.int8.files import diffusion_model_keys, read_header
        from leanvideo.int8.formats import check_int8_header
        from leanvideo.int8.policy import describe_misplaced
        from leanvideo.int8.spec import Int8FormatError
    except ImportError as exc:  # torch broken or missing: the presence check still stands
        logger.warning("the INT8 layout of %s was not checked: %s", path, exc)
        return None

    dit = INT8_LOADERS[class_type]
    try:
        header = read_header(path)
        keys = diffusion_model_keys(header) if dit else None
        found = check_int8_header(path, keys)
        if found in QUANTIZED_ON_LOAD and not quantize_on_load:  # the loader's words
            return (
                f"{class_type} would refuse it: holds no INT8 weights ({found}) and its quantize_on_load "
                "is off; turn it on to quantize the file while loading"
            )
        # a LoRA, a VAE, a text encoder where a diffusion model goes (or one where a text encoder goes),
        # by its keys, as the loaders tell it
        wanted = "diffusion model" if dit else "text encoder"
        misplaced = describe_misplaced(keys or list(header.dtypes), source=str(path), wanted=wanted)
        if (
            not misplaced
            and class_type == CHECKPOINT_LOADER
            and not any(key.startswith(VAE_PREFIXES) for key in header.dtypes)
        ):
            misplaced = (  # the loader's words, short of its model config's exact prefix
                "holds no VAE (no tensor starts with any of ComfyUI's VAE prefixes, "
                f"{', '.join(VAE_PREFIXES)}); it is a diffusion model alone: load it with Load Diffusion "
                "Model (INT8) and its VAE with Load VAE"
            )
    except Int8FormatError as error:
        misplaced = str(error)
    return f"{class_type} would refuse it: {misplaced.removeprefix(f'{path}: ')}" if misplaced else None
