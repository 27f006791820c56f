"""``GET /integration/capabilities``: what this Proxy speaks, so a client can check before it relies on it."""

from __future__ import annotations

from typing import Any

__all__ = ["capabilities", "ENDPOINTS", "SESSION_HEADERS"]

ENDPOINTS = (
    "POST /v1/chat/completions", "GET /v1/models", "POST /sessions", "POST /sessions/{id}/v1/chat/completions",
    "POST /sessions/{id}/generate", "POST /sessions/{id}/finalize", "POST /sessions/{id}/abort",
    "GET /sessions/{id}", "GET /sessions/{id}/segments", "POST /session/finalize", "POST /session/discard",
    "POST /trajectory/read", "POST /trajectory/ack", "POST /trajectory/release", "GET /trajectory/stats", "GET /metrics",
    "GET /transfer_queue/spec", "POST /v1/rollout/pause", "POST /v1/rollout/resume",
    "GET /v1/rollout/pause_state", "GET /v1/engines", "GET /integration/capabilities", "GET /health",
    "POST /v1/responses", "POST /sessions/{id}/v1/responses", "POST /v1/completions",
    "POST /sessions/{id}/v1/completions", "GET /v1/models/{model}", "GET /sessions/{id}/v1/models/{model}",
    "POST /v1/messages", "POST /sessions/{id}/v1/messages", "POST /v1/messages/count_tokens",
    "POST /sessions/{id}/v1/messages/count_tokens", "HEAD /sessions/{id}", "HEAD /",
)
SESSION_HEADERS = {"session": ["X-Session-Id", "X-SMG-Routing-Key"], "instance": ["X-Instance-Id"],
                   "turn": ["X-Turn-Id"]}


def capabilities(*, partial_rollout: bool, rollout_routing_replay: bool, transfer_queue: bool,
                 segment_view: str, engines: int, router: bool, model: dict[str, Any],
                 finalize_wait_s: float) -> dict[str, Any]:
    """The capability document (static facts of this build plus this Proxy's settings)."""
    return {
        "service": "dressage-proxy",
        "endpoints": list(ENDPOINTS),
        "headers": SESSION_HEADERS,
        "body_ids": ["session_id", "instance_id", "turn_id"],
        "features": {
            "turn_scope": True,
            "turn_replay_key": "turn_id + request hash",
            "finalize_idempotent": True,
            "finalize_fields": ["session_id", "reward", "instance_id", "label", "wait_s"],
            "finalize_waits_for_in_flight_s": finalize_wait_s,
            "discard": True,
            "trajectory_read_modes": ["trajectory", "batch"],
            "trajectory_read_fields": ["trajectory_id", "session_id", "session_ids", "instance_id", "max_groups",
                                       "segment_view", "drain"],
            "segment_views": ["lineage", "timeline"],
            "default_segment_view": segment_view,
            "pause_scopes": ["all", "session", "instance"],
            "resume_version": ["weight_version (int)", "version (engine string)"],
            "resume_update_engines": True,
            "partial_rollout": partial_rollout,
            "rollout_routing_replay": rollout_routing_replay,
            "transfer_queue": transfer_queue,
            "token_versions_from_engine": True,
            "router_fanout": router,
        },
        "engines": engines,
        "model": model,
    }
