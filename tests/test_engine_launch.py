"""Serving engines as processes: started in a group of their own, ready on an event, stopped
with nothing left (tpubench/launch/engine.py), and the engines' declarations
(tpubench/serving/engines/). A stand-in engine (tests/fake_engine.py) plays each way an
engine can behave; the real one, ``transformers serve``, is tests/test_serving_engine.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from helpers import in_process, one_error_line, wait_for

from tpubench import store
from tpubench.launch import engine as launch
from tpubench.serving.engines import ENGINES, unknown
from tpubench.serving.engines.base import HONOURED_FIELDS, Engine, flag_value, param_count

TESTS = Path(__file__).resolve().parent
FAKE = Engine(
    name="fake",
    summary="tests/fake_engine.py",
    launcher=("-m", "fake_engine"),
    model_flag=None,
    modules=(),
    install="(test only)",
    honours={"ignore_eos": True, "stream_options": True, "load_format_dummy": False},
    flags={"dtype": ("--dtype",), "tp_size": ("-tp", "--tensor-parallel-size")},
    accelerator="device-flag",
    docs="tests/fake_engine.py",
    version_paths=("/version",),
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "FAKE_ENGINE_STARTED": str(tmp_path / "started"),
        "FAKE_ENGINE_FAMILY": str(tmp_path / "family.json"),
    }


def gone(*pids: int) -> bool:
    """None of ``pids`` runs any more (a zombie waiting for its reaper has stopped)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def test_the_choices_are_the_contracts_and_each_says_what_it_honours() -> None:
    assert list(ENGINES) == ["vllm", "sglang", "vllm-tpu", "vllm-torchtpu", "transformers"]
    for name, engine in ENGINES.items():
        assert engine.name == name
        assert set(engine.honours) == set(HONOURED_FIELDS), name
        assert engine.ready_path.startswith("/") and engine.install and engine.docs.startswith("https://")
    # only the engine run here claims to have been; the rest are read from their documentation
    assert [name for name, engine in ENGINES.items() if engine.verified] == ["transformers"]
    assert not ENGINES["transformers"].honours["ignore_eos"]  # it answers 422 (test_serving_engine)
    assert unknown("vllm") is None
    assert unknown("tgi") == "unknown engine 'tgi'; choose from vllm, sglang, vllm-tpu, vllm-torchtpu, transformers"


def test_argv_puts_the_model_host_port_and_the_users_arguments_in_the_engines_places() -> None:
    vllm = ENGINES["vllm"].argv("org/model", 8123, ["--load-format", "dummy"])
    assert vllm[1:] == ["serve", "org/model", "--host", "127.0.0.1", "--port", "8123", "--load-format", "dummy"]
    sglang = ENGINES["sglang"].argv("org/model", 8123)
    assert sglang[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert sglang[3:] == ["--model-path", "org/model", "--host", "127.0.0.1", "--port", "8123"]
    transformers = ENGINES["transformers"].argv("/models/tiny", 9, ["--device", "cpu"])
    assert Path(transformers[0]).name == "transformers" and transformers[1:3] == ["serve", "/models/tiny"]
    assert transformers[-3:] == ["--continuous-batching", "--device", "cpu"]


def test_settings_are_read_from_the_engines_own_flags() -> None:
    vllm = ENGINES["vllm"]
    assert vllm.settings(["-tp", "4", "--dtype=bfloat16", "-q", "fp8"]) == {
        "dtype": "bfloat16",
        "tp_size": 4,
        "quantization": "fp8",
    }
    assert vllm.settings([]) == {"dtype": None, "tp_size": None, "quantization": None}
    assert ENGINES["sglang"].settings(["--tp", "2"])["tp_size"] == 2
    assert ENGINES["transformers"].settings(["--tp", "2"])["tp_size"] is None  # not one of its flags
    assert flag_value(["--dtype", "a", "--dtype=b"], ["--dtype"]) == "b"  # the last one wins, as argparse has it


def test_the_version_is_the_servers_or_the_packages_with_a_plugins_beside_it() -> None:
    import importlib.metadata

    psutil_version = importlib.metadata.version("psutil")
    plugin = replace(FAKE, version_packages=("tpubench-no-such-package", "psutil"))
    assert plugin.version("0.11.0") == f"0.11.0, psutil {psutil_version}"  # vLLM's own, then the plugin's
    assert plugin.version(None) is None  # no version of the engine itself: a plugin's alone says too little
    package = replace(FAKE, version_packages=("psutil",))
    assert package.version(None) == psutil_version and package.version("2.0") == "2.0"
    assert ENGINES["vllm-tpu"].version_packages == ("vllm", "tpu-inference")


def test_an_engine_not_installed_says_how_to_install_it() -> None:
    absent = replace(FAKE, name="absent", modules=("tpubench_no_such_module",), install="pip install absent")
    assert absent.missing() == (
        "engine absent is not installed here (tpubench_no_such_module missing): pip install absent"
    )
    assert ENGINES["transformers"].missing() is None  # the serving extra is installed for the tests


def test_ready_is_the_ready_path_answering_and_stop_leaves_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    log = tmp_path / "logs" / "engine.log"
    with launch.start(FAKE, "ready", ["-tp", "2"], log, ready_timeout_s=60, env=env) as running:
        assert running.alive() and running.cold_start_s is not None
        assert 0 < running.cold_start_s < time.perf_counter() - running.spawned_at
        assert running.version == "9.9"  # from its /version
        assert running.url == f"http://127.0.0.1:{running.port}/v1"
        assert os.getpgid(running.process.pid) == running.process.pid  # a group of its own
        assert running.honoured == dict(FAKE.honours) and running.engine_args == ["-tp", "2"]
        pid = running.process.pid
    assert gone(pid) and not running.alive()
    assert "serving" in log.read_text() and "fake_engine ready --host 127.0.0.1" in log.read_text()
    running.stop()  # twice is harmless


def test_an_engine_that_dies_while_loading_is_an_error_at_once_with_its_log(
    tmp_path: Path, env: dict[str, str]
) -> None:
    started = time.perf_counter()
    with pytest.raises(launch.EngineError) as raised:
        launch.start(FAKE, "die", [], tmp_path / "engine.log", ready_timeout_s=300, env=env)
    assert time.perf_counter() - started < 60  # its exit, not the 300 s timeout
    assert str(raised.value).startswith("engine fake exited with code 3 before it was ready (log: ")
    assert "CUDA out of memory (fake)" in raised.value.log_tail
    assert (tmp_path / "engine.log").exists()  # kept


def test_an_engine_never_ready_is_stopped_at_its_timeout(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(launch.EngineError, match=r"was not ready within 2 s \(http://127\.0\.0\.1:\d+/health"):
        launch.start(FAKE, "never", [], tmp_path / "engine.log", ready_timeout_s=2, env=env)
    assert gone(int(Path(env["FAKE_ENGINE_STARTED"]).read_text()))


def test_stop_kills_what_ignores_sigterm_even_outside_the_group(tmp_path: Path, env: dict[str, str]) -> None:
    running = launch.start(FAKE, "stubborn", [], tmp_path / "engine.log", ready_timeout_s=60, env=env)
    family = [running.process.pid, *json.loads(Path(env["FAKE_ENGINE_FAMILY"]).read_text())]
    assert os.getpgid(family[2]) != running.process.pid  # the one that left the group
    started = time.perf_counter()
    running.stop(grace_s=1.0)
    assert gone(*family)
    assert time.perf_counter() - started < 30  # SIGKILL after the grace, not a hang


def test_ctrl_c_while_waiting_stops_the_engine(tmp_path: Path, env: dict[str, str]) -> None:
    started = Path(env["FAKE_ENGINE_STARTED"])

    def interrupt_once_started() -> None:
        wait_for(started.exists, "the fake engine's start")
        os.kill(os.getpid(), signal.SIGINT)

    # a background job (a CI runner, `bash .ci/run &`) starts with SIGINT ignored, and Python
    # then raises no KeyboardInterrupt: handle it here as a terminal's Ctrl-C is
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_started, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            launch.start(FAKE, "never", [], tmp_path / "engine.log", ready_timeout_s=120, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert gone(int(started.read_text()))


def test_the_engine_dies_with_the_process_that_started_it(tmp_path: Path, env: dict[str, str]) -> None:
    """A SIGKILLed tpubench runs no cleanup: the kernel's parent-death signal stops the engine."""
    script = (
        "import sys; from pathlib import Path; from tpubench.launch import engine; import test_engine_launch as t; "
        "r = engine.start(t.FAKE, 'ready', [], Path(sys.argv[1]), 60); print(r.process.pid, flush=True); "
        "import signal; signal.pause()"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "e.log")], stdout=subprocess.PIPE, env=env)
    assert parent.stdout is not None
    engine_pid = int(parent.stdout.readline())
    assert not gone(engine_pid)
    parent.kill()
    parent.wait()
    wait_for(lambda: gone(engine_pid), "the engine's exit after its parent's death", timeout=30)


def test_the_chip_is_read_from_the_host() -> None:
    transformers = ENGINES["transformers"]
    cpu = launch.local_chip(transformers, ["--device", "cpu"], {})
    assert cpu and cpu == launch.cpu_model()
    tpus = launch.tpu_pci_devices()
    assert launch.local_chip(ENGINES["vllm-tpu"], [], {}) == (tpus[0].chip if tpus else None)


# tpubench serving --engine: the command's side, with the stand-in engine as a choice


@pytest.fixture
def fake_choice(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, str]:
    """``--engine fake`` (ready on the test server's /v1/models) for one test; the environment it needs."""
    monkeypatch.setitem(ENGINES, "fake", replace(FAKE, ready_path="/v1/models"))
    monkeypatch.setitem(ENGINES, "absent", replace(FAKE, name="absent", modules=("tpubench_no_such_module",)))
    return {name: env[name] for name in ("PYTHONPATH", "FAKE_ENGINE_STARTED", "FAKE_ENGINE_FAMILY")}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("--engine tgi --model m", "error: unknown engine 'tgi'; choose from vllm, sglang, vllm-tpu, vllm-torchtpu"),
        ("--engine absent --model m", "error: engine absent is not installed here (tpubench_no_such_module missing)"),
        ("--engine transformers --model m --ignore-eos", "error: --ignore-eos: engine transformers does not honour"),
        ("--engine fake --model m --url http://127.0.0.1:9/v1", "error: --engine starts a server and --url names"),
        ("--engine fake", "error: --model is required with --engine"),
        ("--model m", "error: --url is required (http://HOST:PORT/v1 of a running OpenAI-compatible server), or"),
        ("--url http://127.0.0.1:9/v1 --engine-arg=-tp=2", "error: --engine-arg is for an engine this command starts"),
        ("--engine fake --model m --request-rate 0", "error: --request-rate expects positive requests/s"),
    ],
)
def test_serving_refuses_an_engine_it_cannot_start_before_starting_it(
    fake_choice: dict[str, str], tmp_path: Path, line: str, expected: str
) -> None:
    done = in_process(f"serving {line} --results", tmp_path / "results", env=fake_choice)
    assert one_error_line(done).startswith(expected)
    assert not Path(fake_choice["FAKE_ENGINE_STARTED"]).exists() and not (tmp_path / "results").exists()


def test_serving_says_why_an_engine_died_while_loading(fake_choice: dict[str, str], tmp_path: Path) -> None:
    done = in_process("serving --engine fake --model die --results", tmp_path / "results", env=fake_choice)
    assert done.returncode == 1, done.stdout + done.stderr
    first, *tail = done.stderr.splitlines()
    assert first.startswith("error: engine fake exited with code 3 before it was ready (log: ")
    assert "  RuntimeError: CUDA out of memory (fake)" in tail
    assert "Traceback" not in done.stderr and not (tmp_path / "results" / "serving").exists()


def test_an_engine_dying_mid_sweep_fails_its_point_and_keeps_the_ones_before(
    fake_choice: dict[str, str], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    done = in_process(
        "serving --engine fake --model openai --request-rate inf --max-concurrency 1,2 --num-prompts 3 "
        "--warmups 0 --input-len 4 --output-len 4 --results",
        results,
        env={**fake_choice, "FAKE_ENGINE_DIE_AFTER": "4"},
    )  # in_process also checks that the engine is gone when the command returns
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fake ready after" in done.stdout and "stopped after 2 of 2 points" not in done.stdout
    points = store.load_table(results, "serving").sort_values("max_concurrency")
    assert list(points["status"]) == ["ok", "failed"]
    assert list(points["completed"]) == [3, 1]
    assert points["cold_start_s"].gt(0).all() and (points["engine"] == "fake").all()
    assert points["engine_version"].eq("testserver-1").all()  # from its /version
    failed = points.iloc[1]
    assert failed["error"].startswith("the server stopped answering during the point")
    assert "fake_engine openai --host 127.0.0.1" in failed["log_tail"]  # the engine log's first line
    assert len(store.load_table(results, "serving_requests")) == 6


def test_a_local_models_parameters_are_counted_from_its_safetensors_headers(tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"a": np.zeros((3, 4), np.float32), "b": np.zeros(5, np.float16)}, tmp_path / "model-1.safetensors")
    save_file({"c": np.zeros((2, 2, 2), np.int8)}, tmp_path / "model-2.safetensors", metadata={"format": "pt"})
    assert param_count(str(tmp_path)) == 12 + 5 + 8
    assert param_count("org/model") is None and param_count(str(tmp_path / "absent")) is None


def test_sigterm_to_the_command_stops_the_engine_it_started(fake_choice: dict[str, str], tmp_path: Path) -> None:
    """A cancelled CI job sends SIGTERM: the command stops its engine as on Ctrl-C."""
    started = Path(fake_choice["FAKE_ENGINE_STARTED"])

    def terminate_once_started() -> None:
        wait_for(started.exists, "the fake engine's start")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_started, daemon=True).start()
    done = in_process("serving --engine fake --model never --results", tmp_path / "results", env=fake_choice)
    assert done.returncode == 128 + signal.SIGTERM  # in_process also checks that the engine is gone
    assert gone(int(started.read_text()))


def test_alive_sees_an_engine_that_is_exiting(tmp_path: Path, env: dict[str, str]) -> None:
    """The client asks ``alive`` when a connection broke, which a crashing engine breaks just
    before its exit shows: an engine killed a moment ago is not alive."""
    with launch.start(FAKE, "ready", [], tmp_path / "engine.log", ready_timeout_s=60, env=env) as running:
        os.killpg(running.process.pid, signal.SIGKILL)
        assert not running.alive()
