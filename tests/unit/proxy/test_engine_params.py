"""An engine's refusal names SGLang's sampling parameter; the agent's 400 names the field it sent, on
each API (:mod:`dressage.proxy.engine_params`)."""

import pytest

from dressage.errors import EngineRequestError, UnknownSessionError
from dressage.proxy.engine_params import APIS, CLIENT_NAMES, engine_param_of, name_client_param


def _refusal(said):
    return EngineRequestError(f"POST http://10.0.0.1:30000/generate: HTTP 400: {said}", status_code=400,
                              engine_message=said)


@pytest.mark.parametrize("said,name", [
    ("sampling_params.logit_bias: this engine does not support logit_bias", "logit_bias"),
    ("sampling_params.json_schema: #: unknown type 'nonsense'", "json_schema"),
    ("top_p must be in (0, 1], got 2.0.", "top_p"),                  # SGLang's SamplingParams.verify words
    ("max_new_tokens must be at least 0, got -1.", "max_new_tokens"),
    ("min_new_tokens must be in [0, max_new_tokens], got 9.", "min_new_tokens"),
    ("sampling_params: json_schema and ebnf are both set; give one constraint", None),
    ("the prompt is empty", None), ("rid must be a string, got 3", None),
    # SGLang's two context refusals: the reply budget past the window names max_new_tokens, the prompt nothing.
    ("Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
     "100009 tokens: 9 tokens from the input messages and 100000 tokens for the completion.", "max_new_tokens"),
    ("The input (5008 tokens) is longer than the model's context length (4096 tokens).", None),
])
def test_the_engines_parameter_is_read_from_its_message(said, name):
    assert engine_param_of(said) == name


@pytest.mark.parametrize("engine,api,sent,param", [
    ("logit_bias", "chat", (), "logit_bias"),
    ("json_schema", "chat", (), "response_format"),
    ("max_new_tokens", "chat", ("messages", "max_completion_tokens"), "max_completion_tokens"),
    ("max_new_tokens", "chat", ("messages",), "max_tokens"),
    ("min_new_tokens", "chat", (), "min_tokens"),
    ("sampling_seed", "chat", (), "seed"),
    ("top_logprobs_num", "chat", (), "top_logprobs"),
    ("ebnf", "chat", (), "tool_choice"),
    ("logit_bias", "completions", (), "logit_bias"),
    ("top_logprobs_num", "completions", (), "logprobs"),
    ("max_new_tokens", "responses", (), "max_output_tokens"),
    ("json_schema", "responses", (), "text.format"),
    ("top_logprobs_num", "responses", ("input", "include"), "include"),
    ("stop", "anthropic", (), "stop_sequences"),
    ("json_schema", "anthropic", (), "output_config.format"),
    ("max_new_tokens", "anthropic", (), "max_tokens"),
    ("top_k", "anthropic", (), "top_k"),
    ("logit_bias", "generate", (), "sampling_params.logit_bias"),
    ("logit_bias", "responses", (), None),      # no Responses field sets it: nothing named
    ("min_p", "anthropic", (), None),
])
def test_each_api_is_told_its_own_field(engine, api, sent, param):
    exc = _refusal(f"sampling_params.{engine}: refused")
    name_client_param(exc, api, sent)
    assert getattr(exc, "param", None) == param


def test_only_engine_refusals_are_renamed_and_a_named_one_is_kept():
    other = UnknownSessionError("sampling_params.top_p: not an engine refusal")
    name_client_param(other, "chat")
    assert getattr(other, "param", None) is None
    exc = _refusal("sampling_params.top_p: bad")
    exc.param = "top_p"
    name_client_param(exc, "anthropic")
    assert exc.param == "top_p"
    unnamed = _refusal("the prompt is empty")
    name_client_param(unnamed, "chat")
    assert getattr(unnamed, "param", None) is None


def test_the_table_has_a_column_per_api():
    assert all(len(row) == len(APIS) for row in CLIENT_NAMES.values())
