"""``dressage bench scale --quick``: every point of each curve, its bounds, the JSON report and the plots."""

import argparse
import json

import numpy as np
import pytest

from dressage_bench import scale, scale_proxy_cpu, scale_sessions


def test_quick_run_writes_every_point_its_bounds_and_a_plot(tmp_path):
    pytest.importorskip("matplotlib")
    parser = argparse.ArgumentParser()
    scale.register(parser.add_subparsers())
    report, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    args = parser.parse_args(["scale", "--quick", "--sizes", "64", "256", "--rounds", "3", "--units", "1", "2",
                              "--unit-steps", "3", "--sessions", "--proxy-cpu-sizes", "--json", str(report),
                              "--plot", str(plot)])
    assert args.func(args) == 0
    curves = json.loads(report.read_text())["curves"]
    curve = curves["step_size"]
    got = {(p["layers"], p["dtype"], p["tokens"]) for p in curve["points"]}
    assert got == {(layers, dtype, t) for layers in (40, 78) for dtype in ("int32", "uint8") for t in (64, 256)}
    for p in curve["points"]:
        itemsize = 4 if p["dtype"] == "int32" else 1
        assert p["stored_bytes"] == (p["tokens"] - 1) * p["layers"] * p["topk"] * itemsize
        assert p["body_bytes"] > p["stored_bytes"]
        assert p["proxy_decode_vs_b64"] > 0 and p["restore_vs_memcpy"] > 0
        # Each figure is the median of its rounds, the best beside it; the judged ratio is of the medians.
        for name in ("b64_decode", "proxy_decode", "memcpy", "restore"):
            assert 0 < p[f"{name}_best_s"] <= p[f"{name}_s"]
        assert p["restore_vs_memcpy"] == pytest.approx(p["restore_s"] / p["memcpy_s"])
        assert p["restore_vs_memcpy_best"] == pytest.approx(p["restore_best_s"] / p["memcpy_best_s"])
    assert set(curve["bounds"]) == set(scale.BOUNDS)
    for name, b in curve["bounds"].items():
        assert b["limit"] == scale.BOUNDS[name] and b["met"] == (b["worst"] <= b["limit"])
    units = curves["storage_units"]
    assert units["link"] is None  # unshaped loopback unless --link-gbit
    assert [p["units"] for p in units["points"]] == [1, 2]
    for p in units["points"]:
        assert p["steps"] == 3 and p["step_bytes"] == 4096 * 40 * 8 and 1 <= p["units_written"] <= p["units"]
        # The floor sends the rounds a PutBatcher forms from 3 waiting Steps (all in one: 3.75 MiB);
        # the batcher's own rounds are counted (1, or 2 when its thread woke before the rest came).
        assert p["batch_groups"] == [3] and 1 <= p["tq_put_rounds"] <= 2
        # Untimed rounds until every unit took a put: one put round a round here, so one per unit.
        assert p["warmup_rounds"] == p["units"] and p["units_warmed"] == p["units"]
        for mode in ("batched", "per_step"):
            m = p[mode]
            assert m["tq_vs_tcp"] == pytest.approx(m["tcp_two_hops_s"] / m["tq_s"])
            assert 0 < m["tq_best_s"] <= m["tq_s"] and 0 < m["tcp_best_s"] <= m["tcp_two_hops_s"]
            assert m["tq_vs_tcp_best"] == pytest.approx(m["tcp_best_s"] / m["tq_best_s"])
            assert m["tq_unauthenticated_vs_tcp"] == pytest.approx(m["tcp_two_hops_s"] / m["tq_unauthenticated_s"])
            assert m["tq_gbps"] == pytest.approx(2 * 3 * p["step_bytes"] / m["tq_s"] / 1e9)
            # Every timed round is in the report, the figures their medians and bests.
            raw = m["rounds_s"]
            assert set(raw) == {"tq", "tq_unauthenticated", "tcp"} and all(len(v) == p["rounds"] for v in raw.values())
            assert m["tq_s"] == pytest.approx(float(np.median(raw["tq"]))) and m["tcp_best_s"] == min(raw["tcp"])
    b = units["bounds"]["tq_vs_two_tcp_hops"]
    assert b["mode"] == "batched" and b["worst"] == min(p["batched"]["tq_vs_tcp"] for p in units["points"])
    assert b["per_step_worst"] == min(p["per_step"]["tq_vs_tcp"] for p in units["points"])
    assert b["met"] == (b["worst"] >= b["limit"] == 0.8)
    for path in (plot, tmp_path / "scale-units.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sessions" not in curves and not (tmp_path / "scale-sessions.png").exists()
    assert "proxy_cpu_points" not in curve


def test_quick_proxy_cpu_column_times_whole_chat_calls_in_the_proxy_process(tmp_path):
    """The quick Proxy-CPU column: one 1K-token Step size through a Proxy process (TQ on) in front of the
    stub engine, its CPU per call and the bare base64 decode of the same routing string, the bound judged
    on the int32 point."""
    pytest.importorskip("matplotlib")
    parser = argparse.ArgumentParser()
    scale.register(parser.add_subparsers())
    report, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    args = parser.parse_args(["scale", "--quick", "--sizes", "64", "--shapes", "40x8", "--dtypes", "int32",
                              "--rounds", "2", "--units", "--sessions", "--json", str(report), "--plot", str(plot)])
    assert args.func(args) == 0
    curve = json.loads(report.read_text())["curves"]["step_size"]
    (p,) = curve["proxy_cpu_points"]
    assert (p["tokens"], p["layers"], p["topk"], p["dtype"], p["rounds"]) == (1024, 40, 8, "int32", 2)
    # the routing string of T - 1 rows, as the stub sends it and the bare decode reads it
    assert p["routing_bytes"] == 4 * -(-(1023 * 40 * 8 * 4) // 3)
    assert p["calls_per_round"] >= 1 and p["stats_polls"] >= 2
    assert 0 < p["proxy_cpu_best_s"] <= p["proxy_cpu_s"] and 0 < p["b64_decode_best_s"] <= p["b64_decode_s"]
    assert p["proxy_cpu_vs_b64"] == pytest.approx(p["proxy_cpu_s"] / p["b64_decode_s"])
    assert p["proxy_cpu_vs_b64_best"] == pytest.approx(p["proxy_cpu_best_s"] / p["b64_decode_best_s"])
    b = curve["bounds"]["proxy_cpu_vs_b64"]
    assert b["limit"] == scale_proxy_cpu.PROXY_CPU_BOUND and b["worst"] == p["proxy_cpu_vs_b64"]
    assert b["met"] == (b["worst"] <= b["limit"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_proxy_cpu_prompt_makes_a_step_of_the_asked_size():
    """The chat prompt renders to T - 16 byte-tokenizer ids (the stub answers 16): a Step of T tokens."""
    from dressage.tokenizer import load_tokenizer

    msgs, n = scale_proxy_cpu.prompt_for(5000)
    assert n == 5000 - scale_proxy_cpu.OUTPUT_TOKENS
    assert len(load_tokenizer("byte").apply_chat_template(msgs, None, True)) == n
    with pytest.raises(ValueError, match="needs more than"):
        scale_proxy_cpu.prompt_for(30)


def test_quick_sessions_curve_runs_every_call_through_the_proxy_and_direct(tmp_path):
    """The quick sessions curve: 16 and 64 sessions of 2 turns, R3 on, through a Proxy process and straight
    to the stub engine; every call answered on both paths, and the bound computed from the points."""
    pytest.importorskip("matplotlib")
    parser = argparse.ArgumentParser()
    scale.register(parser.add_subparsers())
    report, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    args = parser.parse_args(["scale", "--quick", "--sizes", "64", "--shapes", "40x8", "--dtypes", "uint8",
                              "--rounds", "1", "--units", "--proxy-cpu-sizes", "--json", str(report),
                              "--plot", str(plot)])
    assert args.func(args) == 0
    curves = json.loads(report.read_text())["curves"]
    assert "storage_units" not in curves
    curve = curves["sessions"]
    assert curve["config"]["turns"] == 2 and curve["config"]["service_s"] == 0.2
    assert [(p["variant"], p["sessions"]) for p in curve["points"]] == [("r3", 16), ("r3", 64)]
    for p in curve["points"]:
        assert p["errors"] == 0 and p["calls"] == p["direct_calls"] == 2 * p["sessions"]
        # own share = latency less the engine's service time, which the stub never cuts short
        assert 0 < p["proxy_own_p50_ms"] <= p["proxy_own_p99_ms"] <= p["proxy_own_max_ms"]
        assert 0 < p["direct_own_p50_ms"] <= p["direct_own_p99_ms"]
        assert p["proxy_cpu_ms_per_call"] > 0
        assert p["proxy_gc_collections"] >= p["proxy_gc_full_collections"] >= 0 and p["proxy_gc_pause_ms"] >= 0
    b = curve["bounds"]["own_p99_vs_reference"]
    p16, p64 = curve["points"]
    assert (b["at_sessions"], b["reference_sessions"], b["limit"]) == (64, 16, scale_sessions.SESSIONS_BOUND)
    assert b["worst"] == pytest.approx(p64["proxy_own_p99_ms"] / p16["proxy_own_p99_ms"])
    assert b["met"] == (b["worst"] <= b["limit"])
    assert (tmp_path / "scale-sessions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stub_engine_answers_in_the_wire_format_the_proxy_decodes():
    """The stub's /generate answer passes the Proxy's own decoder: logprobs one per output id and routing
    rows exactly ``[routed_experts_start_len, T - 1)``, ids in range."""
    from dressage.fields.sglang import decode_generate_response
    from dressage_bench.stub_engine import REPLY, StubConfig, _Answers
    from dressage.proxy import fastjson

    cfg = StubConfig(service_s=0, layers=3, topk=2, experts=16)
    answers = _Answers(cfg)
    body = fastjson.loads(answers.generate({"input_ids": list(range(40)), "sampling_params": {"max_new_tokens": 500},
                                            "return_logprob": True, "return_routed_experts": True,
                                            "routed_experts_start_len": 10}))
    out = decode_generate_response(body, prompt_len=40, routed_experts_start_len=10, num_layers=3, topk=2,
                                   want_routed_experts=True, routed_experts_dtype="uint8", num_experts=16)
    n = len(REPLY.encode()) + 1
    assert out.finish_reason == "stop" and len(out.output_ids) == n and len(out.logprobs) == n
    assert out.routed_experts.shape == (40 + n - 1 - 10, 3, 2) and int(out.routed_experts.max()) < 16
    assert body["text"] == REPLY
    short = fastjson.loads(answers.generate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5},
                                             "return_logprob": True}))
    assert short["output_ids"] == list(REPLY.encode()[:5]) and short["meta_info"]["finish_reason"]["type"] == "length"
    assert "routed_experts" not in short["meta_info"]


@pytest.mark.parametrize("bad", [{"sessions": ()}, {"sessions": (0,)}, {"turns": 0}, {"service_s": 0},
                                 {"think_s": -1}, {"variants": ("nope",)}])
def test_sessions_config_refuses_bad_values_naming_the_field(bad):
    with pytest.raises(ValueError, match="SessionsConfig"):
        scale_sessions.SessionsConfig(**bad)


def test_scale_is_a_registered_bench():
    from dressage_bench.cli import BENCHES

    assert "dressage_bench.scale:register" in BENCHES


def test_batcher_groups_are_the_rounds_a_put_batcher_forms_from_waiting_steps():
    """As ``PutBatcher._take`` forms them when every Step is already queued: as many as fit both limits,
    at least one (a Step larger than max_bytes goes alone)."""
    assert scale._batcher_groups(64, 1_310_720, 256, 32 << 20) == [25, 25, 14]
    assert scale._batcher_groups(3, 1_310_720, 256, 32 << 20) == [3]
    assert scale._batcher_groups(600, 100, 256, 32 << 20) == [256, 256, 88]
    assert scale._batcher_groups(2, 64 << 20, 256, 32 << 20) == [1, 1]


def test_batcher_groups_match_the_rounds_the_real_put_batcher_sends():
    import numpy as np

    from dressage.tq.client.batching import PutBatcher

    sent: list[int] = []

    class Recorder:
        def put_many(self, items, *, batch=None, keys=None):
            sent.append(len(items))
            return list(keys)

    batcher = PutBatcher(Recorder())
    step = np.zeros(1_310_720, dtype=np.uint8)
    try:
        with batcher._cond:  # every Step queued before the writer thread may take a round
            futures = [batcher.submit([("r3", step)], keys=[f"k{i}"]) for i in range(64)]
        assert [f.result(timeout=10) for f in futures] == [[f"k{i}"] for i in range(64)]
    finally:
        batcher.close()
    assert sent == scale._batcher_groups(64, step.nbytes, batcher.max_items, batcher.max_bytes)
