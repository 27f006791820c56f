"""Upstream Dressage's Proxy command line and ``DRESSAGE_*`` environment start this Proxy: every flag of
upstream's parser is accepted with upstream's meaning, mapped onto the settings that carry it."""

from __future__ import annotations

import pytest

from dressage.cli import build_parser
from dressage.cli.proxy import proxy_config
from dressage.errors import ConfigError
from dressage.proxy.config import upstream_environment
from dressage.proxy.recording.limits import CallLimits
from dressage.proxy.server import upstream_config

# The proxy arguments of upstream's blackbox partial-rollout launch script, with its defaults filled in.
SCRIPT_ARGS = [
    "--tokenizer-path", "qwen3", "--host", "0.0.0.0", "--port", "8800", "--token-build-mode", "tito",
    "--token-build-model", "qwen3_5", "--tito-model", "qwen3_5", "--model-mask-type", "qwen3_5",
    "--model-tool-call-type", "qwen3_5", "--tool-call-parse-backend", "local",
    "--model-reasoning-type", "qwen3", "--reasoning-parse-backend", "local",
    "--rollout-temperature", "1.0", "--context-window", "32768", "--record-token-versions",
    "--mask-nonlast-version-tokens", "--dressage-partial-rollout", "--sglang-router-url", "http://router:30000",
    "--default-max-tokens", "8192",
]
# The rest of upstream's 33 flags.
OTHER_ARGS = [
    "--max-output-tokens", "4096", "--no-dynamic-max-tokens", "--use-rollout-routing-replay",
    "--routed-experts-dtype", "uint8", "--api-key", "no-auth", "--min-group-size", "4", "--session-timeout", "100",
    "--group-timeout", "60", "--max-partial-rollout-preempts", "2", "--stream-heartbeat-interval-seconds", "5",
    "--enable-transfer-queue", "--transfer-queue-retention-seconds", "600", "--transfer-params", "logprobs",
]


def test_upstreams_launch_script_flags_configure_the_proxy():
    cfg = upstream_config(SCRIPT_ARGS + OTHER_ARGS, environ={})
    assert (cfg.server.host, cfg.server.port, cfg.access.api_token, cfg.access.no_auth) == ("0.0.0.0", 8800, None, True)
    assert (cfg.engines.urls, cfg.engines.router) == (("http://router:30000",), True)
    # Upstream's model names map onto the SGLang parsers of that family; both parse in the Proxy.
    assert (cfg.server.tool_call_parser, cfg.server.reasoning_parser, cfg.server.parse_on_engine) == \
        ("qwen3_coder", "qwen3", False)
    assert (cfg.token_build.mode, cfg.token_build.family, cfg.token_build.model_mask_type) == ("tito", "qwen3_5", "qwen3_5")
    assert (cfg.limits.default_temperature, cfg.limits.context_length, cfg.limits.default_max_new_tokens,
            cfg.limits.max_output_tokens, cfg.limits.dynamic_max_tokens) == (1.0, 32768, 8192, 4096, False)
    assert (cfg.reads.record_token_versions, cfg.reads.mask_nonlast_version_tokens, cfg.reads.min_group_size,
            cfg.reads.group_timeout_s) == (True, True, 4, 60.0)
    assert (cfg.sessions.partial_rollout, cfg.sessions.max_partial_rollout_preempts, cfg.sessions.session_timeout_s) \
        == (True, 2, 100.0)
    assert cfg.server.stream_heartbeat_interval_s == 5.0
    dp = cfg.data_plane
    assert (dp.use_rollout_routing_replay, dp.routed_experts_dtype, dp.enable_transfer_queue, dp.transfer_params) == \
        (True, "uint8", True, ("logprobs",))
    assert cfg.transfer_queue.retention_s == 600.0 and cfg.transfer_queue.settings().retention_s == 600.0


def test_upstreams_defaults_and_router_environment_apply_without_flags():
    cfg = upstream_config(["--tokenizer-path", "byte"], environ={"SGLANG_ROUTER_HOST": "10.0.0.7",
                                                                 "SGLANG_ROUTER_PORT": "31000"})
    assert (cfg.server.port, cfg.server.host, cfg.access.no_auth, cfg.server.stream_heartbeat_interval_s) == \
        (8800, "0.0.0.0", True, 15.0)
    assert cfg.engines.urls == ("http://10.0.0.7:31000",) and cfg.engines.router
    assert upstream_config(["--tokenizer-path", "byte"], environ={"MASTER_ADDR": "h"}).engines.urls == ("http://h:8000",)
    token = upstream_config(["--api-key", "s3cret"], environ={})
    assert (token.access.api_token, token.access.no_auth) == ("s3cret", False)


def test_sglang_api_backend_parses_on_the_engine_and_mixed_backends_are_refused():
    assert upstream_config(["--tool-call-parse-backend", "sglang_api"], environ={}).server.parse_on_engine is True
    with pytest.raises(SystemExit):
        upstream_config(["--tool-call-parse-backend", "sglang_api", "--reasoning-parse-backend", "local"], environ={})


@pytest.mark.parametrize("args", [["--token-build-mode", "snapshot"], ["--token-build-model", "llama"],
                                  ["--max-partial-rollout-preempts", "1"],
                                  ["--stream-heartbeat-interval-seconds", "-1"], ["--rollout-temperature", "3"]])
def test_upstream_values_this_proxy_cannot_honour_are_refused_naming_the_setting(args, capsys):
    with pytest.raises(SystemExit):
        upstream_config(args, environ={})
    key = {"--token-build-mode": "token_build.mode", "--token-build-model": "token_build.model",
           "--max-partial-rollout-preempts": "max_partial_rollout_preempts",
           "--stream-heartbeat-interval-seconds": "stream_heartbeat_interval_s",
           "--rollout-temperature": "default_temperature"}[args[0]]
    assert key in capsys.readouterr().err


def test_dressage_environment_fills_what_flags_leave_unset():
    env = {"DRESSAGE_ENABLE_TRANSFER_QUEUE": "1", "DRESSAGE_TRANSFER_QUEUE_RETENTION_SECONDS": "120",
           "DRESSAGE_TRANSFER_PARAMS": "logprobs,routed_experts", "DRESSAGE_PROXY_MAX_STEPS_PER_SESSION": "7"}
    cfg = upstream_config(["--use-rollout-routing-replay"], environ=env)
    assert cfg.data_plane.enable_transfer_queue and cfg.data_plane.transfer_params == ("logprobs", "routed_experts")
    assert (cfg.transfer_queue.retention_s, cfg.limits.max_steps_per_session) == (120.0, 7)
    # A flag wins over the environment; TransferQueue variables mean nothing with TransferQueue off.
    assert upstream_config(["--transfer-queue-retention-seconds", "9", "--use-rollout-routing-replay"],
                           environ=env).transfer_queue.retention_s == 9.0
    off = upstream_environment({**env, "DRESSAGE_ENABLE_TRANSFER_QUEUE": "false"}, {})
    assert off == {"data_plane.enable_transfer_queue": False, "limits.max_steps_per_session": 7}
    with pytest.raises(ConfigError, match="DRESSAGE_PROXY_MAX_STEPS_PER_SESSION"):
        upstream_environment({"DRESSAGE_PROXY_MAX_STEPS_PER_SESSION": "many"}, {})


def test_dressage_proxy_serve_takes_upstreams_flags_too(monkeypatch):
    monkeypatch.setenv("DRESSAGE_PROXY_MAX_STEPS_PER_SESSION", "3")
    args = build_parser().parse_args(["proxy", "serve", "--engine-url", "http://e:2", "--model-tool-call-type",
                                      "hermes", "--rollout-temperature", "0.6", "--no-dynamic-max-tokens"])
    cfg = proxy_config(args)
    assert (cfg.server.tool_call_parser, cfg.limits.default_temperature, cfg.limits.dynamic_max_tokens,
            cfg.limits.max_steps_per_session, cfg.server.port) == ("hermes", 0.6, False, 3, 8000)
    with pytest.raises(ConfigError, match="reachable from other machines"):
        proxy_config(build_parser().parse_args(["proxy", "serve", "--engine-url", "http://e:2", "--host", "0.0.0.0"]))


def test_window_clamping_and_default_temperature_follow_the_limits():
    from dressage.proxy.config import LimitsConfig

    dynamic = CallLimits(LimitsConfig(context_length=100, default_temperature=0.7))
    assert dynamic.sampling(500, 40) == {"max_new_tokens": 59, "temperature": 0.7}
    assert dynamic.sampling(None, 40) == {"max_new_tokens": 59, "temperature": 0.7}
    fixed = CallLimits(LimitsConfig(context_length=100, dynamic_max_tokens=False))
    assert fixed.sampling(500, 40) == {"max_new_tokens": 500} and fixed.sampling(None, 40) == {}
    with pytest.raises(Exception, match="context"):
        fixed.sampling(5, 100)


def test_tool_call_hook_flags_load_hooks_by_reference_and_name(tmp_path):
    from dressage.proxy.tool_call_hooks import load_tool_call_hooks

    (tmp_path / "my_hooks.py").write_text(
        "from dressage.proxy.tool_call_hooks import ToolCallHook, register_tool_call_hook\n"
        "@register_tool_call_hook\nclass A(ToolCallHook):\n    name = 'a'\n    order = 2\n"
        "class B(ToolCallHook):\n    name = 'b'\n    order = 1\n")
    path = str(tmp_path / "my_hooks.py")
    cfg = upstream_config(["--tool-call-hooks", f"{path}:A", "b", "--tool-call-hook-before-timeout", "2.5"], environ={})
    assert cfg.tool_call_hooks.hooks == (f"{path}:A", "b") and cfg.tool_call_hooks.before_timeout_s == 2.5
    assert [h.name for h in load_tool_call_hooks(cfg.tool_call_hooks.hooks)] == ["a", "b"]
    with pytest.raises(ConfigError, match="no loaded hook is named 'c'"):
        load_tool_call_hooks([f"{path}:A", "c"])
    with pytest.raises(ConfigError, match="defines 2 hooks"):
        load_tool_call_hooks([path])
    with pytest.raises(SystemExit):
        upstream_config(["--tool-call-hook-before-timeout", "0"], environ={})
