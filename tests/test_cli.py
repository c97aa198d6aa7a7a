"""The real CLI in subprocesses: listing, environment, bad input, runs end to end."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from helpers import ROOT, command, in_process, tpubench

from tpubench import store
from tpubench.cli.run import left_out
from workloads import get_workload


def test_list_json_describes_every_workload() -> None:
    result = tpubench("list", "--json")
    assert result.returncode == 0, result.stderr
    entries = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert entries["llama3"]["sizes"] == ["tiny", "1b", "3b", "8b"]
    assert entries["gpt2"]["modes"] == ["train", "infer", "prefill", "decode"]
    assert entries["gpt2"]["default_shape"]["cuda"] == {"batch_size": 8, "seq_len": 1024}


def test_list_table_and_suite_filter() -> None:
    result = tpubench("list", "--suite", "llm", env={"COLUMNS": "200"})
    assert result.returncode == 0 and "llama3" in result.stdout and "1.5b" in result.stdout


def test_list_keeps_the_built_ins_counts_for_their_source_and_counts_again_otherwise(tmp_path: Path) -> None:
    """Counting every size on the meta device was most of `list`'s time beyond importing torch:
    the built-ins' counts are kept, and used only for the source and torch they were counted
    with; another key, or a file that cannot be read, is counted over."""
    env = {"TPUBENCH_CACHE_DIR": str(tmp_path)}
    kept_at = tmp_path / "param-counts.json"

    def counts() -> dict[str, int]:
        listed = json.loads(in_process("list --json", env=env).stdout)
        return {
            f"{w['name']}/{d['size']}": d["params"]
            for w in listed
            if w["source"] == "built-in"
            for d in w["size_details"]
        }

    counted = counts()
    kept = json.loads(kept_at.read_text())
    assert kept["counts"] == counted and counted["gpt2/124m"] == 124_439_808  # every built-in size, as counted
    kept["counts"]["gpt2/124m"] = 1
    kept_at.write_text(json.dumps(kept))
    assert counts()["gpt2/124m"] == 1  # a kept count is what list shows, for the same key
    kept_at.write_text(json.dumps({**kept, "key": "another source"}))
    assert counts() == counted and json.loads(kept_at.read_text())["counts"] == counted
    kept_at.write_text("{not json")
    assert counts() == counted and json.loads(kept_at.read_text())["key"] == kept["key"]


def test_env_marks_each_backend_available_or_says_why() -> None:
    result = tpubench("env", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    backends = info["backends"]
    assert set(backends) >= {"cpu", "cpu-compile", "cuda", "cuda-compile"}
    assert backends["cpu"]["available"] and backends["cpu"]["device_name"]
    assert backends["cpu"]["torch_version"] and info["host"] and info["cpu_model"]
    if not backends["cuda"]["available"]:
        assert backends["cuda"]["reason"] in ("no CUDA device", "torch built without CUDA")


def test_python_m_tpubench_is_the_same_command() -> None:
    module = subprocess.run([sys.executable, "-m", "tpubench", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert module.returncode == 0 and "run" in module.stdout and "env" in module.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--suite", "vision2"], "unknown suite 'vision2'; valid: llm"),
        (["run", "--workload", "t5"], "unknown workload 't5'; valid: gpt2, llama3, resnet, vit, bert, mixtral, dit"),
        (["run", "--backend", "tpu9"], "unknown backend 'tpu9'; valid: cpu, cpu-compile, cuda, cuda-compile"),
        (["run", "--mode", "serve"], "unknown mode 'serve'; valid: train, infer, prefill, decode"),
        (["run", "--size", "70b"], "unknown size '70b'; valid: tiny, 124m"),
        (["run", "--dtype", "int8"], "unknown dtype 'int8'; valid: float32, bfloat16"),
        (["run", "--steps", "0"], "--steps"),
        (["run", "--timeout", "-5"], "--timeout"),
        (["run", "--tag", "novalue"], "--tag expects KEY=VALUE"),
        (["run", "--workload", "gpt2", "--seq-len", "4096"], "exceeds gpt2/tiny's context of 1024"),
        (["list", "--suite", "nope"], "unknown suite 'nope'"),
        (["run", "--batch-size", "1,8,x"], "--batch-size expects positive integers separated by commas"),
        (["run", "--gen-len", "12,,3"], "--gen-len expects positive integers"),
        (["run", "--mode", "decode", "--prompt-len", "1000", "--gen-len", "100"], "exceeds gpt2/tiny's context"),
        (["run", "--results", ""], "--results needs a directory"),
        (["run", "--results", "/proc/tpubench"], "--results /proc/tpubench: cannot write there"),
        (["run", "--python", "xla=/nonexistent/python"], "--python xla=/nonexistent/python: no such executable"),
        (["run", "--gen-len", "64"], "--gen-len applies to decode runs only; add --mode decode"),
        (["run", "--size", "tiny,70b"], "unknown size '70b'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    result = in_process(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "backends",
    [
        pytest.param(("cpu",), marks=pytest.mark.slow),
        # four Inductor compiles of train and infer: minutes on 2 cores, so nightly; the
        # compiled rows' columns are also checked by tests/test_inductor_cache.py in CI
        pytest.param(("cpu", "cpu-compile"), marks=pytest.mark.nightly),
    ],
)
def test_run_llm_suite_end_to_end(results_dir: Path, backends: tuple[str, ...]) -> None:
    """The README's command at tiny size: every llm workload, on ``backends``, both modes."""
    result = tpubench(
        "run --suite llm --size tiny --steps 3 --results",
        str(results_dir),
        *(f"--backend={backend}" for backend in backends),
        "--tag",
        "purpose=test",
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tpubench results" in result.stdout and "median ms" in result.stdout
    runs = store.load_runs(results_dir)
    expected = 2 * 2 * len(backends)  # gpt2 and llama3, train and infer
    assert len(runs) == expected
    assert set(runs.status) == {"ok"}, runs[["workload", "backend", "mode", "error"]]
    assert set(runs.backend) == set(backends) and set(runs["mode"]) == {"train", "infer"}
    assert (runs.median_step_ms > 0).all() and (runs.tokens_per_s > 0).all()
    assert (runs.p10_step_ms <= runs.median_step_ms).all() and (runs.median_step_ms <= runs.p90_step_ms).all()
    assert runs.mfu.isna().all()  # a CPU has no entry in the peak table, and each row says so
    assert runs.warnings.str.contains("no peak float32 FLOP/s known").all()
    assert (runs.peak_mem_bytes > 0).all() and (runs.flops_per_step > 0).all()
    assert json.loads(runs.tags[0]) == {"purpose": "test"}
    assert runs.fingerprint.nunique() == 1  # cpu and cpu-compile share an interpreter and device
    compiled = runs[runs.backend == "cpu-compile"]
    assert (compiled.compile_count >= 1).all() and (compiled.recompiles_after_warmup == 0).all()
    assert (compiled.compile_s > 0).all()
    # each compiled run had a private, empty Inductor cache: nothing came from disk
    assert compiled.compile_cache.isna().all() and (compiled.compile_cache_hits == 0).all()
    assert (compiled.compile_cache_misses >= 1).all()
    assert (compiled.first_step_s * 1e3 > compiled.median_step_ms).all()
    steps = store.load_steps(results_dir)
    measured = steps[steps.phase == "measure"].groupby("run_id").size()
    assert (measured == 3).all() and len(measured) == expected
    assert (steps[steps.phase == "first"].groupby("run_id").size() == 1).all()


def test_resume_skips_runs_already_stored_with_the_same_fingerprint(results_dir: Path) -> None:
    """The skip through the real process; the runs in this process, on one fork server
    (helpers.in_process), which spares a CLI and a fork server started per run."""
    args = [
        "run --workload gpt2 --backend cpu --mode infer --steps 2 --results",
        str(results_dir),
    ]
    assert in_process(*args, starts_runs=True).returncode == 0
    again = tpubench(*args, "--resume")
    assert again.returncode == 0 and "skipped 1 run" in again.stdout
    assert len(store.load_runs(results_dir)) == 1
    # a resumed run must match what is asked: shape, measured steps, warm-up and tags
    for n, changed in enumerate(["--batch-size 2", "--steps 3", "--warmup 1", "--tag night=1"], start=2):
        other = in_process(*args, "--resume", *changed.split(), starts_runs=True)
        assert other.returncode == 0 and "skipped" not in other.stdout, changed
        assert len(store.load_runs(results_dir)) == n


def test_oversized_run_is_skipped_with_its_estimate(results_dir: Path) -> None:
    result = tpubench(
        "run --workload llama3 --size 8b --backend cpu --mode train --batch-size 64 --seq-len 4096 --results",
        str(results_dir),
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    [row] = store.load_runs(results_dir).to_dict("records")
    assert row["status"] == "skipped"
    assert "GiB exceeds the" in row["error"] and row["estimated_mem_bytes"] > 100 * 2**30


def test_two_suites_writing_to_one_directory_lose_nothing(fault_workloads: None, results_dir: Path) -> None:
    suites = [
        subprocess.Popen(
            command(
                f"run --backend cpu --mode infer --steps 2 --workload fault-ok --workload fault-ok --workload gpt2 "
                f"--tag suite={i} --results",
                str(results_dir),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        for i in range(2)
    ]
    for process in suites:
        assert process.wait(timeout=300) == 0, process.stderr.read()
    runs = store.load_runs(results_dir)
    assert len(runs) == 4  # --workload fault-ok twice is one workload: 2 runs per suite
    assert runs.invocation_id.nunique() == 2 and set(runs.status) == {"ok"}


def test_a_results_path_that_is_a_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """The process-level check of ``run``'s refusals (the others run the CLI in this process):
    the real command exits 2 with one line and no traceback."""
    path = tmp_path / "results.txt"
    path.write_text("not a directory")
    result = tpubench("run --workload gpt2 --backend cpu --mode infer --results", str(path))
    assert result.returncode == 2 and result.stderr.strip() == f"error: --results {path}: not a directory"
    assert "Traceback" not in result.stdout + result.stderr and path.read_text() == "not a directory"


def test_an_immutable_results_directory_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """Root passes every permission check, so only a real write finds an immutable folder."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible on this file system")
    try:
        result = in_process("run --workload gpt2 --backend cpu --mode infer --results", str(folder))
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith(f"error: --results {folder}: cannot write there")


def test_size_lists_sweep_and_workloads_without_a_size_are_named(results_dir: Path) -> None:
    result = tpubench(
        "run --suite llm --size tiny,124m --backend cpu --mode infer --steps 1 --warmup 0 --results",
        str(results_dir),
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    assert "note: llama3 has no size 124m" in result.stdout
    runs = store.load_runs(results_dir)
    assert sorted(zip(runs.workload, runs["size"], strict=True)) == [
        ("gpt2", "124m"),
        ("gpt2", "tiny"),
        ("llama3", "tiny"),
    ]


def test_a_workload_with_none_of_the_sizes_is_left_out_with_a_note() -> None:
    notes = left_out([get_workload("gpt2"), get_workload("llama3")], ["124m"], [])
    assert notes == [
        "note: llama3 has no size 124m (sizes tiny, 1b, 3b, 8b; modes train, infer, prefill, decode): left out"
    ]


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_terminal(line: str, columns: int) -> str:
    """Run the CLI in a real pseudo-terminal ``columns`` wide; its screen output, escapes removed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of the given size (fd 1 is the terminal), then the CLI
        try:
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
            os.chdir(ROOT)
            os.execve(sys.executable, command(line), {**os.environ, "COLUMNS": str(columns)})  # as a shell sets it
        finally:
            os._exit(127)  # never back into pytest
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return ANSI.sub("", b"".join(chunks).decode(errors="replace"))


@pytest.mark.parametrize("columns", [80, 120])
def test_the_summary_fits_the_terminal(results_dir: Path, columns: int) -> None:
    screen = run_in_terminal(
        f"run --workload gpt2 --size tiny --backend cpu --mode infer --steps 3 --warmup 1 --results {results_dir}",
        columns,
    )
    table = screen[screen.index("tpubench results") :]
    lines = [line for raw in table.splitlines() for line in raw.split("\r")]
    assert all(len(line) <= columns for line in lines), max(lines, key=len)
    assert "…" not in table  # nothing cut to fit
    assert "median ms" in table and "gpt2/tiny" in table and "4x128" in table
    if columns == 80:
        assert "not shown at 80 columns" in table and "--wide" in table


def test_wide_and_json_give_every_column(results_dir: Path) -> None:
    args = f"run --workload gpt2 --size tiny --backend cpu --mode infer --steps 2 --warmup 1 --results {results_dir}"
    wide = tpubench(f"{args} --wide", env={"COLUMNS": "80"})
    assert wide.returncode == 0 and "p90 ms" in wide.stdout and "peak mem" in wide.stdout
    assert "not shown" not in wide.stdout
    as_json = tpubench(f"{args} --json")
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)  # stdout holds the JSON only; progress went to stderr
    assert row["status"] == "ok" and row["median_step_ms"] > 0 and "host_other_cpu_share" in row


def test_env_reads_at_80_columns() -> None:
    screen = run_in_terminal("env", 80)
    lines = [line for raw in screen.splitlines() for line in raw.split("\r")]
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in screen and "cpu-compile" in screen and "tpu-compile" in screen


def test_env_says_what_the_device_count_counts() -> None:
    """`AMD EPYC x1` read as one core; torch sees all of the host's CPUs as one device."""
    said = " ".join(run_in_terminal("env", 80).split())
    assert f"(one torch device over {os.cpu_count()} logical CPUs)" in said and " x1" not in said, said


@pytest.mark.parametrize(
    ("argv", "here"),
    [
        (["tpubench", "run", "--on", "ray"], False),
        (["tpubench", "run", "--on=ray", "--workload", "gpt2"], False),
        (["tpubench", "ci", "--threads", "1", "--out", "o"], False),
        (["tpubench", "run", "--model", "my_model.py:make_model"], False),
        (["tpubench", "run", "--workload-module=my_workloads", "--workload", "mine"], False),
        (["tpubench", "run", "--on", "local"], True),
        (["tpubench", "run", "--workload", "ray"], True),
    ],
)
def test_the_cli_prestarts_a_fork_server_only_for_workers_that_will_use_it(argv: list[str], here: bool) -> None:
    """With --on ray the nodes' actors start their own fork servers, and ci --threads changes
    the workers' environment (so their fork server's) before the first run: one started at
    once would only take a core from the start-up."""
    from tpubench import console

    assert console._workers_start_here(argv) is here


def test_a_cross_backend_table_with_and_without_caveats_renders() -> None:
    """Some pairs measured on a busy host carry a caveat and others none, which reads back as
    NaN: rich refused the float ('unable to render float') and compare crashed."""
    import io

    import pandas as pd
    from rich.console import Console

    from tpubench.analysis.compare import CROSS_COLUMNS
    from tpubench.cli.compare import cross_table

    row = {column: None for column in CROSS_COLUMNS} | {
        "workload": "gpt2", "size": "tiny", "mode": "infer", "dtype": "float32", "batch_size": 4, "seq_len": 128,
        "gen_len": 0, "base_backend": "cpu", "test_backend": "cpu-compile", "base_device": "x", "test_device": "x",
        "base_step_ms": 10.0, "test_step_ms": 5.0, "speedup": 2.0,
    }  # fmt: skip
    cross = pd.DataFrame(
        [{**row, "caveat": "host busy during 1 of 5 baseline run(s)"}, {**row, "caveat": float("nan")}]
    )
    out = io.StringIO()
    Console(file=out, width=400).print(cross_table(cross))  # every column whole: the caveat is the last
    assert "host busy during 1 of 5" in out.getvalue() and "nan" not in out.getvalue()


def test_scaling_of_an_empty_store_says_how_to_fill_it(tmp_path: Path) -> None:
    done = tpubench("scaling --results", str(tmp_path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "no multi-device runs in" in done.stdout


def test_compiles_of_an_unknown_run_names_its_own_list(tmp_path: Path) -> None:
    """It named `tpubench ops`, which lists profiled runs, not the runs that compiled."""
    from datetime import UTC, datetime

    started = datetime(2026, 12, 1, tzinfo=UTC)
    store.InvocationWriter(tmp_path, "inv", started).add(
        {"run_id": "abcdef0123456789", "invocation_id": "inv", "started_at": started, "status": "ok"}
    )
    done = in_process("compiles NOSUCHRUN --results", str(tmp_path))
    assert done.returncode == 2 and done.stderr.startswith("error: unknown run 'NOSUCHRUN'")
    assert "`tpubench compiles` lists the runs" in done.stderr and "tpubench ops" not in done.stderr


def test_columns_is_the_width_piped_or_not() -> None:
    """COLUMNS=80 tpubench ... | less was drawn 200 wide: piped output ignored it."""
    from tpubench.cli.common import console_width

    assert console_width({"COLUMNS": "80"}, tty=False) == 80 and console_width({"COLUMNS": "80"}, tty=True) == 80
    assert console_width({}, tty=False) == 200 and console_width({}, tty=True) is None
    assert console_width({"COLUMNS": "nonsense"}, tty=False) == 200
    done = tpubench("list", env={"COLUMNS": "80"})
    assert done.returncode == 0 and max(len(line) for line in done.stdout.splitlines()) <= 80


def test_whole_number_columns_display_as_integers() -> None:
    """A text row's seq_len showed as 128.0 beside an image row's empty one."""
    import pandas as pd

    from tpubench.analysis.shapes import whole_numbers

    frame = whole_numbers(pd.DataFrame({"seq_len": [128.0, None], "image_size": [None, 224.0], "mfu": [0.5, 0.25]}))
    assert str(frame["seq_len"].dtype) == "Int64" and frame["seq_len"].tolist()[0] == 128
    assert frame["mfu"].dtype == float  # not a runs integer column: left alone
