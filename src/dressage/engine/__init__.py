"""An inference engine for machines without GPUs that speaks SGLang's ``/generate`` protocol.

Deterministic, vectorised output (readable text, logprobs, R3 routed experts consistent across a
shared prefix) so that tests, demos and benchmarks exercise the data plane, not a model.
"""

from dressage.engine.config import EngineConfig
from dressage.engine.core import Engine, Generation
from dressage.engine.protocol import GenerateRequest, SamplingParams, parse_generate_body
from dressage.engine.routing import RoutingModel

_SERVER_NAMES = ("EngineServer", "create_app")


def __getattr__(name: str):
    # The HTTP side needs FastAPI (the ``server`` extra); the engine itself does not.
    if name in _SERVER_NAMES:
        from dressage.engine import server

        return getattr(server, name)
    raise AttributeError(f"module 'dressage.engine' has no attribute {name!r}")

__all__ = [
    "EngineConfig", "Engine", "Generation", "GenerateRequest", "SamplingParams",
    "parse_generate_body", "RoutingModel", "EngineServer", "create_app",
]
