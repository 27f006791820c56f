"""Deterministic stand-ins for engine output, shared by the trajectory tests.

R3 rows are a pure function of (position, token), so the rows any step contributes for a
position must equal what a full recomputation of the final sequence gives.
"""

from __future__ import annotations

import numpy as np

from dressage.trajectory import Session, StepRecord

L, K, E = 3, 2, 16


def expected_r3(tokens: np.ndarray, stop: int | None = None, start: int = 0) -> np.ndarray:
    tokens = np.asarray(tokens, dtype=np.int64)
    stop = len(tokens) - 1 if stop is None else stop
    i = np.arange(start, stop)[:, None, None]
    t = tokens[start:stop][:, None, None]
    layer = np.arange(L)[None, :, None]
    slot = np.arange(K)[None, None, :]
    return ((t * 31 + i * 7 + layer * 5 + slot * 11) % E).astype(np.int32)


def fake_logprobs(response: np.ndarray, salt: int) -> np.ndarray:
    return (-(np.asarray(response, dtype=np.float64) % 97) / 10.0 - salt * 1e-3).astype(np.float32)


def call(session: Session, prompt, response, *, version: int = 0, tools=None, salt: int = 0,
         r3_dtype=np.int32, **kw) -> StepRecord:
    """Route a call like the Proxy does, produce engine-shaped fields for it, commit it."""
    prompt = np.asarray(prompt, dtype=np.int32)
    response = np.asarray(response, dtype=np.int32)
    decision = session.route(prompt, tools=tools)
    full = np.concatenate([prompt, response])
    routed = None
    if session.r3_shape is not None:
        routed = expected_r3(full, start=decision.routed_experts_start).astype(r3_dtype)
    return session.commit_step(decision, prompt_ids=prompt, response_ids=response,
                               logprobs=fake_logprobs(response, salt), routed_experts=routed,
                               token_versions=version, tools=tools, **kw)


def new_session(sid: str = "s", r3: bool = True, **kw) -> Session:
    return Session(sid, r3_shape=(L, K) if r3 else None, **kw)


def sglang_body(prompt, response, *, start: int, salt: int = 0, experts=None) -> dict:
    """A ``/generate`` JSON body as SGLang returns it for this call (rows [start, T-1))."""
    import base64

    prompt = np.asarray(prompt, dtype=np.int32)
    response = np.asarray(response, dtype=np.int32)
    rows = expected_r3(np.concatenate([prompt, response]), start=start) if experts is None else experts
    lps = fake_logprobs(response, salt)
    return {
        "text": "",
        "output_ids": response.tolist(),
        "meta_info": {
            "id": f"req-{salt}",
            "finish_reason": {"type": "stop"},
            "prompt_tokens": int(len(prompt)),
            "completion_tokens": int(len(response)),
            "output_token_logprobs": [[float(lp), int(t), None] for lp, t in zip(lps, response)],
            "routed_experts": base64.b64encode(np.ascontiguousarray(rows, dtype=np.int32).tobytes()).decode(),
        },
    }
