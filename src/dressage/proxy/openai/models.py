"""``GET /v1/models`` and ``GET /v1/models/{id}``: the one model this Proxy serves.

On a session's base URL (``/sessions/{id}/v1/models``) the session must exist, as it must for
every other call made there.
"""

from __future__ import annotations

from typing import Any

from dressage.errors import ModelNotFoundError
from dressage.proxy.config import ProxyConfig
from dressage.proxy.recording.core import ProxyCore

__all__ = ["ModelsServing"]


class ModelsServing:
    """The model list and the model object (``config.server.served_model_name``)."""

    def __init__(self, config: ProxyConfig, core: ProxyCore) -> None:
        self.config, self.core = config, core

    def list(self, session_id: str | None = None) -> dict[str, Any]:
        """``/v1/models``: the one served model (a session's base URL checks the session exists)."""
        if session_id is not None:
            self.core.session(session_id)
        return {"object": "list", "data": [{"id": self.config.server.served_model_name, "object": "model",
                                            "owned_by": "dressage"}]}

    def retrieve(self, model_id: str, session_id: str | None = None) -> dict[str, Any]:
        """``/v1/models/{id}``: the served model, or a 404 for any other id."""
        if session_id is not None:
            self.core.session(session_id)
        if model_id != self.config.server.served_model_name:
            raise ModelNotFoundError(f"model {model_id!r} does not exist here; this Proxy serves "
                                     f"{self.config.server.served_model_name!r}")
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "dressage"}
