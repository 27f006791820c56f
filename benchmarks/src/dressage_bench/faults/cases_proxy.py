"""Proxy faults: a crash and restart from the journal loses no committed StepRecord."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import httpx

from dressage_bench.faults._stack import free_port, start_engine, start_proxy
from dressage_bench.faults.runner import FaultsConfig, case
from dressage.trajectory import build_segments


def _turn(url: str, sid: str, messages: list) -> list:
    r = httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json={"messages": messages, "max_tokens": 24},
                   timeout=30)
    r.raise_for_status()
    return messages + [r.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]


@case("proxy_restart_from_journal")
def proxy_restart(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    engine = start_engine()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "proxy.journal"
        stack = start_proxy(engine.url, journal=str(path), port=port)
        try:
            sids = [httpx.post(stack.url + "/sessions", json={"metadata": {"group_index": i}}).json()["session_id"]
                    for i in range(3)]
            convs = {sid: [{"role": "user", "content": f"Task {i}: count to five."}] for i, sid in enumerate(sids)}
            for _ in range(2):
                for sid in sids:
                    convs[sid] = _turn(stack.url, sid, convs[sid])
            httpx.post(f"{stack.url}/sessions/{sids[0]}/finalize", json={"reward": 1.0}).raise_for_status()
            before = {sid: [seg.tokens.tolist() for seg in build_segments(stack.core.sessions[sid])] for sid in sids}
            steps_before = sum(len(stack.core.sessions[sid].steps) for sid in sids)
        finally:
            stack.stop()                          # the Proxy dies: nothing is flushed or finalized on purpose
        restarted = start_proxy(engine.url, journal=str(path), port=port)
        try:
            core = restarted.core
            after = {sid: [seg.tokens.tolist() for seg in build_segments(core.sessions[sid])] for sid in sids}
            resumed = {sid: core.sessions[sid].state for sid in sids}
            steps_after = sum(len(core.sessions[sid].steps) for sid in sids)
            # in-flight sessions continue where they were, with TITO
            for sid in sids[1:]:
                convs[sid] = _turn(restarted.url, sid, convs[sid])
                httpx.post(f"{restarted.url}/sessions/{sid}/finalize", json={"reward": 0.5}).raise_for_status()
            segs = {sid: httpx.get(f"{restarted.url}/sessions/{sid}/segments").json() for sid in sids[1:]}
            detail = {"sessions": len(sids), "steps_committed_before_crash": steps_before,
                      "steps_after_replay": steps_after,
                      "identical_after_replay": after == before, "states_after_restart": list(resumed.values()),
                      "samples_redelivered": restarted.rm.num_ready,
                      "segments_after_resume": {sid[:6]: len(v) for sid, v in segs.items()},
                      "journal_bytes": path.stat().st_size}
            passed = (after == before and steps_after == steps_before and resumed[sids[0]] == "finalized"
                      and all(resumed[s] == "active" for s in sids[1:])
                      and all(len(v) == 1 and len(v[0]["step_ids"]) == 3 for v in segs.values()))
            return passed, detail
        finally:
            restarted.stop()
            engine.stop()


@case("proxy_kill9_restart")
def proxy_kill9(cfg: FaultsConfig) -> tuple[bool, dict[str, Any]]:
    """``dressage proxy serve --journal`` killed with SIGKILL mid-rollout and started again."""
    from dressage_bench.faults._stack import serve_process

    engine = serve_process(["engine", "serve", "--model", "qwen3.6-35b-a3b", "--mean-response-tokens", "24"])
    with tempfile.TemporaryDirectory() as tmp:
        journal = str(Path(tmp) / "proxy.journal")
        args = ["proxy", "serve", "--engine-url", engine.url, "--use-rollout-routing-replay",
                "--routed-experts-dtype", "uint8", "--journal", journal]
        proxy = serve_process(args)
        try:
            sids = [httpx.post(proxy.url + "/sessions").json()["session_id"] for _ in range(4)]
            convs = {sid: [{"role": "user", "content": f"Job {i}: spell 'river'."}] for i, sid in enumerate(sids)}
            for _ in range(2):
                for sid in sids:
                    convs[sid] = _turn(proxy.url, sid, convs[sid])
            httpx.post(f"{proxy.url}/sessions/{sids[0]}/finalize", json={"reward": 1.0}).raise_for_status()
            before = {sid: httpx.get(f"{proxy.url}/sessions/{sid}").json()["steps"] for sid in sids}
            proxy.proc.kill()                                   # SIGKILL: no shutdown path runs
            proxy.proc.wait()
            port = proxy.url.rsplit(":", 1)[1]
            restarted = serve_process(args, port=int(port))
            try:
                after = {sid: httpx.get(f"{restarted.url}/sessions/{sid}").json() for sid in sids}
                for sid in sids[1:]:
                    convs[sid] = _turn(restarted.url, sid, convs[sid])
                    httpx.post(f"{restarted.url}/sessions/{sid}/finalize", json={"reward": 0.5}).raise_for_status()
                segs = {sid: httpx.get(f"{restarted.url}/sessions/{sid}/segments").json() for sid in sids}
            finally:
                restarted.stop()
            detail = {"steps_before_kill": sum(before.values()),
                      "steps_after_restart": sum(a["steps"] for a in after.values()),
                      "states_after_restart": [a["state"] for a in after.values()],
                      "segments_per_session": [len(v) for v in segs.values()],
                      "steps_in_resumed_segments": [len(v[0]["step_ids"]) for v in list(segs.values())[1:]]}
            passed = (detail["steps_after_restart"] == detail["steps_before_kill"]
                      and detail["states_after_restart"][0] == "finalized"
                      and all(n == 3 for n in detail["steps_in_resumed_segments"])
                      and all(n == 1 for n in detail["segments_per_session"]))
            return passed, detail
        finally:
            proxy.stop()
            engine.stop()
