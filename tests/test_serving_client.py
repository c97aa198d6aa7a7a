"""The serving client against our fixed-delay test server (a real subprocess, one per module):
vLLM's metric definitions to the timer's noise, the arrival process, the concurrency limit by
the server's own count, a server that dies mid-point, and the command's refusals."""

from __future__ import annotations

import json
import math
import statistics
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from helpers import in_process, one_error_line, tpubench

from tpubench import store
from tpubench.serving import arrivals, client, datasets
from tpubench.serving.metrics import RequestRecord, parse_slos, request_record, summarize
from tpubench.serving.sweep import Load, Target, points, run_sweep
from tpubench.serving.testserver import TestServer, chunk_tokens

FIRST_MS, GAP_MS, DOUBLE_EVERY = 60.0, 40.0, 3
#: what the host's timers and two processes' event loops add to the least late of a few requests:
#: 16 ms was seen on 2 cores under a load of 14. A definition that counts the wrong chunk moves
#: every request's figure by a whole gap (40 ms) or more, so the earliest request tells it; a late
#: one, which such load makes by tens of ms, does not fail the test
LATE_MS = 25.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> TestServer:
    with TestServer(
        tmp_path_factory.mktemp("server"),
        "--first-s",
        str(FIRST_MS / 1e3),
        "--gap-s",
        str(GAP_MS / 1e3),
        "--double-every",
        str(DOUBLE_EVERY),
    ) as running:
        yield running


def stats(server: TestServer, reset: bool = False) -> dict[str, int]:
    url = server.url.removesuffix("/v1") + ("/stats/reset" if reset else "/stats")
    with urllib.request.urlopen(urllib.request.Request(url, method="POST" if reset else "GET")) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize("usage", ["separate", "last"])
def test_ttft_itl_e2el_tpot_equal_the_servers_delays(server: TestServer, usage: str) -> None:
    output = 8
    chunks = chunk_tokens(output, DOUBLE_EVERY)
    assert len(chunks) == 6 and sum(chunks) == output  # two chunks carry two tokens
    prompts = datasets.prompts("random", 4, 12, output, seed=1)
    result = client.run_point(
        server.url, "tpubench-test", prompts, [0.0] * 4, max_concurrency=2, warmups=2, extra={"testserver_usage": usage}
    )
    decode_ms = (len(chunks) - 1) * GAP_MS
    for record in result.records:  # nothing arrives before the server sends it
        assert record.error is None
        assert record.output_len == output  # the server's usage, not the 6 chunks
        assert record.input_len == 12  # the server's prompt_tokens
        assert len(record.itl_ms) == len(chunks) - 1  # gaps between chunks, not tokens
        assert record.ttft_ms >= FIRST_MS and record.e2el_ms >= FIRST_MS + decode_ms
        assert record.tpot_ms == pytest.approx((record.e2el_ms - record.ttft_ms) / (output - 1))
    assert min(record.ttft_ms for record in result.records) <= FIRST_MS + LATE_MS
    assert min(record.e2el_ms for record in result.records) <= FIRST_MS + decode_ms + LATE_MS  # not the usage chunk's
    # a stalled client reads several chunks at once (gaps of 0, then a long one): the steadiest request tells
    assert min(abs(statistics.median(record.itl_ms) - GAP_MS) for record in result.records) <= LATE_MS
    tpot_off = min(abs(record.tpot_ms - decode_ms / (output - 1)) for record in result.records)
    assert tpot_off <= LATE_MS / (output - 1)  # over 7 tokens, not 5 chunks
    figures = summarize(result.records, result.duration_s)
    assert figures["completed"] == 4 and figures["failed"] == 0
    assert figures["total_output_tokens"] == 4 * output and figures["total_input_tokens"] == 4 * 12
    assert figures["output_throughput"] == pytest.approx(4 * output / result.duration_s)


def test_a_stream_without_usage_has_no_output_tokens_and_no_tpot(server: TestServer) -> None:
    prompts = datasets.prompts("random", 1, 5, 4)
    (record,) = client.run_point(
        server.url, "tpubench-test", prompts, [0.0], extra={"testserver_usage": "none"}
    ).records
    assert record.error is None and record.ttft_ms is not None
    assert record.output_len is None and record.tpot_ms is None  # not guessed from the chunks
    assert record.input_len == 5  # the dataset's nominal length


def test_summary_goodput_and_vllm_conventions() -> None:
    records = [
        RequestRecord(10, 0.0, output_len=5, ttft_ms=100.0, itl_ms=[10.0] * 4, e2el_ms=140.0),  # tpot 10
        RequestRecord(10, 0.1, output_len=5, ttft_ms=300.0, itl_ms=[10.0] * 4, e2el_ms=340.0),  # ttft too slow
        RequestRecord(10, 0.2, output_len=3, ttft_ms=100.0, itl_ms=[60.0, 60.0], e2el_ms=220.0),  # tpot 60
        RequestRecord(10, 0.3, output_len=1, ttft_ms=50.0, itl_ms=[], e2el_ms=50.0),  # tpot 0 for goodput
        RequestRecord(10, 0.4, error="connection: reset"),
    ]
    figures = summarize(records, 2.0, parse_slos(["ttft:200", "tpot:50"]))
    assert figures["completed"] == 4 and figures["failed"] == 1
    assert figures["request_goodput"] == pytest.approx(2 / 2.0)  # the first and the one-token request
    assert figures["tpot_mean_ms"] == pytest.approx((10 + 10 + 60) / 3)  # one-token requests have no TPOT
    assert figures["total_output_tokens"] == 14 and figures["total_input_tokens"] == 40
    assert figures["total_token_throughput"] == pytest.approx(54 / 2.0)
    assert figures["itl_p50_ms"] == pytest.approx(10.0)
    assert summarize(records, 2.0)["request_goodput"] is None
    # the record of the stream's times: TTFT at the first chunk, E2EL at the last, gaps between
    record = request_record(7, 1.0, [1.05, 1.06, 1.08], 4, None, start=0.5)
    assert record.send_s == pytest.approx(0.5) and record.ttft_ms == pytest.approx(50.0)
    assert record.itl_ms == pytest.approx([10.0, 20.0]) and record.e2el_ms == pytest.approx(80.0)
    assert record.tpot_ms == pytest.approx(10.0)
    assert request_record(7, 1.0, [], 4, None, start=0.5).error  # no chunk with choices: failed


def test_gamma_arrivals_have_vllms_mean_spread_total_and_seed() -> None:
    count, rate = 4000, 8.0
    times = np.array(arrivals.arrival_times(count, rate, burstiness=1.0, seed=3))
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert times[-1] == pytest.approx(count / rate)  # rescaled to end at n/rate
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-9)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # Poisson
    steady = np.diff(arrivals.arrival_times(count, rate, burstiness=4.0, seed=3))
    assert steady.std() / steady.mean() == pytest.approx(0.5, abs=0.05)  # 1/sqrt(4)
    assert arrivals.arrival_times(50, rate, seed=3) == arrivals.arrival_times(50, rate, seed=3)
    assert arrivals.arrival_times(50, rate, seed=3) != arrivals.arrival_times(50, rate, seed=4)
    assert arrivals.arrival_times(5, math.inf) == [0.0] * 5
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            arrivals.arrival_times(5, bad)


def test_datasets_give_the_lengths_asked_and_share_prefixes(tmp_path: Path) -> None:
    random = datasets.prompts("random", 3, 50, 7, seed=2)
    assert [len(p.text.split()) for p in random] == [50] * 3 and {p.output_len for p in random} == {7}
    assert random == datasets.prompts("random", 3, 50, 7, seed=2) != datasets.prompts("random", 3, 50, 7, seed=3)
    shared = datasets.prompts("prefix:30,2", 4, 50, 7)
    heads = [tuple(p.text.split()[:30]) for p in shared]
    assert heads[0] == heads[2] != heads[1] == heads[3]  # two groups, each with its prefix
    assert len({p.text for p in shared}) == 4 and all(len(p.text.split()) == 50 for p in shared)
    conversations = [
        {"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "answer"}]}
        for i in range(3)
    ]
    (tmp_path / "share.json").write_text(json.dumps([*conversations, {"conversations": []}]))
    texts = {p.text for p in datasets.prompts(f"sharegpt:{tmp_path / 'share.json'}", 5, 50, 7)}
    assert texts == {"question 0", "question 1", "question 2"}


def test_requests_are_sent_at_their_arrival_times(server: TestServer) -> None:
    times = arrivals.arrival_times(8, 40.0, seed=0)
    prompts = datasets.prompts("random", 8, 4, 2)
    result = client.run_point(server.url, "tpubench-test", prompts, times)
    late = [record.send_s - at for record, at in zip(result.records, times, strict=True)]
    assert min(late) >= 0 and statistics.median(late) <= LATE_MS / 1e3, (late, times)  # never early
    assert result.duration_s >= times[-1]


def test_max_concurrency_is_never_exceeded_by_the_servers_own_count(server: TestServer) -> None:
    stats(server, reset=True)
    prompts = datasets.prompts("random", 10, 4, 3)
    result = client.run_point(server.url, "tpubench-test", prompts, [0.0] * 10, max_concurrency=3, warmups=2)
    seen = stats(server)
    assert seen["max_in_flight"] == 3 and result.max_in_flight == 3  # reached, never passed
    assert seen["requests"] == 12 and len(result.records) == 10  # the warm-ups are not kept
    assert all(record.error is None for record in result.records)


def test_a_server_that_dies_mid_point_fails_that_point_and_keeps_the_earlier(tmp_path: Path) -> None:
    results = tmp_path / "results"
    with TestServer(tmp_path, "--first-s", "0.005", "--gap-s", "0.002", "--die-after", "5") as dying:
        target = Target(
            url=dying.url, model="tpubench-test", engine="testserver", log_tail=dying.log_tail, alive=dying.alive
        )
        load = Load(input_len=4, output_len=4, num_prompts=4, warmups=0)
        writer = store.InvocationWriter(results, "inv-1", datetime.now(UTC), tables=("serving", "serving_requests"))
        written = run_sweep(target, load, points([math.inf], [1, 2, 4]), writer, "inv-1")
    assert [row["status"] for row in written] == ["ok", "failed"]  # the third point never ran
    stored = store.load_table(results, "serving").sort_values("started_at")
    assert list(stored["status"]) == ["ok", "failed"] and list(stored["completed"]) == [4, written[1]["completed"]]
    failed = stored.iloc[1]
    assert "stopped answering" in failed["error"] and failed["failed"] >= 1
    assert "dying in the middle of request 6" in failed["log_tail"]
    requests = store.load_table(results, "serving_requests")
    assert len(requests) == 8 and requests["error"].notna().sum() == failed["failed"]


def test_the_command_stores_a_sweep(server: TestServer, tmp_path: Path) -> None:
    done = in_process(
        f"serving --url {server.url} --request-rate 50,inf --max-concurrency 4 --num-prompts 6 --input-len 8 "
        "--output-len 4 --warmups 1 --goodput ttft:500 tpot:100 --tag night=1 --results",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "tpubench-testserver testserver-1" in done.stdout and "rate 50/s, concurrency 4: ok, 6/6" in done.stdout
    rows = store.load_table(tmp_path, "serving")
    assert len(rows) == 2 and set(rows["status"]) == {"ok"}
    assert list(rows["engine_version"]) == ["testserver-1"] * 2 and set(rows["request_rate"]) == {50.0, math.inf}
    assert set(rows["goodput_slos"]) == {"ttft:500 tpot:100"} and (rows["request_goodput"] > 0).all()
    assert (rows["total_output_tokens"] == 24).all() and (rows["max_concurrent_requests"] <= 4).all()
    requests = store.load_table(tmp_path, "serving_requests")
    assert len(requests) == 12 and requests["itl_ms"].map(len).eq(len(chunk_tokens(4, DOUBLE_EVERY)) - 1).all()


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("--request-rate 0", "--request-rate expects positive"),
        ("--request-rate 4,-1", "--request-rate expects positive"),
        ("--goodput ttft:fast", "--goodput expects NAME:MS"),
        ("--goodput ttft:200 latency:5", "got 'latency:5'"),
        ("--dataset sharegpt:{not_json}", "not a ShareGPT JSON file"),
        ("--dataset sharegpt:{no_conversations}", "no conversation starting with a human turn"),
        ("--dataset prefix:2000", "must be shorter than --input-len"),
        ("--dataset lines", "unknown dataset; valid: random, sharegpt:FILE"),
        ("--burstiness 0", "--burstiness expects a positive number"),
    ],
)
def test_bad_input_is_one_line_before_anything_is_sent(
    server: TestServer, tmp_path: Path, arguments: str, says: str
) -> None:
    (tmp_path / "not.json").write_text("hello\n")
    (tmp_path / "empty.json").write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "hi"}]}]))
    arguments = arguments.format(not_json=tmp_path / "not.json", no_conversations=tmp_path / "empty.json")
    stats(server, reset=True)
    line = one_error_line(in_process(f"serving --url {server.url} {arguments} --results", tmp_path / "results"))
    assert says in line
    assert stats(server)["requests"] == 0 and not (tmp_path / "results" / "serving").exists()


def test_a_url_that_does_not_answer_is_refused_after_its_timeout(tmp_path: Path) -> None:
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = tpubench(f"serving --url http://127.0.0.1:{port}/v1 --ready-timeout 0.5 --results", str(tmp_path))
    assert "no OpenAI-compatible server answered" in one_error_line(done) and "within 0.5 s" in done.stderr


def test_without_a_server_to_measure_it_says_what_to_give(tmp_path: Path) -> None:
    assert "--url is required" in one_error_line(in_process("serving --results", tmp_path))
    assert "--url expects http://HOST:PORT/v1" in one_error_line(in_process("serving --url localhost:8000"))
