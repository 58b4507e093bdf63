"""`leanvideo models check`: every model file a workflow loads, present (size, sha256) or missing (URL,
its citation, target folder); URLs from the editor twin's properties.models, then the installed
ComfyUI templates."""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
from pathlib import Path

import pytest
import torch
from leanvideo.int8.header import encode_header
from leanvideo.int8.spec import FORMAT_VERSION, METADATA_KEY

from runner.cli.main import main
from runner.errors import WorkflowError
from runner.graph.convert import convert_ui_workflow
from runner.graph.models import ModelRef, ModelSource, model_sources, required_models, required_models_ui
from runner.graph.workflow import is_ui_workflow
from runner.jobs.models import check_models, template_documents, template_sources
from runner.local.extra_model_paths import read_extra_model_paths
from runner.local.server import ComfyServer
from runner.local.server_config import ServerConfig, write_extra_model_paths
from runner.local.workspace import WORKFLOWS_DIR, Workspace
from runner.transport.client import ComfyClient
from tests.ui_export import RELEASE_SOURCES

WORKFLOW = {
    "1": {"class_type": "LeanVideoDiffusionModelLoaderINT8", "inputs": {"unet_name": "dit.safetensors"}},
    "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "te.safetensors", "type": "ltxv"}},
    "3": {"class_type": "LoraLoaderModelOnly", "inputs": {"lora_name": "l.safetensors", "model": ["1", 0]}},
    "4": {"class_type": "SomeCustomLoader", "inputs": {"path": "odd.gguf", "strength": 1.0}},
    "5": {"class_type": "KSampler", "inputs": {"sampler_name": "euler", "model": ["3", 0]}},
}
UI_TWIN = {
    "nodes": [
        {
            "type": "CLIPLoader",
            "properties": {
                "models": [{"name": "te.safetensors", "url": "https://e.x/te", "directory": "text_encoders"}]
            },
        }
    ],
    "definitions": {
        "subgraphs": [
            {
                "nodes": [
                    {
                        "properties": {
                            "models": [
                                {"name": "l.safetensors", "url": "https://e.x/l", "directory": "loras"}
                            ]
                        }
                    }
                ]
            }
        ]
    },
}


def int8_file(scale_shape: tuple[int, ...] = (2, 1), version: int = FORMAT_VERSION) -> bytes:
    """A whole LeanVideo INT8 safetensors file of one [2, 4] layer: what the INT8 loaders read."""
    specs = [("a.weight", "I8", (2, 4)), ("a.weight_scale", "F32", scale_shape)]
    header, ranges = encode_header(specs, {METADATA_KEY: json.dumps({"format_version": version})})
    scales = struct.pack(f"<{math.prod(scale_shape)}f", *[0.5] * math.prod(scale_shape))
    assert ranges["a.weight_scale"][1] == 8 + len(scales)
    return header + bytes(range(8)) + scales


# A small whole model file (every loader's stand-in; the INT8 loaders' headers are looked into)
WEIGHTS = int8_file()


def write(tmp_path: Path) -> tuple[Path, Path]:
    """The workflow (API + editor twin) and a models folder with the DiT under the ``unet`` alias."""
    path = tmp_path / "wf.api.json"
    path.write_text(json.dumps(WORKFLOW), encoding="utf-8")
    (tmp_path / "wf.ui.json").write_text(json.dumps(UI_TWIN), encoding="utf-8")
    models = tmp_path / "models"
    (models / "unet").mkdir(parents=True)
    (models / "unet" / "dit.safetensors").write_bytes(WEIGHTS)
    return path, models


def test_required_models_lists_loader_inputs_with_their_folders() -> None:
    refs = required_models(WORKFLOW)
    assert [(r.node_id, r.input_name, r.name, r.folder) for r in refs] == [
        ("1", "unet_name", "dit.safetensors", "diffusion_models"),
        ("2", "clip_name", "te.safetensors", "text_encoders"),
        ("3", "lora_name", "l.safetensors", "loras"),
        ("4", "path", "odd.gguf", None),  # a file-like value of an input no table knows
    ]
    sources = model_sources(UI_TWIN, "wf.ui.json")
    assert sources["l.safetensors"] == ModelSource("l.safetensors", "https://e.x/l", "loras", "wf.ui.json")


def test_check_finds_aliases_hashes_on_request_and_says_where_missing_files_come_from(tmp_path: Path) -> None:
    path, models = write(tmp_path)
    report = check_models(path, models, hashes=True, templates={})
    by_name = {f.name: f for f in report.files}
    dit = by_name["dit.safetensors"]
    assert (
        dit.status == "present"
        and dit.bytes == len(WEIGHTS)
        and dit.path == str(models / "unet" / "dit.safetensors")
    )
    assert dit.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    te = by_name["te.safetensors"]
    assert (te.status, te.url, te.cited_in, te.target) == (
        "missing",
        "https://e.x/te",
        "wf.ui.json",
        str(models / "text_encoders"),
    )
    assert by_name["l.safetensors"].url == "https://e.x/l"  # from a subgraph of the twin
    odd = by_name["odd.gguf"]
    assert odd.status == "missing" and odd.url is None and odd.target is None
    assert report.missing == 3


def test_the_cli_exits_1_when_something_is_missing_and_0_when_all_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, models = write(tmp_path)
    assert main(["models", "check", str(path), "--models", str(models), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["missing"] == 3 and len(document["files"]) == 4
    assert main(["models", "check", str(path), "--models", str(models)]) == 1
    out = capsys.readouterr().out
    assert "missing text_encoders/te.safetensors" in out and "get it from https://e.x/te" in out
    for name, folder in (
        ("te.safetensors", "text_encoders"),
        ("l.safetensors", "loras"),
        ("odd.gguf", "vae"),
    ):
        (models / folder).mkdir(exist_ok=True)
        (models / folder / name).write_bytes(WEIGHTS)
    assert main(["models", "check", str(path), "--models", str(models)]) == 0
    assert "all 4 file(s) present" in capsys.readouterr().out
    assert main(["models", "check", str(tmp_path / "nope.api.json"), "--models", str(models)]) == 5
    with pytest.raises(SystemExit) as refused:  # an unset variable, not the current folder
        main(["models", "check", str(path), "--models", ""])
    assert refused.value.code == 2 and "an empty path" in capsys.readouterr().err


def test_a_custom_loader_of_unknown_folder_is_said_without_question_marks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gguf.api.json"
    loader = {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": "wan-q8.gguf"}}
    path.write_text(json.dumps({"1": loader}), encoding="utf-8")
    (models := tmp_path / "models").mkdir()
    assert main(["models", "check", str(path), "--models", str(models)]) == 1
    out = capsys.readouterr().out
    assert "missing wan-q8.gguf  node 1 (UnetLoaderGGUF.unet_name)" in out and "?" not in out
    assert "it goes in the folder UnetLoaderGGUF reads (see that node's documentation)" in out


def test_a_misnamed_or_misplaced_file_is_pointed_at_and_no_loader_input_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, models = write(tmp_path)
    (models / "loras").mkdir()
    (models / "loras" / "L.safetensors").write_bytes(WEIGHTS)  # another case
    (models / "vae").mkdir()
    (models / "vae" / "te.safetensors").write_bytes(WEIGHTS)  # another folder
    (models / "unet" / "dit-v2.safetensors").write_bytes(WEIGHTS)
    workflow = json.loads(path.read_text(encoding="utf-8"))
    workflow["6"] = {"class_type": "UNETLoader", "inputs": {"unet_name": "dit-v3.safetensors"}}
    workflow["7"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": 123}}
    workflow["8"] = {"class_type": "VAELoader", "inputs": {"vae_name": ["9", 0]}}
    workflow["9"] = {"class_type": "UpscaleModelLoader", "inputs": {"model_name": ""}}
    workflow["10"] = {"class_type": "LoraLoader", "inputs": {"lora_name": "deep.safetensors"}}
    (models / "loras" / "styles").mkdir()
    (models / "loras" / "styles" / "deep.safetensors").write_bytes(WEIGHTS)
    path.write_text(json.dumps(workflow), encoding="utf-8")
    by_node = {f.node_id: f for f in check_models(path, models, templates={}).files}
    said = "loras/L.safetensors is there: ComfyUI reads names with their case; use that name"
    assert by_node["3"].hint == said
    assert by_node["2"].hint == "it is in vae/te.safetensors; this loader reads text_encoders/, clip/"
    assert by_node["6"].hint == "close names there: dit-v2.safetensors, dit.safetensors"
    assert (by_node["7"].status, by_node["7"].hint) == ("invalid", "123 is not a file name")
    assert by_node["8"].status == "unchecked" and by_node["8"].hint.startswith("linked to node 9")
    assert (by_node["9"].status, by_node["9"].hint) == ("invalid", "'' is not a file name")
    assert by_node["10"].hint == "it is in loras/styles/deep.safetensors: name it styles/deep.safetensors"
    assert main(["models", "check", str(path), "--models", str(models)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "invalid node 7 (CheckpointLoaderSimple.ckpt_name): 123 is not a file name" in out
    assert "7 file(s) missing or invalid; 1 chosen by a link, not checked" in out


def test_urls_come_from_the_installed_comfyui_templates() -> None:
    """The shipped Wan 2.1 workflow's VAE and text encoder are named as the templates name them."""
    sources = template_sources()
    assert len(sources) > 50
    vae = sources["wan_2.1_vae.safetensors"]
    assert vae.url.startswith("https://huggingface.co/Comfy-Org/") and vae.directory == "vae"
    assert vae.cited_in.startswith("template ")
    report = check_models(WORKFLOWS_DIR / "wan21_t2v_int8.api.json", Path("/nonexistent"), templates=sources)
    assert {f.name: f.url for f in report.files}["wan_2.1_vae.safetensors"] == vae.url


MANIFEST = json.loads((WORKFLOWS_DIR / "manifest.json").read_text(encoding="utf-8"))["workflows"]
FULL_SIZE = sorted(n for n, e in MANIFEST.items() if e["models"] == "full" and e["format"] == "api")


def _citable_urls() -> dict[str, set[str]]:
    """Every URL an installed ComfyUI template gives for a file name, and the release pages' URLs."""
    urls: dict[str, set[str]] = {}
    for file_name, document in template_documents():
        for name, source in model_sources(document, file_name).items():
            urls.setdefault(name, set()).add(source.url)
    for name, (url, _) in RELEASE_SOURCES.items():
        urls.setdefault(name, set()).add(url)
    return urls


@pytest.mark.parametrize("name", FULL_SIZE)
def test_every_file_of_a_shipped_workflow_comes_with_a_citable_url(name: str, tmp_path: Path) -> None:
    """Each model file a shipped full-size workflow loads is named as a template or its release page names
    it, and its editor twin alone (no template lookup) gives the URL and the folder it goes in."""
    citable = _citable_urls()
    report = check_models(WORKFLOWS_DIR / name, tmp_path, templates={})
    assert report.files and report.missing == len(report.files)
    for file in report.files:
        assert file.name in citable, f"{name}: {file.name} is named by no template and no release page"
        assert file.url in citable[file.name], f"{name}: {file.name} has the uncited URL {file.url}"
        assert file.cited_in == name.replace(".api.json", ".ui.json")
        assert file.folder and file.target == str(tmp_path / file.folder)


@pytest.mark.parametrize("twin", sorted(p.name for p in WORKFLOWS_DIR.glob("*.ui.json")))
def test_an_editor_file_lists_the_models_its_api_twin_does(twin: str, tmp_path: Path) -> None:
    """``models check`` takes the editor (UI) file too, without a server: the same files, folders,
    nodes and inputs as its API twin, and the same report."""
    ui = json.loads((WORKFLOWS_DIR / twin).read_text(encoding="utf-8"))
    api = json.loads((WORKFLOWS_DIR / twin.replace(".ui.json", ".api.json")).read_text(encoding="utf-8"))
    assert required_models_ui(ui) == required_models(api)
    from_ui = check_models(WORKFLOWS_DIR / twin, tmp_path, templates={})
    from_api = check_models(WORKFLOWS_DIR / twin.replace(".ui.json", ".api.json"), tmp_path, templates={})
    assert [(f.name, f.status, f.url, f.target) for f in from_ui.files] == [
        (f.name, f.status, f.url, f.target) for f in from_api.files
    ]


def test_muted_bypassed_and_editor_only_nodes_load_nothing() -> None:
    """What the API conversion leaves out (muted, bypassed, the editor's own nodes) loads no model."""
    ui = json.loads((WORKFLOWS_DIR / "wan21_t2v_int8.ui.json").read_text(encoding="utf-8"))
    names = {ref.name for ref in required_models_ui(ui)}
    lora = next(node for node in ui["nodes"] if node["type"] == "LoraLoaderModelOnly")
    lora["mode"] = 4  # bypassed
    vae = next(node for node in ui["nodes"] if node["type"] == "VAELoader")
    vae["mode"] = 2  # muted
    primitive = {"id": 99, "type": "PrimitiveNode", "widgets_values": ["wan_2.1_vae.safetensors"]}
    ui["nodes"].append(primitive)
    left = {ref.name for ref in required_models_ui(ui)}
    assert left == names - {lora["widgets_values"][0], vae["widgets_values"][0]}


def test_with_a_users_own_comfyui_its_models_folder_is_searched_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``install.py --comfyui ~/ComfyUI`` the user's models are in that ComfyUI's ``models``; the
    workspace's folder (the tiny models) is searched too, and a missing file goes to the user's."""
    path, workspace_models = write(tmp_path)  # the DiT is in the workspace's models folder
    user = tmp_path / "ComfyUI"
    (user / "models" / "text_encoders").mkdir(parents=True)
    (user / "models" / "text_encoders" / "te.safetensors").write_bytes(WEIGHTS)
    (user / "main.py").write_text("")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "models").symlink_to(workspace_models)
    monkeypatch.setenv("LEANVIDEO_WORKSPACE", str(workspace))
    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(user))
    assert main(["models", "check", str(path), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert (document["models_dir"], document["also"]) == (str(user / "models"), [str(workspace / "models")])
    files = {f["name"]: f for f in document["files"]}
    assert files["te.safetensors"]["path"] == str(user / "models" / "text_encoders" / "te.safetensors")
    assert files["dit.safetensors"]["status"] == "present"
    assert files["l.safetensors"]["target"] == str(user / "models" / "loras")
    # a tiny model is to be written into the workspace's folder, not the user's ComfyUI
    workflow = json.loads(path.read_text(encoding="utf-8"))
    workflow["6"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "ltxv-tiny.safetensors"}}
    path.write_text(json.dumps(workflow), encoding="utf-8")
    assert main(["models", "check", str(path), "--json"]) == 1
    files = {f["name"]: f for f in json.loads(capsys.readouterr().out)["files"]}
    said = f"write it with `leanvideo fixtures {workspace / 'models'}`"
    assert files["ltxv-tiny.safetensors"]["hint"].endswith(said)
    assert files["ltxv-tiny.safetensors"]["target"] == str(workspace / "models" / "checkpoints")


# Sections of an extra_model_paths.yaml: one after the ComfyUI's models, one put before them
BACK = "back:\n  base_path: ../back\n  loras: loras\n"
FRONT = "base_path: ../front\n  is_default: true\n"


def users_comfyui(tmp_path: Path, extra_model_paths: str) -> Path:
    """A user's ComfyUI folder at ``tmp_path / "ComfyUI"`` with the ``extra_model_paths.yaml`` given."""
    user = tmp_path / "ComfyUI"
    user.mkdir()
    (user / "main.py").write_text("")
    (user / "extra_model_paths.yaml").write_text(extra_model_paths, encoding="utf-8")
    return user


def test_the_folders_of_the_users_extra_model_paths_yaml_are_searched_as_its_servers_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ComfyUI's main.py loads the ``extra_model_paths.yaml`` beside it, so the servers LeanVideo starts
    from a user's ComfyUI found a LoRA there that `models check` called missing (exit 1)."""
    path, workspace_models = write(tmp_path)
    user = users_comfyui(
        tmp_path,
        "mine:\n  base_path: ../shared\n  is_default: true\n  loras: |\n    elsewhere\n    my-loras\n"
        "other:\n",
    )
    (user / "models" / "text_encoders").mkdir(parents=True)
    (user / "models" / "text_encoders" / "te.safetensors").write_bytes(WEIGHTS)
    shared = tmp_path / "shared"
    (shared / "my-loras").mkdir(parents=True)
    (shared / "my-loras" / "l.safetensors").write_bytes(WEIGHTS)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "models").symlink_to(workspace_models)
    monkeypatch.setenv("LEANVIDEO_WORKSPACE", str(workspace))
    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(user))
    assert main(["models", "check", str(path), "--json"]) == 1  # odd.gguf (node 4) is missing
    document = json.loads(capsys.readouterr().out)
    assert document["extra_paths"] == str(user / "extra_model_paths.yaml")
    files = {f["name"]: f for f in document["files"]}
    assert files["l.safetensors"]["path"] == str(shared / "my-loras" / "l.safetensors")
    assert [f["name"] for f in document["files"] if f["status"] != "present"] == ["odd.gguf"]
    assert main(["models", "check", str(path)]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert f"(and the folders {user / 'extra_model_paths.yaml'} adds)" in said
    assert f"at {shared / 'my-loras' / 'l.safetensors'}" in said
    # a file ComfyUI would not start with is named, not a traceback
    (user / "extra_model_paths.yaml").write_text("mine:\n  loras: [a, b]\n", encoding="utf-8")
    assert main(["models", "check", str(path)]) == 2
    assert "extra_model_paths.yaml: mine.loras is not a path" in capsys.readouterr().err


def test_files_are_found_in_the_order_the_users_comfyui_searches_its_folders(tmp_path: Path) -> None:
    """A user's ComfyUI searches the ``is_default`` folders of its ``extra_model_paths.yaml``, then its
    own ``models``, then the file's other folders; the workspace's come last. `models check` searched
    the workspace's before the file's folders, so a cut-short file there under a tiny model's name was
    `present` while the server loaded the other one and failed."""
    path, models = write(tmp_path)
    for folder in ("front", "back", "ws"):
        (tmp_path / folder / "loras").mkdir(parents=True)
    users_comfyui(tmp_path, f"{BACK}front:\n  {FRONT}  loras: |\n    nowhere\n    loras\n")
    extra = read_extra_model_paths(tmp_path / "ComfyUI" / "extra_model_paths.yaml")
    assert extra.first == {"loras": [tmp_path / "front" / "loras", tmp_path / "front" / "nowhere"]}
    assert extra.after == {"loras": [tmp_path / "back" / "loras"]}

    def found(*where: str) -> str | None:
        for folder in ("front", "back", "ws"):
            (tmp_path / folder / "loras" / "l.safetensors").unlink(missing_ok=True)
        (models / "loras").mkdir(exist_ok=True)
        (models / "loras" / "l.safetensors").unlink(missing_ok=True)
        for folder in where:
            target = models if folder == "models" else tmp_path / folder
            (target / "loras" / "l.safetensors").write_bytes(WEIGHTS)
        report = check_models(path, models, also=[tmp_path / "ws"], templates={}, extra=extra)
        (lora,) = [f for f in report.files if f.name == "l.safetensors"]
        return Path(lora.path).parents[1].name if lora.path else None

    assert found("front", "models", "back", "ws") == "front"
    assert found("models", "back", "ws") == "models"
    assert found("back", "ws") == "back"  # the workspace's came first
    assert found("ws") == "ws"
    assert found() is None


@pytest.mark.integration
def test_servers_of_a_users_comfyui_search_its_folders_in_its_own_order(
    workspace: Workspace, tmp_path: Path
) -> None:
    """The pinned ComfyUI loads the user's ``extra_model_paths.yaml``, then the servers' own file: the
    folders of the user's (not ``is_default``) came before the user's ``models``, where that ComfyUI
    launched by its user searches ``models`` first."""
    user = users_comfyui(tmp_path, f"{BACK}front:\n  {FRONT}  loras: |\n    second\n    first\n")
    (user / "models" / "loras").mkdir(parents=True)
    state = tmp_path / "state"
    state.mkdir()
    config = ServerConfig(user, state, tmp_path / "ws", extra_models_dirs=(user / "models",))
    ours = write_extra_model_paths(config)
    loads = (
        f"import json, sys; sys.path.insert(0, {str(workspace.comfyui_dir)!r}); import folder_paths; "
        "import utils.extra_config as e; [e.load_extra_path_config(p) for p in sys.argv[1:]]; "
        "print(json.dumps(folder_paths.get_folder_paths('loras')))"
    )
    argv = [str(workspace.python), "-c", loads, str(user / "extra_model_paths.yaml"), str(ours)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    searched = [Path(p) for p in json.loads(done.stdout.splitlines()[-1]) if p.startswith(str(tmp_path))]
    assert searched == [
        tmp_path / "front" / "first",
        tmp_path / "front" / "second",
        user / "models" / "loras",
        tmp_path / "back" / "loras",
        tmp_path / "ws" / "loras",
    ]
    extra = read_extra_model_paths(user / "extra_model_paths.yaml")  # what `models check` reads
    assert [*extra.first["loras"], user / "models" / "loras", *extra.after["loras"]] == searched[:4]


def test_a_dangling_link_and_a_tiny_model_not_yet_written_are_said(tmp_path: Path) -> None:
    path, models = write(tmp_path)
    (models / "loras").mkdir()
    (models / "loras" / "l.safetensors").symlink_to(tmp_path / "moved-away.safetensors")
    workflow = json.loads(path.read_text(encoding="utf-8"))
    workflow["6"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "ltxv-tiny.safetensors"}}
    path.write_text(json.dumps(workflow), encoding="utf-8")
    by_node = {f.node_id: f for f in check_models(path, models, templates={}).files}
    link = models / "loras" / "l.safetensors"
    assert by_node["3"].status == "missing"
    assert (
        by_node["3"].hint
        == f"{link} is a link to {tmp_path / 'moved-away.safetensors'}, which does not exist"
    )
    assert (
        by_node["6"].hint
        == f"a tiny random-weight model of LeanVideo's: write it with `leanvideo fixtures {models}`"
    )


def test_a_folder_or_a_pipe_where_the_file_belongs_is_said(tmp_path: Path) -> None:
    """Not "missing" with a hint to write the file there, which would then fail on the folder."""
    path, models = write(tmp_path)
    (models / "loras" / "l.safetensors").mkdir(parents=True)
    workflow = json.loads(path.read_text(encoding="utf-8"))
    workflow["6"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "ltxv-tiny.safetensors"}}
    path.write_text(json.dumps(workflow), encoding="utf-8")
    (models / "checkpoints").mkdir()
    os.mkfifo(models / "checkpoints" / "ltxv-tiny.safetensors")
    by_node = {f.node_id: f for f in check_models(path, models, templates={}).files}
    assert by_node["3"].status == "missing"
    assert (
        by_node["3"].hint
        == f"{models / 'loras' / 'l.safetensors'} is a folder, not a model file: move it away first"
    )
    assert by_node["6"].hint == (
        f"{models / 'checkpoints' / 'ltxv-tiny.safetensors'} is not a regular file "
        "(a pipe, socket or device): move it away first"
    )


def _loaded_files(refs: list[ModelRef]) -> list[tuple[str, str, str, str, str | None]]:
    return sorted((r.node_id, r.class_type, r.input_name, r.name, r.problem) for r in refs if r.folder)


@pytest.mark.integration
def test_an_editor_file_lists_what_its_conversion_loads_for_every_installed_template(
    comfy_server: ComfyServer,
) -> None:
    """Read without a server, every installed template lists the loader files the server's conversion
    of it loads: subgraph nodes by their path ids (``75:37``), and a file widget promoted to the subgraph
    instance with the instance's value, not the inner node's."""
    with ComfyClient(comfy_server.url) as client:
        object_info = client.get_json("/object_info")
    compared = subgraphed = 0
    for name, ui in template_documents():
        if not is_ui_workflow(ui):
            continue
        try:
            api = convert_ui_workflow(ui, object_info)
        except WorkflowError:  # a node this server lacks (API nodes, custom node packs)
            continue
        assert _loaded_files(required_models_ui(ui)) == _loaded_files(required_models(api)), name
        compared += 1
        subgraphed += bool((ui.get("definitions") or {}).get("subgraphs"))
    assert compared > 100 and subgraphed > 10, (compared, subgraphed)


def test_a_changed_subgraph_value_is_the_file_it_loads() -> None:
    """The instance's value of a promoted file widget is what loads; the inner widget keeps a stale one."""
    ui = next(doc for name, doc in template_documents() if name == "01_qwen_t2i_subgraphed.json")
    instance = next(node for node in ui["nodes"] if node["id"] == 75)
    instance["widgets_values"][0] = "my_own_dit.safetensors"
    refs = {(r.node_id, r.input_name): r.name for r in required_models_ui(ui)}
    assert refs[("75:37", "unet_name")] == "my_own_dit.safetensors"
    assert "qwen_image_fp8_e4m3fn.safetensors" not in refs.values()
    assert not any(node_id == "75" for node_id, _ in refs)  # the instance itself loads nothing


def test_an_editor_file_with_two_nodes_of_one_id_is_refused() -> None:
    ui = json.loads((WORKFLOWS_DIR / "wan21_t2v_int8.ui.json").read_text(encoding="utf-8"))
    ui["nodes"][1]["id"] = ui["nodes"][0]["id"]
    with pytest.raises(WorkflowError, match=f"two nodes have the id {ui['nodes'][0]['id']}"):
        required_models_ui(ui)


def test_stock_loaders_built_in_choices_and_a_widget_that_names_no_file() -> None:
    """A ControlNet is looked up in controlnet/; VAELoader's built-in pixel_space is no file; a file
    widget holding null is said as such, not replaced by the next widget's value."""
    ui = {
        "nodes": [
            {"id": 1, "type": "ControlNetLoader", "widgets_values": ["union.safetensors"]},
            {"id": 2, "type": "VAELoader", "widgets_values": ["pixel_space"]},
            {"id": 3, "type": "UNETLoader", "widgets_values": [None, "default"]},
        ],
        "links": [],
    }
    refs = required_models_ui(ui)
    assert [(r.node_id, r.input_name, r.name, r.folder, r.problem) for r in refs] == [
        ("1", "control_net_name", "union.safetensors", "controlnet", None),
        ("3", "unet_name", "", "diffusion_models", "null is not a file name"),
    ]
    api = {"2": {"class_type": "VAELoader", "inputs": {"vae_name": "pixel_space"}}}
    assert required_models(api) == []


def test_a_controlnet_in_its_folder_is_present(tmp_path: Path) -> None:
    (tmp_path / "models" / "controlnet").mkdir(parents=True)
    (tmp_path / "models" / "controlnet" / "union.safetensors").write_bytes(WEIGHTS)
    path = tmp_path / "cn.api.json"
    node = {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "union.safetensors"}}
    path.write_text(json.dumps({"1": node}), encoding="utf-8")
    report = check_models(path, tmp_path / "models", templates={})
    assert [(f.name, f.status, f.folder) for f in report.files] == [
        ("union.safetensors", "present", "controlnet")
    ]


def test_an_empty_or_cut_short_safetensors_file_is_invalid_not_present(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from safetensors.torch import save_file

    path, models = write(tmp_path)
    whole = models / "unet" / "dit.safetensors"
    save_file({"w": torch.zeros(64, 64)}, str(whole))
    assert next(f.status for f in check_models(path, models, templates={}).files) == "present"
    size = whole.stat().st_size
    assert size > 5000
    whole.write_bytes(whole.read_bytes()[:5000])  # an interrupted download
    (models / "text_encoders").mkdir()
    (models / "text_encoders" / "te.safetensors").write_bytes(b"")
    files = {f.name: f for f in check_models(path, models, templates={}).files}
    assert files["dit.safetensors"].status == "invalid"
    assert (
        files["dit.safetensors"].hint
        == f"cut short (5000 bytes of the {size} its header says): an interrupted download"
    )
    assert (files["te.safetensors"].status, files["te.safetensors"].hint) == (
        "invalid",
        "the file is empty (0 bytes): download it again",
    )
    assert main(["models", "check", str(path), "--models", str(models)]) == 1
    assert "cut short (5000 bytes" in " ".join(capsys.readouterr().out.split())


def test_close_names_are_near_misses_not_any_file_of_the_folder(tmp_path: Path) -> None:
    """Compared without the shared ``.safetensors``: clip_l is no look-alike of t5xxl_fp16."""
    path, models = write(tmp_path)
    (models / "text_encoders").mkdir()
    (models / "text_encoders" / "clip_l.safetensors").write_bytes(WEIGHTS)
    (models / "text_encoders" / "te-v2.safetensors").write_bytes(WEIGHTS)
    workflow = {"1": {"class_type": "CLIPLoader", "inputs": {"clip_name": "t5xxl_fp16.safetensors"}}}
    workflow["2"] = {"class_type": "CLIPLoader", "inputs": {"clip_name": "te-v1.safetensors"}}
    path.write_text(json.dumps(workflow), encoding="utf-8")
    by_node = {f.node_id: f for f in check_models(path, models, templates={}).files}
    assert by_node["1"].status == "missing" and by_node["1"].hint is None
    assert by_node["2"].hint == "close names there: te-v2.safetensors"


def test_a_damaged_file_is_said_with_its_path_and_where_to_get_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, models = write(tmp_path)
    (models / "text_encoders").mkdir()
    (models / "text_encoders" / "te.safetensors").write_bytes(b"")
    (te,) = [f for f in check_models(path, models, templates={}).files if f.name == "te.safetensors"]
    assert (te.status, te.url, te.cited_in) == ("invalid", "https://e.x/te", "wf.ui.json")
    assert main(["models", "check", str(path), "--models", str(models)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"invalid {models / 'text_encoders' / 'te.safetensors'} node 2 (CLIPLoader.clip_name)" in out
    assert "get it again from https://e.x/te (cited in wf.ui.json)" in out


def test_a_name_no_file_can_have_is_invalid_and_the_rest_is_still_reported(tmp_path: Path) -> None:
    path, models = write(tmp_path)
    workflow = {
        **WORKFLOW,
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "a" * 300 + ".safetensors"}},
    }
    path.write_text(json.dumps(workflow), encoding="utf-8")
    (models / "text_encoders").mkdir()  # where the name is looked up: the system refuses it
    files = {f.node_id: f for f in check_models(path, models, templates={}).files}
    assert (
        files["2"].status == "invalid"
        and files["2"].hint == "no file can have this name (File name too long)"
    )
    assert files["1"].status == "present"


def test_a_twin_or_template_shaped_oddly_gives_no_links_and_no_traceback(tmp_path: Path) -> None:
    odd = {
        "nodes": [
            {"type": "A", "properties": ["a"]},
            {"type": "B", "properties": {"models": "x"}},
            {"type": "C", "properties": {"models": [1, {"name": "te.safetensors", "url": "https://e.x/te"}]}},
        ],
        "definitions": {"subgraphs": [5, {"nodes": "x"}]},
    }
    assert list(model_sources(odd, "odd.json")) == ["te.safetensors"]
    assert model_sources({"nodes": [], "definitions": []}, "odd.json") == {}


def test_a_damaged_editor_file_is_named_by_models_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "twice.json"
    path.write_text(json.dumps({"nodes": [{"id": 1, "type": "A"}, {"id": 1, "type": "B"}], "links": []}))
    assert main(["models", "check", str(path)]) == 5
    assert f"{path}: two nodes have the id 1 (A and B)" in " ".join(capsys.readouterr().err.split())


def test_an_int8_file_its_loader_would_refuse_is_invalid_naming_the_loader_and_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A present file used to pass whatever its INT8 layout; the loader then refused it (exit 6)."""
    path, models = write(tmp_path)
    dit = models / "unet" / "dit.safetensors"
    said = {
        int8_file(
            version=FORMAT_VERSION + 1
        ): f"format version {FORMAT_VERSION + 1} is newer than this pack reads",
        int8_file(scale_shape=(2, 3)): "'a.weight': weight_scale has shape [2, 3]; for weight shape [2, 4]",
    }
    source = {"dit.safetensors": ModelSource("dit.safetensors", "https://e.x/dit", "diffusion_models", "t")}
    for content, reason in said.items():
        dit.write_bytes(content)
        report = check_models(path, models, templates=source)
        [file] = [f for f in report.files if f.name == "dit.safetensors"]
        assert file.status == "invalid" and file.path == str(dit)
        assert file.url is None  # the same file again would not help: the loader is what refuses it
        assert file.hint is not None and file.hint.startswith(
            "LeanVideoDiffusionModelLoaderINT8 would refuse it"
        )
        assert reason in file.hint
    assert main(["models", "check", str(path), "--models", str(models)]) == 1
    assert "weight_scale has shape [2, 3]" in " ".join(capsys.readouterr().out.split())
    # the same bytes under a stock loader are not looked into
    stock = {
        "1": {
            "class_type": "UNETLoader",
            "inputs": {"unet_name": "dit.safetensors", "weight_dtype": "default"},
        }
    }
    path.write_text(json.dumps(stock), encoding="utf-8")
    assert [f.status for f in check_models(path, models, templates={}).files] == ["present"]


def test_a_model_of_another_kind_under_an_int8_loader_is_invalid_as_the_loader_says(tmp_path: Path) -> None:
    """A LoRA where the INT8 DiT loader reads, a diffusion model where the INT8 text encoder loader reads:
    `models check` said `all present`, and the loaders then refused them by their keys (exit 6)."""
    from safetensors.torch import save_file

    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    (models / "text_encoders").mkdir()
    lora_key = "diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight"
    save_file({lora_key: torch.zeros(8, 64)}, str(models / "diffusion_models" / "lora.safetensors"))
    save_file(
        {"transformer_blocks.0.attn1.to_q.weight": torch.zeros(4, 4)},
        str(models / "text_encoders" / "dit.safetensors"),
    )
    workflow = {
        "1": {"class_type": "LeanVideoDiffusionModelLoaderINT8", "inputs": {"unet_name": "lora.safetensors"}},
        "2": {"class_type": "LeanVideoTextEncoderLoaderINT8", "inputs": {"clip_name": "dit.safetensors"}},
    }
    path = tmp_path / "wf.api.json"
    path.write_text(json.dumps(workflow), encoding="utf-8")
    by_node = {f.node_id: f for f in check_models(path, models, templates={}).files}
    assert by_node["1"].status == by_node["2"].status == "invalid"
    assert by_node["1"].hint == (
        f"LeanVideoDiffusionModelLoaderINT8 would refuse it: a LoRA (key {lora_key!r}), which is not "
        "quantized: load it as it is with LoraLoaderModelOnly on the INT8 model (the loaders' lora_mode "
        "decides how it is applied)"
    )
    assert by_node["2"].hint == (
        "LeanVideoTextEncoderLoaderINT8 would refuse it: an LTXV diffusion model; load it with Load "
        "Diffusion Model (INT8)"
    )
    # a diffusion model alone where Load Checkpoint (INT8) reads: it needs the VAE beside it
    (models / "checkpoints").mkdir()
    dit = {"model.diffusion_model.transformer_blocks.0.attn1.to_q.weight": torch.zeros(4, 4)}
    save_file(dit, str(models / "checkpoints" / "dit-only.safetensors"))
    save_file(
        {**dit, "vae.decoder.conv_in.weight": torch.zeros(4)}, str(models / "checkpoints" / "c.safetensors")
    )
    workflow = {
        str(n): {"class_type": "LeanVideoCheckpointLoaderINT8", "inputs": {"ckpt_name": name}}
        for n, name in enumerate(("dit-only.safetensors", "c.safetensors"), start=1)
    }
    path.write_text(json.dumps(workflow), encoding="utf-8")
    by_node = {f.node_id: f for f in check_models(path, models, templates={}).files}
    assert (by_node["1"].status, by_node["2"].status) == ("invalid", "present")
    assert (by_node["1"].hint or "").startswith("LeanVideoCheckpointLoaderINT8 would refuse it: holds no VAE")


def test_a_float_file_under_an_int8_loader_that_does_not_quantize_on_load_is_invalid(tmp_path: Path) -> None:
    """With quantize_on_load off, the loaders refuse a float or fp8 file (exit 6 at run time); `models
    check` said it was present. Read from the API file's inputs and the editor file's widgets alike."""
    from safetensors.torch import save_file

    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    key = "model.diffusion_model.transformer_blocks.0.attn1.to_q.weight"
    save_file({key: torch.zeros(8, 8)}, str(models / "diffusion_models" / "dit.safetensors"))
    loader = "LeanVideoDiffusionModelLoaderINT8"
    path = tmp_path / "wf.api.json"
    for quantize, status in ((False, "invalid"), (True, "present")):
        inputs = {"unet_name": "dit.safetensors", "quantize_on_load": quantize}
        path.write_text(json.dumps({"7": {"class_type": loader, "inputs": inputs}}), encoding="utf-8")
        [api] = check_models(path, models, templates={}).files
        values = ["dit.safetensors", "default", "auto", quantize, False, "merge"]
        ui = {"nodes": [{"id": 7, "type": loader, "widgets_values": values}], "links": []}
        (tmp_path / "wf.ui.json").write_text(json.dumps(ui), encoding="utf-8")
        [edited] = check_models(tmp_path / "wf.ui.json", models, templates={}).files
        assert api.status == edited.status == status, (quantize, api, edited)
        assert api.hint == edited.hint
    path.write_text(json.dumps({"7": {"class_type": loader, "inputs": {"unet_name": "dit.safetensors"}}}))
    assert [f.status for f in check_models(path, models, templates={}).files] == ["present"]  # default: on
    boolean_ui = {"id": 8, "type": "PrimitiveBoolean", "widgets_values": [False], "outputs": [{"links": [5]}]}
    slot = {"name": "quantize_on_load", "type": "BOOLEAN", "link": 5, "widget": {"name": "quantize_on_load"}}
    stale = ["dit.safetensors", "default", "auto", True, False, "merge"]  # the widget's own value: stale
    loader_ui = {"id": 7, "type": loader, "inputs": [slot], "widgets_values": stale}
    ui = {"nodes": [boolean_ui, loader_ui], "links": [[5, 8, 0, 7, 0, "BOOLEAN"]]}
    (tmp_path / "wf.ui.json").write_text(json.dumps(ui), encoding="utf-8")
    [edited] = check_models(tmp_path / "wf.ui.json", models, templates={}).files
    assert edited.status == "invalid"  # the linked Boolean's False, not the widget's stale True
    linked = {**inputs, "quantize_on_load": ["8", 0]}  # from a Boolean node: its value
    boolean = {"class_type": "PrimitiveBoolean", "inputs": {"value": False}}
    path.write_text(json.dumps({"7": {"class_type": loader, "inputs": linked}, "8": boolean}))
    assert [f.status for f in check_models(path, models, templates={}).files] == ["invalid"]
    off = {**inputs, "quantize_on_load": False}
    path.write_text(json.dumps({"7": {"class_type": loader, "inputs": off}}))
    [api] = check_models(path, models, templates={}).files
    assert api.hint == (
        f"{loader} would refuse it: holds no INT8 weights (float) and its quantize_on_load is off; turn it "
        "on to quantize the file while loading"
    )
