"""Fixtures several integration modules share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def engine():
    """The built-in SGLang-protocol engine on a free port, tiny-moe shapes, half of its replies tool calls,
    short replies (a module that needs other settings defines its own ``engine``)."""
    from dressage.engine.config import EngineConfig
    from dressage.engine.server import EngineServer
    from dressage.fields import get_model

    srv = EngineServer(EngineConfig(model=get_model("tiny-moe"), port=0, seed=3, tool_call_rate=0.5,
                                    mean_response_tokens=24))
    srv.start_background()
    yield srv
    srv.stop()
