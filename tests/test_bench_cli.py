"""``leanvideo bench`` argument handling that needs no server."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from benchmarks.bench_servers import place_groups
from benchmarks.harness import BenchSettings, open_server
from benchmarks.matrix import load_matrix
from runner.cli.bench import add_bench_parser, main
from runner.local.workspace import REPO_ROOT

TINY = REPO_ROOT / "benchmarks" / "seed_table_tiny.toml"


def test_bad_soak_count_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(TINY), "--out", str(tmp_path), "--soak", "3"]) == 2
    assert "at least 10 rounds" in capsys.readouterr().err


def test_consistency_with_fewer_than_two_runs_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([str(TINY), "--out", str(out), "--consistency", "--repeats", "1"]) == 2
    said = "--consistency compares each variant's measured runs, and there would be 1"
    assert said in capsys.readouterr().err
    assert not out.exists()


def test_a_bench_without_an_installed_comfyui_leaves_no_out_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEANVIDEO_WORKSPACE", str(tmp_path / "nowhere"))
    monkeypatch.delenv("LEANVIDEO_COMFYUI", raising=False)
    out = tmp_path / "out"
    assert main([str(TINY), "--out", str(out)]) == 3
    assert "install" in capsys.readouterr().err
    assert not out.exists()
    monkeypatch.chdir(tmp_path)  # the default --out, bench-out/<matrix>: both folders go
    assert main([str(TINY)]) == 3
    assert not (tmp_path / "bench-out").exists()


def test_malformed_set_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error, before anything starts
        main([str(TINY), "--out", str(tmp_path), "--set", "9.steps=8", "--set", "width=64"])
    assert exit_info.value.code == 2
    assert "argument --set: 'width=64': expected NODE.input=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("budget", ["nan", "0", "-5"])
def test_a_budget_that_is_no_positive_number_is_refused(
    budget: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:  # nan meant "no limit"
        main([str(TINY), "--out", str(tmp_path / "out"), "--budget-s", budget])
    assert exit_info.value.code == 2
    assert f"argument --budget-s: {budget}: must be a positive number of seconds" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_existing_result_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bench.json").write_text("{}", encoding="utf-8")
    assert main([str(TINY), "--out", str(tmp_path)]) == 2
    assert "results are immutable" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--repeats", "0"], "--repeats must be 1 to 1000, got 0"),
        (["--repeats", "10000000"], "--repeats must be 1 to 1000, got 10000000"),  # not a plan filling memory
        (["--warmups", "-1"], "--warmups must be 0 to 1000"),
        (["--out", "README.md"], "README.md is a file, not a folder"),
        (["--jobs", "4"], "--concurrency and --jobs set up --load"),
    ],
)
def test_unusable_options_are_refused_before_any_server_starts(
    options: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = [str(TINY), "--out", str(tmp_path / "out"), *options]
    if "README.md" in options:
        arguments = [str(TINY), "--out", str(REPO_ROOT / "README.md")]
    assert main(arguments) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_server_given_twice_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:  # a trailing slash names the same server
        main(
            [
                str(TINY),
                "--out",
                str(tmp_path),
                "--server",
                "http://127.0.0.1:9/",
                "--server",
                "http://127.0.0.1:9",
            ]
        )
    assert refused.value.code == 2
    assert "--server: http://127.0.0.1:9 is given twice" in capsys.readouterr().err


def test_an_error_naming_a_long_path_keeps_it_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The error console does not wrap at 80 columns: a path broken over two lines cannot be copied
    in_the_way = tmp_path / ("a-folder-with-a-long-name-" * 4) / "results.txt"
    in_the_way.parent.mkdir()
    in_the_way.write_text("", encoding="utf-8")
    assert main([str(TINY), "--out", str(in_the_way)]) == 2
    assert f"{in_the_way} is a file, not a folder" in capsys.readouterr().err


def test_an_out_left_by_a_bench_that_did_not_finish_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "runs" / "4-step").mkdir(parents=True)
    (out / "workflows").mkdir()
    assert main([str(TINY), "--out", str(out)]) == 2
    said = f"--out {out} holds runs/, workflows/ of a bench that did not finish (no bench.json: interrupted?)"
    assert said in " ".join(capsys.readouterr().err.split())
    assert sorted(p.name for p in out.iterdir()) == ["runs", "workflows"]


def test_an_out_holding_a_report_of_the_users_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "notes"
    out.mkdir()
    (out / "report.md").write_text("mine", encoding="utf-8")
    assert main([str(TINY), "--out", str(out)]) == 2
    said = f"--out {out} holds report.md, which the bench would write over"
    assert said in " ".join(capsys.readouterr().err.split())
    assert [p.name for p in out.iterdir()] == ["report.md"]
    assert (out / "report.md").read_text(encoding="utf-8") == "mine"


def test_run_matrix_called_as_a_library_refuses_a_used_out_before_any_server_starts(tmp_path: Path) -> None:
    """Only the CLI checked: run_matrix ran the whole matrix into a folder holding a result, then
    failed writing bench.json (a raw FileExistsError)."""
    from benchmarks.harness import run_matrix
    from runner.errors import UsageError

    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.json").write_text("{}", encoding="utf-8")
    with pytest.raises(UsageError, match="already holds a result"):
        run_matrix(load_matrix(TINY), BenchSettings(out_dir=out, servers=("http://127.0.0.1:9",)))
    assert [p.name for p in out.iterdir()] == ["bench.json"]


def test_bad_matrix_exits_with_the_workflow_error_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "missing.toml")]) == 5
    assert "cannot read matrix" in capsys.readouterr().err


def test_running_servers_skip_variants_that_need_launch_flags(tmp_path: Path) -> None:
    matrix = load_matrix(TINY)
    settings = BenchSettings(out_dir=tmp_path, servers=("http://127.0.0.1:8460",))
    placed = place_groups([(), ("--async-offload",)], {"http://127.0.0.1:8460": ()})  # a plain server
    with open_server(matrix, settings, ("--async-offload",), tmp_path, print, placed) as (url, reason):
        assert url is None
        assert reason == "needs server flags --async-offload (no --server was launched with them)"
    with open_server(matrix, settings, (), tmp_path, print, placed) as (url, reason):
        assert (url, reason) == ("http://127.0.0.1:8460", "")


def test_order_flag_overrides_the_matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="leanvideo")
    add_bench_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["bench", str(TINY)]).order is None  # the matrix's order (interleaved)
    assert parser.parse_args(["bench", str(TINY), "--order", "sequential"]).order == "sequential"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", str(TINY), "--order", "shuffled"])
    assert "invalid choice: 'shuffled'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--order must be one of"):
        BenchSettings(out_dir=tmp_path, order="shuffled")


def test_a_port_in_use_is_refused_before_any_server_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        assert main([str(TINY), "--out", str(tmp_path / "out"), "--port", str(port)]) == 2
    assert f"--port {port} is in use" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_matrix_refused_before_any_run_leaves_no_out_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same --out must be usable once the matrix is mended (a leftover folder would be refused)
    (tmp_path / "broken.api.json").write_text('{"1": ', encoding="utf-8")
    matrix = tmp_path / "m.toml"
    matrix.write_text('[bench]\nworkflow = "broken.api.json"\n[[variant]]\nname = "a"\n', encoding="utf-8")
    assert main([str(matrix), "--out", str(tmp_path / "out")]) == 5
    assert "is not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    kept = tmp_path / "kept"  # an --out that was there before stays, with what it held
    (kept / "notes").mkdir(parents=True)
    assert main([str(matrix), "--out", str(kept)]) == 5
    assert sorted(path.name for path in kept.iterdir()) == ["notes"]


def test_a_bench_stopped_before_any_run_leaves_its_out_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while its first server started left OUT/servers/, and the same --out was then refused
    ("holds servers/ of a bench that did not finish"); once a run is recorded, the folder stays."""
    import benchmarks.harness
    from runner.errors import ServerError

    out = tmp_path / "out"

    def stopped_while_starting(*args: object, **kwargs: object) -> None:
        (out / "servers" / "default").mkdir(parents=True)
        (out / "servers" / "default" / "comfyui.log").write_text("starting", encoding="utf-8")
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmarks.harness, "run_matrix", stopped_while_starting)
    assert main([str(TINY), "--out", str(out)]) == 130
    assert not out.exists()

    def server_gone(*args: object, **kwargs: object) -> None:  # a --server gone before its flags were read
        (out / "servers").mkdir(parents=True)
        raise ServerError("http://127.0.0.1:9: connection refused")

    monkeypatch.setattr(benchmarks.harness, "run_matrix", server_gone)
    assert main([str(TINY), "--out", str(out)]) == 4
    assert not out.exists()

    def shadowed(*args: object, **kwargs: object) -> None:  # a model of yours under a tiny model's name
        from runner.fixtures import ShadowedFixturesError

        (out / "servers").mkdir(parents=True)
        raise ShadowedFixturesError({tmp_path / "ltxv-tiny.safetensors": "a model of yours"})

    monkeypatch.setattr(benchmarks.harness, "run_matrix", shadowed)
    assert main([str(TINY), "--out", str(out)]) == 2
    assert not out.exists()  # it was left, empty

    def stopped_in_a_run(*args: object, **kwargs: object) -> None:
        (out / "runs" / "baseline").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmarks.harness, "run_matrix", stopped_in_a_run)
    assert main([str(TINY), "--out", str(out)]) == 130
    assert (out / "runs" / "baseline").is_dir()


@pytest.mark.parametrize("entry", ["leanvideo", "bench module"])
def test_an_interrupted_bench_with_json_ends_with_a_json_error(
    entry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    import benchmarks.harness
    from runner.cli import main as cli_main

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # what Ctrl-C, SIGTERM or SIGHUP raise during the runs

    monkeypatch.setattr(benchmarks.harness, "run_matrix", interrupted)
    arguments = [str(TINY), "--out", str(tmp_path / "out"), "--json"]
    code = cli_main.main(["bench", *arguments]) if entry == "leanvideo" else main(arguments)
    assert code == 130
    printed = capsys.readouterr()
    assert json.loads(printed.out) == {
        "error": {"type": "KeyboardInterrupt", "message": "interrupted", "exit_code": 130}
    }
    assert "interrupted" in printed.err


def test_a_refused_matrix_with_json_is_a_json_error_from_the_bench_module_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    matrix = tmp_path / "m.toml"
    matrix.write_text('[bench]\nworkflow = "none.json"\n[[variant]]\nname = "a"\n', encoding="utf-8")
    assert main([str(matrix), "--out", str(tmp_path / "out"), "--json"]) == 5
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["exit_code"] == 5 and "none.json" in error["message"]


def test_a_server_given_that_never_answers_is_unreachable_and_leaves_no_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    out = tmp_path / "out"
    assert main([str(TINY), "--out", str(out), "--server", "http://127.0.0.1:9", "--json"]) == 4
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["exit_code"] == 4
    assert error["message"].startswith("--server http://127.0.0.1:9: cannot reach ComfyUI")
    assert not out.exists()  # no report of a server that "stopped answering"


def test_a_server_whose_proxy_refuses_the_websocket_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Followed by polling, its runs had no start and no node times: the bench failed with 'variant
    times must be positive, got 0.0' (a traceback, exit 1) after running them all."""
    import json

    from tests.fake_server import FakeComfy

    async def never(fake: FakeComfy, prompt_id: str) -> None:
        return None

    out = tmp_path / "out"
    with FakeComfy(never) as fake:
        fake.ws_refusal = 404
        assert main([str(TINY), "--out", str(out), "--server", fake.url, "--json"]) == 4
        assert not [call for call in fake.calls if call[0] == "POST /prompt"]
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["message"].startswith(f"--server {fake.url}: {fake.url}/ws refused the websocket (404 ")
    assert "let the proxy pass websockets on for /ws" in error["message"]
    assert not out.exists()
