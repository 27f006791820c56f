"""Fixtures several test modules share: the real Qwen3 tokenizer, an embedded TransferQueue, restoring a
RolloutManager batch, and the engine + Proxy stack of :mod:`dressage.testing.stack` over loopback."""

from __future__ import annotations

import pytest

from dressage.errors import TokenizerError
from dressage.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def qwen3():
    """The real Qwen3 tokenizer; the test skips (and says why) where its files are not installed."""
    try:
        return load_tokenizer("qwen3")
    except TokenizerError as exc:
        pytest.skip(f"real Qwen3 tokenizer unavailable: {exc}")


@pytest.fixture
def tq():
    """An embedded TransferQueue that keeps keys until they are cleared (no retention sweep)."""
    from dressage.tq import TransferQueue

    q = TransferQueue.start({"deployment": "embedded", "retention_s": None})
    yield q
    q.shutdown()


@pytest.fixture()
def restore_batch():
    """``restore_batch(manager, tq)``: take batch 0, restore every shard (through ``tq`` when
    given), release its TransferQueue keys, return its Samples."""
    from dressage.rollout.manager import sample_ref_keys
    from dressage.train import TrainingReader, release_batch

    def restore(manager, tq=None):
        batch = manager.take_batch(0)
        keys = sample_ref_keys(batch.samples)
        client = tq.client() if tq else None
        for shard in batch.shards:
            TrainingReader(client).restore(shard)
        if client:
            release_batch(client, keys)
        return batch.samples

    return restore


@pytest.fixture(scope="module")
def engine(request):
    """The built-in SGLang-protocol engine on a free port (:func:`dressage.testing.stack.start_engine`):
    tiny-moe shapes, half of its replies tool calls, short replies. A module that needs other settings
    says so in a module-level ``ENGINE = {...}`` of ``start_engine`` arguments."""
    from dressage.testing.stack import start_engine

    srv = start_engine(**getattr(request.module, "ENGINE", {}))
    yield srv
    srv.stop()


@pytest.fixture
def proxy_stack():
    """``proxy_stack(engine_urls, **options)``: a Proxy started by :func:`dressage.testing.stack.start_proxy`,
    closed (with every other one the test started) when the test ends."""
    from dressage.testing.stack import start_proxy

    started = []

    def start(*args, **options):
        stack = start_proxy(*args, **options)
        started.append(stack)
        return stack

    yield start
    for stack in reversed(started):
        stack.close()
