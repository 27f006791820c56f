"""TimedTokenizer: the same answers as the tokenizer it wraps, with its calls counted once each."""

from __future__ import annotations

from dressage.proxy.recording.tokenizer_clock import TimedTokenizer
from dressage.tokenizer import load_tokenizer


def test_same_answers_and_one_count_per_outer_call():
    inner = load_tokenizer("byte")
    tok = TimedTokenizer(inner)
    msgs = [{"role": "user", "content": "héllo"}]
    assert tok.encode("héllo") == inner.encode("héllo")
    ids = tok.apply_chat_template(msgs, None, True)
    assert ids == inner.apply_chat_template(msgs, None, True)
    assert tok.decode(ids) == inner.decode(ids)
    # apply_chat_template encodes on the inner tokenizer: that is part of its own call, not a second one.
    assert tok.calls == 3
    assert tok.cpu_s >= 0.0
    # Properties and plain attributes are the inner tokenizer's, untimed.
    assert tok.eos_token_id == inner.eos_token_id
    assert tok.special_token_ids == inner.special_token_ids
    assert tok.calls == 3


def test_a_failing_call_is_counted_and_raises_unchanged():
    tok = TimedTokenizer(load_tokenizer("byte"))
    try:
        tok.decode(None)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - whatever the tokenizer raises comes through
        raised = type(exc)
    else:
        raised = None
    assert raised is not None
    assert tok.calls == 1


def test_stats_report_the_tokenizer_cpu(tmp_path):
    from dressage.proxy.config import ProxyConfig
    from dressage.proxy.deployment import build_service

    service, _ = build_service(ProxyConfig())
    assert isinstance(service.tokenizer, TimedTokenizer)
    service.tokenizer.encode("some text")
    stats = service.stats()
    assert isinstance(stats["tokenizer_cpu_s"], float)
    assert service.tokenizer.calls == 1
