"""What every endpoint of one Proxy shares about its sessions: the ones a header call created, the
per-session state to drop when a session leaves, and the call counters.

:class:`SessionBook` is handed to each serving object and to the trajectory use cases by the
composition root (:class:`dressage.proxy.service.ProxyService`); it owns the :class:`SessionKeeper`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from dressage.errors import MissingSessionIdError, SessionStateError
from dressage.proxy.recording.lifecycle import InFlight
from dressage.proxy.recording.session_caps import SessionKeeper
from dressage.proxy.recording.turns import CallIdentity, checked_identity, instance_group

__all__ = ["SessionBook"]


class SessionBook:
    """Header-created sessions, per-session forgetting and the call counters of one Proxy.

    ``forgetters``: what the call path keeps per session (engine placement, turns, responses,
    weight-version pins), each a ``forget(session_id)``; the keeper's idle clock is released too.
    """

    def __init__(self, core: Any, in_flight: InFlight, *, timeout_s: float, max_sessions: int,
                 forgetters: Iterable[Callable[[str], None]] = ()) -> None:
        self.core, self.in_flight = core, in_flight
        self._forgetters = list(forgetters)
        self.keeper = SessionKeeper(core, timeout_s=timeout_s, max_sessions=max_sessions,
                                    busy=in_flight.running, on_evict=self.forget_state)
        """Idle eviction and the cap on live sessions."""
        self.calls = 0
        """Generations started (an engine call each, retries of a tool rule included)."""
        self.failed_calls = 0
        """Requests answered with an error (streamed ones included)."""
        self.failed_by: dict[tuple[int, str], int] = {}
        """Failed calls by (HTTP status, error code): ``dressage_failed_calls_total``'s labels."""
        self.generated_tokens = 0
        """Response tokens of every recorded step."""
        self.field_bytes: dict[str, int] = {"logprobs": 0, "routed_experts": 0}
        """Bytes of the large fields of every recorded step, as the engine answered them."""
        self.replayed_turns = 0
        """Calls answered from a recorded turn (``X-Turn-Id``) instead of the engine."""
        self._fresh: set[str] = set()
        """Sessions a header call created whose first call has not recorded yet (dropped if it fails)."""

    def create(self, metadata: dict[str, Any] | None) -> Any:
        """A new session (``POST /sessions``), counted against the cap and on the idle clock."""
        self.keeper.admit()
        s = self.core.create_session(metadata)
        self.keeper.touch(s.session_id)
        return s

    def header_session(self, ident: CallIdentity) -> str:
        """The session a header-identified call belongs to, created by its first call."""
        if not ident.session_id:
            raise MissingSessionIdError("send the session in an X-Session-Id (or X-SMG-Routing-Key) header, "
                                        "or use a session's base URL /sessions/{id}/v1")
        sid = checked_identity(ident).session_id
        if sid not in self.core.sessions:
            meta: dict[str, Any] = {"session_source": "headers"}
            if ident.instance_id is not None:
                meta.update(instance_id=ident.instance_id, group_index=instance_group(ident.instance_id))
            self.keeper.admit()
            try:
                self.core.create_session(meta, session_id=sid)
            except SessionStateError:
                return sid  # a concurrent first call created it
            self.keeper.touch(sid)
            self._fresh.add(sid)
        return sid

    def failed(self, exc: BaseException) -> None:
        """Count a request answered with ``exc`` (its status and stable code; 500 for what is not ours)."""
        self.failed_status(int(getattr(exc, "http_status", 500) or 500),
                           str(getattr(exc, "code", None) or type(exc).__name__))

    def failed_status(self, status: int, code: str) -> None:
        """Count a request answered with an error ``status`` and ``code`` (a refusal no DressageError made:
        a body the schema refused, an unknown path)."""
        self.failed_calls += 1
        key = (int(status), code)
        self.failed_by[key] = self.failed_by.get(key, 0) + 1

    def recorded(self, session_id: str) -> None:
        """A step of the session was recorded: it is in use (and no longer a failed first call's)."""
        self._fresh.discard(session_id)
        self.keeper.touch(session_id)

    def drop_if_unused(self, session_id: str, *, own_calls: int = 0) -> None:
        """A header-created session whose first call failed is dropped: a failed call leaves nothing.

        ``own_calls``: calls of the caller itself still counted in flight (no other may be running).
        """
        if session_id in self._fresh and self.in_flight.running(session_id) <= own_calls:
            self._fresh.discard(session_id)
            if self.core.drop_unused(session_id):
                self.forget_state(session_id)

    def forget_state(self, session_id: str) -> None:
        """Drop what the call path keeps per session, and its idle clock."""
        for forget in self._forgetters:
            forget(session_id)
        self.keeper.release(session_id)
        self._fresh.discard(session_id)
