"""The benchmark harness's own logic: the sustained-rate search, the open-loop generator,
how engine settings reach vLLM's server, that the fleet's Weir configs are valid, and that
bench's imports point one way (never into tests/, no cycles)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench import SUITES
from bench import __main__ as bench_main
from bench import fleet as fleet_mod
from bench.load import Client, RunResult, Sample, SseTally, open_loop, run_load
from bench.procs import vllm_server
from bench.table import closed_loop_split, concurrency_sweep, faq_bodies, max_sustained
from proxy.cli import check_config


def capacity_probe(capacity: float, log: list[float]):  # type: ignore[no-untyped-def]
    async def probe(rate: float, i: int) -> dict[str, Any]:
        log.append(rate)
        return {"rate": rate, "kept_up": rate <= capacity}

    return probe


@pytest.mark.parametrize("start", [10.0, 40.0, 99.0, 150.0, 400.0])
async def test_sustained_search_brackets_the_capacity(start: float) -> None:
    rates: list[float] = []
    found = await max_sustained(capacity_probe(100.0, rates), start, probes=20)
    assert found["req_per_s"] is not None and found["first_failed"] is not None
    assert found["req_per_s"] <= 100.0 < found["first_failed"]
    # Bisection stops once the bracket is within 10%.
    assert found["first_failed"] / found["req_per_s"] < 1.1
    assert len(rates) == len(found["probes"]) <= 20


async def test_sustained_search_is_bounded_and_honest_when_nothing_passes() -> None:
    rates: list[float] = []
    found = await max_sustained(capacity_probe(0.0, rates), 50.0, probes=4)
    assert found["req_per_s"] is None
    assert len(rates) == 4 and rates == sorted(rates, reverse=True)
    assert rates[0] == rates[1] and rates[2] == rates[3]  # each failure confirmed


async def test_one_stalled_window_does_not_fail_a_rate() -> None:
    rates: list[float] = []
    steady = capacity_probe(100.0, rates)

    async def probe(rate: float, i: int) -> dict[str, Any]:
        got = await steady(rate, i)
        return {**got, "kept_up": got["kept_up"] and i != 0}  # the first window stalls

    found = await max_sustained(probe, 60.0, probes=12)
    assert rates[:2] == [60.0, 60.0]  # the stalled rate, tried again and kept up
    assert found["req_per_s"] is not None and 90.0 <= found["req_per_s"] <= 100.0


class ScriptedCpu:
    """A server whose process tree has used `totals[k]` CPU seconds at the k-th read."""

    def __init__(self, totals: list[float]) -> None:
        self.totals, self.reads = totals, 0

    def cpu_seconds(self) -> float:
        t = self.totals[min(self.reads, len(self.totals) - 1)]
        self.reads += 1
        return t


def test_quiet_waits_until_every_server_is_idle() -> None:
    # One server burns a whole core for three intervals, then stops; the other is idle.
    busy = ScriptedCpu([0.0, 0.01, 0.02, 0.03, 0.03])
    idle = ScriptedCpu([5.0])
    with fleet_mod.Fleet() as fleet:
        fleet.started = [busy, idle]  # type: ignore[list-item]
        fleet.quiet(timeout_s=60, interval_s=0.01)
        assert busy.reads == 5  # read until two reads in a row were equal
        assert fleet.quiet_summary()["waits"] == 1
        fleet.started = []


def test_quiet_gives_up_on_a_server_busy_for_good() -> None:
    spinning = ScriptedCpu([0.01 * k for k in range(10_000)])
    with fleet_mod.Fleet() as fleet:
        fleet.started = [spinning]  # type: ignore[list-item]
        waited = fleet.quiet(timeout_s=0.05, interval_s=0.01)
        assert 0.05 <= waited < 60 and 2 <= spinning.reads < 10_000
        fleet.started = []


def chat_app(hold: asyncio.Event | None) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        await request.json()
        if hold is not None:
            await hold.wait()
        return web.json_response({"choices": [], "usage": {"completion_tokens": 3}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_open_loop_sends_every_arrival_and_counts_tokens() -> None:
    async with TestServer(chat_app(None), host="127.0.0.1") as server:
        url = str(server.make_url("/v1/chat/completions"))
        r = await open_loop(url, [{"i": i} for i in range(20)], rate=2000, seed=1)
    assert r.unsent == 0
    assert len(r.samples) == 20 and all(s.ok and s.tokens == 3 for s in r.samples)


def test_a_stream_tally_finds_the_first_content_and_the_usage() -> None:
    def event(obj: object) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    tally = SseTally()
    role = event({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert not tally.feed(role)  # an empty content is no content
    first = event({"choices": [{"delta": {"content": "Hi"}}], "usage": None})
    assert not tally.feed(first[:9])  # split mid-event: nothing yet
    assert tally.feed(first[9:] + event({"choices": [{"delta": {"content": "!"}}]}))
    assert not tally.feed(event({"choices": [{"delta": {"content": "again"}}]}))
    assert tally.tokens == 0
    assert not tally.feed(event({"choices": [], "usage": {"completion_tokens": 7}})
                          + b": comment\n\ndata: [DONE]\n\n")
    assert tally.tokens == 7 and tally.content
    legacy = SseTally()  # /v1/completions chunks carry `text`
    assert legacy.feed(event({"choices": [{"text": "x"}]}))


async def test_the_client_sends_every_body_once_and_reads_each_answer() -> None:
    seen: list[Any] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["i"])
        status = 429 if body["i"] == 7 else 200
        resp = web.json_response({"i": body["i"], "pad": "x" * body["i"] * 100},
                                 status=status, headers={"x-weir-cache": f"c{body['i']}"})
        if body["i"] % 5 == 0:
            resp.force_close()  # `Connection: close`: the client opens another
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app, host="127.0.0.1") as server:
        url = str(server.make_url("/v1/chat/completions"))
        r = await run_load(url, [{"i": i} for i in range(40)], concurrency=4)
    assert sorted(seen) == list(range(40))  # every body, once, over 4 workers' connections
    assert sorted(s.cache for s in r.samples) == sorted(f"c{i}" for i in range(40))  # type: ignore[type-var]
    assert [s.status for s in r.samples if not s.ok] == [429] and r.wall_s > 0


def stream_app(name: str = "", seen: list[tuple[str, str]] | None = None) -> web.Application:
    """Streams answer by chunked SSE, one write per event, as Weir and vLLM's server do;
    whole answers by Content-Length; `{"close": true}` closes a stream's connection.
    `seen` gets (name, the first message's content) of each request."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if seen is not None:
            seen.append((name, body["messages"][0]["content"]))
        if not body.get("stream"):
            return web.json_response({"usage": {"completion_tokens": 2}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "x-weir-cache": "miss"})
        if body.get("close"):
            resp.force_close()
        await resp.prepare(request)
        for data in ({"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                     {"choices": [{"delta": {"content": "a" * 70_000}}]},
                     {"choices": [{"delta": {"content": "b"}}]},
                     {"choices": [], "usage": {"completion_tokens": 5}}):
            await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_the_client_reads_chunked_streams_and_whole_answers_on_one_connection(
) -> None:
    async with TestServer(stream_app(), host="127.0.0.1") as server:
        url = str(server.make_url("/v1/chat/completions"))
        bodies = [{"stream": i % 2 == 0, "close": i == 4} for i in range(12)]
        r = await run_load(url, bodies, concurrency=1)
    assert len(r.samples) == 12 and all(s.ok for s in r.samples)
    streamed = r.samples[::2]
    assert [s.tokens for s in streamed] == [5] * 6 and {s.cache for s in streamed} == {"miss"}
    assert all(s.ttft is not None and s.ttft <= s.e2e for s in streamed)
    assert [s.tokens for s in r.samples[1::2]] == [2] * 6


async def test_the_client_sends_again_when_an_idle_connection_was_closed() -> None:
    """A server that answers one request a connection, as one whose keep-alive timeout
    ends just as the client sends its next: it reads the next request and closes without
    a byte of answer. The client sends that request again, on a new connection."""
    served: list[int] = []
    dropped: list[int] = []
    ended: list[int] = []
    all_ended = asyncio.Event()  # the three connections' handlers are done

    async def body(reader: asyncio.StreamReader) -> int:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return int(json.loads(await reader.readexactly(length))["i"])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(await body(reader))
        answer = b'{"usage": {"completion_tokens": 1}}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(answer), answer))
        with contextlib.suppress(asyncio.IncompleteReadError):
            dropped.append(await body(reader))
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        ended.append(len(ended))
        if len(ended) == 3:
            all_ended.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}/v1/chat/completions")
    try:
        samples = [await client.send(client.encode({"i": i})) for i in range(3)]
    finally:
        client.close()  # the third connection's end: its handler returns
        async with asyncio.timeout(10):
            await all_ended.wait()
        server.close()
        await server.wait_closed()
    assert all(s.ok and s.tokens == 1 for s in samples)
    assert served == [0, 1, 2] and dropped == [1, 2]  # each sent again after its drop


async def test_open_loop_stops_sending_when_the_system_falls_behind() -> None:
    hold = asyncio.Event()  # the server answers nothing: every request stays in flight
    async with TestServer(chat_app(hold), host="127.0.0.1") as server:
        url = str(server.make_url("/v1/chat/completions"))
        r = await open_loop(url, [{"i": i} for i in range(10)], rate=5000, max_in_flight=3,
                            drain_s=0.5)
        hold.set()
    assert r.unsent == 6  # 4 sent (more than 3 in flight), then it stopped
    assert len(r.samples) == 4 and not any(s.ok for s in r.samples)


def test_engine_settings_become_vllm_flags(tmp_path: Path) -> None:
    engine = {"model": "org/model", "served_model_name": "m", "dtype": "bfloat16",
              "max_num_seqs": 8, "enable_prefix_caching": False, "quantization": None,
              "gpu_memory_utilization": 0.85, "cpu_kvcache_space_gib": 2,
              "extra_args": {"enforce_eager": True}}
    s = vllm_server(tmp_path, engine, "/models/m")
    cmd = s.cmd
    assert cmd[cmd.index("--model") + 1] == "/models/m"
    assert cmd[cmd.index("--served-model-name") + 1] == "m"
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.85"
    assert "--no-enable-prefix-caching" in cmd and "--enforce-eager" in cmd
    assert "--quantization" not in cmd and "--extra-args" not in cmd
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2 * 2**30)
    assert "--cpu-kvcache-space-gib" not in cmd


def test_engine_flag_parsing() -> None:
    assert bench_main.engine_setting("gpu_memory_utilization=0.85") == (
        "gpu_memory_utilization", 0.85)
    assert bench_main.engine_setting("enable_prefix_caching=false") == (
        "enable_prefix_caching", False)
    with pytest.raises(Exception, match="KEY=VALUE"):
        bench_main.engine_setting("dtype")


@pytest.mark.parametrize("role", ["weir", "weir-exact", "weir-l2", "one-at-a-time"])
def test_fleet_weir_configs_pass_check_config(role: str, capsys: pytest.CaptureFixture[str],
                                              ) -> None:
    fleet = fleet_mod.Fleet(quick=role == "one-at-a-time")
    try:
        fleet._redis = SimpleNamespace(url="redis://127.0.0.1:1/0")  # type: ignore[assignment]
        fleet.systems["vllm"] = fleet_mod.System(  # never started: only its URL is read
            "vLLM server", "vllm", SimpleNamespace(base_url="http://127.0.0.1:1"))  # type: ignore[arg-type]
        system = fleet._make(role)
        assert system is not None and system.kind == "weir"
        config = system.server.cmd[system.server.cmd.index("--config") + 1]
        assert check_config(config) == 0, capsys.readouterr().err
        if role == "weir":
            import yaml

            cfg = yaml.safe_load(Path(config).read_text())
            names = [p["name"] for p in cfg["plugins"]]
            assert names == ["sanitizer", "rate_limit", "cache", "breaker", "admission"]
            assert {k["tenant"] for k in cfg["auth"]["keys"]} == set(SUITES)
    finally:
        fleet._redis = None
        fleet.close()


def test_litellm_requests_carry_the_suites_cache_namespace() -> None:
    lite = fleet_mod.System("LiteLLM", "litellm", SimpleNamespace(base_url="x"))  # type: ignore[arg-type]
    weir = fleet_mod.System("Weir", "weir", SimpleNamespace(base_url="x"))  # type: ignore[arg-type]
    bodies = faq_bodies("m", 5, 0.5, seed=0)
    assert all(b["cache"] == {"namespace": "bench-cache"} for b in lite.bodies(bodies, "cache"))
    assert weir.bodies(bodies, "cache") == bodies
    assert weir.headers("table") != weir.headers("cache")


def test_faq_workload_repeats_at_the_ratio_asked() -> None:
    def distinct(bodies: list[dict[str, Any]]) -> int:
        return len({b["messages"][0]["content"] for b in bodies})

    assert distinct(faq_bodies("m", 200, 0.0, seed=3)) == 200
    assert distinct(faq_bodies("m", 200, 0.6, seed=3)) < 120
    streamed = [b for b in faq_bodies("m", 10, 0.6, seed=3) if b["stream"]]
    assert len(streamed) == 5 and all(b["stream_options"]["include_usage"] for b in streamed)


def test_readme_shows_the_last_full_runs_figures() -> None:
    from bench.procs import RESULTS
    from bench.report import README, readme_with_results

    text = README.read_text()
    assert readme_with_results(text) == text, "run `python -c 'from bench.report import " \
        "update_readme; update_readme()'` after a full benchmark run"
    run = json.loads((RESULTS / "run.json").read_text())
    assert run["quick"] is False
    for name in SUITES:
        assert (RESULTS / f"{name}.md").read_text().strip() in text


def test_engine_settings_are_built_per_run_not_patched_into_a_module() -> None:
    before = dict(fleet_mod.DEFAULT_ENGINE)
    args = bench_main.parse_args(["--model", "org/big", "--engine", "dtype=bfloat16",
                                  "--engine", "max_num_seqs=8"])
    engine = bench_main.engine_settings(args)
    assert engine["model"] == engine["served_model_name"] == "org/big"
    assert engine["dtype"] == "bfloat16" and engine["max_num_seqs"] == 8
    assert "cpu_kvcache_space_gib" not in engine  # the demo model's CPU default is dropped
    assert fleet_mod.DEFAULT_ENGINE == before  # nothing shared was changed
    named = bench_main.engine_settings(bench_main.parse_args(["--served-model-name", "x"]))
    assert named["model"] == "builtin:demo" and named["served_model_name"] == "x"


def test_a_fleet_serves_the_engine_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import procs

    # Building LiteLLM's command must not install LiteLLM (ensure_litellm does, on first use).
    monkeypatch.setattr(procs, "ensure_litellm", lambda: Path("/nonexistent/litellm"))
    engine = {**fleet_mod.DEFAULT_ENGINE, "served_model_name": "bench-model"}
    fleet = fleet_mod.Fleet(engine=engine)
    try:
        assert fleet.served == "bench-model"
        assert fleet_mod.DEFAULT_ENGINE["served_model_name"] == "weir-demo"
        fleet._redis = SimpleNamespace(url="redis://127.0.0.1:1/0", port=1)  # type: ignore[assignment]
        fleet.systems["vllm"] = fleet_mod.System(  # never started: only its URL is read
            "vLLM server", "vllm", SimpleNamespace(base_url="http://127.0.0.1:1"))  # type: ignore[arg-type]
        weir = fleet._make("weir-l2")
        assert weir is not None
        import yaml

        cfg = yaml.safe_load(Path(weir.server.cmd[weir.server.cmd.index("--config") + 1])
                             .read_text())
        assert cfg["engine"]["models"] == ["bench-model"]
        lite = fleet._make("litellm")
        assert lite is not None
        lite_cfg = yaml.safe_load(Path(lite.server.cmd[lite.server.cmd.index("--config") + 1])
                                  .read_text())
        assert lite_cfg["model_list"][0]["model_name"] == "bench-model"
        assert lite_cfg["litellm_settings"]["cache_params"]["port"] == 1
    finally:
        fleet._redis = None
        fleet.close()


def test_the_suite_list_is_the_one_every_part_uses() -> None:
    import importlib

    from bench.report import SECTIONS

    parser_choices = bench_main.parse_args(["--only", *SUITES]).only
    assert parser_choices == list(SUITES)
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--only", "no-such-suite"])
    assert [name for name, _ in SECTIONS] == [*SUITES, "run"]
    for name in SUITES:
        assert callable(importlib.import_module(f"bench.{name}").run)


def _bench_imports() -> dict[str, set[str]]:
    """Every module of bench/ and what it imports, at module level or inside functions."""
    root = Path(bench_main.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        name = "bench" if path.stem == "__init__" else f"bench.{path.stem}"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = found
    return graph


def test_bench_never_imports_tests_and_has_no_import_cycle() -> None:
    graph = _bench_imports()
    assert len(graph) > 5
    for name, imports in graph.items():
        assert not any(i == "tests" or i.startswith("tests.") for i in imports), name
    edges = {n: {i for i in imports if i in graph and i != n and i != "bench"}
             for n, imports in graph.items()}
    state: dict[str, str] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = "open"
        for m in edges[n]:
            assert state.get(m) != "open", f"import cycle: {' -> '.join([*path, n, m])}"
            if m not in state:
                visit(m, [*path, n])
        state[n] = "done"

    for n in edges:
        if n not in state:
            visit(n, [])


def test_finetune_pairs_label_paraphrases_and_every_distinct_stored_question() -> None:
    from bench.finetune import pairs

    data = {"paraphrase": [["A?", "a1"], ["A?", "a2"], ["B?", "b1"]],
            "near_miss": {"number": [["B?", "B 2?"]]}}
    got = {(a, b): y for a, b, y in pairs(data)}
    assert got == {("A?", "a1"): 1.0, ("A?", "a2"): 1.0, ("B?", "b1"): 1.0,
                   ("a1", "a2"): 1.0,  # two paraphrases of one question
                   ("B?", "B 2?"): 0.0, ("A?", "B?"): 0.0}


def test_the_closed_loop_split_tells_cache_answers_from_engine_ones() -> None:
    def sample(ms: float, cache: str | None, ok: bool = True) -> Sample:
        return Sample(ok=ok, status=200 if ok else 500, ttft=None, e2e=ms / 1000, tokens=1,
                      cache=cache)

    r = RunResult(samples=[sample(2, "exact"), sample(4, "semantic"), sample(3, "exact"),
                           sample(150, "miss"), sample(170, "miss"), sample(190, None),
                           sample(900, "miss", ok=False)])
    split = closed_loop_split(r)
    assert split["cache"]["share"] == 0.5 and split["engine"]["share"] == 0.5
    assert split["cache"]["p50_ms"] == 3.0 and split["engine"]["p50_ms"] == 170.0
    assert 3.0 < split["cache"]["p99_ms"] <= 4.0 and 170 < split["engine"]["p99_ms"] <= 190
    empty = {"share": None, "p50_ms": None, "p99_ms": None}
    assert closed_loop_split(RunResult())["engine"] == empty


async def test_the_sweep_alternates_the_systems_and_keeps_one_row_a_level() -> None:
    seen: list[tuple[str, str]] = []
    async with TestServer(stream_app("A", seen), host="127.0.0.1") as a, \
            TestServer(stream_app("B", seen), host="127.0.0.1") as b:
        systems = {name: (SimpleNamespace(chat_url=str(s.make_url("/v1/chat/completions"))),
                          {}) for name, s in (("A", a), ("B", b))}
        rows = await concurrency_sweep(systems, "m", [1, 4], lambda: 0.0)  # type: ignore[arg-type]
    # Per level: A then B in the first round, B then A in the second.
    runs = []
    for name, content in seen:
        run = (name, content.rsplit(" ", 1)[0])
        if not runs or runs[-1] != run:
            runs.append(run)
    assert runs == [("A", "sweep 1 0"), ("B", "sweep 1 0"), ("B", "sweep 1 1"),
                    ("A", "sweep 1 1"), ("A", "sweep 4 0"), ("B", "sweep 4 0"),
                    ("B", "sweep 4 1"), ("A", "sweep 4 1")]
    assert len(seen) == 2 * 2 * (32 + 32)
    for name in ("A", "B"):
        assert [r["concurrency"] for r in rows[name]] == [1, 4]
        assert all(r["output_tok_per_s"] > 0 and r["req_per_s"] > 0 for r in rows[name])


@pytest.mark.parametrize("stream", [False, True])
async def test_the_gateway_suite_s_instant_engine_serves_the_default_chain(
        aiohttp_client: Any, stream: bool) -> None:
    """The overhead suite's gateway-only runs (bench/mock_server.py) put every plugin in
    front of `InstantEngine`: an engine interface change it missed made every request a
    500 there, and the suite's load timed out."""
    from bench.fleet import default_plugins
    from bench.mock_engine import InstantEngine
    from proxy.app import create_app
    from tests.conftest import make_settings

    settings = make_settings(plugins=default_plugins(), embeddings={"enabled": False})
    client = await aiohttp_client(create_app(settings, engine=InstantEngine("mock", 4)))
    body = {"model": "mock", "max_tokens": 8, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "What are the opening hours?"}]}
    for cache in ("miss", "exact"):
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status == 200, await r.text()
        assert r.headers["x-weir-cache"] == cache
        await r.read()


async def test_the_mock_server_hides_its_startup_heap_before_it_listens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`weir serve` hides its startup heap from the garbage collector once its engine is
    up; the mock server did not, so every collection of the oldest generation walked the
    plugins' and the embedder's heap there, and the gateway suite charged a chain with
    more to load for it per request. It hides it once the engine started, before it
    listens (the first request measured finds it hidden)."""
    import yaml

    from bench import mock_server

    config = tmp_path / "mock.yaml"
    config.write_text(yaml.safe_dump({
        "engine": {"kind": "vllm", "model": "builtin:demo", "served_model_name": "mock"},
        "auth": {"mode": "open"}, "embeddings": {"enabled": False}, "plugins": []}))
    events: list[str] = []
    started = mock_server.InstantEngine.start

    async def engine_start(self: Any) -> None:
        await started(self)
        events.append("engine started")

    async def listen(self: Any) -> None:
        events.append("listening")
        raise asyncio.CancelledError  # (enough: the order is what is asked)

    monkeypatch.setattr(mock_server.InstantEngine, "start", engine_start)
    monkeypatch.setattr(mock_server, "freeze_startup_heap", lambda: events.append("frozen"))
    monkeypatch.setattr(web.TCPSite, "start", listen)
    with contextlib.suppress(asyncio.CancelledError):
        await mock_server._serve(str(config), 0, 4)
    assert events == ["engine started", "frozen", "listening"]


def test_the_cpu_cost_tool_parses_its_arguments(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench.cpu_cost` (its servers are processes: only its arguments here)."""
    from bench import cpu_cost

    monkeypatch.setattr("sys.argv", ["cpu_cost", "--help"])
    with pytest.raises(SystemExit) as e:
        cpu_cost.main()
    assert e.value.code == 0 and "--against" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["cpu_cost", "--only", "some"])
    with pytest.raises(SystemExit) as e:
        cpu_cost.main()
    assert e.value.code == 2


def test_the_chain_cost_tool_measures_every_chain_it_names(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench.chain_cost`, a tiny run: config/weir.yaml's chain, none and each
    plugin alone each serve its streams in process, and each gets a line."""
    from bench import chain_cost
    from bench.fleet import default_plugins

    monkeypatch.setattr("sys.argv", ["chain_cost", "--n", "3", "--rounds", "1", "--each"])
    chain_cost.main()
    lines = capsys.readouterr().out.splitlines()
    labels = [line.split()[0] for line in lines if "us/request" in line]
    assert labels == ["none", "all", *(p["name"] for p in default_plugins())]
