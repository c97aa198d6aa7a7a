"""``--precision``: torchao's conversions on real workers, the peaks MFU divides by, the quality
columns against bf16, old rows' precision, and the input refused before anything runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import in_process, one_error_line, tpubench
from torch import nn

from tpubench import peaks
from tpubench.analysis import ceilings
from tpubench.analysis.identity import config_labels, configurations
from tpubench.precision import choices, convert
from tpubench.runner import SuiteRunner, plan
from tpubench.spec import KEY_FIELDS, RunSpec
from tpubench.store import load_runs

TERA = 1e12
#: the measured steps of the train runs: the issue's bound is the loss after 10 steps
TRAIN_STEPS = 10


def run_rows(
    results: Path, precisions: tuple[tuple[str, str, int, tuple[str, ...]], ...], **shape: int
) -> pd.DataFrame:
    """Each (precision, mode, measured steps, workloads) on cpu at tiny size through one
    runner: real workers, the rows as the store reads them."""
    specs = []
    for precision, mode, steps, workloads in precisions:
        specs += plan(
            list(workloads),
            sizes=["tiny"],
            backends=["cpu"],
            modes=[mode],
            dtype="bfloat16",
            precision=precision,
            warmup=0,
            steps=steps,
            capture_compiles=False,
            **shape,
        )
    SuiteRunner(results).run(specs)
    return load_runs(results)


BOTH = ("gpt2", "llama3")


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """Each precision the CPU runs, on gpt2 tiny or llama3 tiny (both for int8-wo, whose bound
    the issue names), one sequence of 16 tokens, one measured step; and two precisions it does
    not run. Every worker imports torchao (about 2.5 CPU-seconds) and a bf16 train step of
    gpt2 tiny takes most of a CPU-second here, mostly its LM head: the whole matrix, both
    models in every precision for 10 steps, is nightly
    (:func:`test_both_models_in_every_cpu_precision_stay_within_the_bounds`)."""
    return run_rows(
        tmp_path_factory.mktemp("precision"),
        (
            ("int8-wo", "infer", 1, BOTH),
            ("int8-dq", "infer", 1, ("llama3",)),
            ("fp8", "train", 1, ("gpt2",)),
            ("fp8-rowwise", "train", 1, ("llama3",)),
            ("int4-wo", "infer", 1, ("gpt2",)),
            ("mxfp8", "train", 1, ("gpt2",)),
        ),
        batch_size=1,
        seq_len=16,
    )


def check_converted(ran: pd.DataFrame) -> None:
    """Every converted row ok, with its conversion and quality columns set and within bounds."""
    assert set(ran["status"]) == {"ok"}, ran[["workload", "precision", "status", "error"]]
    assert set(ran["dtype"]) == {"bfloat16"} and set(ran["reference_precision"]) == {"bf16"}
    assert (ran["converted_linears"] > 0).all() and ran["quality_ok"].all()
    infer, train = ran[ran["mode"] == "infer"], ran[ran["mode"] == "train"]
    assert infer["logits_rel_error"].between(0, 0.05).all() and infer["top1_agreement"].between(0.9, 1).all()
    assert train["final_loss"].notna().all() and train["reference_loss"].notna().all()
    assert (train["loss_rel_diff"].abs() < 0.05).all(), train[["workload", "precision", "loss_rel_diff"]]


def test_each_cpu_precision_gives_ok_rows_with_quality_beside_bf16(rows: pd.DataFrame) -> None:
    ran = rows[rows["precision"].isin(["int8-wo", "int8-dq", "fp8", "fp8-rowwise"])]
    assert len(ran) == 5
    check_converted(ran)


def test_the_summary_names_the_precision_and_its_divergence(rows: pd.DataFrame) -> None:
    from rich.console import Console

    from tpubench import report

    ran = rows[rows["precision"].isin(["int8-wo", "fp8"])]
    table, _ = report.summary_table(ran.astype(object).where(ran.notna(), None).to_dict("records"))
    out = Console(width=300, record=True, file=io.StringIO())
    out.print(table)
    text = out.export_text()
    assert "precision" in text and "int8-wo" in text and "vs bf16" in text
    assert "logits 1." in text and "loss " in text


def test_int8_weight_only_logits_stay_within_5_percent_of_bf16(rows: pd.DataFrame) -> None:
    """The bound docs/precision.md gives, with the figures measured (about 1-2%)."""
    int8 = rows[rows["precision"] == "int8-wo"]
    assert (int8["logits_rel_error"] < 0.05).all(), int8[["workload", "logits_rel_error"]]
    assert (int8["top1_agreement"] >= 0.9).all()


@pytest.mark.nightly
def test_both_models_in_every_cpu_precision_stay_within_the_bounds(tmp_path: Path) -> None:
    """gpt2 tiny and llama3 tiny in every precision the CPU runs, training for 10 measured
    steps and as many bf16 reference steps (about a minute per train run on CI's CPUs): fp8's
    loss within 5% of bf16's, int8's logits within 5% (docs/precision.md gives the figures)."""
    ran = run_rows(
        tmp_path,
        (
            ("int8-wo", "infer", 2, BOTH),
            ("int8-dq", "infer", 2, BOTH),
            ("fp8", "train", TRAIN_STEPS, BOTH),
            ("fp8-rowwise", "train", TRAIN_STEPS, BOTH),
        ),
        batch_size=2,
        seq_len=32,
    )
    assert len(ran) == 8 and (ran.loc[ran["mode"] == "train", "measured_steps"] == TRAIN_STEPS).all()
    check_converted(ran)


def test_conversion_names_the_linears_converted_and_left_out(rows: pd.DataFrame) -> None:
    """gpt2's LM head is tied to its embedding: quantize_ would untie it, so it is left out
    with that reason; float8 keeps the tie (it reuses the weight) and converts it."""
    gpt2 = rows[rows["workload"] == "gpt2"].set_index("precision")
    int8 = json.loads(gpt2.loc["int8-wo", "conversion"])
    assert int8["api"] == "torchao.quantization.quantize_" and int8["torchao"] == "0.18.0"
    assert "lm_head" in int8["skipped"] and "tied" in int8["skipped"]["lm_head"]
    assert gpt2.loc["int8-wo", "skipped_linears"] == len(int8["skipped"]) == 1
    assert gpt2.loc["int8-wo", "converted_linears"] == len(int8["converted"])
    fp8 = json.loads(gpt2.loc["fp8", "conversion"])
    assert fp8["api"] == "torchao.float8.convert_to_float8_training" and "tensorwise" in fp8["config"]
    assert "lm_head" in fp8["converted"]


def test_a_cuda_only_precision_on_cpu_is_an_unavailable_row_saying_why(rows: pd.DataFrame) -> None:
    lacking = rows[rows["precision"].isin(["int4-wo", "mxfp8"])]
    assert len(lacking) == 2 and set(lacking["status"]) == {"unavailable"}
    assert lacking["error"].str.contains("needs CUDA|compute capability 10.0").all()
    assert lacking["median_step_ms"].isna().all()


def test_a_model_no_linear_of_which_can_take_fp8_is_unconvertible() -> None:
    odd = nn.Sequential(nn.Linear(10, 24), nn.Linear(24, 10))
    with pytest.raises(convert.Unconvertible, match=r"not divisible by 16.*would run in bf16"):
        convert.convert(odd, "fp8", "train")
    mixed = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 10)).to(torch.bfloat16)
    done = convert.convert(mixed, "fp8", "train")
    assert done.converted == ["0"] and done.skipped == {
        "1": "dims 48x10 not divisible by 16 (torchao float8's requirement)"
    }


def test_device_checks_name_what_is_missing() -> None:
    cpu = torch.device("cpu")
    assert convert.unavailable("fp8", cpu) is None and convert.unavailable("int8-wo", cpu) is None
    assert "needs CUDA" in convert.unavailable("int4-wo", cpu)
    assert "compute capability 10.0" in convert.unavailable("mxfp8", cpu)
    assert convert.unavailable("bf16", cpu) is None


# --- peaks: each new figure against its data sheet ---------------------------------------


@pytest.mark.parametrize(
    ("device", "kind", "key", "tflops", "sheet"),
    [
        ("NVIDIA H100 80GB HBM3", "cuda", "fp8", 1978.9, "FP8 1978.9 TFLOPS"),  # H100 SXM5, dense
        ("NVIDIA H100 80GB HBM3", "cuda", "int8", 1978.9, "INT8 1978.9 TOPS"),
        ("NVIDIA H100 80GB HBM3", "cuda", "float16", 989.4, "FP16 989.4"),
        ("NVIDIA H200", "cuda", "fp8", 1978.9, "FP8 1978.9 TFLOPS"),  # the same GH100 compute
        ("NVIDIA H100 PCIe", "cuda", "fp8", 1513, "FP8 3,026 TFLOPS and INT8 3,026 TOPS with sparsity"),
        ("NVIDIA H100 NVL", "cuda", "fp8", 1670.5, "FP8 3,341"),
        ("NVIDIA H200 NVL", "cuda", "int8", 1670.5, "INT8 3,341 TOPS with sparsity"),
        ("NVIDIA A100-SXM4-80GB", "cuda", "int8", 624, "INT8 624 TOPS (dense)"),
        ("NVIDIA A100-SXM4-80GB", "cuda", "float16", 312, "FP16 312"),
        ("NVIDIA B200", "cuda", "fp8", 4500, "FP8/FP6 9 PFLOPS"),
        ("NVIDIA L4", "cuda", "fp8", 242.5, "FP8 485"),
        ("NVIDIA L40S", "cuda", "fp8", 733, "FP8 733 TFLOPS"),
        ("AMD Instinct MI300X", "cuda", "fp8", 2614.9, "FP8 2614.9"),
        ("AMD Instinct MI325X", "cuda", "int8", 2614.9, "INT8 2614.9 TOPS"),
        ("TPU v5 lite", "tpu", "int8", 393, "393 TOPs INT8"),  # v5e
        ("TPU v5", "tpu", "int8", 918, "918 TOPs INT8"),  # v5p
        ("TPU v6 lite", "tpu", "int8", 1836, "1,836 TOPs INT8"),  # v6e
        ("TPU v6 lite", "tpu", "fp8", 918, "FP8 at the BF16 rate"),
        ("TPU v5", "tpu", "fp8", 459, "FP8 at the BF16 rate"),
        ("TPU7x", "tpu", "fp8", 4614 / 2, "4,614 TFLOPs FP8 per chip"),  # two devices per chip
    ],
)
def test_each_precision_peak_is_its_data_sheet_figure(
    device: str, kind: str, key: str, tflops: float, sheet: str
) -> None:
    peak = peaks.lookup(device, kind)
    assert peak.device_flops(key) == pytest.approx(tflops * TERA)
    assert sheet in peak.source


def test_a100_has_no_fp8_peak_and_v7_none_for_int8() -> None:
    assert peaks.lookup("NVIDIA A100-SXM4-80GB", "cuda").device_flops("fp8") is None
    assert peaks.lookup("TPU7x", "tpu").device_flops("int8") is None


@pytest.mark.parametrize(
    ("precision", "dtype", "key"),
    [
        ("fp8", "bfloat16", "fp8"),
        ("fp8-rowwise", "bfloat16", "fp8"),
        ("int8-dq", "bfloat16", "int8"),
        ("int8-wo", "bfloat16", "bfloat16"),  # weight-only: the matmul runs in bf16
        ("int4-wo", "bfloat16", "bfloat16"),
        ("bf16", "bfloat16", "bfloat16"),
        ("fp32", "float32", "float32"),
        (None, "float32", "float32"),
    ],
)
def test_mfu_divides_by_the_peak_of_the_precision_its_matmuls_ran_in(
    precision: str | None, dtype: str, key: str
) -> None:
    h100 = peaks.lookup("NVIDIA H100 80GB HBM3", "cuda")
    flops = 1e12
    mfu = peaks.mfu(flops, 1.0, "NVIDIA H100 80GB HBM3", "cuda", dtype, "highest", precision)
    assert mfu == pytest.approx(flops / h100.device_flops(key))
    assert peaks.describe("NVIDIA H100 80GB HBM3", "cuda", key).startswith(f"{key} dense ")


def test_fp8_mfu_peak_names_the_figure() -> None:
    assert peaks.describe("NVIDIA H100 80GB HBM3", "cuda", "fp8") == (
        "fp8 dense 1978.9 TFLOP/s per device, H100 SXM data sheet"
    )


def test_mfu_attained_holds_an_fp8_run_against_the_fp8_ceiling() -> None:
    device = "NVIDIA H100 80GB HBM3"
    key = ceilings.device_key(device, "cuda")
    table = pd.DataFrame(
        {
            "device_key": [key, key],
            "dtype": ["bfloat16", "fp8"],
            "ceiling_flops_per_s": [800 * TERA, 1600 * TERA],
            "ceiling_run_id": ["bf", "f8"],
            "ceiling_choice": ["bf16 sweep", "fp8 sweep"],
        }
    )
    runs = pd.DataFrame(
        {
            "backend": ["cuda", "cuda", "cuda"],
            "device": [device] * 3,
            "dtype": ["bfloat16"] * 3,
            "precision": ["fp8", "bf16", None],  # None: a row from before --precision
            "flops_per_step": [400 * TERA] * 3,
            "median_step_ms": [1000.0] * 3,
        }
    )
    attained = ceilings.attach_ceilings(runs, table)
    assert attained["ceiling_run_id"].tolist() == ["f8", "bf", "bf"]
    assert attained["mfu_attained"].tolist() == pytest.approx([0.25, 0.5, 0.5])


# --- identity: precision joins the key; old rows read from their dtype ---------------------


def test_precision_is_part_of_a_runs_identity_and_label() -> None:
    assert "precision" in KEY_FIELDS
    base = dict(suite="llm", workload="gpt2", size="tiny", backend="cpu", mode="infer", batch_size=2, seq_len=32)
    plain, converted = RunSpec(dtype="bfloat16", **base), RunSpec(dtype="bfloat16", precision="int8-wo", **base)
    assert plain.precision == "bf16" and RunSpec(dtype="float32", **base).precision == "fp32"
    assert plain.key() != converted.key()
    assert "bfloat16 int8-wo" in converted.label() and " bf16" not in plain.label()
    with pytest.raises(ValueError, match="computes in bfloat16"):
        RunSpec(dtype="float32", precision="fp8", **base)


def test_a_row_from_before_precision_reads_its_dtypes_plain_one() -> None:
    old = pd.DataFrame(
        {
            "workload": ["gpt2"] * 3,
            "size": ["tiny"] * 3,
            "mode": ["infer"] * 3,
            "dtype": ["bfloat16", "float32", "bfloat16"],
            "precision": [None, None, "int8-wo"],
            "batch_size": [2] * 3,
            "seq_len": [32] * 3,
        }
    )
    assert configurations(old)["precision"].tolist() == ["bf16", "fp32", "int8-wo"]
    assert configurations(old.drop(columns="precision"))["precision"].tolist() == ["bf16", "fp32", "bf16"]
    labels = config_labels(old).tolist()
    assert labels[0] == "gpt2/tiny infer bfloat16 2x32" and labels[2] == "gpt2/tiny infer bfloat16 int8-wo 2x32"


@pytest.mark.parametrize(
    ("precision", "dtype", "expected"),
    [(None, None, ("fp32", "float32")), (None, "bfloat16", ("bf16", "bfloat16")), ("fp8", None, ("fp8", "bfloat16"))],
)
def test_precision_and_dtype_set_each_other(precision: str | None, dtype: str | None, expected: tuple) -> None:
    assert choices.resolve(precision, dtype) == expected


# --- bad input: one error line, exit 2, before anything runs -------------------------------


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("--precision fp4", "unknown precision 'fp4'; valid: bf16, fp32, fp8"),
        ("--precision int4-wo --mode train", "int4-wo quantizes for inference"),
        ("--precision int8-wo --mode train", "int8-wo quantizes for inference"),
        ("--precision fp8 --backend xla", "no torchao path on the xla backend"),
        ("--precision fp8 --backend tpu", "no torchao path on the tpu backend"),
        ("--precision fp8 --dtype float32", "fp8 computes in bfloat16"),
        ("--precision fp8 --verify", "drop --verify"),
        ("--precision fp8 --devices 2 --parallel dp", "runs on one device"),
    ],
)
def test_bad_precision_input_is_one_error_line(line: str, says: str, tmp_path: Path) -> None:
    result = in_process(f"run --workload gpt2 --size tiny --backend cpu {line} --results", tmp_path / "r")
    assert says in one_error_line(result)
    assert not (tmp_path / "r" / "runs").exists()


def test_the_real_cli_refuses_an_unknown_precision(tmp_path: Path) -> None:
    """The one subprocess: exit status 2, one line, no traceback, in a real process."""
    assert "valid: bf16, fp32, fp8, fp8-rowwise, mxfp8, int8-wo, int8-dq, int4-wo" in one_error_line(
        tpubench("run --workload gpt2 --precision int3 --results", str(tmp_path))
    )
