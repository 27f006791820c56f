"""``tool_choice`` "required" / a named function through the real Proxy and built-in engine, for each
parser family: every seed gives a call of the family's syntax at the first draw, with arguments valid
for the tool's schema, recorded with the tokens the tokenizer gives its text."""

import json

import httpx
import jsonschema
import pytest

from dressage.tokenizer import load_tokenizer

ENGINE = {"seed": 11, "tool_call_rate": 0.0}  # unforced, this engine never calls a tool

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                        "note": {"type": "string"}, "mode": {"enum": ["fast", "exact"]}},
       "required": ["a", "b"]}
LOOKUP = {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
          "required": ["q"]}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD}},
         {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP}}]
MARKERS = {"qwen3_coder": "<function=", "glm45": "<arg_key>", "deepseekv31": "<｜tool▁sep｜>",
           "kimi_k2": "<|tool_call_argument_begin|>", "gpt-oss": "<|channel|>commentary to=functions."}


@pytest.mark.parametrize("family", sorted(MARKERS))
def test_every_forced_reply_is_a_valid_call_of_the_family_at_the_first_draw(engine, proxy_stack, family):
    stack = proxy_stack(engine.url, tool_call_parser=family)
    tok = load_tokenizer("byte")
    for seed in range(10):
        for choice, allowed in (("required", {"add", "lookup"}),
                                ({"type": "function", "function": {"name": "lookup"}}, {"lookup"})):
            sid = httpx.post(stack.url + "/sessions", timeout=20).json()["session_id"]
            r = httpx.post(f"{stack.url}/sessions/{sid}/v1/chat/completions", timeout=30, json={
                "messages": [{"role": "user", "content": f"add {seed} and 2"}], "tools": TOOLS,
                "tool_choice": choice, "seed": seed, "max_tokens": 3000})
            assert r.status_code == 200, r.text
            choice_out = r.json()["choices"][0]
            calls = choice_out["message"]["tool_calls"]
            assert choice_out["finish_reason"] == "tool_calls" and calls and not choice_out["message"]["content"]
            for c in calls:
                assert c["function"]["name"] in allowed
                jsonschema.validate(json.loads(c["function"]["arguments"]),
                                    ADD if c["function"]["name"] == "add" else LOOKUP)
            (step,) = stack.core.sessions[sid].steps.values()  # one draw, recorded
            text = tok.decode(step.response_ids.tolist(), skip_special_tokens=True)
            assert MARKERS[family] in text
            assert step.response_ids.tolist() == tok.encode(text) + [tok.im_end_token_id]
            assert step.metadata["assistant_message"] == choice_out["message"]
