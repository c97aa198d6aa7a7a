"""Measured ceilings through real workers: the sweeps' arithmetic, what they store, MFU
against them, and the bad input the command refuses before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import another_sweep, in_process, tpubench, write_sweeps

from tpubench import store
from tpubench.analysis import ceilings as analysis
from tpubench.analysis.collectives import BUSBW_FACTORS
from tpubench.ceilings import CeilingSpec, collective_sizes, estimate_bytes, matmul_sizes, memory_sizes
from tpubench.ceilings.matmul import flops
from tpubench.ceilings.memory import stream_bytes
from tpubench.runner import SuiteRunner, plan, run_ceilings

#: a sweep small enough for CI: matmul to 128^3, STREAM arrays of 1 and 2 MiB, messages of 1 KiB
MATMUL_MAX, MEMORY_MAX, MESSAGE_MAX = 128, 2 * 2**20, 1024


def test_sweep_arithmetic() -> None:
    """FLOPs are 2MNK, STREAM moves 2 or 3 arrays, sizes double (messages by 4) up to the cap."""
    assert flops(64, 32, 16) == 2 * 64 * 32 * 16
    assert [stream_bytes(k, 100) for k in ("copy", "scale", "add", "triad")] == [200, 200, 300, 300]
    assert matmul_sizes("cpu", False, 512) == [64, 128, 256, 512]
    assert memory_sizes(32 * 2**20, False, None)[-1] == 128 * 2**20  # 4x a 32 MiB last-level cache
    assert memory_sizes(50 * 2**20, False, None)[-1] == 256 * 2**20  # at least 4x an H100's 50 MiB L2
    assert collective_sizes("cpu", False, 2**14) == [2**10, 2**12, 2**14]
    assert estimate_bytes("matmul", 1024, "bfloat16") == 3 * 1024 * 1024 * 2


def check_points(rows: list[dict], samples_max: int) -> None:
    """Every ok point: raw samples kept, rates from them, the first call apart."""
    for row in rows:
        assert row["status"] == "ok", row
        times = np.asarray(row["samples_s"])
        assert 3 <= len(times) == row["samples"] <= samples_max and row["first_s"] > 0
        assert row["median_s"] == pytest.approx(np.median(times))
        if row["kind"] in ("matmul", "memory", "collective"):
            work = {
                "matmul": row.get("flops_per_op"),
                "memory": row.get("bytes_per_op"),
                "collective": row.get("bytes_per_op", 0) * row.get("busbw_factor", 0),
            }[row["kind"]]
            assert row["median_rate"] == pytest.approx(np.median(work / times))
            assert row["max_rate"] == pytest.approx((work / times).max())
            assert row["p10_rate"] <= row["median_rate"] <= row["max_rate"]


@pytest.fixture(scope="module")
def cpu_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a cpu matmul, STREAM and latency sweep and a tiny registry run beside them."""
    results = tmp_path_factory.mktemp("ceilings")
    runner = SuiteRunner(results)
    specs = [
        CeilingSpec("cpu", "matmul", dtypes=("float32",), max_size=MATMUL_MAX),
        CeilingSpec("cpu", "memory", max_size=MEMORY_MAX),
        CeilingSpec("cpu", "latency"),
    ]
    run_ceilings(runner, specs)
    SuiteRunner(results).run(plan(["gpt2"], sizes=["tiny"], backends=["cpu"], modes=["infer"], warmup=1, steps=3))
    return results


def test_cpu_matmul_stream_latency(cpu_store: Path) -> None:
    rows = store.load_ceilings(cpu_store).to_dict("records")
    by_kind = {kind: [r for r in rows if r["kind"] == kind] for kind in ("matmul", "memory", "latency")}
    check_points(rows, 10)
    assert [(r["m"], r["n"], r["k"]) for r in by_kind["matmul"]] == [(64, 64, 64), (128, 128, 128)]
    assert all(
        r["flops_per_op"] == 2 * r["m"] * r["n"] * r["k"] and r["rate_unit"] == "FLOP/s" for r in by_kind["matmul"]
    )
    assert all(r["flush_bytes"] and r["flush_bytes"] >= 2 * r["llc_bytes"] for r in by_kind["matmul"])
    assert {(r["op"], r["size_bytes"]) for r in by_kind["memory"]} == {
        (op, size) for op in ("copy", "scale", "add", "triad") for size in (2**20, 2**21)
    }
    assert all(r["bytes_per_op"] == stream_bytes(r["op"], r["size_bytes"]) for r in by_kind["memory"])
    assert [r["op"] for r in by_kind["latency"]] == ["empty_step", "tiny_op"]
    assert {r["timing"] for r in rows} == {"perf_counter"} and {r["device_kind"] for r in rows} == {"cpu"}


def test_show_lists_ceilings_beside_the_datasheet(cpu_store: Path) -> None:
    done = tpubench("ceilings --show --json --select kind=matmul --results", str(cpu_store))
    assert done.returncode == 0, done.stderr
    lines = json.loads(done.stdout)
    # The ceiling is the sweep's fastest point, whichever shape that was on this host tonight.
    matmuls = store.load_ceilings(cpu_store).query("kind == 'matmul'")
    best = matmuls.loc[matmuls["median_rate"].idxmax()]
    assert [(line["kind"], line["dtype"], line["shape"]) for line in lines] == [("matmul", "float32", best["shape"])]
    assert lines[0]["datasheet"] is None and lines[0]["ratio"] is None  # no CPU has a data-sheet entry


def test_mfu_attained_where_a_ceiling_exists(cpu_store: Path) -> None:
    """A run on the device and dtype of a measured ceiling gets achieved / ceiling and the
    sweep's run id; the same run on a device without one (an H100 here) gets null. A run that
    beats its ceiling shows no figure: the ceiling was measured low (``ceiling_low``), and
    compare, its Markdown and every reader say so instead of a ratio above 1."""
    from reports.markdown import cross_markdown
    from tpubench.analysis.compare import cross_backend

    run = store.load_runs(cpu_store).iloc[[0]]
    ceilings = store.load_ceilings(cpu_store)
    best = ceilings[ceilings["kind"] == "matmul"]["median_rate"].max()
    seconds = run["median_step_ms"].iloc[0] / 1e3
    # the same run doing a quarter of the ceiling's work per second, then twice it
    below, above = (run.assign(flops_per_step=share * best * seconds, run_id=f"x{share}") for share in (0.25, 2.0))
    elsewhere = run.assign(device="NVIDIA H100 80GB HBM3", backend="cuda", run_id="other")
    frame = analysis.attach_attained(pd.concat([below, above, elsewhere], ignore_index=True), ceilings)
    here, beaten, there = frame.iloc[0], frame.iloc[1], frame.iloc[2]
    assert pd.isna(beaten["mfu_attained"]) and beaten["ceiling_low"]  # 2.0 is no figure to show
    assert here["mfu_attained"] == pytest.approx(0.25) and not here["ceiling_low"]
    assert here["ceiling_run_id"] == ceilings[ceilings["kind"] == "matmul"]["run_id"].iloc[0]
    assert here["ceiling_choice"].startswith(f"cpu matmul float32 sweep {here['ceiling_run_id']}")
    assert beaten["ceiling_flops_per_s"] == pytest.approx(best)  # the ceiling it beat stays named
    assert pd.isna(there["mfu_attained"]) and pd.isna(there["ceiling_run_id"]) and not there["ceiling_low"]
    assert pd.isna(there["mfu"]) or there["mfu"] >= 0  # MFU against the data sheet stays its own column
    assert analysis.attained_text(here["mfu_attained"], here["ceiling_low"]) == "25.0%"
    cross = cross_backend(frame.iloc[[1]], frame.iloc[[2]], {})
    assert cross["base_ceiling_low"].tolist() == [True] and cross["base_mfu_attained"].isna().all()
    assert analysis.CEILING_LOW in cross_markdown(cross)


def test_a_sweep_without_an_array_past_the_caches_never_sets_the_memory_ceiling(
    cpu_store: Path, tmp_path: Path
) -> None:
    """The fixture's memory sweep stops at 2 MiB (--max-size), far below 4x this host's last-level
    cache: a cache's figure. Beside an older sweep that went past the caches (its rows as a sweep
    without --max-size writes them), --show and the roofline read the older one's arrays past
    the caches and say which sweep and why; alone, the limited sweep sets no memory ceiling and
    --show marks its figures a cache's, with no data-sheet ratio."""
    from tpubench.analysis.roofline import ceilings_for

    real = store.load_ceilings(cpu_store)
    limited, matmul = real[real["kind"] == "memory"], real[real["kind"] == "matmul"]
    full = another_sweep(limited, "full-sweep", -60, past_cache=4.0)  # an hour before, DRAM 4x slower per byte
    reach = analysis.cache_reach(limited["llc_bytes"].iloc[0])
    assert limited["size_bytes"].max() < reach  # the fixture's sweep is the limited one
    both, alone = tmp_path / "both", tmp_path / "alone"
    write_sweeps(both, limited, full, matmul)
    write_sweeps(alone, limited, matmul)

    done = tpubench("ceilings --show --json --select kind=memory --results", str(both))
    assert done.returncode == 0, done.stderr
    lines = json.loads(done.stdout)
    assert [(line["op"], line["run_id"], line["shape"]) for line in lines] == [
        (op, "full-sweep", analysis.size_label(reach)) for op in ("add", "copy", "scale", "triad")
    ]
    past = full[full["size_bytes"] == reach].set_index("op")["median_rate"]
    assert {line["op"]: line["median_rate"] for line in lines} == pytest.approx(past.to_dict())
    assert all(line["ceiling"] and "sweep full-sweep" in line["choice"] for line in lines)
    assert all("the only sweep past the caches; 1 sweep(s) with no array past 4x" in line["choice"] for line in lines)
    device = limited["device"].iloc[0]
    roof = ceilings_for(device, "cpu", "float32", analysis.roofline_frame(store.load_ceilings(both)))
    assert roof.source == "measured" and roof.bandwidth_bytes_per_s == pytest.approx(past.max())
    assert "memory from cpu sweep full-sweep" in roof.describe()

    shown = tpubench("ceilings --show --results", str(alone))
    assert shown.returncode == 0, shown.stderr
    assert "(a cache's)" in shown.stdout and "not a ceiling but a cache's figure" in " ".join(shown.stdout.split())
    lines = analysis.summary(store.load_ceilings(alone))
    memory = lines[lines["kind"] == "memory"]
    assert len(memory) == 4 and not memory["ceiling"].any() and memory["ratio"].isna().all()
    frame = analysis.roofline_frame(store.load_ceilings(alone))
    unset = frame[frame["kind"] == "memory"]  # one row that says why, and no figure for a roofline to take
    assert len(unset) == 1 and unset["bytes_per_s"].isna().all() and "not a ceiling" in unset["sweep"].iloc[0]
    assert ceilings_for(device, "cpu", "float32", frame).source == "none"


@pytest.mark.nightly
def test_a_limited_memory_sweep_after_a_full_one_leaves_the_full_ones_ceiling(tmp_path: Path) -> None:
    """The new user's case, both sweeps real: `tpubench ceilings --kind memory` (to 4x the
    last-level cache; about 30 s on a 2-core host), then the same with --max-size 2 MiB. The
    newer, limited sweep's closing line calls its figure a cache's, and --show keeps reading
    the full sweep's arrays past the caches."""
    results = str(tmp_path / "results")
    full = tpubench("ceilings --backend cpu --kind memory --results", results)
    assert full.returncode == 0, full.stderr
    assert "(arrays past 4x the last-level cache:" in " ".join(full.stdout.split()), full.stdout
    limited = tpubench("ceilings --backend cpu --kind memory --max-size 2097152 --results", results)
    assert limited.returncode == 0, limited.stderr
    assert "a cache's figure: no array reached" in " ".join(limited.stdout.split()), limited.stdout
    rows = store.load_ceilings(results)
    first = rows.loc[rows["started_at"].idxmin(), "run_id"]
    reach = analysis.cache_reach(rows["llc_bytes"].iloc[0])
    done = tpubench("ceilings --show --json --results", results)
    assert done.returncode == 0, done.stderr
    lines = json.loads(done.stdout)
    assert {(line["run_id"], line["ceiling"]) for line in lines} == {(first, True)}
    largest = rows.loc[rows["run_id"] == first, "size_bytes"].max()  # the one size past the caches
    assert largest >= reach and {line["shape"] for line in lines} == {analysis.size_label(largest)}


def test_the_quietest_sweep_sets_the_ceiling_and_show_gives_the_spread(cpu_store: Path, tmp_path: Path) -> None:
    """Four sweeps of the fixture's matmul points, as a busy host gives them: the newest two with
    other processes on 60% and 50% of the CPUs, 4x and 2x slower; a quiet one (2%) with tight
    samples, and a newer one as quiet (3%) whose samples spread wider. The quiet, tight one sets
    the ceiling for --show, mfu_attained and the roofline, which say why; --show gives the spread
    of the point over the four."""
    real = store.load_ceilings(cpu_store)
    matmul = real[real["kind"] == "matmul"]
    quiet = another_sweep(matmul, "quiet", -40, other_cpu_share=0.02)
    loose = another_sweep(matmul, "loose", -30, other_cpu_share=0.03)
    loose = loose.assign(min_s=loose["min_s"] / 2)  # (p90 - min) / median wider
    busy = another_sweep(matmul, "busy", -20, slower=2.0, other_cpu_share=0.5)
    busier = another_sweep(matmul, "busier", -10, slower=4.0, other_cpu_share=0.6)
    results = tmp_path / "results"
    write_sweeps(results, quiet, loose, busy, busier)
    ceilings = store.load_ceilings(results)

    done = tpubench("ceilings --show --json --results", str(results))
    assert done.returncode == 0, done.stderr
    (line,) = json.loads(done.stdout)
    best = quiet.loc[quiet["median_rate"].idxmax()]
    assert (line["run_id"], line["shape"]) == ("quiet", best["shape"])
    assert line["median_rate"] == pytest.approx(best["median_rate"])
    assert line["point_sweeps"] == 4
    assert (line["point_low"], line["point_high"]) == pytest.approx((best["median_rate"] / 4, best["median_rate"]))
    shown = tpubench("ceilings --show --results", str(results))
    assert f"4: {analysis.rate_text(best['median_rate'] / 4, 'FLOP/s')} to" in shown.stdout, shown.stdout
    assert "sweep quiet" in shown.stdout
    table = analysis.matmul_ceilings(ceilings)
    assert table["ceiling_run_id"].tolist() == ["quiet"]
    assert table["ceiling_flops_per_s"].tolist() == pytest.approx([best["median_rate"]])
    assert analysis.roofline_frame(ceilings)["flops_per_s"].max() == pytest.approx(best["median_rate"])
    chosen = analysis.choose(ceilings)
    assert chosen["run_id"].tolist() == ["quiet"] and chosen["sweeps"].tolist() == [4]
    assert "the tightest samples" in chosen["choice"].iloc[0]

    # on their own, the busy sweeps: the quieter of the two, though older, and why
    chosen = analysis.choose(ceilings[ceilings["run_id"].isin(["busy", "busier"])])
    assert chosen["run_id"].tolist() == ["busy"]
    assert "the quietest of 2 sweeps: other processes used 50% of the CPUs, 60% in the others" in chosen["choice"][0]
    assert "measured on a busy host" in chosen["choice"][0]


@pytest.mark.parametrize("group", [2, pytest.param(4, marks=pytest.mark.nightly)])
def test_gloo_collectives(group: int, results_dir: Path) -> None:
    """Real gloo ranks on loopback: every collective at each size, busbw with nccl-tests' factor."""
    spec = CeilingSpec("cpu", "collective", devices=group, max_size=MESSAGE_MAX)
    rows = run_ceilings(SuiteRunner(results_dir), [spec])
    check_points(rows, 10)
    assert {(r["op"], r["size_bytes"]) for r in rows} == {(op, 1024) for op in BUSBW_FACTORS if op != "reduce"}
    for row in rows:
        assert row["busbw_factor"] == pytest.approx(BUSBW_FACTORS[row["op"]](group))
        assert row["algbw_median"] == pytest.approx(row["size_bytes"] / row["median_s"])
        assert row["devices"] == group and row["simulated"] is True
    assert len(store.load_ceilings(results_dir)) == len(rows)


def test_xla_matmul_and_stream_on_pjrt_cpu(xla_python: str, results_dir: Path) -> None:
    """torch_xla on PJRT CPU: a sample is 8 chained products (or STREAM kernels behind
    optimisation barriers) in one graph, divided by 8; the rates come out in the CPU's range."""
    runner = SuiteRunner(results_dir, pythons={"xla": xla_python})
    specs = [
        CeilingSpec("xla", "matmul", dtypes=("float32",), max_size=MATMUL_MAX),
        CeilingSpec("xla", "memory", max_size=2**20),
    ]
    rows = run_ceilings(runner, specs)
    check_points(rows, 10)
    assert {r["timing"] for r in rows} == {"xla_graph/8"} and {r["reps"] for r in rows} == {8}
    assert {r["op"] for r in rows if r["kind"] == "memory"} == {"scale", "add", "triad"}  # XLA elides a copy
    assert all(1e6 < r["median_rate"] < 1e13 for r in rows)  # sane for a CPU, not a tracing artefact
    assert {r["device"] for r in rows} == {"CPU (PJRT)"}


#: nccl-tests' bus-bandwidth factor of each collective at group sizes 2 and 4, written out
#: (all-reduce 2(n-1)/n, broadcast 1, the others (n-1)/n) so the test checks the one definition's numbers
FACTORS = {
    ("all_reduce", 2): 1.0,
    ("all_reduce", 4): 1.5,
    ("broadcast", 2): 1.0,
    ("broadcast", 4): 1.0,
    **{(op, n): (n - 1) / n for op in ("all_gather", "reduce_scatter", "all_to_all") for n in (2, 4)},
}


@pytest.mark.parametrize("group", [pytest.param(2, marks=pytest.mark.nightly), 4])
def test_xla_spmd_collectives_over_virtual_devices(
    group: int, xla_python: str, results_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch_xla's own collectives under SPMD in one worker over CPU_NUM_DEVICES virtual
    devices: every collective, 8 chained in one graph per sample and divided by 8, busbw by
    nccl-tests' factors. XLA's optimised HLO (dumped by the worker) holds exactly 8 of the op
    per graph, over the group's devices: none merged, none left out. Broadcast is torch_xla's
    (an all-reduce of the tensor scaled by 1 on the root, 0 elsewhere): 8 all-reduces, and
    after the first every device holds the root's data."""
    dump = tmp_path / "hlo"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to={dump} --xla_dump_hlo_as_text")
    runner = SuiteRunner(results_dir, pythons={"xla": xla_python})
    rows = run_ceilings(runner, [CeilingSpec("xla", "collective", devices=group, max_size=MESSAGE_MAX)])
    check_points(rows, 10)
    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
    assert [(r["op"], r["size_bytes"], r["devices"]) for r in rows] == [(op, 1024, group) for op in ops]
    for row in rows:
        assert row["busbw_factor"] == pytest.approx(FACTORS[row["op"], group])
        assert row["bytes_per_op"] == 1024 and row["algbw_median"] == pytest.approx(1024 / row["median_s"])
        assert (row["timing"], row["reps"], row["simulated"], row["device"]) == ("xla_graph/8", 8, True, "CPU (PJRT)")
        assert "broadcast is torch_xla's collective_broadcast" in row["warnings"]
    graphs = []  # each compiled graph with collectives: {opcode: count}, and the sizes of its groups
    for path in dump.glob("*after_optimizations.txt"):
        text = path.read_text()
        found = {op: text.count(f" {op}(") for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")}
        if any(found.values()):
            sizes = {len(g.split(",")) for g in re.findall(r"replica_groups=\{\{([0-9,]+)\}\}", text)}
            graphs.append(({op: count for op, count in found.items() if count}, sizes))
    hlo_op = {"broadcast": "all-reduce"}  # torch_xla's broadcast is an all-reduce
    expected = [({hlo_op.get(op, op.replace("_", "-")): 8}, {group}) for op in ops]
    assert sorted(graphs, key=str) == sorted(expected, key=str)


def test_refusals_by_the_devices_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the probe says a device lacks is refused before any worker: a dtype below a GPU's
    compute capability, a collective where the backend has one device or fewer than the group,
    a size the memory cannot hold (with the estimate). Simulated devices default to a group of 2."""
    from tpubench.cli.ceilings import check_backend, plan
    from tpubench.cli.common import BadInput

    monkeypatch.setenv("PJRT_DEVICE", "CPU")

    volta = {"device_name": "Tesla V100", "compute_capability": "7.0", "parallel_devices": 1}
    cases = [
        (
            "cuda",
            volta,
            ["matmul"],
            ["bfloat16"],
            None,
            None,
            "cuda (Tesla V100) has no bfloat16 matmul; valid: float32, float16",
        ),
        (
            "xla",
            {"parallel_devices": 1},
            ["collective"],
            [],
            None,
            None,
            "collective ceilings need at least 2 devices; xla has 1",
        ),
        ("xla", {"parallel_devices": 4}, ["collective"], [], None, [8], "--group-size 8: xla has 4 devices"),
        (
            "cpu",
            {"memory_bytes": 2**30},
            ["memory"],
            [],
            2**30,
            None,
            "a memory point needs about 3.0 GiB, more than the 1.0 GiB",
        ),
    ]
    for backend, availability, kinds, dtypes, max_size, groups, message in cases:
        with pytest.raises(BadInput, match=re.escape(message)):
            check_backend(backend, availability, kinds, dtypes, max_size, groups)
    check_backend("xla", {"parallel_devices": 4}, ["collective"], [], None, [2, 4])  # torch_xla has a sweep now
    specs = plan("xla", {"parallel_devices": 8}, ["collective"], [], None, False, None, 60.0)
    assert [(s.kind, s.devices) for s in specs] == [("collective", 2)]  # PJRT CPU's devices are simulated
    specs = plan("xla", {"parallel_devices": 8}, ["collective"], [], None, True, None, 60.0)
    assert [s.devices for s in specs] == [2, 4, 8]


def test_bad_input_is_one_error_line(results_dir: Path) -> None:
    """Refused before anything is measured. What the options alone refuse is checked in this
    process; a matmul too large for the device and a collective over too few devices run the
    real command (the process-level check of ``ceilings``' refusals): a worker reads the
    device's memory and count for them, which the CLI run here would leave as a fork server."""
    for line, message in (
        ("--backend cpu --dtype fp8", "cpu has no fp8 matmul; valid: float32, bfloat16, float16"),
        ("--backend cpu --kind warp", "unknown kind 'warp'; valid: matmul, memory, collective, latency"),
    ):
        done = in_process(f"ceilings {line} --results", str(results_dir))
        assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error:"), done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
    for line, message, env in (
        ("--backend cpu --kind matmul --max-size 1000000", "a matmul point needs about", {}),
        (
            "--backend cpu --kind collective",
            "collective ceilings need at least 2 devices",
            {"TPUBENCH_SIMULATED_DEVICES": "1"},
        ),
    ):
        done = tpubench(f"ceilings {line} --results", str(results_dir), env=env)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stdout + done.stderr
    assert not list(results_dir.glob("ceilings/*/*.parquet"))  # nothing ran


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("backend", ["cuda", "cuda-compile"])
def test_cuda_matmul_dtypes_and_copies(backend: str, results_dir: Path) -> None:
    """CUDA events, the L2 flush and every tensor-core dtype the GPU has (fp8 via _scaled_mm)."""
    from tpubench.ceilings import supported_dtypes

    capability = "{}.{}".format(*torch.cuda.get_device_capability(0))
    dtypes = tuple(d for d in ("bfloat16", "float16", "tf32", "fp8") if d in supported_dtypes(backend, capability))
    specs = [
        CeilingSpec(backend, "matmul", dtypes=dtypes, max_size=1024),
        CeilingSpec(backend, "memory", max_size=8 * 2**20),
    ]
    rows = run_ceilings(SuiteRunner(results_dir), specs)
    check_points([r for r in rows if not r["op"].startswith(("h2d", "d2h"))], 10)
    assert {r["timing"] for r in rows} == {"cuda_events"}
    assert {r["dtype"] for r in rows if r["kind"] == "matmul"} == set(dtypes)
    assert all(r["flush_bytes"] >= 256 * 2**20 for r in rows if r["kind"] == "matmul")
    assert {"h2d_pinned", "d2h_pageable"} <= {r["op"] for r in rows}
