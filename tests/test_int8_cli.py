"""``leanvideo quantize`` (runner/cli/quantize.py), driven through its own argparse parser."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from leanvideo.int8.formats import read_int8_file
from rich.console import Console

from runner.cli.quantize import add_quantize_parser, run_quantize
from runner.fixtures import FixtureSet

pytestmark = pytest.mark.integration


def _run(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="leanvideo")
    add_quantize_parser(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    code = run_quantize(parser.parse_args(["quantize", *argv]), Console(file=out, width=200))
    return code, out.getvalue()


def test_quantize_the_tiny_dit(tiny_models: FixtureSet, tmp_path: Path) -> None:
    target = tmp_path / "dit-int8.safetensors"
    code, output = _run(str(tiny_models.diffusion_model), str(target))
    print(output)
    assert code == 0, output
    assert "round trip verified" in output and "per-layer SQNR" in output
    assert read_int8_file(target).format == "leanvideo"

    code, output = _run(str(tiny_models.diffusion_model), str(target))
    assert code == 1 and "refusing to overwrite" in output


def test_quantize_json_report_and_options(tiny_models: FixtureSet, tmp_path: Path) -> None:
    target = tmp_path / "dit-block.safetensors"
    code, output = _run(
        str(tiny_models.diffusion_model), str(target), "--family", "ltxv", "--granularity", "block",
        "--block-size", "32", "--json",
    )  # fmt: skip
    assert code == 0, output
    report = json.loads(output)
    assert report["family"] == "ltxv" and report["verified"] is True
    assert report["layers"] == 20 and report["sqnr_db"]["min"] > 38.0
    assert report["target_bytes"] < report["source_bytes"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--granularity", "block"], "needs a positive block_size"),
        (["--family", "wan"], "no layer of family 'wan'"),
    ],
)
def test_quantize_errors_name_the_problem(
    tiny_models: FixtureSet, tmp_path: Path, argv: list[str], message: str
) -> None:
    code, output = _run(str(tiny_models.diffusion_model), str(tmp_path / "x.safetensors"), *argv)
    assert code == 1 and message in output
    assert not (tmp_path / "x.safetensors").exists()
