"""Byte tokenizer and ChatML template: round trips, exact template output, TITO deltas."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.errors import ChatTemplateError, TokenizerError
from dressage.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer, render_chatml

TOK = ByteTokenizer()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def test_special_ids_and_vocab_size():
    assert (TOK.eos_token_id, TOK.im_start_token_id, TOK.im_end_token_id) == (256, 257, 258)
    assert TOK.vocab_size == 259
    assert TOK.stop_token_ids == (258, 256)


def test_encode_is_utf8_bytes_with_specials_split_out():
    assert TOK.encode("hi") == [104, 105]
    assert TOK.encode("é") == [0xC3, 0xA9]
    assert TOK.encode("<|im_start|>user\nx<|im_end|>") == [257, *b"user\nx", 258]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_decode_encode_round_trips_any_text(text):
    assert TOK.decode(TOK.encode(text)) == text


def test_decode_skips_specials_on_request():
    ids = TOK.encode("<|im_start|>assistant\nok<|im_end|>")
    assert TOK.decode(ids, skip_special_tokens=True) == "assistant\nok"
    with pytest.raises(ValueError, match="outside"):
        TOK.decode([999])


def test_chat_template_renders_chatml_turns():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = render_chatml(msgs)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert TOK.apply_chat_template(msgs) == TOK.encode(text)
    assert render_chatml(msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_content_parts_are_joined():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_chatml(msgs, add_generation_prompt=False) == "<|im_start|>user\nab<|im_end|>\n"


def test_tools_go_into_system_turn_and_calls_render_as_blocks():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "warm"},
    ]
    text = render_chatml(msgs, TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nS\n\n# Tools")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in system
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n') in text
    # Consecutive tool results share one user turn.
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n") in text


def test_bad_messages_raise_chat_template_error():
    with pytest.raises(ChatTemplateError, match=r"messages\[0\].role"):
        TOK.apply_chat_template([{"role": "robot", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="arguments are not JSON"):
        TOK.apply_chat_template([{"role": "assistant", "content": None,
                                  "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}])


def test_render_delta_is_suffix_of_full_render():
    base = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
    new = [{"role": "user", "content": "More?"}]
    full = TOK.apply_chat_template(base + new, TOOLS)
    delta = TOK.render_delta(base, new, TOOLS)
    assert delta == TOK.encode("<|im_start|>user\nMore?<|im_end|>\n<|im_start|>assistant\n")
    assert full[len(full) - len(delta):] == delta
    assert TOK.apply_chat_template(base, TOOLS, add_generation_prompt=False) + delta == full


def test_render_delta_across_tool_turn():
    base = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}]
    new = [{"role": "tool", "content": "rain"}]
    assert TOK.decode(TOK.render_delta(base, new, TOOLS)) == (
        "<|im_start|>user\n<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_render_delta_refuses_when_base_is_rewritten():
    # A base ending in a tool result is merged with the next tool result: no exact delta exists.
    base = [{"role": "user", "content": "q"}, {"role": "tool", "content": "a"}]
    with pytest.raises(ChatTemplateError, match="not a prefix"):
        TOK.render_delta(base, [{"role": "tool", "content": "b"}])


def test_glue_after_assistant_restores_what_the_engine_did_not_emit():
    nl = TOK.encode("\n")
    assert TOK.assistant_turn_suffix_ids == [258, *nl]
    assert TOK.glue_after_assistant(TOK.encode("ok") + [258]) == nl          # stopped on <|im_end|>
    assert TOK.glue_after_assistant(TOK.encode("ok")) == [258, *nl]          # cut by length
    assert TOK.glue_after_assistant(TOK.encode("ok") + [258, *nl]) == []


def test_load_tokenizer_byte_and_missing_transformers():
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(TokenizerError, match="transformers"):
            load_tokenizer("some/model")
    else:  # pragma: no cover - only where transformers is installed
        pytest.skip("transformers installed")


class _FakeHF:
    """The slice of a transformers tokenizer HFTokenizer uses, backed by the byte tokenizer."""

    eos_token_id = 256
    unk_token_id = None
    unk_token = None
    name_or_path = "fake/chatml"

    def encode(self, text, add_special_tokens=False):
        return TOK.encode(text)

    def decode(self, ids, skip_special_tokens=False):
        return TOK.decode(ids, skip_special_tokens=skip_special_tokens)

    def __len__(self):
        return TOK.vocab_size

    def convert_tokens_to_ids(self, token):
        ids = TOK.encode(token)
        return ids[0] if len(ids) == 1 and ids[0] >= 256 else None

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=True):
        return {"input_ids": TOK.apply_chat_template(messages, tools, add_generation_prompt)}


def test_hf_wrapper_maps_specials_template_and_probes_glue():
    hf = HFTokenizer(_FakeHF())
    assert hf.name == "fake/chatml"
    assert (hf.eos_token_id, hf.im_start_token_id, hf.im_end_token_id, hf.vocab_size) == (256, 257, 258, 259)
    msgs = [{"role": "user", "content": "x"}]
    assert hf.apply_chat_template(msgs) == TOK.apply_chat_template(msgs)
    assert hf.assistant_turn_suffix_ids == TOK.assistant_turn_suffix_ids
    assert hf.decode(hf.encode("héllo")) == "héllo"
