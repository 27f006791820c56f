"""The parameter policies of chat completions, Responses and text completions: docs/parameters.md says what
the code does, every field OpenAI defines is decided, and each decision holds on a request."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from dressage.errors import UnsupportedParameterError
from dressage.proxy.openai.chat.params import CHAT_PARAMS, chat_options
from dressage.proxy.openai.completions import COMPLETIONS_PARAMS, CompletionRequest
from dressage.proxy.openai.policy import IGNORED, REFUSED, USED, Param, ParamPolicy
from dressage.proxy.openai.responses.protocol import RESPONSES_PARAMS, ResponsesRequest, chat_body
from dressage.proxy.schemas import GENERATE_PARAMS, ChatRequest

DOC = Path(__file__).resolve().parents[3] / "docs" / "parameters.md"
POLICIES = {"Chat completions": CHAT_PARAMS, "Responses": RESPONSES_PARAMS, "Text completions": COMPLETIONS_PARAMS,
            "SGLang generate": GENERATE_PARAMS}


def _doc_tables() -> dict[str, str]:
    """Heading (up to its first backtick) -> the table under it, as text."""
    tables, heading = {}, None
    for block in re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        rows = [line for line in body.splitlines() if line.startswith("|")]
        tables[heading.split("(")[0].strip()] = "\n".join(rows)
    return tables


@pytest.mark.parametrize("title", sorted(POLICIES))
def test_the_documented_table_is_the_policy_the_code_checks(title):
    table = _doc_tables().get(title)
    assert table == POLICIES[title].markdown(), f"docs/parameters.md, section {title!r}, must read:\n" \
                                                 f"{POLICIES[title].markdown()}"


def test_the_anthropic_table_decides_every_field_of_the_messages_api():
    rows = [line.split("|")[1:3] for line in _doc_tables()["Anthropic Messages"].splitlines()[2:]]
    decided = {name.strip().strip("`"): action.strip() for name, action in rows}
    assert set(decided.values()) <= {USED, IGNORED, REFUSED}
    anthropic = pytest.importorskip("anthropic.types.message_create_params")
    fields = set(typing.get_type_hints(anthropic.MessageCreateParamsBase)) | {"stream"}
    assert fields <= set(decided), sorted(fields - set(decided))


def _openai_fields(module: str, cls: str) -> set[str]:
    types = pytest.importorskip(module)
    return set(getattr(types, cls).__annotations__)


def test_every_field_openai_and_the_schemas_define_is_decided():
    chat = _openai_fields("openai.types.chat.completion_create_params", "CompletionCreateParamsBase")
    responses = _openai_fields("openai.types.responses.response_create_params", "ResponseCreateParamsBase")
    text = _openai_fields("openai.types.completion_create_params", "CompletionCreateParamsBase")
    for fields, policy in ((chat | set(ChatRequest.model_fields), CHAT_PARAMS),
                           (responses | set(ResponsesRequest.model_fields) | {"stream"}, RESPONSES_PARAMS),
                           (text | set(CompletionRequest.model_fields), COMPLETIONS_PARAMS)):
        assert fields <= policy.names(), (policy.endpoint, sorted(fields - policy.names()))


def test_a_policy_refuses_unknown_and_refused_fields_by_name_and_checks_values():
    policy = ParamPolicy("demo", (Param("a", USED, "used"),
                                  Param("b", IGNORED, "no-op", lambda v: "bad" if v else None),
                                  Param("c", REFUSED, "cannot")))
    policy.check({"a": 1, "b": 0, "c": None})
    for fields, param, message in (({"z": 1}, "z", "not a demo parameter"), ({"c": 1}, "c", "cannot"),
                                   ({"a": 1, "b": True}, "b", "bad")):
        with pytest.raises(UnsupportedParameterError, match=message) as info:
            policy.check(fields)
        assert info.value.param == param and info.value.http_status == 400
    with pytest.raises(ValueError, match="twice"):
        ParamPolicy("demo", (Param("a", USED, ""), Param("a", IGNORED, "")))


# One value a client sends for each ignored field; none may change what the engine is asked.
CHAT_IGNORED = {"user": "u", "metadata": {"k": "v"}, "store": True, "service_tier": "auto", "prompt_cache_key": "k",
                "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "explicit"},
                "safety_identifier": "s", "prediction": {"type": "content", "content": "x"},
                "reasoning_effort": "high", "verbosity": "low", "modalities": ["text"]}
RESPONSES_IGNORED = {"metadata": {"k": "v"}, "reasoning": {"effort": "low", "summary": "auto", "mode": "standard",
                                                           "context": "auto"}, "max_tool_calls": 2,
                     "truncation": "disabled", "background": False, "background_options": {}, "stream_options": {"include_obfuscation": False},
                     "client_metadata": {"thread_id": "t"}, "user": "u", "service_tier": "auto",
                     "safety_identifier": "s", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
                     "prompt_cache_options": {"mode": "explicit"}, "image": {}}


def test_every_ignored_field_is_accepted_and_changes_nothing():
    assert set(CHAT_IGNORED) == CHAT_PARAMS.names(IGNORED)
    assert set(RESPONSES_IGNORED) == RESPONSES_PARAMS.names(IGNORED)
    messages = [{"role": "user", "content": "x"}]
    plain = chat_options(ChatRequest(messages=messages, temperature=0.5))
    for name, value in CHAT_IGNORED.items():
        assert chat_options(ChatRequest(messages=messages, temperature=0.5, **{name: value})) == plain, name
    base = chat_body(ResponsesRequest(input="x", temperature=0.5), messages)
    for name, value in RESPONSES_IGNORED.items():
        assert chat_body(ResponsesRequest(input="x", temperature=0.5, **{name: value}), messages) == base, name


REFUSED_VALUES = {"audio": {"voice": "alloy"}, "functions": [{"name": "f"}], "function_call": "auto",
                  "web_search_options": {}, "moderation": {"model": "m"}, "conversation": "conv_1",
                  "prompt": {"id": "p"}, "context_management": [{"type": "compaction"}],
                  "access_programs": {}, "suffix": "x"}


@pytest.mark.parametrize("policy, make", [
    (CHAT_PARAMS, lambda kw: chat_options(ChatRequest(messages=[{"role": "user", "content": "x"}], **kw))),
    (RESPONSES_PARAMS, lambda kw: chat_body(ResponsesRequest(input="x", **kw), [{"role": "user", "content": "x"}])),
], ids=["chat", "responses"])
def test_every_refused_field_and_unservable_value_is_a_400_naming_it(policy, make):
    cases = [({name: REFUSED_VALUES[name]}, name) for name in sorted(policy.names(REFUSED))]
    if policy is CHAT_PARAMS:
        cases += [({"modalities": ["text", "audio"]}, "modalities"), ({"logit_bias_typo": 1}, "logit_bias_typo")]
    else:
        cases += [({"truncation": "auto"}, "truncation"), ({"background": True}, "background"),
                  ({"reasoning": {"effort": "low", "budget": 3}}, "reasoning"), ({"n": 2}, "n")]
    for kw, param in cases:
        with pytest.raises(UnsupportedParameterError) as info:
            make(kw)
        assert info.value.param == param and info.value.code == "unsupported_parameter", kw


def test_text_completions_refuse_what_changes_the_sample():
    for kw, param in (({"n": 2}, "n"), ({"best_of": 3}, "best_of"), ({"echo": True}, "echo"),
                      ({"suffix": "s"}, "suffix"), ({"top_k": 3}, "top_k")):
        with pytest.raises(UnsupportedParameterError) as info:
            COMPLETIONS_PARAMS.check(dict(prompt="x", **kw))
        assert info.value.param == param
    COMPLETIONS_PARAMS.check({"prompt": "x", "n": 1, "best_of": 1, "echo": False, "user": "u"})
