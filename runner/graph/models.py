"""Which model files a workflow needs: every loader input that names a file, with its models folder.

Loaders are known by class and input (stock ComfyUI's and LeanVideo's); any other input whose value
ends in ``.safetensors``, ``.ckpt``, ``.pt``, ``.pth``, ``.bin`` or ``.gguf`` is listed too, with the
folder unknown. An editor (UI) workflow can say where each file comes from: the ``properties.models``
entries (``name``, ``url``, ``directory``) the ComfyUI templates carry, read by :func:`model_sources`.

Example::

    for ref in required_models(load_workflow(Path("workflows/ltxv_t2v_int8.api.json"))):
        print(ref.node_id, ref.class_type, ref.folder, ref.name)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from runner.graph.subgraph import Node, flatten_subgraphs, is_editor_only, link_origin
from runner.graph.suggest import MODEL_SUFFIXES
from runner.graph.ui_shape import check_ui_shape
from runner.graph.workflow import Workflow, is_link

__all__ = [
    "MODEL_INPUTS",
    "ModelRef",
    "ModelSource",
    "model_sources",
    "required_models",
    "required_models_ui",
]

# (class_type, input) -> the models folder ComfyUI looks the file up in
MODEL_INPUTS: dict[tuple[str, str], str] = {
    ("CheckpointLoaderSimple", "ckpt_name"): "checkpoints",
    ("ImageOnlyCheckpointLoader", "ckpt_name"): "checkpoints",
    ("UNETLoader", "unet_name"): "diffusion_models",
    ("CLIPLoader", "clip_name"): "text_encoders",
    ("DualCLIPLoader", "clip_name1"): "text_encoders",
    ("DualCLIPLoader", "clip_name2"): "text_encoders",
    ("CLIPVisionLoader", "clip_name"): "clip_vision",
    ("VAELoader", "vae_name"): "vae",
    ("LoraLoader", "lora_name"): "loras",
    ("LoraLoaderModelOnly", "lora_name"): "loras",
    ("UpscaleModelLoader", "model_name"): "upscale_models",
    ("unCLIPCheckpointLoader", "ckpt_name"): "checkpoints",
    ("TripleCLIPLoader", "clip_name1"): "text_encoders",
    ("TripleCLIPLoader", "clip_name2"): "text_encoders",
    ("TripleCLIPLoader", "clip_name3"): "text_encoders",
    **{("QuadrupleCLIPLoader", f"clip_name{n}"): "text_encoders" for n in range(1, 5)},
    ("ControlNetLoader", "control_net_name"): "controlnet",
    ("DiffControlNetLoader", "control_net_name"): "controlnet",
    ("StyleModelLoader", "style_model_name"): "style_models",
    ("GLIGENLoader", "gligen_name"): "gligen",
    ("HypernetworkLoader", "hypernetwork_name"): "hypernetworks",
    ("PhotoMakerLoader", "photomaker_model_name"): "photomaker",
    ("ModelPatchLoader", "name"): "model_patches",
    ("AudioEncoderLoader", "audio_encoder_name"): "audio_encoders",
    ("LatentUpscaleModelLoader", "model_name"): "latent_upscale_models",
    ("LeanVideoDiffusionModelLoaderINT8", "unet_name"): "diffusion_models",
    ("LeanVideoCheckpointLoaderINT8", "ckpt_name"): "checkpoints",
    ("LeanVideoTextEncoderLoaderINT8", "clip_name"): "text_encoders",
}


# Choices of a loader's file input that name no file: ComfyUI builds them in (VAELoader's pixel_space)
BUILT_IN: dict[tuple[str, str], frozenset[str]] = {("VAELoader", "vae_name"): frozenset({"pixel_space"})}


@dataclass(frozen=True)
class ModelRef:
    """One model file a node of a workflow loads."""

    node_id: str
    class_type: str
    input_name: str
    name: str
    folder: str | None  # None: a file-like value of an input we do not know
    problem: str | None = None  # a loader's input without a file name: linked, or not a string


@dataclass(frozen=True)
class ModelSource:
    """Where a model file comes from, as a UI workflow's ``properties.models`` says."""

    name: str
    url: str
    directory: str
    cited_in: str  # the workflow (or template) that says so


def required_models(workflow: Workflow) -> list[ModelRef]:
    """Every model file ``workflow`` (API format) loads, in node order; each (node, input) once."""
    found: list[ModelRef] = []
    for node_id, node in workflow.items():
        class_type = str(node.get("class_type", ""))
        for input_name, value in (node.get("inputs") or {}).items():
            folder = MODEL_INPUTS.get((class_type, input_name))
            if not isinstance(value, str) or (folder is not None and not value.strip()):
                if folder is not None:  # a loader's file input must not vanish from the report
                    problem = (
                        f"linked to node {value[0]}: the file is chosen there, not checked"
                        if is_link(value)
                        else f"{value!r} is not a file name"
                    )
                    found.append(ModelRef(str(node_id), class_type, input_name, "", folder, problem))
                continue
            if value in BUILT_IN.get((class_type, input_name), ()):
                continue
            if folder is not None or value.lower().endswith(MODEL_SUFFIXES):
                found.append(ModelRef(str(node_id), class_type, input_name, value, folder))
    return found


def required_models_ui(ui_workflow: dict[str, Any]) -> list[ModelRef]:
    """:func:`required_models` of an editor (UI) workflow, read without a server: each node's file-like
    widget values, named after the loader's file inputs in order where the class is known
    (``widgets_values`` holds the widgets in their declared order), else ``widget N``.

    Subgraphs are expanded as the editor runs them (:func:`~runner.graph.subgraph.flatten_subgraphs`):
    an inner node is ``"<instance>:<inner>"``, and a file widget promoted to the instance takes the
    instance's value, not the inner node's stale one. A file input linked to a primitive takes its
    value; linked to another node, it is listed as chosen there. Raises :class:`WorkflowError` for a
    damaged file (see :func:`~runner.graph.ui_shape.check_ui_shape`)."""
    check_ui_shape(ui_workflow)
    nodes, rows = flatten_subgraphs(ui_workflow)
    by_id = {str(node.get("id")): node for node in nodes}
    origins = {int(row[0]): str(row[1]) for row in rows}
    found: list[ModelRef] = []
    for node in nodes:
        class_type = str(node.get("type", ""))
        if is_editor_only(node):  # not in the API workflow (a primitive's value is its loader's too)
            continue
        values = node.get("widgets_values")
        named = list(values.items()) if isinstance(values, dict) else list(enumerate(values or []))
        inputs = [name for (kind, name) in MODEL_INPUTS if kind == class_type]
        linked = {
            slot.get("name"): slot.get("link") for slot in node.get("inputs") or [] if slot.get("widget")
        }
        for key, value in named:
            if isinstance(key, str):  # widgets saved by name
                input_name, folder = key, MODEL_INPUTS.get((class_type, key))
            elif key < len(inputs):  # a known loader: its file widgets come first, in declared order
                input_name = inputs[key]
                folder = MODEL_INPUTS[(class_type, input_name)]
            else:
                input_name, folder = f"widget {key}", None
            named_file = isinstance(value, str) and value.lower().endswith(MODEL_SUFFIXES)
            built_in = isinstance(value, str) and value in BUILT_IN.get((class_type, input_name), ())
            if (folder is None and not named_file) or built_in:
                continue
            usable = isinstance(value, str) and bool(value.strip())
            problem = None if usable else f"{json.dumps(value)} is not a file name"
            ref = ModelRef(
                str(node.get("id")), class_type, input_name, value if usable else "", folder, problem
            )
            if linked.get(input_name) is not None:
                ref = _linked_ref(replace(ref, problem=None), _source(linked[input_name], by_id, origins))
            found.append(ref)
    return found


def _source(link: Any, nodes: dict[str, Node], origins: dict[int, str]) -> tuple[str | None, Any]:
    """Where a link's value comes from (:func:`~runner.graph.subgraph.link_origin`): ``("value", v)``
    from a primitive, ``("node", id)`` from another node, ``(None, None)`` if nothing."""
    node = link_origin(link, nodes, origins)
    if node is None:
        return None, None
    if node.get("type") == "PrimitiveNode":
        values = node.get("widgets_values")
        return "value", values[0] if isinstance(values, list) and values else None
    return "node", str(node.get("id"))


def _linked_ref(ref: ModelRef, source: tuple[str | None, Any]) -> ModelRef:
    """``ref`` (read from the node's own widget) as the link into that widget sets it."""
    kind, value = source
    if kind == "value":
        if isinstance(value, str) and value.strip():
            return replace(ref, name=value)
        return replace(ref, name="", problem=f"{json.dumps(value)} is not a file name")
    if kind == "node":
        return replace(ref, name="", problem=f"linked to node {value}: the file is chosen there, not checked")
    return ref  # a link from nowhere: the editor runs the widget's own value


def _ui_nodes(ui_workflow: dict[str, Any]) -> list[dict[str, Any]]:
    """The node objects of an editor file and its subgraphs; what is not shaped so is passed over (a
    twin or a template is read only for download links)."""
    graphs = [ui_workflow]
    definitions = ui_workflow.get("definitions")
    if isinstance(definitions, dict) and isinstance(definitions.get("subgraphs"), list):
        graphs += [g for g in definitions["subgraphs"] if isinstance(g, dict)]
    return [n for g in graphs if isinstance(g.get("nodes"), list) for n in g["nodes"] if isinstance(n, dict)]


def model_sources(ui_workflow: dict[str, Any], cited_in: str) -> dict[str, ModelSource]:
    """``{file name: source}`` from the ``properties.models`` of an editor workflow's nodes (subgraphs
    included); entries without a name or URL are skipped."""
    sources: dict[str, ModelSource] = {}
    for node in _ui_nodes(ui_workflow):
        properties = node.get("properties")
        entries = properties.get("models") if isinstance(properties, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            name, url = entry.get("name"), entry.get("url")
            if isinstance(name, str) and isinstance(url, str) and name not in sources:
                sources[name] = ModelSource(name, url, str(entry.get("directory") or ""), cited_in)
    return sources
