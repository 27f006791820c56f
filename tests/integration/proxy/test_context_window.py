"""The context window a Proxy learns from its engine, and errors an agent can act on.

A call without ``max_tokens`` runs to what the engine's window leaves; a prompt the window cannot take
is a 400 ``context_overflow`` before any stream opens, in every room; and no agent-facing error, streamed
or not, carries the engine's URL (the Proxy's log keeps it).
"""

import logging

import httpx
import openai
import pytest

from dressage.testing.stack import start_engine, start_proxy

WINDOW = 300


@pytest.fixture(scope="module")
def engine():
    # Long planned replies: a call without max_tokens runs into the window.
    srv = start_engine(mean_response_tokens=5000, tool_call_rate=0.0, context_length=WINDOW)
    yield srv
    srv.stop()


def _session(url):
    r = httpx.post(url + "/sessions", timeout=10).json()
    return r["session_id"], r["base_url"]


def _no_internals(text, engine_url):
    host = engine_url.split("://", 1)[1]
    return engine_url not in text and host not in text and "/generate" not in text


def test_the_proxy_takes_the_window_the_engine_tells(engine):
    with start_proxy(engine.url) as p:
        assert p.proxy.config.limits.context_length == WINDOW
        assert p.proxy.engine_check.context_length == WINDOW
    with start_proxy(engine.url, context_length=200) as p:      # a smaller window of the user's stays
        assert p.proxy.config.limits.context_length == 200
    with start_proxy(engine.url, context_length=10_000) as p:   # a larger one is lowered to the engine's
        assert p.proxy.config.limits.context_length == WINDOW


def test_a_call_without_max_tokens_runs_to_what_the_window_leaves(engine):
    with start_proxy(engine.url) as p:
        sid, base = _session(p.url)
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "tell me more"}])
        assert r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens + r.usage.completion_tokens == WINDOW - 1
        text = client.completions.create(model="m", prompt="once upon a time")
        assert text.choices[0].finish_reason == "length"
        assert text.usage.prompt_tokens + text.usage.completion_tokens == WINDOW - 1
        short = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=7)
        assert short.usage.completion_tokens == 7                # an explicit max_tokens is kept
        resp = client.responses.create(model="m", input="and then?")
        assert resp.usage.input_tokens + resp.usage.output_tokens == WINDOW - 1
        assert len(p.steps(sid)) == 4


def test_a_default_max_tokens_applies_only_when_set(engine):
    with start_proxy(engine.url, default_max_new_tokens=11) as p:
        _, base = _session(p.url)
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go on"}])
        assert r.usage.completion_tokens == 11


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_beyond_the_window_is_a_400_context_overflow_before_any_stream(engine, stream):
    with start_proxy(engine.url) as p:
        sid, base = _session(p.url)
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        long = [{"role": "user", "content": "w" * (WINDOW + 50)}]
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=long, stream=stream)
        assert err.value.status_code == 400 and err.value.code == "context_overflow"
        message = err.value.body["message"]
        assert f"context window is {WINDOW} tokens" in message and "the prompt has" in message
        assert _no_internals(message, engine.url)
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="m", prompt="w" * (WINDOW + 50), stream=stream)
        assert err.value.code == "context_overflow"
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="m", input="w" * (WINDOW + 50), stream=stream)
        assert err.value.code == "context_overflow"
        raw = httpx.post(f"{base}/chat/completions", json={"model": "m", "messages": long, "stream": stream},
                         timeout=10)
        assert raw.status_code == 400 and raw.headers["content-type"].startswith("application/json")
        assert sid not in p.proxy.core.sessions or not p.steps(sid)


def test_an_engine_refusal_reaches_the_agent_without_the_engine_url(engine, caplog):
    # Without the start-up check the Proxy knows no window: the engine itself refuses the prompt.
    with start_proxy(engine.url, check_engine=False) as p:
        _, base = _session(p.url)
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        long = [{"role": "user", "content": "w" * (WINDOW + 50)}]
        with caplog.at_level(logging.WARNING, logger="dressage.proxy"):
            with pytest.raises(openai.BadRequestError) as err:
                client.chat.completions.create(model="m", messages=long)
            message = err.value.body["message"]
            assert err.value.code == "context_overflow"            # the engine's refusal, by its words
            assert "context length" in message and str(WINDOW) in message
            assert _no_internals(message, engine.url)
            # Streamed, the 200 waits for the engine's first answer: its refusal is a plain 400, not an
            # error event inside a 200 stream (which agents such as Qwen Code take for a finished reply).
            streamed = httpx.post(f"{base}/chat/completions", json={"model": "m", "messages": long, "stream": True},
                                  timeout=10)
            assert streamed.status_code == 400 and streamed.json()["error"]["code"] == "context_overflow"
            assert "context length" in streamed.text and _no_internals(streamed.text, engine.url)
            text = httpx.post(f"{base}/completions", json={"model": "m", "prompt": "w" * (WINDOW + 50), "stream": True},
                              timeout=10)
            assert text.status_code == 400 and text.json()["error"]["code"] == "context_overflow"
            response = httpx.post(f"{base}/responses", json={"model": "m", "input": "w" * (WINDOW + 50), "stream": True},
                                  timeout=10)
            assert response.status_code == 400 and response.json()["error"]["code"] == "context_overflow"
            assert _no_internals(response.text, engine.url)
            message = httpx.post(f"{base}/messages", json={"model": "m", "max_tokens": 5, "stream": True,
                                                          "messages": [{"role": "user", "content": "w" * (WINDOW + 50)}]},
                                 timeout=10)  # Anthropic's stream too: no message_start before the engine answered
            assert message.status_code == 400 and message.json()["type"] == "error", message.text
            assert "context length" in message.text and _no_internals(message.text, engine.url)
        assert any(engine.url in record.getMessage() for record in caplog.records)   # the log keeps it


def test_an_unreachable_engine_is_reported_without_its_address():
    dead = start_engine(tool_call_rate=0.0)
    url = dead.url
    dead.stop()
    with start_proxy(url, check_engine=False, request_timeout_s=5.0) as p:
        _, base = _session(p.url)
        for stream in (False, True):
            r = httpx.post(f"{base}/chat/completions", timeout=30,
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
            assert r.status_code == 502 and r.json()["error"]["type"] == "engine_error"
            assert "inference engine" in r.text and _no_internals(r.text, url)
