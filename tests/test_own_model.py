"""Benchmarking a user's own model, the harness's side: ``--model`` and its bad
input, plugin modules and entry points with their providers, the Python API, the row's
identity columns, and pairing on ``model_hash``.

Real subprocesses and real parquet throughout: the user's model lives in ``tmp_path``,
outside the repository, and is imported again by each worker. The XLA case runs on
torch_xla's PJRT CPU device (no chip is faked). The examples of docs/workloads.md's
"Benchmark your own model" are run as written by ``test_the_own_model_examples_run_as_written``.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import ROOT, in_process
from rich.console import Console

import tpubench
import workloads
from tpubench import TpubenchWarning, store
from tpubench.analysis import changepoints, compare, identity
from tpubench.cli import main
from tpubench.models import importable_from, model_ref, prepared, reference_of, stored_ref
from tpubench.report import summary_table
from tpubench.runner import SuiteRunner, plan
from tpubench.schema import RUNS, STEPS
from tpubench.spec import RunSpec, model_label
from tpubench.worker import identity_columns, throughput_columns
from workloads.base import Shape
from workloads.custom import ModelRefError, resolve

MY_MODEL = """
import torch
from torch import nn


def make_model(hidden=8):
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def make_inputs(batch_size, generator, **dims):
    return (torch.randn(batch_size, 16, generator=generator),)


def make_frozen():
    model = make_model()
    model[0].weight.requires_grad_(False)
    return model


def make_attention_inputs(batch_size, generator, seq_len=4):
    return (torch.randn(batch_size, seq_len, 8, generator=generator),)


def make_flat_inputs(batch_size, generator):
    return (torch.randn(batch_size, 16, generator=generator),)


def make_unseeded():
    import random

    model = make_model()
    with torch.no_grad():
        model[0].weight.fill_(random.random())
    return model


def not_a_model():
    return 42


NOT_CALLABLE = 3
"""
#: make_model(hidden=8)'s parameters: 16 x 8 + 8, then 8 x 4 + 4
PARAMS = 16 * 8 + 8 + 8 * 4 + 4
QUICK = ["--steps", "2", "--warmup", "1"]


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder outside the repository holding ``my_model.py``; the test's working
    directory, and sys.path and the plugin variable as they were afterwards."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "my_model.py").write_text(MY_MODEL)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("PYTHONPATH", workloads.PLUGIN_ENV):  # the CLI in this process may set them
        monkeypatch.setenv(name, os.environ.get(name, ""))
    return folder


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, run from the user's folder."""
    return subprocess.run(
        [sys.executable, "-m", "tpubench", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def cli_here(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The CLI's entry point in this process (for input checks that stop before any run)."""
    argv = sys.argv
    sys.argv = ["tpubench", *args]
    try:
        with pytest.raises(SystemExit) as exited:
            main()
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


# --- the factory route, end to end --------------------------------------------------------------


def xla_interpreter() -> str | None:
    """torch_xla's interpreter (TPUBENCH_XLA_PYTHON, as the ``xla_python`` fixture reads it), or None."""
    python = os.environ.get("TPUBENCH_XLA_PYTHON")
    return python if python and os.access(python, os.X_OK) else None


@pytest.mark.slow
def test_a_factory_in_a_file_outside_the_repository_runs_on_cpu_cpu_compile_and_xla(user_dir: Path) -> None:
    """One invocation: cpu, cpu-compile and, where torch_xla's interpreter is installed (.ci/run
    builds it), xla on the PJRT CPU device, whose worker imports the user's file again there."""
    xla = xla_interpreter()
    backends = ["--backend", "cpu", "--backend", "cpu-compile"]
    if xla:
        backends += ["--backend", "xla", "--python", f"xla={xla}"]
    result = cli(
        "run",
        *("--model", "my_model.py:make_model", "--inputs", "my_model.py:make_inputs", "--model-config", "hidden=8"),
        *(*backends, "--mode", "train", *QUICK, "--results", "res"),
        cwd=user_dir,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = store.load_runs(user_dir / "res").set_index("backend")
    assert set(runs["status"]) == {"ok"} and len(runs) == (3 if xla else 2), runs["error"].tolist()
    reference = f"{user_dir / 'my_model.py'}:make_model"  # made absolute: workers start elsewhere
    assert set(runs["workload"]) == {"my_model:make_model"} and set(runs["size"]) == {"default"}
    ref = json.loads(runs.loc["cpu", "model_ref"])
    assert ref["target"] == reference and ref["inputs"] == f"{user_dir / 'my_model.py'}:make_inputs"
    assert ref["overrides"] == []  # hidden=8 is make_model's default: the stored reference keeps what differs
    # one model on every backend, in every interpreter
    assert runs["model_hash"].nunique() == 1 and runs["model_hash"].notna().all()
    assert set(runs["param_count"]) == set(runs["trainable_param_count"]) == {PARAMS}
    assert set(runs["flops_source"]) == {"counted"} and runs["flops_incomplete"].isna().all()
    # counted, not 3 x forward: the forward's two matmuls, both weight gradients, and the
    # input gradient of the second layer only (the batch itself needs none), 2 FLOPs per MAC
    per_sample = 2 * (16 * 8 + 8 * 4) + 2 * (16 * 8 + 8 * 4) + 2 * (8 * 4)
    assert set(runs["flops_per_step"]) == {per_sample * runs["batch_size"].iloc[0]}
    assert set(runs["loss_source"]) == {"synthesised: mean of outputs"}
    if xla:
        assert runs.loc["xla", "device"] == "CPU (PJRT)" and runs.loc["xla", "python_executable"] == xla


def test_frozen_parameters_count_in_param_count_but_not_in_trainable(
    user_dir: Path, results_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    importable_from(user_dir)  # here and in the workers, as the CLI does for the working directory
    ref = model_ref("my_model:make_frozen", inputs="my_model:make_inputs")
    specs = plan([resolve(ref)], backends=["cpu"], modes=["infer"], steps=2, warmup=1, model_ref=ref.to_json())
    [row] = SuiteRunner(results_dir).run(specs)
    assert row["status"] == "ok", (row.get("error"), row.get("stderr_tail"))
    assert row["param_count"] == PARAMS and row["trainable_param_count"] == PARAMS - 16 * 8
    assert row["workload"] == "my_model:make_frozen" and row["loss_source"] is None  # infer: no loss


def test_resume_skips_the_same_model_and_reruns_a_changed_one(user_dir: Path, results_dir: Path) -> None:
    """The hash is known when planning (``prepared``), so ``--resume`` matches on it: editing the
    factory's source under the same reference is a new model, never an already-stored run."""

    def planned() -> list:
        ref = model_ref(str(user_dir / "my_model.py:make_model"), inputs=str(user_dir / "my_model.py:make_inputs"))
        workload = resolve(ref)
        specs = plan([workload], backends=["cpu"], modes=["infer"], steps=2, warmup=1, model_ref=ref.to_json())
        return prepared(workload, specs)

    [first] = SuiteRunner(results_dir).run(planned())
    assert first["status"] == "ok" and first["model_hash"] == planned()[0].model_hash
    again = SuiteRunner(results_dir, resume=True)
    assert again.run(planned()) == [] and len(again.resumed) == 1
    (user_dir / "my_model.py").write_text(MY_MODEL.replace("hidden=8", "hidden=6"))
    changed = SuiteRunner(results_dir, resume=True)
    [row] = changed.run(planned())
    assert changed.resumed == [] and row["status"] == "ok" and row["model_hash"] != first["model_hash"]


def test_an_interpreter_that_cannot_import_the_model_gives_unavailable_rows_naming_it(
    user_dir: Path, results_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--python cpu=...`` naming an interpreter whose environment lacks the user's folder
    (a wrapper that drops PYTHONPATH: tpubench itself is found from the worker's working
    directory, the checkout, as a real second venv's editable install would find it)."""
    importable_from(user_dir)
    wrapper = tmp_path / "python-without-my-model"
    wrapper.write_text(f'#!/bin/sh\nunset PYTHONPATH\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    ref = model_ref("my_model:make_model", inputs="my_model:make_inputs")
    specs = plan([resolve(ref)], backends=["cpu"], modes=["infer"], steps=2, warmup=1, model_ref=ref.to_json())
    [row] = SuiteRunner(results_dir, pythons={"cpu": str(wrapper)}).run(specs)
    assert row["status"] == "unavailable"
    # the interpreter as it knows itself (the wrapper execs this one); a venv's python is its own path
    assert row["error"] == (
        f"my_model:make_model cannot be loaded by {sys.executable}: module 'my_model' does not import: "
        "ModuleNotFoundError: No module named 'my_model'"
    )


# --- bad input: one error line, exit 2, before anything runs -------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no_such_module:make"], "module 'no_such_module' does not import"),
        (["--model", "my_model.py:nothere"], "'nothere' not found"),
        (["--model", "my_model.py:NOT_CALLABLE"], "NOT_CALLABLE"),
        (["--model", "my_model.py:not_a_model", "--inputs", "my_model.py:make_inputs"], "int"),
        (["--model", "missing.py:make_model"], "no such file 'missing.py'"),
        (["--model", "my_model.py"], "expected MODULE:FUNCTION or path/to/file.py:FUNCTION"),
        (["--model", "my_model.py:make_model"], "no inputs"),
        (
            ["--model", "my_model.py:make_model", "--inputs", "my_model.py:make_flat_inputs", "--image-size", "64"],
            "make_model: make_flat_inputs(batch_size, generator) takes no dimension; "
            "name the dimension among its parameters, or take **dims",
        ),
        (["--model", "my_model.py:make_unseeded", "--inputs", "my_model.py:make_inputs"], "draws unseeded weights"),
        (["--model", "hf:./no/such/dir"], "no such directory"),
        (["--model", "hf:not_a_model_type"], "unknown model_type 'not_a_model_type'"),
        (["--model", "hf:nobody/not-cached"], "not in the local Hugging Face cache"),
        (["--model", "hf:bert", "--task", "image-classification"], "cannot serve image-classification"),
        (["--model", "hf:t5"], "decoder_start_token_id"),
        (["--model", "my_model.py:make_model", "--workload", "gpt2"], "does not combine with --workload or --suite"),
        (["--model", "my_model.py:make_model", "--suite", "llm"], "does not combine with --workload or --suite"),
        (["--model", "my_model.py:make_model", "--task", "causal-lm"], "--task applies to hf: models"),
        (["--model", "hf:llama", "--inputs", "my_model:make_inputs"], "--inputs and --loss apply to a factory"),
        (["--inputs", "my_model:make_inputs"], "--inputs describe(s) a model of yours: add --model"),
        (["--model", "my_model.py:make_model", "--model-config", "hidden"], "--model-config expects KEY=VALUE"),
        (["--workload-module", "no_such_plugin"], "workload module no_such_plugin does not import"),
        *(
            (
                ["--model", "hf:bert", "--model-config", given],
                f"{field} of bert's BertConfig is a count; valid: an integer >= 1",
            )
            for field, given in (
                ("hidden_size", "hidden_size=abc"),
                ("hidden_size", "hidden_size=null"),
                ("num_hidden_layers", "num_hidden_layers=1.5"),
                ("num_hidden_layers", "num_hidden_layers=-1"),
            )
        ),
        (
            ["--model", "hf:bert", "--model-config", "layer_norm_eps=abc"],
            "is not a valid BertConfig: Validation error for field 'layer_norm_eps'",
        ),
        (
            ["--model", "my_model.py:make_model", "--model-config", "hidden=128,hidden=64"],
            "gives hidden 2 times (hidden=128, hidden=64); give each key once",
        ),
    ],
)
def test_bad_model_input_is_one_error_line_and_exit_2(
    args: list[str], message: str, user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli_here(["run", *args, "--backend", "cpu", "--results", str(user_dir / "res")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert not (user_dir / "res" / "runs").exists()


def test_bad_model_input_from_the_command_line(user_dir: Path) -> None:
    """A file path relative to the user's folder, read from the command line as typed there
    (test_cli.py's process-level check covers ``run``'s real process)."""
    result = in_process("run --model my_model.py:not_there --backend cpu", cwd=user_dir)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stdout + result.stderr


# --- plugin modules and entry points ------------------------------------------------------------

PLUGIN = """
import dataclasses

from workloads.llm import gpt2

WORKLOAD = dataclasses.replace(gpt2.WORKLOAD, name="{name}")
"""


def write_distribution(site: Path, name: str, entry: str, module: str, workload: str) -> None:
    """An installed package as pip leaves it: the module, and a ``.dist-info`` whose
    ``entry_points.txt`` is what :func:`importlib.metadata.entry_points` reads."""
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(PLUGIN.format(name=workload))
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tpubench.workloads]\n{entry} = {module}:WORKLOAD\n")


def test_list_names_each_workloads_provider(
    user_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (user_dir / "my_plugin.py").write_text(PLUGIN.format(name="gpt2-mine"))
    site = tmp_path / "site"
    write_distribution(site, "tiny-plug", "llama-ep", "tiny_plug", "llama-ep")
    monkeypatch.syspath_prepend(str(site))
    args = ["list", "--json", "--workload-module", "my_plugin", "--model", "my_model.py:make_model"]
    code, out, err = cli_here([*args, "--inputs", "my_model.py:make_inputs"], capsys)
    assert code == 0, err
    sources = {entry["name"]: entry["source"] for entry in json.loads(out)}
    assert sources["gpt2"] == "built-in"
    assert sources["gpt2-mine"] == "module my_plugin"
    assert sources["llama-ep"] == "entry point llama-ep (tiny_plug:WORKLOAD) of tiny-plug 0.1"
    assert sources["my_model:make_model"] == "--model"
    assert os.environ[workloads.PLUGIN_ENV].split(",")[-1] == "my_plugin"  # what every worker inherits


def test_two_providers_of_one_name_is_an_error_naming_both(
    user_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (user_dir / "shadow.py").write_text(PLUGIN.format(name="gpt2"))
    code, _, err = cli_here(["list", "--workload-module", "shadow"], capsys)
    assert code == 2
    assert err.strip() == (
        "error: workload 'gpt2' is provided twice: by built-in and by module shadow; rename one of them"
    )
    monkeypatch.setenv(workloads.PLUGIN_ENV, "")  # --workload-module added shadow for this process's workers
    (user_dir / "mine.py").write_text(PLUGIN.format(name="mine"))
    site = tmp_path / "site"
    write_distribution(site, "other-plug", "mine", "other_plug", "mine")
    monkeypatch.syspath_prepend(str(site))
    code, _, err = cli_here(["run", "--workload-module", "mine", "--workload", "mine"], capsys)
    assert code == 2
    assert "by module mine and by entry point mine (other_plug:WORKLOAD) of other-plug 0.1" in err


API_SCRIPT = """
import sys

import tpubench
from my_model import make_inputs, make_model

if __name__ == "__main__":
    rows = tpubench.bench(
        make_model, make_inputs, backends=["cpu-compile", "xla"], modes=["train"], pythons={"xla": sys.argv[1]},
        results="res", steps=2, warmup=1,
    )
    print(rows[["backend", "status"]].to_string())
"""


@pytest.mark.nightly
@pytest.mark.parametrize("route", ["workload-module", "entry-point", "api"])
def test_every_route_runs_on_cpu_compile_and_xla(route: str, user_dir: Path, tmp_path: Path, xla_python: str) -> None:
    """The routes docs/workloads.md runs on cpu, on the compiled and XLA backends (the factory's own
    test runs those already)."""
    site = tmp_path / "site"
    write_distribution(site, "tiny-plug", "gpt2-ep", "tiny_plug", "gpt2-ep")
    (user_dir / "my_plugin.py").write_text(PLUGIN.format(name="gpt2-mine"))
    (user_dir / "use_api.py").write_text(API_SCRIPT)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    backends = ["--backend", "cpu-compile", "--backend", "xla", "--python", f"xla={xla_python}"]
    quick = ["--mode", "train", "--size", "tiny", *QUICK, "--results", "res"]
    if route == "api":
        result = subprocess.run(
            [sys.executable, "use_api.py", xla_python],
            capture_output=True,
            text=True,
            cwd=user_dir,
            env={**os.environ, **env},
        )
    else:
        chosen = (
            ["--workload-module", "my_plugin", "--workload", "gpt2-mine"]
            if route == "workload-module"
            else ["--workload", "gpt2-ep"]
        )
        result = cli("run", *chosen, *backends, *quick, cwd=user_dir, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = store.load_runs(user_dir / "res")
    assert sorted(runs["backend"]) == ["cpu-compile", "xla"] and set(runs["status"]) == {"ok"}, runs["error"].tolist()


# --- the Python API -----------------------------------------------------------------------------


def test_bench_names_a_factory_by_a_reference_a_worker_can_import(user_dir: Path) -> None:
    def local_factory() -> torch.nn.Module:
        return torch.nn.Linear(2, 2)

    assert reference_of(json.dumps, "model") == "json:dumps"
    assert reference_of("hf:llama", "model") == "hf:llama"
    for bad, message in (
        (lambda: torch.nn.Linear(2, 2), "a lambda or a function defined inside another"),
        (local_factory, "a lambda or a function defined inside another"),
        (torch.nn.Linear(2, 2), "a model object cannot cross into the worker processes"),
    ):
        with pytest.raises(ModelRefError, match=message):
            reference_of(bad, "model")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"devices": [0]}, "devices expects positive integers, got 0"),
        ({"devices": 2}, "devices=2 needs parallel, the plan to split the run by: dp, fsdp, tp, fsdp_tp"),
        ({"parallel": "bogus"}, "unknown parallel='bogus'; valid: none, dp, fsdp, tp, fsdp_tp"),
        ({"backends": ["nope"]}, "unknown backend 'nope'; valid: cpu, "),
        ({"precision": "bogus"}, "unknown precision 'bogus'; valid: bf16, fp32, fp8"),
        ({"precision": "fp8", "dtype": "float32"}, "precision fp8 computes in bfloat16 (its base dtype)"),
        ({"precision": "int4-wo", "modes": ["train"]}, "precision int4-wo quantizes for inference"),
        ({"precision": "fp8", "backends": ["xla"]}, "precision fp8 has no torchao path on the xla backend"),
    ],
)
def test_bench_refuses_bad_input_in_its_own_arguments_words(user_dir: Path, arguments: dict, message: str) -> None:
    """A Python caller named ``devices=``, not the CLI's ``--devices``; an unknown backend is a
    ValueError like the rest, not a KeyError. Refused before any run starts."""
    with pytest.raises(ModelRefError) as refused:
        tpubench.bench("my_model:make_model", "my_model:make_inputs", **arguments)
    assert str(refused.value).startswith(message) and "--" not in str(refused.value)


def test_bench_takes_a_precision_and_leaves_out_a_mode_it_cannot_run(user_dir: Path) -> None:
    """``precision="int8-wo"`` builds in bfloat16 as ``--precision`` does; train, a default mode
    it cannot take, is left out with a warning that says why, not stored as a failed row."""
    with pytest.warns(TpubenchWarning, match="int8-wo quantizes for inference.*left out"):
        rows = tpubench.bench("my_model:make_model", "my_model:make_inputs", precision="int8-wo", steps=1, warmup=0)
    [row] = rows.to_dict("records")
    assert (row["mode"], row["status"], row["precision"], row["dtype"]) == ("infer", "ok", "int8-wo", "bfloat16")


# --- identity in rows: MFU, pairing --------------------------------------------------------------


def test_an_incomplete_flop_count_gives_no_mfu(tmp_path: Path) -> None:
    spec = plan(["gpt2"], backends=["cuda"], modes=["infer"])[0]
    workload = workloads.get_workload("gpt2")
    device = ("NVIDIA H100 80GB HBM3", "cuda")
    args = (spec, workload, workload.config("tiny"), device, 10.0, "highest")
    complete = throughput_columns(*args, {"flops_incomplete": None})
    assert complete["mfu"] > 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        incomplete = throughput_columns(*args, {"flops_incomplete": '["aten._grouped_mm"]'})
    assert incomplete["mfu"] is None and incomplete["flops_per_step"] == complete["flops_per_step"]
    assert [str(w.message) for w in caught if w.category is TpubenchWarning] == [
        'MFU left null: the FLOP count missed ops ["aten._grouped_mm"]'
    ]


def test_attention_flops_is_null_for_a_model_without_attention(user_dir: Path) -> None:
    """The row's attention convention ("full") says how attention was counted: an MLP or a
    CNN has none to count, so theirs is null; an own model with SDPA says "full" as gpt2 does."""
    importable_from(user_dir)
    mlp = resolve(model_ref("my_model:make_model", inputs="my_model:make_inputs"))
    spec = RunSpec("custom", mlp.name, "default", "cpu", "train", "float32", 2, model_ref=stored_ref(mlp))
    assert identity_columns(mlp, mlp.config("default"), spec)["attention_flops"] is None
    for builtin, convention in ((workloads.get_workload("resnet"), None), (workloads.get_workload("gpt2"), "full")):
        spec = RunSpec(builtin.suite, builtin.name, "tiny", "cpu", "infer", "float32", 2)
        assert identity_columns(builtin, builtin.config("tiny"), spec)["attention_flops"] == convention
    (user_dir / "attending.py").write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class Attend(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.qkv = nn.Linear(8, 24)\n\n"
        "    def forward(self, x):\n"
        "        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4)\n"
        "        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
    )
    attending = resolve(model_ref("attending:Attend", inputs="my_model:make_attention_inputs"))
    columns = attending.row_columns(attending.config("default"), Shape(2, seq_len=4), "train")
    assert columns["attention_flops"] == "full"


def runs_and_steps(hashes: list[str | None], medians: list[float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs-table rows (every schema column) of one configuration, five runs per (hash, median)."""
    runs, steps = [], []
    for side, (model_hash, median) in enumerate(zip(hashes, medians, strict=True)):
        for repeat in range(5):
            run_id = f"{side}-{repeat}"
            row = dict.fromkeys(RUNS.names)
            row |= {
                "run_id": run_id,
                "invocation_id": f"inv{side}",
                "started_at": pd.Timestamp(f"2026-11-{10 + side:02d}T00:{repeat:02d}:00Z"),
                **{"workload": "my_model:make_model", "size": "default", "mode": "train", "dtype": "float32"},
                **{"batch_size": 8, "gen_len": 0, "backend": "cpu", "device": "AMD EPYC", "status": "ok"},
                **{"model_hash": model_hash, "median_step_ms": median, "git_sha": f"sha{side}"},
            }
            runs.append(row)
            sample = dict.fromkeys(STEPS.names) | {"run_id": run_id, "phase": "measure", "step_ms": median}
            steps += [sample | {"step": i} for i in range(8)]
    return pd.DataFrame(runs), pd.DataFrame(steps)


def test_compare_never_pairs_a_changed_model_with_its_old_self() -> None:
    runs, steps = runs_and_steps(["aaa", "bbb"], [10.0, 20.0])
    base, test = runs[runs["invocation_id"] == "inv0"], runs[runs["invocation_id"] == "inv1"]
    verdicts = compare.compare_runs(base, test, steps, steps)
    assert set(verdicts["verdict"]) == {"unpaired"} and set(verdicts["model_hash"]) == {"aaa", "bbb"}
    same, steps = runs_and_steps(["aaa", "aaa"], [10.0, 20.0])
    base, test = same[same["invocation_id"] == "inv0"], same[same["invocation_id"] == "inv1"]
    assert "regressed" in set(compare.compare_runs(base, test, steps, steps)["verdict"])
    # registered workloads have no hash, and pair as before
    builtin, steps = runs_and_steps([None, None], [10.0, 20.0])
    base, test = builtin[builtin["invocation_id"] == "inv0"], builtin[builtin["invocation_id"] == "inv1"]
    assert "regressed" in set(compare.compare_runs(base, test, steps, steps)["verdict"])


def test_regressions_start_a_new_series_when_the_model_changes() -> None:
    medians = [10.0 + 0.1 * (night % 3) for night in range(6)] + [20.0 + 0.1 * (night % 3) for night in range(6)]
    same, _ = runs_and_steps(["aaa"] * 12, medians)
    assert len(changepoints.change_points(same, "median_step_ms")) == 1  # one model, twice as slow
    changed, _ = runs_and_steps(["aaa"] * 6 + ["bbb"] * 6, medians)
    assert set(changepoints.series_points(changed)["model_hash"]) == {"aaa", "bbb"}
    assert changepoints.change_points(changed, "median_step_ms").empty  # two models, one series each


# --- a user's model's identity and labels ---------------------------------------------------------


def test_the_model_hash_is_the_source_and_the_effective_config_not_the_path(user_dir: Path, tmp_path: Path) -> None:
    """A module name or the file's path, the file in another folder (a moved checkout), and
    ``hidden=8`` given or by default: one model, one name, one hash; ``hidden=16`` is another."""
    importable_from(user_dir)
    moved = tmp_path / "moved" / "my_model.py"
    moved.parent.mkdir()
    moved.write_text(MY_MODEL)

    def identity(module: str, config: str | None = None) -> tuple[str, str]:
        workload = resolve(model_ref(f"{module}:make_model", inputs=f"{module}:make_inputs", config=config))
        return workload.name, workload.config("default").model_hash

    named = {identity("my_model"), identity(str(user_dir / "my_model.py")), identity(str(moved))}
    named.add(identity("my_model", "hidden=8"))
    [(name, model_hash)] = named
    assert name == "my_model:make_model"
    wider, wider_hash = identity("my_model", "hidden=16")
    assert wider == "my_model:make_model(hidden=16)" and wider_hash != model_hash


def own_rows(user_dir: Path, *configs: str) -> list[dict]:
    """A stored row of ``my_model:make_model`` under each ``--model-config``, as planning names it."""
    rows = []
    for config in configs:
        workload = resolve(model_ref("my_model:make_model", inputs="my_model:make_inputs", config=config))
        rows.append(
            {
                **{"workload": workload.name, "size": "default", "mode": "train", "dtype": "float32"},
                **{"batch_size": 16, "backend": "cpu", "status": "ok", "median_step_ms": 12.5},
                **{"model_ref": stored_ref(workload), "model_hash": workload.config("default").model_hash},
                "host_other_cpu_share": 0.9,  # "ok, host busy": the widest status
            }
        )
    return rows


def test_a_users_model_is_labelled_by_its_name_and_the_config_it_differs_by(user_dir: Path) -> None:
    importable_from(user_dir)
    default, wider = own_rows(user_dir, "hidden=8", "hidden=16")
    assert (default["workload"], wider["workload"]) == ("my_model:make_model", "my_model:make_model(hidden=16)")
    stored_before = {**wider, "workload": f"{user_dir / 'my_model.py'}:make_model"}  # rows kept the path
    labels = identity.config_labels(pd.DataFrame([default, wider, stored_before])).tolist()
    assert labels == [
        f"my_model:make_model train float32 16 model {default['model_hash'][:8]}",
        f"my_model:make_model(hidden=16) train float32 16 model {wider['model_hash'][:8]}",
        f"my_model:make_model train float32 16 model {wider['model_hash'][:8]}",
    ]
    assert model_label("gpt2", "tiny", None) == "gpt2/tiny"


def test_the_summary_of_a_users_model_keeps_the_median_at_80_columns(user_dir: Path) -> None:
    """The label folds onto more lines; backend, mode and shape stay whole."""
    importable_from(user_dir)
    [row] = own_rows(user_dir, "hidden=16")
    row["workload"] = "my_model:make_model(hidden=16,depth=12,width=1024)"
    table, hidden = summary_table([row], width=80)
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(table)
    screen = console.export_text()
    assert "median ms" in screen and "12.50" in screen and "median ms" not in hidden
    assert "…" not in screen and max(len(line) for line in screen.splitlines()) <= 80
    assert re.search(r" cpu +train +16 +- +ok, host busy +12\.50", screen), screen


# --- docs/workloads.md's section, as written ------------------------------------------------------------


def own_model_blocks() -> list[tuple[str, str]]:
    """The fenced blocks of docs/workloads.md's "Benchmark your own model": (language, text)."""
    text = (ROOT / "docs" / "workloads.md").read_text()
    section = text.split("## Benchmark your own model", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_the_own_model_examples_run_as_written(tmp_path: Path) -> None:
    """Each file block (first line ``# path``) is written, each bash block run, in one folder.
    ``pip install`` goes to a folder of its own on PYTHONPATH (``PIP_TARGET``), so that the
    entry point is found the way an installed package's is, without touching this venv."""
    site = tmp_path / "site"
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "PIP_TARGET": str(site),
        "PIP_NO_DEPS": "1",
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip's inverted spelling: build with this venv's setuptools
    }
    commands = []
    for language, block in own_model_blocks():
        if language == "bash":
            commands.append(block)
            continue
        path = tmp_path / block.splitlines()[0].removeprefix("# ")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block)
    assert len(commands) == 5
    outputs = []
    for script in commands:
        result = subprocess.run(
            ["bash", "-ec", script], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, **env}
        )
        assert result.returncode == 0, script + result.stdout + result.stderr
        outputs.append(result.stdout)
    runs = store.load_runs(tmp_path / "results")
    assert len(runs) == 4 and set(runs["status"]) == {"ok"}, runs[["workload", "status", "error"]]
    # the factory runs train and infer; the others one mode each
    llama = "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2"
    assert set(runs["workload"]) == {
        "my_model:make_model(hidden=128)",  # the config that differs from make_model's defaults
        f"hf:llama(causal-lm,{llama},vocab_size=512)",
        "gpt2-mine",
    }
    assert "llama3-mine" in outputs[3] and "entry point llama3-mine" in outputs[3]
    assert "bench_mine:make_model" in outputs[4] and "train" in outputs[4]


def test_own_model_file_blocks_name_their_files() -> None:
    blocks = own_model_blocks()
    assert [language for language, _ in blocks].count("bash") == 5
    for language, block in blocks:
        if language != "bash":
            assert re.fullmatch(r"# [\w./-]+", block.splitlines()[0]), block
