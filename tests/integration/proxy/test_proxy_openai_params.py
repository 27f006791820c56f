"""OpenAI chat-completions parameters on the real Proxy and built-in engine, over loopback.

Each parameter either reaches the engine under SGLang's name (the engine's request bodies are
recorded on the way), is enforced by the Proxy, or is refused with a 400 naming it.
"""

import json

import httpx
import numpy as np
import openai
import pytest

from dressage.fields import get_model
from dressage.proxy.engines.sglang_client import SGLangClient
from dressage.testing.stack import start_engine, start_proxy
from dressage.tokenizer import load_tokenizer

MODEL = get_model("tiny-moe")
CALC = {"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                         "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "look up",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
USER = [{"role": "user", "content": "Tell me about routing replay."}]


class Recording(httpx.AsyncBaseTransport):
    """Forwards to the engine and keeps each /generate body."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies = []

    async def handle_async_request(self, request):
        if request.url.path == "/generate":
            self.bodies.append(json.loads(request.content))
        return await self.inner.handle_async_request(request)

    async def aclose(self):
        await self.inner.aclose()


ENGINE = {"seed": 5, "tool_call_rate": 0.5, "mean_response_tokens": 60}


@pytest.fixture(scope="module")
def stack(engine):
    rec = Recording()  # every /generate body the Proxy sends the engine
    with start_proxy(engine.url, engine=SGLangClient(engine.url, timeout=20, transport=rec)) as proxy:
        yield proxy, rec


class Api:
    def __init__(self, proxy, rec):
        self.proxy, self.rec, self.url = proxy, rec, proxy.url

    def session(self):
        return httpx.post(self.url + "/sessions", timeout=20).json()["session_id"]

    def chat(self, sid=None, **body):
        sid = sid or self.session()
        body.setdefault("messages", USER)
        r = httpx.post(f"{self.url}/sessions/{sid}/v1/chat/completions", json=body, timeout=30)
        return sid, r

    def ok(self, **body):
        sid, r = self.chat(**body)
        assert r.status_code == 200, r.text
        return sid, r.json()

    def steps(self, sid):
        return sorted(self.proxy.service.core.session(sid).steps.values(), key=lambda s: s.step_id)

    def client(self, sid):
        return openai.OpenAI(base_url=f"{self.url}/sessions/{sid}/v1", api_key="none", max_retries=0)


@pytest.fixture()
def api(stack):
    return Api(*stack)


def _text(tok_ids):
    return load_tokenizer("byte").decode(list(tok_ids), skip_special_tokens=True)


def test_developer_role_renders_as_system(api):
    sid_dev, dev = api.ok(messages=[{"role": "developer", "content": "Be brief."}, *USER], max_tokens=8)
    sid_sys, sys = api.ok(messages=[{"role": "system", "content": "Be brief."}, *USER], max_tokens=8)
    a, b = api.steps(sid_dev)[0], api.steps(sid_sys)[0]
    np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
    assert load_tokenizer("byte").decode(a.prompt_ids.tolist()).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert dev["choices"][0]["message"]["content"] == sys["choices"][0]["message"]["content"]
    # The next turn reuses the recorded tokens (TITO) with the developer turn sent again.
    msgs = [{"role": "developer", "content": "Be brief."}, *USER, dev["choices"][0]["message"],
            {"role": "user", "content": "More."}]
    api.ok(sid=sid_dev, messages=msgs, max_tokens=8)
    first, second = api.steps(sid_dev)
    assert second.parent_id == first.step_id


def test_stop_cuts_the_text_and_keeps_the_engine_tokens(api):
    _, free = api.ok(max_tokens=200)
    full = free["choices"][0]["message"]["content"]
    words = full.split()
    stop = " " + words[len(words) // 2]
    assert stop in full
    sid, out = api.ok(max_tokens=200, stop=[stop, "@@never@@"])
    choice = out["choices"][0]
    assert choice["message"]["content"] == full[:full.index(stop)]
    assert choice["finish_reason"] == "stop"
    (step,) = api.steps(sid)
    recorded = _text(step.response_ids)
    # Exactly the engine's tokens: up to and including the token that completed the stop string.
    assert recorded.startswith(choice["message"]["content"] + stop) and full.startswith(recorded)
    assert recorded.endswith(stop)
    assert out["usage"]["completion_tokens"] == len(step.response_ids)
    assert api.rec.bodies[-1]["sampling_params"]["stop"] == [stop, "@@never@@"]
    # The agent sends the cut reply back: the next turn reuses the recorded tokens (TITO), and the
    # template's end of turn follows them.
    msgs = [*USER, choice["message"], {"role": "user", "content": "Go on."}]
    api.ok(sid=sid, messages=msgs, max_tokens=20)
    first, second = api.steps(sid)
    assert second.parent_id == first.step_id
    np.testing.assert_array_equal(second.prompt_ids[:first.seq_len], first.full_ids)
    assert load_tokenizer("byte").decode(second.prompt_ids[first.seq_len:].tolist()).startswith("<|im_end|>\n")
    # Streamed: no delta shows the stop string; the deltas add up to the same content.
    with api.client(api.session()) as c:
        chunks = list(c.chat.completions.create(model="m", messages=USER, max_tokens=200, stop=stop, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == choice["message"]["content"] and stop.strip() not in streamed.split()[-1:]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_list_over_four_is_refused(api):
    sid, r = api.chat(stop=["a", "b", "c", "d", "e"])
    assert r.status_code == 422 and r.json()["error"]["param"] == "stop"
    assert api.steps(sid) == []


def test_tool_choice_none_offers_no_tools(api):
    for _ in range(3):
        sid, out = api.ok(tools=[CALC], tool_choice="none", max_tokens=60)
        assert "tool_calls" not in out["choices"][0]["message"]
        assert out["choices"][0]["finish_reason"] in ("stop", "length")
        assert "<tools>" not in load_tokenizer("byte").decode(api.steps(sid)[0].prompt_ids.tolist())


def test_tool_choice_required_and_named_are_kept_by_the_engines_grammar(api):
    # Every seed gives a call at the first draw: the engine is sent the family's call grammar
    # (SGLang's ebnf) and nothing is drawn again.
    for i in range(16):
        msgs = [{"role": "user", "content": f"Compute {i} + 1."}]
        sent = len(api.rec.bodies)
        sid, out = api.ok(messages=msgs, tools=[CALC, SEARCH], tool_choice="required", max_tokens=300, seed=i)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"]
        for c in choice["message"]["tool_calls"]:
            args = json.loads(c["function"]["arguments"])
            assert c["function"]["name"] in ("calculator", "search")
            assert set(args) <= {"a", "q"} and all(isinstance(v, (int, float)) for k, v in args.items() if k == "a")
        (body,) = api.rec.bodies[sent:]  # one engine request, no re-draw
        assert "<tool_call>" in body["sampling_params"]["ebnf"]
        (step,) = api.steps(sid)
        assert step.metadata["assistant_message"] == choice["message"] and "refused_replies" not in step.metadata
        assert _text(step.response_ids).startswith("<tool_call>")  # the tokens are the call's text
        sid, out = api.ok(messages=msgs, tools=[CALC, SEARCH], max_tokens=300, seed=i, parallel_tool_calls=False,
                          tool_choice={"type": "function", "function": {"name": "search"}})
        calls = out["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["search"]
        assert "calculator" not in load_tokenizer("byte").decode(api.steps(sid)[0].prompt_ids.tolist())
    # A forced call cut short by max_tokens is no call: a 502 naming the rule, nothing recorded.
    sid, r = api.chat(tools=[CALC], tool_choice="required", max_tokens=3, seed=1)
    assert r.status_code == 502 and r.json()["error"]["code"] == "reply_constraint_unmet"
    assert api.steps(sid) == []
    sid, r = api.chat(tools=[CALC], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    # Streamed: the checked reply is sent once recorded, and adds up to the recorded message.
    sid = api.session()
    with api.client(sid) as c:
        chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Compute 0 + 1."}],
                                                tools=[CALC, SEARCH], tool_choice="required", max_tokens=300,
                                                seed=0, stream=True))
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices]
    (step,) = api.steps(sid)
    assert [tc.function.name for tc in calls] == [c["function"]["name"]
                                                   for c in step.metadata["assistant_message"]["tool_calls"]]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_required_fails_clearly_when_the_model_never_calls(proxy_stack):
    srv = start_engine(seed=5, tool_call_rate=0.0, mean_response_tokens=60)
    try:
        proxy = proxy_stack(srv.url)
        api = Api(proxy, None)
        sid, r = api.chat(tools=[CALC], tool_choice="required", max_tokens=30)
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == "reply_constraint_unmet" and "called no tool" in err["message"]
        assert api.steps(sid) == []
        body = {"messages": USER, "tools": [CALC], "tool_choice": "required", "max_tokens": 30, "stream": True}
        events = httpx.post(f"{api.url}/sessions/{sid}/v1/chat/completions", json=body, timeout=30).text
        assert '"code":"reply_constraint_unmet"' in events and api.steps(sid) == []
    finally:
        srv.stop()


def test_response_format_json_object_and_schema(api):
    _, out = api.ok(response_format={"type": "json_object"}, max_tokens=200)
    assert isinstance(json.loads(out["choices"][0]["message"]["content"]), dict)
    assert json.loads(api.rec.bodies[-1]["sampling_params"]["json_schema"]) == {"type": "object"}
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "score": {"type": "integer", "minimum": 1, "maximum": 5},
                                               "tags": {"type": "array", "items": {"enum": ["x", "y"]}}},
              "required": ["name", "score", "tags"], "additionalProperties": False}
    for i in range(3):
        _, out = api.ok(messages=[{"role": "user", "content": f"rate {i}"}], max_tokens=300,
                        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
        doc = json.loads(out["choices"][0]["message"]["content"])
        assert set(doc) == {"name", "score", "tags"} and len(doc["name"]) <= 12
        assert 1 <= doc["score"] <= 5 and set(doc["tags"]) <= {"x", "y"}
    sid, r = api.chat(response_format={"type": "json_schema",
                                       "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "a+"}}})
    assert r.status_code == 400 and "pattern" in r.json()["error"]["message"] and api.steps(sid) == []
    sid, r = api.chat(response_format={"type": "grammar"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.type"


def test_logprobs_in_openai_shape_plain_and_streamed(api):
    sid, out = api.ok(logprobs=True, top_logprobs=3, max_tokens=40)
    content = out["choices"][0]["logprobs"]["content"]
    (step,) = api.steps(sid)
    assert len(content) == len(step.response_ids) == out["usage"]["completion_tokens"]
    np.testing.assert_allclose([e["logprob"] for e in content], step.logprobs, rtol=1e-6)
    tok = load_tokenizer("byte")
    for e, t in zip(content, step.response_ids.tolist()):
        assert e["token"] == tok.decode([t]) and e["bytes"] == list(e["token"].encode())
        tops = [a["logprob"] for a in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert e["token"] in [a["token"] for a in e["top_logprobs"]] or e["logprob"] <= tops[-1]
        assert sum(np.exp(tops)) <= 1.0 + 1e-5
    assert api.rec.bodies[-1]["top_logprobs_num"] == 3
    with api.client(api.session()) as c:
        chunks = list(c.chat.completions.create(model="m", messages=USER, max_tokens=40, logprobs=True,
                                                top_logprobs=3, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == [e["logprob"] for e in content]
    _, plain = api.ok(max_tokens=5)
    assert plain["choices"][0]["logprobs"] is None
    sid, r = api.chat(top_logprobs=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_n_samples_are_steps_of_the_session(api):
    sid, out = api.ok(n=3, max_tokens=30, temperature=1.0)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    steps = api.steps(sid)
    assert len(steps) == 3 and len({s.response_ids.tobytes() for s in steps}) == 3
    assert out["usage"]["completion_tokens"] == sum(len(s.response_ids) for s in steps)
    assert out["usage"]["prompt_tokens"] == len(steps[0].prompt_ids)
    assert sorted(s.metadata["sample_index"] for s in steps) == [0, 1, 2]
    texts = {c["message"]["content"] for c in out["choices"]}
    assert texts == {_text(s.response_ids) for s in steps}
    # With a seed the group is reproducible; its samples still differ from each other.
    a = [c["message"]["content"] for c in api.ok(n=2, seed=11, max_tokens=30)[1]["choices"]]
    b = [c["message"]["content"] for c in api.ok(n=2, seed=11, max_tokens=30)[1]["choices"]]
    assert a == b and a[0] != a[1]
    seeds = [body["sampling_params"]["sampling_seed"] for body in api.rec.bodies[-2:]]
    assert sorted(seeds) == [11, 12]
    with api.client(api.session()) as c:
        chunks = list(c.chat.completions.create(model="m", messages=USER, n=2, seed=11, max_tokens=30, stream=True))
    by_index = {0: "", 1: ""}
    for ch in chunks:
        for choice in ch.choices:
            by_index[choice.index] += choice.delta.content or ""
    assert [by_index[0], by_index[1]] == a


def test_sampling_parameters_reach_the_engine_under_sglang_names(api):
    _, out = api.ok(frequency_penalty=0.5, presence_penalty=-0.25, repetition_penalty=1.1, top_k=20, min_p=0.05,
                    seed=42, max_completion_tokens=17, min_tokens=2, temperature=0.8, top_p=0.9)
    sp = api.rec.bodies[-1]["sampling_params"]
    assert {k: sp[k] for k in ("frequency_penalty", "presence_penalty", "repetition_penalty", "top_k", "min_p",
                               "sampling_seed", "max_new_tokens", "min_new_tokens", "temperature", "top_p")} == {
        "frequency_penalty": 0.5, "presence_penalty": -0.25, "repetition_penalty": 1.1, "top_k": 20, "min_p": 0.05,
        "sampling_seed": 42, "max_new_tokens": 17, "min_new_tokens": 2, "temperature": 0.8, "top_p": 0.9}
    assert out["usage"]["completion_tokens"] <= 17
    # The seed decides the draw; the same seed draws the same reply in another session.
    same = [api.ok(seed=42, max_tokens=30)[1]["choices"][0]["message"]["content"] for _ in range(2)]
    others = {api.ok(seed=s, max_tokens=30)[1]["choices"][0]["message"]["content"] for s in (1, 2, 3)}
    assert same[0] == same[1] and len(others | {same[0]}) > 1
    # logit_bias reaches the engine as SGLang's field; this engine cannot honour it and says so.
    sid, r = api.chat(logit_bias={"65": -100})
    assert api.rec.bodies[-1]["sampling_params"]["logit_bias"] == {"65": -100.0}
    assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"] and api.steps(sid) == []
    sid, r = api.chat(frequency_penalty=3)
    assert r.status_code == 422 and r.json()["error"]["param"] == "frequency_penalty"


def test_an_engine_refusal_names_the_clients_field_on_every_api(api):
    """The engine names its own sampling parameter; the agent's 400 names the field the agent sent,
    on each API's shape, and carries no engine URL. Nothing is recorded."""
    bad = {"type": "nonsense"}  # a schema the engine's grammar compiler refuses
    url, sid = api.url, api.session()

    def refused(path, body, param):
        r = httpx.post(f"{url}/sessions/{sid}{path}", json=body, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("engine_rejected_request", param) and "http" not in err["message"]

    refused("/v1/chat/completions", {"messages": USER, "logit_bias": {"50": 5}}, "logit_bias")
    refused("/v1/chat/completions", {"messages": USER, "logit_bias": {"50": 5}, "stream": True}, "logit_bias")
    refused("/v1/chat/completions", {"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": bad}}}, "response_format")
    refused("/v1/completions", {"prompt": "hi", "max_tokens": 4, "logit_bias": {"50": 5}}, "logit_bias")
    refused("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": bad}}},
            "text.format")
    refused("/v1/responses", {"input": "hi", "stream": True,
                              "text": {"format": {"type": "json_schema", "name": "x", "schema": bad}}}, "text.format")
    refused("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3, "logit_bias": {"5": 1}}},
            "sampling_params.logit_bias")
    # Anthropic's error has no param: its message leads with the field (and names no engine URL).
    body = {"model": "m", "messages": USER, "max_tokens": 4, "output_config": {"format": {"type": "json_schema",
                                                                                          "schema": bad}}}
    r = httpx.post(f"{url}/sessions/{sid}/v1/messages", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    message = r.json()["error"]["message"]
    assert message.startswith("output_config.format: the inference engine refused the request: ") and "http" not in message
    # Streamed, the refusal comes before the engine's first event: the same plain 400, no 200 stream.
    streamed = httpx.post(f"{url}/sessions/{sid}/v1/messages", json={**body, "stream": True}, timeout=30)
    assert streamed.status_code == 400 and streamed.json()["error"]["message"] == message
    assert api.steps(sid) == []


def test_non_text_parts_and_unknown_parameters_are_refused_by_name(api):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    sid, r = api.chat(messages=[{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}])
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages[0].content[1]" and "image_url" in err["message"]
    assert api.steps(sid) == []
    for key, value in (("web_search_options", {}), ("functions", [{"name": "f"}]), ("best_of", 2),
                       ("modalities", ["text", "audio"])):
        sid, r = api.chat(**{key: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == key, (key, r.text)
        assert r.json()["error"]["code"] == "unsupported_parameter" and api.steps(sid) == []
    _, out = api.ok(user="u1", metadata={"k": "v"}, store=False, parallel_tool_calls=True, modalities=["text"],
                    reasoning_effort="high", verbosity="low", prompt_cache_key="k", max_tokens=4, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert out["usage"]["completion_tokens"] >= 1


def test_openai_structured_output_parse_with_a_pydantic_model(api):
    from typing import Literal, Optional

    from pydantic import BaseModel

    class Step(BaseModel):
        explanation: str
        output: int

    class Answer(BaseModel):
        steps: list[Step]
        final: Literal["yes", "no"]
        note: Optional[str]

    with api.client(api.session()) as c:
        for i in range(3):
            done = c.chat.completions.parse(model="m", messages=[{"role": "user", "content": f"Solve {i}."}],
                                            response_format=Answer, max_tokens=400)
            parsed = done.choices[0].message.parsed
            assert isinstance(parsed, Answer) and parsed.final in ("yes", "no") and parsed.steps
    schema = json.loads(api.rec.bodies[-1]["sampling_params"]["json_schema"])
    assert schema["additionalProperties"] is False and "$defs" in schema


def test_a_retried_n_sample_turn_is_replayed_whole(api):
    sid = api.session()
    url = f"{api.url}/sessions/{sid}/v1/chat/completions"
    body = {"messages": USER, "n": 2, "max_tokens": 20}
    h = {"X-Turn-Id": "t1", "Idempotency-Key": "k1"}
    first = httpx.post(url, json=body, headers=h, timeout=30).json()
    again = httpx.post(url, json=body, headers=h, timeout=30).json()
    assert again == first and len(api.steps(sid)) == 2
    events = httpx.post(url, json={**body, "stream": True}, headers=h, timeout=30).text
    chunks = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    texts = {0: "", 1: ""}
    for ch in chunks:
        for c in ch["choices"]:
            texts[c["index"]] += c["delta"].get("content") or ""
    assert [texts[0], texts[1]] == [c["message"]["content"] for c in first["choices"]]
    assert len(api.steps(sid)) == 2 and {s.metadata["turn_id"] for s in api.steps(sid)} == {"t1"}
