"""Matrix files: the shipped ones parse, inheritance and insertion work, errors name file/variant/key."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.matrix import MatrixError, load_matrix
from runner.workflow import load_workflow
from runner.workspace import REPO_ROOT, WORKFLOWS_DIR

TINY = REPO_ROOT / "benchmarks" / "seed_table_tiny.toml"
FULL = REPO_ROOT / "benchmarks" / "seed_table.toml"
HEADER = f'[bench]\nworkflow = "{WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"}"\n'


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(HEADER + body, encoding="utf-8")
    return path


def test_tiny_matrix_has_the_seed_rows_in_order() -> None:
    matrix = load_matrix(TINY)
    names = [v.name for v in matrix.variants]
    assert names == [
        "20-step baseline",
        "8-step distill",
        "8-step + non-blocking transfer",
        "8-step + graph compile",
        "8-step + attention acceleration",
    ]
    assert matrix.baseline == matrix.reference == "20-step baseline"
    transfer = matrix.variant("8-step + non-blocking transfer")
    assert transfer.overrides == ("9.steps=20", "9.steps=8", "11.cfg=1.0")  # inherited, the later one wins
    assert transfer.server_args == ("--async-offload",)
    assert [i.class_type for i in transfer.inserts] == ["LoraLoaderModelOnly"]
    assert matrix.variant("8-step + graph compile").skip_on_cpu
    assert matrix.mode == "cold"  # the seed unloads models before every run


@pytest.mark.skipif(not FULL.is_file(), reason="no real-size matrix")
def test_full_size_matrix_parses() -> None:
    matrix = load_matrix(FULL)
    assert len(matrix.variants) == 5
    assert not matrix.fixtures


def test_inserted_nodes_chain_onto_the_target_input() -> None:
    matrix = load_matrix(TINY)
    base = load_workflow(matrix.workflow)
    workflow = matrix.variant("8-step + attention acceleration").build_workflow(base)
    assert workflow["11"]["inputs"]["model"] == ["bench_attention", 0]
    assert workflow["bench_attention"]["inputs"]["model"] == ["bench_lora", 0]
    assert workflow["bench_lora"]["inputs"]["model"] == ["1", 0]
    assert "bench_compile" not in workflow  # one optimisation on top of the distill, not a stack
    assert "bench_lora" not in base  # the base workflow is left alone


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[variant]]\nname = "a"\nsteps = 3\n', "variant 'a': unknown key(s) ['steps']"),
        ('[[variant]]\nname = "a"\nextends = "b"\n', "variant 'a': key 'extends': 'b' is not an earlier"),
        ('[[variant]]\nname = "a"\nset = ["steps=3"]\n', "variant 'a': key 'set': 'steps=3'"),
        ('[[variant]]\nname = "a"\n[[variant]]\nname = "a"\n', "variant 'a': duplicate name"),
        ('repeats = 0\n[[variant]]\nname = "a"\n', "repeats must be ≥ 1"),
        ('mode = "hot"\n[[variant]]\nname = "a"\n', "mode must be one of"),
        ('baseline = "zz"\n[[variant]]\nname = "a"\n', "baseline 'zz' is not a variant"),
        ('warmups = true\n[[variant]]\nname = "a"\n', "key 'warmups' has the wrong type"),
        (
            '[[variant]]\nname = "a"\n[[variant.insert]]\nid = "x"\nclass_type = "X"\n'
            'link_input = "model"\ntarget = "11"\n',
            "variant 'a': insert #1 key 'target': '11' is not NODE.input",
        ),
        ("", "no [[variant]] tables"),
    ],
)
def test_errors_name_file_variant_and_key(tmp_path: Path, body: str, message: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(MatrixError) as caught:
        load_matrix(path)
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


def test_missing_workflow_and_bad_toml_are_named(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[bench]\nworkflow = "nope.json"\n[[variant]]\nname = "a"\n', encoding="utf-8")
    with pytest.raises(MatrixError, match=r"workflow 'nope\.json': no such file"):
        load_matrix(path)
    path.write_text("[bench\n", encoding="utf-8")
    with pytest.raises(MatrixError, match="cannot read matrix"):
        load_matrix(path)
