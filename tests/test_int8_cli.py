"""``leanvideo quantize`` (runner/cli/quantize.py), driven through its own argparse parser."""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import pytest
import torch
from leanvideo.int8.convert import quantize_file
from leanvideo.int8.files import read_tensors
from leanvideo.int8.formats import read_int8_file
from rich.console import Console
from safetensors.torch import save_file

from runner.cli.main import main
from runner.cli.quantize import add_quantize_parser, run_quantize
from runner.errors import LeanVideoError, UsageError
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
    # The permissions any new file gets (umask), as the float file it came from: a ComfyUI server running
    # as another user reads it
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]

    with pytest.raises(UsageError, match=f"OUT {target} exists; refusing to overwrite it"):
        _run(str(tiny_models.diffusion_model), str(target))


def test_a_one_layer_file_is_reported_in_the_singular(tmp_path: Path) -> None:
    source = tmp_path / "one.safetensors"
    save_file(
        {
            "transformer_blocks.0.attn1.to_q.weight": torch.randn(
                64, 64, generator=torch.Generator().manual_seed(0)
            )
        },
        str(source),
    )
    code, output = _run(str(source), str(tmp_path / "one-int8.safetensors"))
    assert code == 0, output
    assert "(ltxv, 1 INT8 layer, round trip verified)" in output and "lowest SQNR (1 layer)" in output


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


def _fail(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``leanvideo quantize ARGV`` through the whole CLI: the exit code and stderr (one line)."""
    code = main(["quantize", *argv])
    return code, capsys.readouterr().err.replace("\n", "")


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--granularity", "block"], 2, "--granularity block needs --block-size N"),
        (
            ["--family", "wan"],
            1,
            "no layer of family 'wan' to quantize: it holds an LTXV model (family 'ltxv')",
        ),
        (["--block-size", "32"], 2, "--block-size 32 goes with --granularity block, not row"),
        (["--convrot-group", "1024"], 2, "--convrot-group 1024 goes with --convrot"),
        (["--convrot", "--convrot-group", "100"], 2, "100"),
    ],
)
def test_quantize_errors_name_the_problem(
    tiny_models: FixtureSet,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    message: str,
) -> None:
    exit_code, err = _fail(capsys, str(tiny_models.diffusion_model), str(tmp_path / "x.safetensors"), *argv)
    assert exit_code == code and message in err
    assert not (tmp_path / "x.safetensors").exists()


def test_a_full_checkpoint_of_another_family_is_said_as_that_family_not_as_its_vae(
    tiny_models: FixtureSet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = str(tiny_models.checkpoint)
    code, err = _fail(capsys, source, str(tmp_path / "x.safetensors"), "--family", "wan")
    assert code == 1 and f"{source}: no layer of family 'wan' to quantize: it holds an LTXV model" in err
    assert "VAE" not in err and not (tmp_path / "x.safetensors").exists()


def test_loras_and_vaes_are_refused_with_what_they_are(
    tiny_models: FixtureSet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lora = str(tiny_models.lora)
    for family in ([], ["--family", "ltxv"]):  # also when the family is named: a LoRA is never quantized
        code, err = _fail(capsys, lora, str(tmp_path / "lora-int8.safetensors"), *family)
        assert code == 1 and f"{lora}: a LoRA (key " in err and "LoraLoaderModelOnly" in err
    vae = tmp_path / "vae.safetensors"
    tensors = read_tensors(tiny_models.checkpoint)
    save_file({k.removeprefix("vae."): t for k, t in tensors.items() if k.startswith("vae.")}, str(vae))
    for family in ([], ["--family", "ltxv"]):
        code, err = _fail(capsys, str(vae), str(tmp_path / "vae-int8.safetensors"), *family)
        assert code == 1 and f"{vae}: a VAE (key " in err and "Load VAE" in err
    wan_vae = tmp_path / "wan_vae.safetensors"  # Wan's layout: conv1, middle, upsamples, head
    keys = (
        "encoder.conv1.weight",
        "encoder.middle.0.residual.0.gamma",
        "decoder.upsamples.0.resample.1.weight",
    )
    save_file({key: torch.zeros(4, 4) for key in keys}, str(wan_vae))
    code, err = _fail(capsys, str(wan_vae), str(tmp_path / "wan_vae-int8.safetensors"))
    assert (
        code == 1
        and f"{wan_vae}: a VAE (key 'decoder.upsamples.0.resample.1.weight')" in err
        and "Load VAE" in err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vae.safetensors", "wan_vae.safetensors"]


@pytest.mark.parametrize(
    ("keys", "advice"),
    [
        (["diffusion_model.blocks.0.attn.hada_w1_a", "diffusion_model.blocks.0.attn.hada_w1_b"], "ModelOnly"),
        (["diffusion_model.blocks.0.ff.lokr_w1", "diffusion_model.blocks.0.ff.lokr_w2"], "ModelOnly"),
        (["transformer.transformer_blocks.0.attn1.to_q.lora_A.default.weight"], "ModelOnly"),
        (["unet.up.0.proj.lora_linear_layer.down.weight"], "ModelOnly"),
        (["diffusion_model.transformer_blocks.0.attn1.to_q.diff"], "ModelOnly"),
        (["lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"], "LoraLoader, its clip input"),
    ],
)
def test_lora_formats_comfyui_applies_are_refused_as_loras(
    keys: list[str], advice: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LoHa, LoKr, PEFT and diffusers LoRAs and weight diffs were 'cannot tell the model family', and a
    text-encoder LoRA was sent to LoraLoaderModelOnly, which has no clip input."""
    lora = tmp_path / "style.safetensors"
    save_file({key: torch.zeros(4, 4) for key in keys}, str(lora))
    code, err = _fail(capsys, str(lora), str(tmp_path / "x.safetensors"))
    assert code == 1 and f"{lora}: a LoRA (key {keys[0]!r}), which is not quantized: load it as it is" in err
    assert ("LoraLoaderModelOnly on the INT8 model" if advice == "ModelOnly" else advice) in err
    assert not (tmp_path / "x.safetensors").exists()


def test_bad_paths_are_named_and_nothing_of_the_users_is_touched(
    tiny_models: FixtureSet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dit = str(tiny_models.diffusion_model)
    code, err = _fail(capsys, str(tmp_path), str(tmp_path / "x.safetensors"))
    assert code == 1 and f"{tmp_path}: a folder, not a model file" in err
    os.mkfifo(pipe := tmp_path / "pipe.safetensors")  # read, it would wait for a writer forever
    code, err = _fail(capsys, str(pipe), str(tmp_path / "p.safetensors"))
    assert code == 1 and f"{pipe}: not a regular file (a pipe, socket or device)" in err
    pipe.unlink()
    code, err = _fail(capsys, str(tiny_models.int8_checkpoint), str(tmp_path / "twice.safetensors"))
    assert code == 1 and "already INT8 (tensor 'model.diffusion_model." in err
    code, err = _fail(capsys, dit, str(tmp_path))
    assert code == 2 and f"OUT {tmp_path} is a folder; name the new file" in err
    code, err = _fail(capsys, dit, str(tmp_path / "missing" / "x.safetensors"))
    assert code == 2 and f"the folder {tmp_path / 'missing'} does not exist" in err
    code, err = _fail(capsys, dit, "/proc/x.safetensors")  # access() lets it through; it takes no file
    assert code == 2 and "OUT /proc/x.safetensors: cannot write in the folder /proc (" in err
    assert ".partial" not in err
    code = main(["quantize", dit, str(tmp_path / "x.safetensors"), "--json", "--family", "wan"])
    assert code == 1 and json.loads(capsys.readouterr().out)["error"]["exit_code"] == 1
    mine = tmp_path / "dit-int8.safetensors.partial"  # a file of the user's with the old temporary name
    mine.write_text("mine")
    code, output = _run(dit, str(tmp_path / "dit-int8.safetensors"))
    assert code == 0, output
    assert mine.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dit-int8.safetensors", mine.name]


def test_a_target_that_appears_while_quantizing_is_kept(tiny_models: FixtureSet, tmp_path: Path) -> None:
    target = tmp_path / "dit-int8.safetensors"
    with pytest.raises(FileExistsError, match="appeared while quantizing"):
        quantize_file(
            tiny_models.diffusion_model,
            target,
            family="ltxv",
            progress=lambda key, done, total: target.write_text("theirs") if done == 1 else None,
        )
    assert target.read_text() == "theirs" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_fallbacks_are_reported(tiny_models: FixtureSet, tmp_path: Path) -> None:
    dit = str(tiny_models.diffusion_model)
    code, output = _run(dit, str(tmp_path / "a.safetensors"), "--granularity", "block", "--block-size", "7")
    assert code == 0 and "20 of 20 layers have per-row scales: --block-size 7 does not divide" in output
    code, output = _run(
        dit, str(tmp_path / "b.safetensors"), "--convrot", "--convrot-group", "1024", "--json"
    )
    report = json.loads(output)
    assert code == 0 and report["layouts"] == {"row": 20} and report["rotated"] == 0


def test_damaged_weights_misnamed_outputs_and_links_are_refused_before_writing(
    tiny_models: FixtureSet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tensors = read_tensors(tiny_models.diffusion_model)
    quantized = "transformer_blocks.0.attn1.to_q.weight"
    kept = next(key for key in tensors if key.startswith("adaln_single.") and key.endswith(".weight"))
    for key, value in ((quantized, float("nan")), (kept, float("inf"))):  # a quantized and a kept tensor
        damaged = tmp_path / "damaged.safetensors"
        bad = dict(tensors)
        bad[key] = bad[key].clone()
        bad[key].view(-1)[3] = value
        save_file(bad, str(damaged))
        code, err = _fail(capsys, str(damaged), str(tmp_path / "out.safetensors"))
        err = " ".join(err.split())
        assert code == 1 and f"{damaged}: tensor '{key}': 1 of" in err and "NaN or infinite" in err, err
        damaged.unlink()
    dit = str(tiny_models.diffusion_model)
    code, err = _fail(capsys, dit, str(tmp_path / "out.pt"))
    assert code == 2 and "name it .safetensors" in err
    link = tmp_path / "link.safetensors"
    link.symlink_to(tmp_path / "elsewhere.safetensors")  # dangling: nothing there yet
    code, err = _fail(capsys, dit, str(link))
    assert code == 2 and f"{link} is a link" in " ".join(err.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.safetensors"]


def test_a_pickle_under_a_safetensors_name_is_said_to_be_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    renamed = tmp_path / "model.safetensors"
    torch.save({"w": torch.ones(2)}, renamed)  # never loaded: only its first bytes are looked at
    code, err = _fail(capsys, str(renamed), str(tmp_path / "out.safetensors"))
    assert code == 1 and "looks like a PyTorch pickle checkpoint" in " ".join(err.split())


def test_a_damaged_safetensors_file_is_not_called_a_pickle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "model.safetensors"
    header = b'{"w":{"dtype":"F32","shape":[64],"data_offsets":[0,256]}}'.ljust(128)  # length 0x80
    damaged.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 100)  # data cut short
    code, err = _fail(capsys, str(damaged), str(tmp_path / "out.safetensors"))
    assert code == 1 and f"{damaged}: not a readable safetensors file" in err and "pickle" not in err


def test_a_quantized_fixture_is_the_users_file_not_a_fixture(tiny_models: FixtureSet, tmp_path: Path) -> None:
    from runner.fixtures import STAMP_KEY
    from runner.fixtures.tensors import read_safetensors_metadata

    assert STAMP_KEY in read_safetensors_metadata(tiny_models.diffusion_model)
    target = tmp_path / "dit-int8.safetensors"
    code, output = _run(str(tiny_models.diffusion_model), str(target))
    assert code == 0, output
    metadata = read_safetensors_metadata(target)
    # `leanvideo fixtures` rewrites a file with the stamp: the user's quantized model must not carry it
    assert STAMP_KEY not in metadata and "config" in metadata


def test_a_killed_quantize_leaves_nothing_the_next_one_keeps(tiny_models: FixtureSet, tmp_path: Path) -> None:
    import fcntl
    import signal
    import socket
    import subprocess
    import sys

    target = tmp_path / "dit-int8.safetensors"
    # A writer killed mid-file (SIGKILL): its partial file stays, named with its host and pid
    script = (
        "import os, sys\nfrom pathlib import Path\nfrom leanvideo.int8.convert import quantize_file\n"
        "def stop(key, done, total):\n"
        "    if done == 3: print('writing', flush=True); os.kill(os.getpid(), 9)\n"
        "quantize_file(Path(sys.argv[1]), Path(sys.argv[2]), family='ltxv', progress=stop)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(tiny_models.diffusion_model), str(target)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as killed:  # fmt: skip
        out, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL and "writing" in out, err
    (left,) = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert left.name.startswith(f".{target.name}.{socket.gethostname()}-{killed.pid}.")
    assert left.stat().st_size > 0
    # A live writer's file (locked: on this host, in another PID namespace or on another host sharing
    # the folder) and a file of the user's stay; an unlocked one of another host is a dead writer's too
    alive = tmp_path / f".{target.name}.elsewhere-1.0badc0de.partial"
    dead = tmp_path / f".{target.name}.gone-7.0badc0de.partial"
    mine = tmp_path / f".{target.name}.partial"
    for path in (alive, dead, mine):
        path.write_text("in use")
    with alive.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, output = _run(str(tiny_models.diffusion_model), str(target))
    assert code == 0, output
    said = " ".join(output.split())
    assert f"removed {left}" in said and f"removed {dead}" in said and "killed" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, alive.name, mine.name])


def test_a_full_disk_while_quantizing_names_out_and_leaves_nothing(
    tiny_models: FixtureSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from leanvideo.int8.writer import StreamingWriter

    def full(self: StreamingWriter, key: str, tensor: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write() says it: no file name

    monkeypatch.setattr(StreamingWriter, "write", full)
    target = tmp_path / "dit-int8.safetensors"
    with pytest.raises(LeanVideoError) as raised:
        _run(str(tiny_models.diffusion_model), str(target))
    source = tiny_models.diffusion_model
    expected = f"No space left on device while quantizing {source} into {target} (nothing is left behind)"
    assert str(raised.value) == expected
    assert list(tmp_path.iterdir()) == []
