"""``GET /integration/capabilities``: what this Proxy speaks, so a client can check before it relies on it.

The document is upstream Dressage's (``schema_version`` ``dressage.proxy.integration/v1``: its Harbor
integration requires those keys); ours, with endpoints, features and the model shape, is under ``dressage``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from dressage.proxy.schemas import TrajectoryReadRequest

__all__ = ["capabilities", "upstream_capabilities", "template_fingerprint", "ENDPOINTS", "SESSION_HEADERS", "UPSTREAM_SCHEMA_VERSION",
           "OURS_KEY"]

UPSTREAM_SCHEMA_VERSION = "dressage.proxy.integration/v1"
OURS_KEY = "dressage"
"""The key of our own capability document inside upstream's."""

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
                   "turn": ["X-Turn-Id"], "retry": ["Idempotency-Key", "x-stainless-retry-count"],
                   "expected_version": ["X-Dressage-Expected-Version"]}


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
            "turn_replay_key": "Idempotency-Key, or turn_id + request hash on x-stainless-retry-count > 0",
            "turn_resend": "generates again (a branch)",
            "finalize_idempotent": True,
            "finalize_fields": ["session_id", "reward", "instance_id", "label", "wait_s"],
            "finalize_waits_for_in_flight_s": finalize_wait_s,
            "discard": True,
            # The answer's ``mode``: a named read, a batch of whole groups, or trainer-ready Samples.
            "trajectory_read_modes": ["trajectory", "batch", "samples"],
            "trajectory_read_fields": list(TrajectoryReadRequest.model_fields),
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


def template_fingerprint(tokenizer: object) -> str | None:
    """SHA-256 of the tokenizer's chat template source (upstream's ``chat_template_fingerprint``);
    ``None`` for a tokenizer without one (the byte tokenizer)."""
    source = getattr(tokenizer, "template_source", None)
    return hashlib.sha256(source.encode("utf-8")).hexdigest() if isinstance(source, str) and source else None


def upstream_capabilities(ours: dict[str, Any], *, tokenizer: str, token_build_model: str | None,
                          max_output_tokens: int | None, partial_rollout: bool,
                          max_partial_rollout_preempts: int | None, record_token_versions: bool,
                          mask_nonlast_version_tokens: bool, weight_version: str,
                          chat_template_fingerprint: str | None = None) -> dict[str, Any]:
    """Upstream's document with ``ours`` under :data:`OURS_KEY`.

    Turns are always built token-in-token-out here (``token_build_model``: upstream's family when one
    was named, else the tokenizer). The weight
    version is the one the engines' last answer stamped (the Proxy does not poll the workers for
    it), so it is reported as observed, not authoritative.
    """
    return {
        "schema_version": UPSTREAM_SCHEMA_VERSION,
        "token_build_mode": "tito",
        "token_build_model": token_build_model or tokenizer,
        "tokenizer_id": tokenizer,
        "chat_template_fingerprint": chat_template_fingerprint,
        "record_token_versions": record_token_versions,
        "mask_nonlast_version_tokens": mask_nonlast_version_tokens,
        "max_output_tokens": max_output_tokens,
        "partial_rollout": partial_rollout,
        "max_partial_rollout_preempts": max_partial_rollout_preempts,
        "current_weight_version": weight_version,
        "cached_weight_version": weight_version,
        "weight_version_authoritative": False,
        "weight_versions_consistent": False,
        "weight_version_source": "generation_observation",
        "weight_version_worker_count": 0,
        "supports_expected_version": True,
        OURS_KEY: ours,
    }
