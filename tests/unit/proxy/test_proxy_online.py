"""The Proxy's online pieces without HTTP: engine pool, pause state, turn cache, server config."""

import asyncio

import numpy as np
import pytest

from dressage.errors import ConfigError, EngineUnavailable
from dressage.errors import NoHealthyEngineError
from dressage.proxy.recording.pause import RolloutPause
from dressage.proxy.engines.pool import EnginePool
from dressage.proxy.config import EnginesConfig, LimitsConfig, SessionsConfig
from dressage.proxy.recording.turns import TurnCache, identity_from_headers, instance_group


class FakeEngine:
    def __init__(self, url):
        self.base_url, self.up, self.aborted = url, True, []

    async def health(self, timeout=5.0):
        return self.up

    async def abort(self, rid):
        self.aborted.append(rid)


def _pool(n=3, **kw):
    return EnginePool([FakeEngine(f"http://e{i}") for i in range(n)], **kw)


def test_sessions_stick_and_only_the_failed_engines_sessions_move():
    pool = _pool()
    sids = [f"s{i}" for i in range(200)]
    first = {sid: pool.place(sid).member.url for sid in sids}
    assert len(set(first.values())) == 3
    assert all(pool.place(sid).member.url == first[sid] for sid in sids)
    pool.members["http://e1"].client.up = False
    assert asyncio.run(pool.check()) == ["http://e1"]
    after = {sid: pool.place(sid) for sid in sids}
    for sid in sids:
        if first[sid] == "http://e1":
            assert after[sid].moved_from == "http://e1" and after[sid].member.url != "http://e1"
        else:
            assert after[sid].moved_from is None and after[sid].member.url == first[sid]
    assert len(pool.moves) == sum(u == "http://e1" for u in first.values())
    # Back up: it rejoins, but moved sessions stay where they went.
    pool.members["http://e1"].client.up = True
    asyncio.run(pool.check())
    assert all(pool.place(sid).member.url != "http://e1" for sid in sids if first[sid] == "http://e1")


def test_no_healthy_engine_is_a_typed_error_and_failures_threshold_applies():
    pool = _pool(2, failures_to_remove=2)
    for m in pool.members.values():
        m.client.up = False
    assert asyncio.run(pool.check()) == []          # one failure is not enough
    assert sorted(asyncio.run(pool.check())) == ["http://e0", "http://e1"]
    with pytest.raises(NoHealthyEngineError) as err:
        pool.place("s")
    assert isinstance(err.value, EngineUnavailable) and err.value.code == "no_healthy_engine"


def test_pause_aborts_running_requests_until_they_answer_and_resume_sets_the_version():
    async def scenario():
        pause = RolloutPause(abort_retry_s=0.01)
        engine = FakeEngine("http://e")
        finished = asyncio.Event()

        async def generation():
            async with pause.track("rid-1", engine) as run:
                while not engine.aborted:       # the engine answers once the abort reached it
                    await asyncio.sleep(0.005)
                finished.set()
                return run.aborted

        task = asyncio.ensure_future(generation())
        await asyncio.sleep(0.02)
        out = await pause.pause()
        assert out == {"paused": True, "aborted": 1, "still_running": 0, "weight_version": 0, "version": "0"}
        assert finished.is_set() and await task is True
        waiter = asyncio.ensure_future(pause.wait_running())
        await asyncio.sleep(0.02)
        assert not waiter.done()                # new calls wait while paused
        assert pause.resume(4) == {"paused": False, "resumed": True, "weight_version": 4, "version": "4"}
        await asyncio.wait_for(waiter, 1)
        assert pause.state()["in_flight"] == 0 and pause.weight_version == 4

    asyncio.run(scenario())


def test_turn_cache_replays_committed_turns_and_forgets_failed_ones():
    async def scenario():
        turns = TurnCache()
        turns.begin("s", "t1")

        async def commit():
            return {"id": "r1"}

        task = asyncio.ensure_future(commit())
        turns.settle("s", "t1", task)
        await task
        assert await turns.get("s", "t1") == {"id": "r1"}
        turns.begin("s", "t2")

        async def broken():
            raise RuntimeError("TQ down")

        bad = asyncio.ensure_future(broken())
        turns.settle("s", "t2", bad)
        with pytest.raises(RuntimeError):
            await bad
        assert turns.get("s", "t2") is None        # its retry is a new call
        turns.forget_session("s")
        assert len(turns) == 0

    asyncio.run(scenario())


def test_headers_and_instance_groups():
    ident = identity_from_headers({"x-smg-routing-key": "k", "x-instance-id": "7", "x-turn-id": "3"})
    assert (ident.session_id, ident.instance_id, ident.turn_id) == ("k", "7", "3")
    assert instance_group("7") == 7 and instance_group("-3") == -3
    assert instance_group("prompt-a") == instance_group("prompt-a") != instance_group("b")
    assert instance_group("prompt-a") < -1
    # ids that are numbers too large for 63 bits (or 5,000 digits) get a derived index, not a crash
    assert -2**57 < instance_group("9" * 30) < -1 and instance_group("9" * 5000) < -1
    assert instance_group("9" * 18) == 10**18 - 1


def test_header_ids_are_bounded_and_printable():
    from dressage.errors import SessionIdError

    for headers in ({"x-instance-id": "9" * 5000}, {"x-session-id": "s", "x-turn-id": "t" * 257},
                    {"x-session-id": "a\x00b"}):
        with pytest.raises(SessionIdError):
            identity_from_headers(headers)
    assert identity_from_headers({"x-instance-id": "i" * 256}).instance_id == "i" * 256


def test_a_refused_id_names_the_header_or_field_it_came_from():
    from dressage.errors import SessionIdError
    from dressage.proxy.recording.turn_scope import identity_of, scope_of

    cases = [({"x-session-id": "s", "x-turn-id": "t" * 257}, None, "X-Turn-Id"),
             ({"x-session-id": "s", "x-instance-id": "i" * 257}, None, "X-Instance-Id"),
             ({"x-session-id": "a\x00b"}, None, "X-Session-Id"),
             ({"x-smg-routing-key": "k" * 300}, None, "X-SMG-Routing-Key"),
             ({"x-session-id": "s"}, type("B", (), {"turn_id": "t" * 257}), "turn_id"),
             ({}, type("B", (), {"session_id": "a/b"}), "session_id")]
    for headers, body, param in cases:
        with pytest.raises(SessionIdError) as caught:
            identity_of(headers, body)
        assert caught.value.param == param and caught.value.code == "invalid_session_id"
    with pytest.raises(SessionIdError) as caught:
        scope_of({"x-session-id": "s", "idempotency-key": "k" * 257})
    assert caught.value.param == "Idempotency-Key"


def test_a_session_id_must_be_one_path_segment():
    """A session is named in /sessions/{id}/...: an id the path cannot carry is refused at the header."""
    from dressage.errors import SessionIdError
    from dressage.proxy.recording.turns import path_safe

    for sid in ("a/b", "/", "a/", ".", ".."):
        assert not path_safe(sid)
        with pytest.raises(SessionIdError, match="URL path") as caught:
            identity_from_headers({"x-session-id": sid})
        assert caught.value.param == "X-Session-Id"
    # what clients send stays valid, and so does what round-trips once percent-encoded
    for sid in ("6f1c1b9e-2d4a-4a7e-9a55-0c7f3c1e2b10", "proj:task-1", "run.3_a~b", "a?b", "a#b", "50%", "a b", "...",
                "é"):
        assert path_safe(sid) and identity_from_headers({"x-session-id": sid}).session_id == sid


def test_turn_cache_keeps_at_most_its_capacity_of_settled_turns():
    async def scenario():
        turns = TurnCache(capacity=3)
        loop = asyncio.get_running_loop()
        pending = turns.begin("s", "inflight")            # never settled: must survive eviction
        for i in range(10):
            fut = turns.begin("s", f"t{i}")
            done = loop.create_future()
            done.set_result({"turn": i})
            turns.settle("s", f"t{i}", done)
            await asyncio.sleep(0)
        assert len(turns) == 3
        assert turns.get("s", "inflight") is pending
        assert turns.get("s", "t9").result() == {"turn": 9} and turns.get("s", "t0") is None

    asyncio.run(scenario())


@pytest.mark.parametrize("section, kw, key", [
    (LimitsConfig, {"context_length": 0}, "limits.context_length"),
    (LimitsConfig, {"max_output_tokens": -1}, "limits.max_output_tokens"),
    (LimitsConfig, {"max_steps_per_session": 1.5}, "limits.max_steps_per_session"),
    (EnginesConfig, {"engine_urls": ("http://a", "ftp://b")}, "engines.engine_urls[1]"),
    (EnginesConfig, {"engine_urls": ("http://a", "http://a/")}, "listed twice"),
    (EnginesConfig, {"health_check_interval_s": -1}, "engines.health_check_interval_s"),
    (EnginesConfig, {"health_check_failures": 0}, "engines.health_check_failures"),
    (SessionsConfig, {"partial_rollout": "yes"}, "sessions.partial_rollout"),
])
def test_proxy_sections_reject_bad_values_by_dotted_key(section, kw, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        section(**kw)


def test_engines_config_urls():
    assert EnginesConfig(engine_url="http://x:1").urls == ("http://x:1",)
    cfg = EnginesConfig(engine_urls=["http://a:1", "http://b:2"])
    assert cfg.urls == ("http://a:1", "http://b:2") and cfg.engine_url == "http://a:1"


def test_proxy_serve_flags_build_the_sections():
    from dressage.cli import build_parser
    from dressage.cli.proxy import proxy_config

    args = build_parser().parse_args([
        "proxy", "serve", "--engine-url", "http://127.0.0.1:1", "--engine-url", "http://127.0.0.1:2",
        "--context-window", "4096", "--max-output-tokens", "512", "--max-steps-per-session", "30",
        "--partial-rollout", "--health-check-interval", "0.5"])
    cfg = proxy_config(args)
    assert cfg.engines.urls == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert (cfg.limits.context_length, cfg.limits.max_output_tokens, cfg.limits.max_steps_per_session) == \
        (4096, 512, 30)
    assert cfg.sessions.partial_rollout is True and cfg.engines.health_check_interval_s == 0.5
    with pytest.raises(SystemExit):  # a token count must be positive: the flag's own parse refuses it
        build_parser().parse_args(["proxy", "serve", "--engine-url", "http://x:1", "--context-window", "0"])
    with pytest.raises(ConfigError, match="limits.context_length"):
        LimitsConfig(context_length=0)


def test_a_move_stays_reported_until_a_step_is_recorded_on_the_new_engine():
    pool = _pool(2)
    url = pool.place("s").member.url
    pool.members[url].client.up = False
    asyncio.run(pool.check())
    assert pool.place("s").moved_from == url
    assert pool.place("s").moved_from == url      # the first call after the move failed: retry sees it
    pool.settle("s")
    assert pool.place("s").moved_from is None


def test_call_limits_clamp_to_the_context_budget_and_the_step_limit():
    from types import SimpleNamespace

    from dressage.errors import ContextOverflowError, StepLimitError
    from dressage.proxy.recording.limits import CallLimits

    limits = CallLimits(LimitsConfig(context_length=100, max_output_tokens=30, max_steps_per_session=2,
                                     default_max_new_tokens=50))
    assert limits.max_new_tokens(None, 10) == 30          # default 50, capped by --max-output-tokens
    assert limits.max_new_tokens(8, 10) == 8              # the request's own max_tokens
    assert limits.max_new_tokens(None, 95) == 4           # what the window leaves: 100 - 95 - 1
    assert limits.max_new_tokens(None, 98) == 1
    with pytest.raises(ContextOverflowError) as err:
        limits.max_new_tokens(1, 99)                      # prompt + one token would reach the window
    assert err.value.code == "context_overflow" and "99 tokens" in str(err.value) and "100 tokens" in str(err.value)
    assert limits.sampling(None, 10) == {"max_new_tokens": 30}
    session = SimpleNamespace(session_id="s", steps={0: None})
    limits.check_call(session)
    session.steps[1] = None
    with pytest.raises(StepLimitError):
        limits.check_call(session)


def test_call_limits_without_max_tokens_run_to_the_window_or_the_engine_default():
    from dressage.proxy.recording.limits import CallLimits

    windowed = CallLimits(LimitsConfig(context_length=100))
    assert windowed.max_new_tokens(None, 10) == 89        # no default: all the window leaves
    assert windowed.max_new_tokens(500, 10) == 89         # an explicit max_tokens is clamped too
    assert CallLimits(LimitsConfig(context_length=100, default_max_new_tokens=20)).max_new_tokens(None, 10) == 20
    open_ended = CallLimits(LimitsConfig())
    assert open_ended.max_new_tokens(None, 10) is None    # no window known: the engine's own default
    assert open_ended.sampling(None, 10) == {}
    assert open_ended.sampling(7, 10) == {"max_new_tokens": 7}
    assert CallLimits(LimitsConfig(default_max_new_tokens=64)).sampling(None, 10) == {"max_new_tokens": 64}


def test_weight_versions_hold_a_session_to_one_version_unless_partial_rollout():
    from dressage.errors import WeightVersionChangedError
    from dressage.proxy.recording.weights import WeightVersions

    versions = WeightVersions()
    versions.check("s", [0])                             # no step yet: any version
    versions.recorded("s", 0)
    versions.check("s", [0])
    step = versions.stamp("rl-step-3", 0)                 # the engine moved on: its name is shown
    with pytest.raises(WeightVersionChangedError, match="weight version 0 .* version rl-step-3"):
        versions.check("s", [0, step])
    versions.check("t", [step])                           # another session is not held to it
    versions.forget("s")
    versions.check("s", [step])
    relaxed = WeightVersions(partial_rollout=True)
    relaxed.recorded("s", 0)
    relaxed.check("s", [0, 1, 2])                         # partial rollout: versions may change


def test_a_calls_generated_versions_are_checked_once_for_all_its_samples():
    from dressage.errors import WeightVersionChangedError
    from dressage.proxy.recording.weights import WeightVersions

    versions = WeightVersions()
    # A session's first call: its first sample pins the version, so a sibling of another version
    # fails the call before either is recorded.
    with pytest.raises(WeightVersionChangedError):
        versions.check_generated("s", [np.array([0, 0], np.int32), np.array([1, 1], np.int32)])
    versions.check_generated("s", [np.array([0, 0], np.int32), np.array([0], np.int32)])
    versions.recorded("s", 0)
    versions.check_current("s")                           # the policy has not moved: a new call may start
    versions.set(2)
    with pytest.raises(WeightVersionChangedError):
        versions.check_current("s")                       # before the engine request
    with pytest.raises(WeightVersionChangedError):
        versions.check_generated("s", [np.array([0, 2], np.int32)])  # tokens cut across an update
    WeightVersions(partial_rollout=True).check_generated("s", [np.array([0], np.int32), np.array([3], np.int32)])
