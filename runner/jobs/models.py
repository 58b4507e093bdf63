"""``leanvideo models check``: is every model file a workflow needs in the models folder, and where
does a missing one come from?

A file is looked up in the folder its loader reads (``diffusion_models`` also under ``unet``,
``text_encoders`` also under ``clip``, as ComfyUI does); a present file is listed with its size (and
sha256 on request), a missing one with its download URL and the folder it belongs in. URLs come from
the ``properties.models`` entries of the workflow's editor twin (``X.ui.json`` beside ``X.api.json``)
and, for any file still without one, of the ComfyUI templates installed with ComfyUI (the
``comfyui-workflow-templates*`` packages); each URL names the file that cites it.

Example::

    report = check_models(Path("workflows/wan21_t2v_int8.api.json"), Path(".workspace/models"))
    print(report.missing, [f.name for f in report.files if f.status == "missing"])
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import WorkflowError
from runner.fixtures import fixture_set
from runner.graph.models import ModelSource, model_sources, required_models, required_models_ui
from runner.graph.suggest import MODEL_SUFFIXES
from runner.graph.workflow import api_workflow, is_ui_workflow
from runner.graph.workflow_file import read_json_file
from runner.install.pin import sha256_file
from runner.jobs.int8_files import int8_layout_problem, quantize_on_load_by_node
from runner.local.extra_model_paths import ExtraModelPaths
from runner.local.server_config import MODEL_FOLDERS

logger = logging.getLogger(__name__)

__all__ = ["ModelFile", "ModelsReport", "check_models", "template_documents", "template_sources"]

TEMPLATE_DISTRIBUTIONS = "comfyui-workflow-templates"
ALL_FOLDERS = tuple(dict.fromkeys(d for dirs in MODEL_FOLDERS.values() for d in dirs))  # each once, in order


@dataclass(frozen=True)
class ModelFile:
    """One needed file: present (path, bytes, sha256 when asked) or missing (where to get it)."""

    node_id: str
    class_type: str
    input_name: str
    name: str
    folder: str | None
    status: str  # "present" or "missing"
    path: str | None = None
    bytes: int | None = None
    sha256: str | None = None
    url: str | None = None
    cited_in: str | None = None
    target: str | None = None  # where a missing file goes
    hint: str | None = None  # a missing file: a near name or another folder that holds it


@dataclass
class ModelsReport:
    workflow: str
    models_dir: str
    files: list[ModelFile] = field(default_factory=list)
    also: list[str] = field(default_factory=list)  # further folders searched
    extra_paths: str | None = None  # the extra_model_paths.yaml whose folders were searched too

    @property
    def missing(self) -> int:
        """Files not there, and loader inputs that name no file (not counted: linked ones, ``unchecked``)."""
        return sum(1 for f in self.files if f.status in ("missing", "invalid"))

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "models_dir": self.models_dir,
            "also": self.also,
            "extra_paths": self.extra_paths,
            "missing": self.missing,
            "files": [asdict(f) for f in self.files],
        }


def template_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file name, workflow)`` of every ComfyUI template workflow installed in this environment."""
    for dist in importlib.metadata.distributions():
        if not (dist.metadata["Name"] or "").lower().replace("_", "-").startswith(TEMPLATE_DISTRIBUTIONS):
            continue
        for file in dist.files or []:
            if file.suffix != ".json":
                continue
            try:
                document = json.loads(Path(str(dist.locate_file(file))).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(document, dict):
                yield file.name, document


def template_sources() -> dict[str, ModelSource]:
    """``{file name: source}`` from every ComfyUI template workflow installed in this environment."""
    sources: dict[str, ModelSource] = {}
    for file_name, document in template_documents():
        for name, source in model_sources(document, f"template {file_name}").items():
            sources.setdefault(name, source)
    return sources


def check_models(
    workflow_path: Path,
    models_dir: Path,
    *,
    also: Sequence[Path] = (),
    hashes: bool = False,
    templates: Mapping[str, ModelSource] | None = None,
    fixtures_dir: Path | None = None,
    extra: ExtraModelPaths | None = None,
) -> ModelsReport:
    """The report for ``workflow_path`` (API or editor format) against ``models_dir`` and the folders a
    ComfyUI's ``extra_model_paths.yaml`` adds (``extra``: its ``is_default`` ones before ``models_dir``,
    the others after it, as that ComfyUI searches them), then the folders ``also``; a file found in none
    goes to ``models_dir``; see the module docstring. A missing tiny
    model is to be written into ``fixtures_dir`` (default ``models_dir``): the workspace's models folder
    beside a user's own ComfyUI.

    ``templates`` replaces the installed templates' sources (``None``: read them when a file lacks one).
    """
    document = read_json_file(workflow_path)
    if is_ui_workflow(document):  # the editor file says itself where its models come from
        try:
            refs = required_models_ui(document)
        except WorkflowError as error:
            raise WorkflowError(f"{workflow_path}: {error}") from error
        sources = model_sources(document, workflow_path.name)
    else:
        refs, sources = required_models(api_workflow(document, workflow_path)), _twin_sources(workflow_path)
    if templates is None and any(ref.name not in sources for ref in refs):
        templates = template_sources()
    sources = {**(templates or {}), **sources}
    report = ModelsReport(str(workflow_path), str(models_dir), also=[str(folder) for folder in also])
    index: dict[str, list[str]] | None = None
    quantizes = quantize_on_load_by_node(document)
    for ref in refs:
        known = {key: value for key, value in asdict(ref).items() if key != "problem"}
        if ref.problem is not None:  # a link chooses the file elsewhere; anything else is no file name
            status = "unchecked" if ref.problem.startswith("linked") else "invalid"
            report.files.append(ModelFile(**known, status=status, hint=ref.problem))
            continue
        try:
            found = (
                _locate_extra(extra.first if extra else {}, ref.folder, ref.name)
                or _locate(models_dir, ref.folder, ref.name)
                or _locate_extra(extra.after if extra else {}, ref.folder, ref.name)
                or next((f for d in also if (f := _locate(d, ref.folder, ref.name)) is not None), None)
            )
        except OSError as exc:  # a name no file can have (over 255 bytes, say)
            hint = f"no file can have this name ({exc.strerror or exc})"
            report.files.append(ModelFile(**known, status="invalid", hint=hint))
            continue
        source = sources.get(ref.name)
        if found is not None:
            digest = sha256_file(found) if hashes else None
            damaged = safetensors_damage(found)  # an interrupted download is there, yet cannot load
            on = quantizes.get(ref.node_id, True)
            refused = None if damaged else int8_layout_problem(found, ref.class_type, quantize_on_load=on)
            again = source if damaged else None  # where to get it again
            file = ModelFile(
                **known,
                status="invalid" if damaged or refused else "present",
                path=str(found),
                bytes=found.stat().st_size,
                sha256=digest,
                hint=damaged or refused,
                url=again.url if again else None,
                cited_in=again.cited_in if again else None,
            )
        else:
            if index is None:  # once, for the first missing file
                index = _model_index((models_dir, *also), extra.folders() if extra else {})
            folder = ref.folder or (source.directory if source else None)
            tiny = _fixture_path(fixtures_dir or models_dir, ref.folder, ref.name)
            target = tiny.parent if tiny else models_dir / folder if folder else None
            file = ModelFile(
                **known,
                status="missing",
                url=source.url if source else None,
                cited_in=source.cited_in if source else None,
                target=str(target) if target else None,
                hint=_not_a_file(models_dir, ref.folder, ref.name)
                or _near(ref.name, ref.folder, index)
                or (
                    "a tiny random-weight model of LeanVideo's: write it with `leanvideo fixtures "
                    f"{fixtures_dir or models_dir}`"
                    if tiny
                    else None
                ),
            )
        report.files.append(file)
    return report


def safetensors_damage(path: Path) -> str | None:
    """Why the ``.safetensors`` file ``path`` cannot load, read from its header and size (empty, a web
    page saved under its name, cut short), or None; other files are not looked into."""
    if path.suffix.lower() != ".safetensors":
        return None
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            start = file.read(8)
            declared = int.from_bytes(start, "little") if len(start) == 8 else 0
            if size == 0:
                return "the file is empty (0 bytes): download it again"
            if len(start) < 8 or declared > min(size - 8, 100_000_000):
                return f"no safetensors header ({size} bytes; a web page or an interrupted download?)"
            header = json.loads(file.read(declared))
    except (OSError, ValueError) as exc:
        return f"its safetensors header cannot be read ({exc}): download it again"
    if not isinstance(header, dict):
        return "its safetensors header is no object: download it again"
    offsets = [t.get("data_offsets") for t in header.values() if isinstance(t, dict)]
    end = max(
        (o[1] for o in offsets if isinstance(o, list) and len(o) == 2 and isinstance(o[1], int)), default=0
    )
    if 8 + declared + end > size:
        return (
            f"cut short ({size} bytes of the {8 + declared + end} its header says): an interrupted download"
        )
    return None


def _model_index(roots: Sequence[Path], extra: Mapping[str, Sequence[Path]]) -> dict[str, list[str]]:
    """Every file of the models folders under ``roots`` and of the ``extra`` folders: its name ->
    ``"folder/relative path"``s."""
    seen: dict[str, list[str]] = {}
    bases = [(subdir, root / subdir) for root in roots for subdir in ALL_FOLDERS]
    for subdir, base in [*bases, *((folder, base) for folder, dirs in extra.items() for base in dirs)]:
        if base.is_dir():
            for path in base.rglob("*"):
                if path.is_file():
                    seen.setdefault(path.name, []).append(f"{subdir}/{path.relative_to(base).as_posix()}")
    return seen


def _near(name: str, folder: str | None, seen: dict[str, list[str]]) -> str | None:
    """What a user who misnamed or misplaced ``name`` would want to hear, from the models folders'
    files ``seen``: the same name in another case, the file in another models folder, or close names
    in its own; None when there is none."""
    wanted = Path(name).name
    own = MODEL_FOLDERS.get(folder, (folder,)) if folder else ()
    case = [
        where
        for file, places in seen.items()
        if file != wanted and file.lower() == wanted.lower()
        for where in places
        if where.split("/")[0] in own
    ]
    if case:
        return f"{', '.join(case[:3])} is there: ComfyUI reads names with their case; use that name"
    inside = [where for where in seen.get(wanted, []) if where.split("/")[0] in own]
    if inside:  # in a subfolder of the right folder: ComfyUI names it by its path there
        relative = inside[0].split("/", 1)[1]
        return f"it is in {inside[0]}: name it {relative}"
    if wanted in seen:
        reads = "/, ".join(own) or "another folder"
        return f"it is in {', '.join(seen[wanted][:3])}; this loader reads {reads}/"
    in_own = [where for places in seen.values() for where in places if where.split("/")[0] in own]
    # compared without the suffix every model file shares (with it, t5xxl_fp16 looked like clip_l)
    stems: dict[str, list[str]] = {}
    for where in in_own:
        relative = where.split("/", 1)[1]
        stems.setdefault(_stem(relative), []).append(relative)
    close = [
        n
        for stem in difflib.get_close_matches(_stem(name), list(stems), n=3, cutoff=0.6)
        for n in stems[stem]
    ]
    return f"close names there: {', '.join(close[:3])}" if close else None


def _stem(name: str) -> str:
    """``name`` without a model file's suffix, lower case: what tells two model file names apart."""
    lowered = name.lower()
    return next((lowered[: -len(s)] for s in MODEL_SUFFIXES if lowered.endswith(s)), lowered)


def _twin_sources(workflow_path: Path) -> dict[str, ModelSource]:
    name = workflow_path.name
    if not name.endswith(".api.json"):
        return {}
    twin = workflow_path.with_name(name[: -len(".api.json")] + ".ui.json")
    try:
        document = json.loads(twin.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return model_sources(document, twin.name) if isinstance(document, dict) else {}


def _not_a_file(models_dir: Path, folder: str | None, name: str) -> str | None:
    """What stands where the file belongs and is no file (a link whose target is gone, a folder, a
    pipe): said, not just "missing", since writing the file there would fail."""
    for candidate in _candidates(models_dir, folder, name):
        if candidate.is_symlink() and not candidate.exists():
            return f"{candidate} is a link to {os.readlink(candidate)}, which does not exist"
        if candidate.is_dir():
            return f"{candidate} is a folder, not a model file: move it away first"
        if candidate.exists() and not candidate.is_file():
            return f"{candidate} is not a regular file (a pipe, socket or device): move it away first"
    return None


def _fixture_path(fixtures_dir: Path, folder: str | None, name: str) -> Path | None:
    """Where ``leanvideo fixtures`` writes the tiny model ``name`` of ``folder`` in ``fixtures_dir``,
    or None when it is none of them."""
    for path in fixture_set(fixtures_dir).paths():
        if path.name == name and (folder is None or path.parent.name in MODEL_FOLDERS.get(folder, (folder,))):
            return path
    return None


def _locate(models_dir: Path, folder: str | None, name: str) -> Path | None:
    """The file ``name`` in ``folder`` (or its aliases; any folder when unknown), or None."""
    return next((c for c in _candidates(models_dir, folder, name) if c.is_file()), None)


def _locate_extra(extra: Mapping[str, Sequence[Path]], folder: str | None, name: str) -> Path | None:
    """The file ``name`` in the ``extra`` folders of ``folder`` (or its aliases; any when unknown)."""
    subdirs = MODEL_FOLDERS.get(folder, (folder,)) if folder else tuple(extra)
    places = (base / _inside(name) for subdir in subdirs for base in extra.get(subdir, ()))
    return next((place for place in places if place.is_file()), None)


def _candidates(models_dir: Path, folder: str | None, name: str) -> list[Path]:
    """Where ``name`` of ``folder`` (or its aliases; any folder when unknown) would be, in order."""
    subdirs = MODEL_FOLDERS.get(folder, (folder,)) if folder else ALL_FOLDERS
    return [models_dir / subdir / _inside(name) for subdir in subdirs]


def _inside(name: str) -> str:
    """``name`` as ComfyUI reads it in a models folder: "../" cannot climb out of the folder (symlinked
    files still count)."""
    return os.path.relpath(os.path.join("/", name), "/")
