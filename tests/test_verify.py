"""--verify: outputs against a CPU float32 reference, in separate workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tpubench import store, verify
from tpubench.runner import SuiteRunner, plan


def test_compare_uses_relative_error_per_dtype_and_exact_tokens() -> None:
    reference = {"logits": torch.tensor([10.0, -20.0]), "tokens": torch.tensor([[1, 2]])}
    close = {"logits": torch.tensor([10.01, -20.0]), "tokens": torch.tensor([[1, 2]])}
    assert verify.compare(reference, close, "float32") == {
        "verified": "match",
        "max_rel_err": pytest.approx(0.0005, rel=1e-4),  # float32 rounding of 10.01
        "verify_tolerance": 1e-3,
        "tokens_match": True,
    }
    forked = {"logits": torch.tensor([10.01, -20.0]), "tokens": torch.tensor([[1, 3]])}
    assert verify.compare(reference, forked, "float32")["verified"] == "mismatch"
    assert verify.compare(reference, forked, "bfloat16")["verified"] == "match"  # bf16 tokens may fork
    assert (
        verify.compare(reference, {"logits": torch.tensor([12.0, -20.0]), "tokens": reference["tokens"]}, "bfloat16")[
            "verified"
        ]
        == "mismatch"
    )


def run(results_dir: Path, backend: str, mode: str, **settings) -> dict:
    specs = plan(
        ["gpt2"],
        backends=[backend],
        modes=[mode],
        batch_size=2,
        seq_len=16,
        gen_len=4,
        warmup=1,
        steps=2,
        verify=True,
        **settings,
    )
    [row] = SuiteRunner(results_dir).run(specs)
    return row


@pytest.mark.parametrize("mode", ["infer", "decode"])
def test_a_backend_that_computes_something_else_is_a_mismatch(
    fault_backends: None, results_dir: Path, mode: str
) -> None:
    row = run(results_dir, "cpu-wrong", mode)
    assert row["status"] == "mismatch" and row["verified"] == "mismatch"
    assert row["max_rel_err"] == pytest.approx(0.01, rel=0.05) and row["verify_tolerance"] == 1e-3
    assert "differ from the cpu float32 reference" in row["error"]
    assert row["median_step_ms"] > 0  # the timings are kept, marked
    assert store.load_runs(results_dir).status.tolist() == ["mismatch"]


def test_a_backend_that_unties_shared_weights_fails_train_verification(fault_backends: None, results_dir: Path) -> None:
    """The first loss is identical (same weights); the parameter count and the later steps are not."""
    row = run(results_dir, "cpu-untied", "train")
    assert row["status"] == "mismatch" and row["verified"] == "mismatch"
    assert "1052160 parameter elements against the reference's 790016" in row["error"]
    assert row["max_rel_err"] > 0  # the losses drift once the two copies are updated apart


def test_train_verification_compares_the_loss_over_three_steps() -> None:
    reference = {"loss": torch.tensor([7.0, 6.9, 6.8, 6.7]), "param_count": torch.tensor([10])}
    drifted = {"loss": torch.tensor([7.0, 6.9, 6.8, 6.6]), "param_count": torch.tensor([10])}
    assert verify.compare(reference, drifted, "float32")["verified"] == "mismatch"
    untied = {"loss": reference["loss"], "param_count": torch.tensor([12])}
    columns = verify.compare(reference, untied, "float32")
    assert columns["verified"] == "mismatch" and columns["max_rel_err"] == 0.0
    assert columns["verify_note"] == "12 parameter elements against the reference's 10 (shared weights untied?)"


@pytest.mark.parametrize(
    ("backend", "mode"),
    # an Inductor prefill compile is a minute here: nightly (tests/test_xla.py verifies a compiled backend in CI)
    [("cpu", "train"), pytest.param("cpu-compile", "prefill", marks=pytest.mark.nightly)],
)
def test_correct_backends_match(results_dir: Path, backend: str, mode: str) -> None:
    row = run(results_dir, backend, mode)
    assert row["status"] == "ok" and row["verified"] == "match", row.get("error") or row.get("warnings")
    assert row["max_rel_err"] <= 1e-3
    if mode == "prefill":
        assert row["tokens_match"] is True
