"""Fields the official ``openai`` and ``anthropic`` SDKs send, against the real Proxy and built-in engine.

The rule: a field that cannot change the sample is accepted and ignored; one that would change it and
cannot be served is a 400 that names it, as the client sent it (a Responses or Messages request is
served as a chat call, but its refusals name the Responses or Messages field).
"""

import openai
import pytest

anthropic = pytest.importorskip("anthropic")

# The Messages tests' Proxy (a fixture) and their session clients: a session's official SDK client each.
from test_proxy_anthropic import _chat as _openai, _session as _anthropic, proxy  # noqa: E402,F401

HI = {"role": "user", "content": "hi"}


def _refused(call, param):
    with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as err:
        call()
    body = err.value.response.json()
    error = body["error"]
    if "param" in error:  # OpenAI's shape names it; Anthropic's message opens with it
        assert error["param"] == param and error["code"] == "unsupported_parameter", body
    assert error["message"].startswith(f"{param}:"), body
    return error["message"]


def test_chat_history_in_the_deprecated_function_call_form_is_refused_by_name(proxy):
    _, client = _openai(proxy)
    call = {"name": "lookup", "arguments": '{"q": 1}'}
    _refused(lambda: client.chat.completions.create(model="m", max_tokens=2, messages=[
        HI, {"role": "assistant", "content": None, "function_call": call}, HI]), "messages[1].function_call")
    _refused(lambda: client.chat.completions.create(model="m", max_tokens=2, messages=[
        HI, {"role": "function", "name": "lookup", "content": "1"}]), "messages[1].role")
    _refused(lambda: client.chat.completions.create(model="m", max_tokens=2, messages=[
        HI, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "custom", "custom": {"name": "x", "input": "y"}}]}, HI]),
        "messages[1].tool_calls[0].type")


def test_an_assistant_refusal_in_the_history_is_that_turns_text(proxy):
    sid, client = _openai(proxy)
    said = [HI, {"role": "assistant", "content": "I cannot help with that."}, HI]
    refused = [HI, {"role": "assistant", "content": None, "refusal": "I cannot help with that."}, HI]
    a = client.chat.completions.create(model="m", max_tokens=4, temperature=0, messages=said)
    b = client.chat.completions.create(model="m", max_tokens=4, temperature=0, messages=refused)
    assert a.choices[0].message.content == b.choices[0].message.content  # the same prompt, the same reply
    _refused(lambda: client.chat.completions.create(model="m", max_tokens=2, messages=[
        HI, {"role": "assistant", "content": "text", "refusal": "no"}, HI]), "messages[1].refusal")


def test_a_tool_choice_shape_not_served_is_a_400_naming_it(proxy):
    _, client = _openai(proxy)
    tools = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "get"}}]}}
    for choice in (allowed, {"type": "custom", "custom": {"name": "get"}}):
        message = _refused(lambda: client.chat.completions.create(
            model="m", max_tokens=2, messages=[HI], tools=tools, tool_choice=choice), "tool_choice")
        assert repr(choice["type"]) in message


def test_responses_and_messages_refusals_name_the_field_their_client_sent(proxy):
    _, client = _openai(proxy)
    _refused(lambda: client.responses.create(model="m", input="hi", max_output_tokens=16,
                                             text={"format": {"type": "json_schema", "name": "x"}}),
             "text.format.schema")
    _refused(lambda: client.responses.create(model="m", input="hi", max_output_tokens=16,
                                             text={"format": {"type": "grammar"}}), "text.format.type")
    _, messages = _anthropic(proxy)
    tools = [{"name": "get", "input_schema": {"type": "object"}}]
    _refused(lambda: messages.messages.create(
        model="m", max_tokens=8, messages=[HI], tools=tools, tool_choice={"type": "any"},
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
        "output_config.format")
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="hi", previous_response_id="resp_nobody_made")
    assert err.value.response.json()["error"]["param"] == "previous_response_id"


def test_fields_that_cannot_change_the_sample_are_accepted(proxy):
    sid, messages = _anthropic(proxy)
    plain = messages.messages.create(model="m", max_tokens=4, messages=[HI], extra_body={"temperature": 0})
    billed = messages.messages.create(model="m", max_tokens=4, messages=[HI], extra_body={
        "temperature": 0, "billing_policy": {"type": "billing_policy", "bill_to": "self"},
        "fallback_credit_token": {"type": "fallback_credit_token", "token": "abc"}})
    assert billed.content[0].text == plain.content[0].text
    # Messages has no cap on stop sequences (OpenAI's four is OpenAI's); the engine takes them all.
    stops = messages.messages.create(model="m", max_tokens=4, messages=[HI],
                                     stop_sequences=["zz1", "zz2", "zz3", "zz4", "zz5"])
    assert stops.stop_reason in ("max_tokens", "end_turn", "stop_sequence")
    _, client = _openai(proxy)
    for extra in ({"max_tool_calls": 3}, {"reasoning": {"mode": "standard"}}, {"reasoning": {"context": "auto"}}):
        assert client.responses.create(model="m", input="hi", max_output_tokens=4, extra_body=extra).status
    _refused(lambda: client.responses.create(model="m", input="hi", max_output_tokens=4,
                                             extra_body={"reasoning": {"context": "all_turns"}}), "reasoning")
    with pytest.raises(openai.UnprocessableEntityError, match="stop: .*at most 4 stop sequences"):
        client.chat.completions.create(model="m", max_tokens=2, messages=[HI], stop=["a", "b", "c", "d", "e"])
