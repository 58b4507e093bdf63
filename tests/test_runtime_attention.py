"""The attention override's dispatch, fallback and layouts, on CPU with fake and SDPA backends."""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from leanvideo.attention_ops import (
    SAGE_VARIANTS,
    SDPA_BACKEND,
    AttentionBackend,
    AttentionOverride,
    available_modes,
    import_sage,
    patch_attention,
    resolve_backend,
    sdpa_kernel,
)

B, H, N, M, D = 2, 3, 5, 7, 16


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain softmax attention on ``[B, H, N, D]``."""
    weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return weights @ v


def to_bnc(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


class RecordingOriginal:
    """Stands in for ComfyUI's attention function: records each call, returns a marker tensor."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, **kwargs: Any
    ) -> torch.Tensor:
        self.calls.append({"heads": heads, **kwargs})
        return torch.full((1,), -1.0)


def qkv(dtype: torch.dtype = torch.float32, d: int = D) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, N, d, generator=generator, dtype=torch.float32).to(dtype)
    k = torch.randn(B, H, M, d, generator=generator, dtype=torch.float32).to(dtype)
    v = torch.randn(B, H, M, d, generator=generator, dtype=torch.float32).to(dtype)
    return q, k, v


def fake_backend(**limits: Any) -> AttentionBackend:
    return AttentionBackend(name="fake", kernel=lambda q, k, v, mask: reference_attention(q, k, v), **limits)


@pytest.mark.parametrize(
    ("limits", "call", "reason_part"),
    [
        ({"needs_cuda": True}, {}, "needs CUDA"),
        ({"head_dims": frozenset({64, 128})}, {}, "head dim 16"),
        ({"dtypes": frozenset({torch.float16})}, {}, "dtype torch.float32"),
        ({"supports_mask": False}, {"mask": torch.zeros(N, M)}, "mask present"),
        ({"key_block": 64, "max_key_padding": 0.01}, {}, "7 keys, not a multiple of 64: fake would count 57"),
    ],
)
def test_unsupported_calls_go_to_the_original_attention_and_log_once(
    limits: dict[str, Any], call: dict[str, Any], reason_part: str, caplog: pytest.LogCaptureFixture
) -> None:
    override = AttentionOverride(fake_backend(**limits))
    original = RecordingOriginal()
    q, k, v = qkv()
    with caplog.at_level(logging.INFO, logger="leanvideo.attention_ops"):
        for _ in range(3):
            out = override(original, q, k, v, H, skip_reshape=True, transformer_options={}, **call)
            assert out.tolist() == [-1.0]
    assert len(original.calls) == 3
    assert original.calls[0]["skip_reshape"] is True and "transformer_options" in original.calls[0]
    [reason] = override.calls
    assert reason_part in reason and override.calls[reason] == 3
    fallback_lines = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert len(fallback_lines) == 1 and reason_part in fallback_lines[0]


def test_every_call_is_told_to_telemetry_by_what_ran_it() -> None:
    """A node report is written before the model runs, so which calls fell back (and why) is counted
    per prompt: the override tells ``on_call``, and the telemetry keeps one counted event per reason."""
    from leanvideo.telemetry import Telemetry

    telemetry = Telemetry()

    def told(key: str, fell_back: bool) -> None:
        telemetry.count_event("attention", key, outcome="fell back" if fell_back else "ran")

    override = AttentionOverride(fake_backend(supports_mask=False), on_call=told)
    q, k, v = qkv()
    told("before any prompt", False)  # no prompt running: dropped
    telemetry.prompt_started("p")
    for mask in (None, None, torch.zeros(N, M), None):
        override(RecordingOriginal(), q, k, v, H, skip_reshape=True, skip_output_reshape=True, mask=mask)
    telemetry.prompt_finished("p", "success")
    record = telemetry.record("p")
    assert record is not None
    assert {(e["key"], e["outcome"]): e["calls"] for e in record["events"] if e["kind"] == "attention"} == {
        ("fake", "ran"): 3,  # the backend's name
        ("attention mask present (fake would ignore it)", "fell back"): 1,
    }


def test_supported_call_uses_the_backend() -> None:
    override = AttentionOverride(fake_backend(head_dims=frozenset({D}), dtypes=frozenset({torch.float32})))
    original = RecordingOriginal()
    q, k, v = qkv()
    out = override(original, q, k, v, H, skip_reshape=True, skip_output_reshape=True)
    torch.testing.assert_close(out, reference_attention(q, k, v))
    assert original.calls == [] and override.calls == {"backend": 1}


@pytest.mark.parametrize(
    ("layout", "skip_reshape", "skip_output_reshape"),
    [
        ("LTXV / Wan [B,N,H*D]", False, False),
        ("HunyuanVideo [B,H,N,D]→[B,N,H*D]", True, False),
        ("Wan HND", True, True),
    ],
)
def test_sdpa_matches_reference_in_every_layout(
    layout: str, skip_reshape: bool, skip_output_reshape: bool
) -> None:
    q, k, v = qkv()
    expected = reference_attention(q, k, v)
    if not skip_output_reshape:
        expected = to_bnc(expected)
    args = (q, k, v) if skip_reshape else tuple(to_bnc(t) for t in (q, k, v))
    override = AttentionOverride(SDPA_BACKEND)
    out = override(
        RecordingOriginal(), *args, H, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape
    )
    torch.testing.assert_close(out, expected, msg=layout)


def test_sdpa_applies_an_additive_mask_like_comfyui() -> None:
    q, k, v = qkv()
    mask = torch.zeros(B, N, M)
    mask[:, :, -2:] = -torch.inf  # hide the last two keys
    out = sdpa_kernel(q, k, v, mask)
    torch.testing.assert_close(out, reference_attention(q, k[:, :, :-2], v[:, :, :-2]))


def test_a_kernel_that_writes_k_never_changes_the_callers_tensor() -> None:
    def smoothing_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
        k.sub_(k.mean(dim=-2, keepdim=True))  # what sageattn's smooth_k does
        return reference_attention(q, k, v)

    q, k, v = qkv()
    inputs = [t.clone() for t in (q, k, v)]
    override = AttentionOverride(AttentionBackend(name="smooth", kernel=smoothing_kernel, writes_k=True))
    out = override(RecordingOriginal(), q, k, v, H, skip_reshape=True, skip_output_reshape=True)
    for before, after in zip(inputs, (q, k, v), strict=True):
        assert torch.equal(before, after)
    torch.testing.assert_close(out, reference_attention(q, k, v))  # smoothing K does not change softmax


def test_fallback_goes_through_an_override_already_on_the_model() -> None:
    seen: list[str] = []

    def previous(func: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append("previous")
        return func(*args, **kwargs)

    override = AttentionOverride(fake_backend(needs_cuda=True), previous=previous)
    original = RecordingOriginal()
    override(original, *qkv(), H, skip_reshape=True)
    assert seen == ["previous"] and len(original.calls) == 1


def test_model_copies_share_one_override() -> None:
    override = AttentionOverride(SDPA_BACKEND)
    options = {"transformer_options": {"optimized_attention_override": override}}
    assert copy.deepcopy(options)["transformer_options"]["optimized_attention_override"] is override


def test_something_else_than_a_model_is_named() -> None:
    """Free VRAM's output takes any type, so the editor lets a VAE reach Patch Attention's model: it
    failed with "'VAE' object has no attribute 'model_options'"."""

    class VAE:
        pass

    for wrong in (VAE(), {"samples": torch.zeros(1)}, None):
        said = f"Patch Attention: model got a {type(wrong).__name__}, not a MODEL"
        with pytest.raises(TypeError, match=said):
            patch_attention(wrong, "sdpa")


def test_mode_resolution() -> None:
    backend, plan = resolve_backend("auto", cuda_available=False, sage=None)
    assert (
        backend is SDPA_BACKEND and plan.summary() == "attention: auto → sdpa (no CUDA device: PyTorch SDPA)"
    )
    backend, plan = resolve_backend("auto", cuda_available=True, sage=None)
    assert backend is SDPA_BACKEND and "not installed" in plan.reason
    backend, plan = resolve_backend("sage", cuda_available=True, sage=None)
    assert backend is None and plan.backend == "original"

    class FakeSage:
        @staticmethod
        def sageattn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            return q

    backend, plan = resolve_backend("auto", cuda_available=True, sage=FakeSage)
    assert (
        backend is not None and backend.name == "sageattn" and backend.writes_k and not backend.supports_mask
    )
    assert plan.summary().endswith(
        "; a call it cannot take runs the original attention (counted per prompt in telemetry)"
    )
    with pytest.raises(ValueError, match="'flash'"):
        resolve_backend("flash")
    assert available_modes()[:3] == ["auto", "sdpa", "sage"]


def fake_sage_package(root: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put a ``sageattention`` package whose ``__init__`` is ``body`` first on the import path."""
    (root / "sageattention").mkdir()
    (root / "sageattention" / "__init__.py").write_text(body, encoding="utf-8")
    monkeypatch.delitem(sys.modules, "sageattention", raising=False)
    monkeypatch.syspath_prepend(str(root))


def test_a_missing_sageattention_is_reported_as_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sageattention", None)  # makes the import fail as if absent
    assert import_sage() == (None, "sageattention is not installed")
    backend, plan = resolve_backend("auto", cuda_available=True)
    assert backend is SDPA_BACKEND and plan.reason == "sageattention is not installed: PyTorch SDPA"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            "import triton_that_is_not_there\n",
            "ModuleNotFoundError: No module named 'triton_that_is_not_there'",
        ),
        ("raise RuntimeError('Triton found no GPU')\n", "RuntimeError: Triton found no GPU"),
    ],
)
def test_a_broken_sageattention_is_reported_as_a_failed_import(
    body: str, error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sage_package(tmp_path, body, monkeypatch)
    assert import_sage() == (None, f"sageattention failed to import: {error}")
    backend, plan = resolve_backend("auto", cuda_available=True)
    assert backend is SDPA_BACKEND and plan.reason == f"sageattention failed to import: {error}: PyTorch SDPA"
    backend, plan = resolve_backend("sage", cuda_available=True)
    assert backend is None and plan.reason.startswith(f"sageattention failed to import: {error}")
    # every variant is in the menu, installed or not: a workflow saved where one is runs here unpatched
    assert available_modes() == ["auto", "sdpa", "sage", *SAGE_VARIANTS]
    backend, plan = resolve_backend(SAGE_VARIANTS[-1], cuda_available=True)
    assert backend is None and plan.backend == "original"


@pytest.mark.parametrize(
    ("keys", "taken"), [(64, True), (128, True), (6480, True), (3000, True), (1000, False), (100, False)]
)
def test_a_partial_last_key_block_is_taken_only_where_its_error_is_small(keys: int, taken: bool) -> None:
    backend = fake_backend(key_block=64, max_key_padding=0.01)  # SageAttention 1.x's, see make_sage_backend
    q, k = torch.zeros(1, 1, 4, 64), torch.zeros(1, 1, keys, 64)
    reason = backend.unsupported_reason(q, k, None)
    assert (reason is None) is taken, reason


def test_every_sageattention_backend_gets_the_key_block_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanvideo.attention_ops import make_sage_backend

    fake_sage_package(tmp_path, "def sageattn(q, k, v, **kw):\n    return q\n", monkeypatch)
    sage, _ = import_sage()
    assert make_sage_backend(sage, "sageattn").key_block == 64


@pytest.mark.gpu
def test_sage_on_cuda_falls_back_where_its_last_key_block_is_mostly_empty() -> None:
    sage = pytest.importorskip("sageattention")
    backend, plan = resolve_backend("sage", cuda_available=True, sage=sage)
    assert backend is not None, plan
    q, k, v = (t.cuda() for t in qkv(torch.float16, d=64))  # 7 keys: 57 of the 64 slots empty
    override = AttentionOverride(backend)
    out = override(RecordingOriginal(), q, k, v, H, skip_reshape=True, skip_output_reshape=True)
    assert out.tolist() == [-1.0] and list(override.calls) != ["backend"]


@pytest.mark.gpu
def test_sage_on_cuda_matches_sdpa_and_leaves_k_alone() -> None:
    sage = pytest.importorskip("sageattention")
    backend, plan = resolve_backend("sage", cuda_available=True, sage=sage)
    assert backend is not None, plan
    q, k, v = (t.cuda() for t in qkv(torch.float16, d=64))
    generator = torch.Generator().manual_seed(1)  # 128 keys: SageAttention 1.x's blocks are full
    k, v = (torch.randn(B, H, 128, 64, generator=generator).to("cuda", torch.float16) for _ in range(2))
    k_before = k.clone()
    override = AttentionOverride(backend)
    out = override(RecordingOriginal(), q, k, v, H, skip_reshape=True, skip_output_reshape=True)
    assert override.calls == {"backend": 1} and torch.equal(k, k_before)
    torch.testing.assert_close(out.float(), sdpa_kernel(q, k, v, None).float(), atol=2e-2, rtol=2e-2)
