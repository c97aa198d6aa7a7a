"""Every train step's loss stored, and two runs' losses side by side: ``tpubench parity A B``,
the Run details page's view, and ``--verify`` of a run of rank processes, which its losses
answer.

One real invocation serves every test here: gpt2 tiny trained on the cpu backend on one
device and on two gloo ranks (dp, strong scaling: the same global batch), with --verify.
docs/multi-host.md and docs/multi-device.md say dp gives one device's losses to 1e-5; the
stored losses are checked against that, and against the loss computed in this process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, in_process, one_error_line, tpubench
from streamlit.testing.v1 import AppTest

from dashboard import RESULTS_ENV, catalog
from tpubench import store
from tpubench.analysis import parity
from tpubench.analysis.steps import job_steps
from tpubench.measure import make_step
from workloads import build, get_workload
from workloads.base import Shape

#: what docs/multi-device.md and docs/multi-host.md claim for dp and fsdp against one device
DOCUMENTED = 1e-5
BATCH, SEQ, WARMUP, STEPS = 4, 16, 1, 2
RUN = (
    f"run --workload gpt2 --size tiny --backend cpu --mode train --batch-size {BATCH} --seq-len {SEQ} "
    f"--warmup {WARMUP} --steps {STEPS} --devices 1,2 --parallel dp --scaling strong --verify --results"
)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parity") / "results"
    done = tpubench(RUN, str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def in_process_losses(steps: int) -> list[float]:
    """gpt2 tiny's loss at each of ``steps`` train steps, in this process, on the global batch."""
    workload = get_workload("gpt2")
    instance = build(workload, "tiny", shape=Shape(batch_size=BATCH, seq_len=SEQ))
    step = make_step(instance, instance.model, "train")
    return [step().item() for _ in range(steps)]


def runs_by_devices(results: Path) -> dict[int, dict]:
    return {int(row["devices"]): row for row in store.load_runs(results).to_dict("records")}


def test_every_step_of_every_rank_stores_its_loss_and_dp_gives_one_devices(results: Path) -> None:
    runs = runs_by_devices(results)
    steps = store.load_steps(results)
    assert steps["loss"].notna().all() and set(steps["schema_version"]) == {3}
    one = steps[steps["run_id"] == runs[1]["run_id"]].sort_values("step")
    two = steps[steps["run_id"] == runs[2]["run_id"]]
    assert list(one["step"]) == list(range(1 + WARMUP + STEPS)) and set(two["rank"]) == {0, 1}
    # one device's stored losses are the model's own, step by step
    assert list(one["loss"]) == pytest.approx(in_process_losses(len(one)), rel=1e-6)
    # each rank stored its own slice's loss; the job's is their mean, one device's to the documented 1e-5
    ranks = two.pivot(index="step", columns="rank", values="loss")
    assert (ranks[0] != ranks[1]).all()
    job = job_steps(two).sort_values("step")
    assert list(job["loss"]) == pytest.approx(list(ranks.mean(axis=1)))
    found = parity.parity(runs[1], runs[2], steps)
    assert list(found.frame["step"]) == list(range(1 + WARMUP + STEPS))
    assert 0 < found.max_rel_diff <= DOCUMENTED, found.frame
    assert runs[1]["seed"] == runs[2]["seed"] == 0


def test_verify_of_two_ranks_compares_the_jobs_losses_with_one_device(results: Path) -> None:
    runs = runs_by_devices(results)
    for devices in (1, 2):
        assert runs[devices]["status"] == "ok" and runs[devices]["verified"] == "match", runs[devices]
    assert 0 < runs[2]["max_rel_err"] <= DOCUMENTED  # the ranks' mean against one float32 device


def test_parity_prints_both_curves_and_their_largest_difference(results: Path) -> None:
    runs = runs_by_devices(results)
    done = in_process("parity devices=1 devices=2 --results", results)
    assert done.returncode == 0, done.stderr
    found = parity.parity(runs[1], runs[2], store.load_steps(results))
    assert f"largest relative difference {found.max_rel_diff:.2e} at step {found.step_of_max}" in done.stdout
    assert runs[1]["run_id"] in done.stdout and runs[2]["run_id"] in done.stdout
    for row in found.frame.itertuples():
        assert f"{row.loss_a:.7g}" in done.stdout and f"{row.loss_b:.7g}" in done.stdout
    as_json = json.loads(in_process("parity devices=1 devices=2 --json --results", results).stdout)
    assert as_json["max_rel_diff"] == found.max_rel_diff and len(as_json["steps"]) == len(found.frame)
    assert (as_json["a"]["devices"], as_json["b"]["devices"]) == (1, 2)


def rewrite(results: Path, table: str, change) -> None:
    """Rewrite every file of ``table`` in ``results`` with ``change(table) -> table``."""
    for path in (results / table).glob("date=*/*.parquet"):
        pq.write_table(change(pq.read_table(path)), path)


def test_parity_refuses_runs_of_another_seed_and_a_steps_file_of_version_2(results: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(results, copy)
    refused = one_error_line(in_process("parity devices=1 devices=1 --results", copy))
    assert "A and B pick the same run" in refused
    refused = one_error_line(in_process("parity devices=1 devices=3 --results", copy))
    assert refused.startswith("error: B 'devices=3' in ") and refused.endswith(
        "no runs match devices=3; devices has: 2, 1"
    )

    def seed_one(table: pa.Table) -> pa.Table:
        devices = table["devices"].to_pylist()
        seeds = [1 if n == 2 else seed for n, seed in zip(devices, table["seed"].to_pylist(), strict=True)]
        return table.set_column(table.schema.get_field_index("seed"), "seed", pa.array(seeds, pa.int64()))

    rewrite(copy, "runs", seed_one)
    refused = one_error_line(in_process("parity devices=1 devices=2 --results", copy))
    assert refused.endswith("the runs differ in seed (0 against 1): their losses are not one computation")

    # a store written before losses: its steps file of version 2 has no loss column, and loads
    def version_2(table: pa.Table) -> pa.Table:
        table = table.drop_columns([c for c in ("loss",) if c in table.column_names])
        index = table.schema.get_field_index("schema_version")
        return table.set_column(index, "schema_version", pa.array([2] * len(table), pa.int32()))

    rewrite(copy, "steps", version_2)
    rewrite(copy, "runs", lambda table: version_2(table.drop_columns(["seed"])))  # nor any seed
    steps = store.load_steps(copy)
    assert set(steps["schema_version"]) == {2} and steps["loss"].isna().all() and len(steps) > 0
    assert set(store.load_runs(copy)["seed"]) == {0}  # every run before version 3 was drawn from seed 0
    refused = one_error_line(in_process("parity devices=1 devices=2 --results", copy))
    assert "has no stored loss: it was stored before tpubench kept losses (schema version 3)" in refused


def test_parity_refuses_an_infer_run_and_another_workload() -> None:
    train = {"run_id": "a", "mode": "train", "status": "ok", "workload": "gpt2", "size": "tiny", "seed": 0,
             "batch_size": 4}  # fmt: skip
    assert parity.refusal(train, {**train, "run_id": "b", "mode": "infer"}).startswith("run B (b) is a infer run")
    unavailable = {**train, "run_id": "b", "status": "unavailable", "error": "torch_xla not installed", "seed": None}
    assert parity.refusal(train, unavailable) == "run B (b) is unavailable (torch_xla not installed): it stored no loss"
    why = parity.refusal(train, {**train, "workload": "llama3"})
    assert why == "the runs differ in workload (gpt2 against llama3): their losses are not one computation"
    assert parity.refusal(train, {**train, "backend": "xla", "dtype": "bfloat16", "devices": 8}) is None


def test_run_details_sets_a_runs_losses_beside_one_devices(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = runs_by_devices(results)
    monkeypatch.setenv(RESULTS_ENV, str(results))
    app = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    app.switch_page(catalog.BY_TITLE["Run details"].path)
    app.query_params.update(run=runs[2]["run_id"])
    app.run()
    assert not app.exception, app.exception[0].value
    assert app.selectbox(key="parity").value == runs[1]["run_id"]  # one device: the reference
    found = parity.parity(runs[1], runs[2], store.load_steps(results))
    captions = " ".join(element.value for element in app.caption)
    assert f"Largest relative difference {found.max_rel_diff:.2e} at step {found.step_of_max}" in captions
    shown = next(frame.value for frame in app.dataframe if "|B - A| / |A|" in frame.value.columns)
    assert list(shown["loss_b"]) == pytest.approx(list(found.frame["loss_b"]))
    figures = [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]
    (curves,) = [f for f in figures if f["layout"].get("title", {}).get("text") == "Loss per step"]
    assert curves["data"][1]["y"] == pytest.approx(list(found.frame["loss_b"]))


def test_the_jobs_loss_is_the_ranks_mean_and_none_where_a_rank_has_none() -> None:
    """Each rank's loss is over its own slice of the batch: a mean over some ranks is no loss of the job's."""
    steps = pd.DataFrame(
        {"run_id": "r", "phase": "measure", "step": [0, 0, 1, 1], "rank": [0, 1, 0, 1],
         "step_ms": [1.0, 2.0, 3.0, 4.0], "loss": [1.0, 2.0, 3.0, None]}
    )  # fmt: skip
    job = job_steps(steps)
    assert list(job["step_ms"]) == [2.0, 4.0] and job["loss"].iloc[0] == 1.5 and pd.isna(job["loss"].iloc[1])
    assert list(parity.run_losses(steps, "r")["loss"]) == [1.5]  # only the step every rank stored
