"""The engine over real HTTP (uvicorn on a loopback port): SGLang's wire format end to end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from dressage.engine import EngineConfig, EngineServer
from dressage.fields.config import model_from_preset
from dressage.fields.sglang import decode_generate_response
from dressage.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
QWEN = model_from_preset("qwen3.6-35b-a3b")
PROMPT = TOK.apply_chat_template([{"role": "user", "content": "Describe the data plane."}])


@pytest.fixture(scope="module")
def fast():
    with EngineServer(EngineConfig(model=QWEN, port=0, seed=3)) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            yield client


@pytest.fixture(scope="module")
def slow():
    with EngineServer(EngineConfig(model=QWEN, port=0, seed=3, token_delay_s=0.002, stream_interval=4)) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            yield client


def _decode(body, prompt_len, start=0):
    return decode_generate_response(body, prompt_len=prompt_len, routed_experts_start_len=start,
                                    num_layers=QWEN.num_layers, topk=QWEN.topk, want_routed_experts=True)


def _gen(client, ids, **kw):
    body = {"input_ids": ids, "sampling_params": kw.pop("sampling_params", {"max_new_tokens": 256}),
            "return_logprob": True, "return_routed_experts": True, **kw}
    resp = client.post("/generate", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _stable(body):
    meta = {k: v for k, v in body["meta_info"].items() if k not in ("id", "e2e_latency", "cached_tokens")}
    return {**body, "meta_info": meta}


def test_generate_matches_sglang_format(fast):
    out = _gen(fast, PROMPT, routed_experts_start_len=10, rid="fmt-1")
    meta = out["meta_info"]
    assert set(out) == {"text", "output_ids", "meta_info"}
    assert {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
            "output_token_logprobs", "routed_experts", "e2e_latency", "weight_version"} <= set(meta)
    assert meta["id"] == "fmt-1" and meta["prompt_tokens"] == len(PROMPT)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    dec = _decode(out, len(PROMPT), 10)
    n = len(out["output_ids"])
    assert dec.routed_experts.shape == (len(PROMPT) + n - 1 - 10, 40, 8)
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(e[2] is None for e in meta["output_token_logprobs"])
    assert out["text"] == TOK.decode(out["output_ids"], skip_special_tokens=True)


def test_same_request_same_answer(fast):
    a = _gen(fast, PROMPT, sampling_params={"max_new_tokens": 128, "temperature": 0.8})
    b = _gen(fast, PROMPT, sampling_params={"max_new_tokens": 128, "temperature": 0.8})
    assert _stable(a) == _stable(b)


def test_prefix_rows_resent_equal_rows_first_returned(fast):
    first = _gen(fast, PROMPT)
    r1 = _decode(first, len(PROMPT)).routed_experts
    follow = PROMPT + first["output_ids"] + TOK.encode("\n<|im_start|>user\nAnd then?<|im_end|>\n")
    second = _gen(fast, follow)
    r2 = _decode(second, len(follow)).routed_experts
    assert np.array_equal(r2[:len(r1)], r1)
    assert second["meta_info"]["cached_tokens"] > len(PROMPT) - 16


def test_batch_of_prompts_answers_a_list(fast):
    other = TOK.apply_chat_template([{"role": "user", "content": "Hi"}])
    resp = fast.post("/generate", json={"input_ids": [PROMPT, other], "sampling_params": {"max_new_tokens": 8}})
    assert resp.status_code == 200
    body = resp.json()
    assert isinstance(body, list) and [b["meta_info"]["prompt_tokens"] for b in body] == [len(PROMPT), len(other)]


def test_text_input_is_tokenized(fast):
    resp = fast.post("/generate", json={"text": "<|im_start|>user\nhey<|im_end|>\n", "sampling_params": {"max_new_tokens": 4}})
    assert resp.json()["meta_info"]["prompt_tokens"] == len(TOK.encode("<|im_start|>user\nhey<|im_end|>\n"))


def test_stream_is_sse_with_done_and_final_equal_to_plain_answer(fast):
    plain = _gen(fast, PROMPT, sampling_params={"max_new_tokens": 64})
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 64}, "return_logprob": True,
            "return_routed_experts": True, "stream": True}
    with fast.stream("POST", "/generate", json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    for c in chunks[:-1]:  # cumulative, as SGLang streams by default
        assert plain["output_ids"][:len(c["output_ids"])] == c["output_ids"]
    assert _stable(chunks[-1]) == _stable(plain)


def _abort_later(client_url, rid, after):
    def go():
        time.sleep(after)
        httpx.post(f"{client_url}/abort_request", json={"rid": rid}, timeout=10)
    t = threading.Thread(target=go)
    t.start()
    return t


def test_abort_request_returns_partial_output(slow, fast):
    sp = {"max_new_tokens": 3000, "ignore_eos": True}
    t = _abort_later(str(slow.base_url).rstrip("/"), "to-abort", 0.3)
    out = _gen(slow, PROMPT, rid="to-abort", sampling_params=sp)
    t.join()
    n = len(out["output_ids"])
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < n < 3000 and out["meta_info"]["completion_tokens"] == n
    dec = _decode(out, len(PROMPT))
    assert dec.routed_experts.shape[0] == len(PROMPT) + n - 1
    full = _gen(fast, PROMPT, sampling_params=sp)  # same seed: the partial output is its head
    assert full["output_ids"][:n] == out["output_ids"]
    assert np.array_equal(_decode(full, len(PROMPT)).routed_experts[:len(PROMPT) + n - 1], dec.routed_experts)


def test_abort_mid_stream_ends_with_abort_chunk(slow):
    body = {"input_ids": PROMPT, "rid": "stream-abort", "stream": True, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    t = _abort_later(str(slow.base_url).rstrip("/"), "stream-abort", 0.3)
    with slow.stream("POST", "/generate", json=body) as resp:
        events = [line for line in resp.iter_lines() if line]
    t.join()
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(last["output_ids"]) < 3000
    assert len(last["meta_info"]["output_token_logprobs"]) == len(last["output_ids"])


def test_info_and_health_endpoints(fast):
    assert fast.get("/health").status_code == 200
    assert fast.get("/health_generate").status_code == 200
    info = fast.get("/get_model_info").json()
    assert info["model_path"] == "qwen3.6-35b-a3b" and info["is_generation"] is True
    assert (info["num_hidden_layers"], info["num_experts_per_tok"], info["num_experts"]) == (40, 8, 256)
    server = fast.get("/get_server_info").json()
    assert server["random_seed"] == 3 and "internal_states" in server and "version" in server


def test_errors_are_400_with_message_and_server_keeps_serving(fast):
    resp = fast.post("/generate", content=b"{not json")
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    resp = fast.post("/generate", json={"input_ids": [1], "sampling_params": {"max_tokens": 3}})
    assert resp.status_code == 400 and "max_tokens" in resp.json()["error"]["message"]
    assert fast.get("/health").status_code == 200


def test_weight_version_is_reported_and_updatable(fast):
    assert fast.post("/update_weight_version", json={"new_version": "v7"}).json()["success"] is True
    assert _gen(fast, PROMPT, sampling_params={"max_new_tokens": 2})["meta_info"]["weight_version"] == "v7"


def test_cli_engine_serve_answers_health():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = os.path.join(os.path.dirname(sys.executable), "dressage")
    proc = subprocess.Popen([exe, "engine", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--model", "tiny-moe", "--num-layers", "3"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                info = httpx.get(f"http://127.0.0.1:{port}/get_model_info", timeout=1).json()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(proc.stderr.read().decode() if proc.poll() is not None else "no start")
                time.sleep(0.1)
        assert info["num_hidden_layers"] == 3 and info["model_path"] == "tiny-moe"
    finally:
        proc.terminate()
        proc.wait(10)


def test_incremental_stream_chunks_concatenate_to_the_answer(fast):
    plain = _gen(fast, PROMPT, sampling_params={"max_new_tokens": 50})
    cfg = EngineConfig(model=QWEN, port=0, seed=3, stream_interval=7, incremental_streaming_output=True)
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 50}, "return_logprob": True,
            "return_routed_experts": True, "stream": True}
    with EngineServer(cfg) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            with client.stream("POST", "/generate", json=body) as resp:
                chunks = [json.loads(line[len("data: "):]) for line in resp.iter_lines()
                          if line.startswith("data: {")]
    ids = [t for c in chunks for t in c["output_ids"]]
    lps = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    assert len(chunks) > 2 and all(len(c["output_ids"]) <= 7 for c in chunks)
    assert ids == plain["output_ids"] and lps == plain["meta_info"]["output_token_logprobs"]
    assert chunks[-1]["meta_info"]["routed_experts"] == plain["meta_info"]["routed_experts"]


def test_engine_serve_on_port_0_announces_the_port_it_bound():
    src = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "dressage", "engine", "serve", "--model.preset", "tiny-moe",
                             "--port", "0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stderr.readline()
        url = line.rsplit(" on ", 1)[1].strip()
        assert not url.endswith(":0"), line
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(url + "/health", timeout=5).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, f"nothing answers at {url}"
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)
