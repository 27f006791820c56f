"""Start-up: the Proxy's --model and tokenizer checked against the engine's model info; upstream's flag names."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import httpx
import pytest

from dressage.errors import ConfigError, EngineMismatchError, EngineNotSglangError, EngineUnavailable
from dressage.fields import get_model
from dressage.proxy.config import DataPlaneConfig, EnginesConfig, ProxyConfig
from dressage.proxy.engines.router_client import RouterClient
from dressage.proxy.engines.startup import check_engine, engine_clients, fetch_engine_infos
from sglang_mock import MockSGLang

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "sglang"
GLM = "glm-5.2-744b-a40b"


def model_dir(tmp_path, config_name):
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(FIXTURES / config_name, d / "config.json")
    info = json.loads((FIXTURES / "model_info.json").read_text())
    info.pop("_shape")
    info["model_path"] = info["tokenizer_path"] = str(d)
    return info


def config(model=GLM, *, r3=True, tokenizer="qwen3", **kw):
    return ProxyConfig(data_plane=DataPlaneConfig(model=model, use_rollout_routing_replay=r3), tokenizer=tokenizer,
                       engines=EnginesConfig(engine_url="http://gpu-0:30000"), **kw)


def test_glm_served_by_sglang_decodes_every_hidden_layer(tmp_path):
    info = model_dir(tmp_path, "glm_config.json")
    check = check_engine(config(), [info])
    m = check.model
    assert (m.num_layers, m.topk, m.num_experts, m.dense_layers) == (78, 8, 256, 0)  # 3 dense + 75 MoE rows
    assert m.name == GLM and check.source.num_layers == "config.json" and check.tokenizer == "qwen3"
    assert "78 R3 layers" in check.describe()


def test_a_preset_that_does_not_fit_the_engine_model_names_both(tmp_path):
    info = model_dir(tmp_path, "glm_config.json")
    with pytest.raises(EngineMismatchError) as err:
        check_engine(config("qwen3.6-35b-a3b"), [info])
    text = str(err.value)
    assert "http://gpu-0:30000" in text and info["model_path"] in text and "qwen3.6-35b-a3b" in text
    assert "layers 78 (the model's) vs 40 (the preset's)" in text and "--num-layers" in text
    # Overrides give the shape instead; R3 off needs no shape at all.
    check = check_engine(config("qwen3.6-35b-a3b", num_layers=78, topk=8, num_experts=256), [info])
    assert (check.model.num_layers, check.model.topk, check.model.num_experts) == (78, 8, 256)
    assert check.source.to_dict() == {"num_layers": "override", "topk": "override", "num_experts": "override"}
    assert check_engine(config("qwen3.6-35b-a3b", r3=False), [info]).model is get_model("qwen3.6-35b-a3b")


def test_qwen_moe_config_names_its_experts_num_experts(tmp_path):
    info = model_dir(tmp_path, "qwen_moe_config.json")
    with pytest.raises(EngineMismatchError, match="num_experts 128 .the model's. vs 512"):
        check_engine(config("qwen3-next-80b-a3b"), [info])


def test_the_byte_tokenizer_is_refused_for_a_real_model_or_taken_from_the_engine(tmp_path):
    info = model_dir(tmp_path, "glm_config.json")
    with pytest.raises(EngineMismatchError, match="--tokenizer"):
        check_engine(config(tokenizer="byte"), [info])
    assert check_engine(config(tokenizer="byte", tokenizer_from_engine=True), [info]).tokenizer == info["model_path"]


def test_the_built_in_engine_keeps_the_preset():
    tiny = get_model("tiny-moe")
    info = {"model_path": "tiny-moe", "tokenizer_path": "byte", "num_hidden_layers": 4, "num_experts_per_tok": 2,
            "num_experts": 16}
    check = check_engine(config("tiny-moe", tokenizer="byte"), [info])
    assert check.model is tiny and check.tokenizer == "byte"


def test_model_info_is_fetched_through_a_router_with_the_engine_key():
    mock = MockSGLang(["http://10.0.0.1:30001"], router="http://router.test:30000", api_key="sk-e")
    server = EnginesConfig(router_url="http://router.test:30000", engine_api_key="sk-e")
    (info,) = fetch_engine_infos(server, transport=mock.transport())
    assert info["tokenizer_path"] == "byte" and mock.requests[0]["headers"]["authorization"] == "Bearer sk-e"
    assert isinstance(engine_clients(server)[0], RouterClient)
    with pytest.raises(EngineUnavailable, match="http://router.test:30000 did not answer its model info"):
        fetch_engine_infos(EnginesConfig(router_url="http://router.test:30000"), transport=mock.transport())


def test_proxy_start_checks_the_built_in_engine_and_refuses_a_wrong_model():
    from dressage.engine.config import EngineConfig
    from dressage.engine.server import EngineServer
    from dressage.proxy.deployment import Proxy

    engine = EngineServer(EngineConfig(model=get_model("tiny-moe"), port=0, seed=1))
    url = engine.start_background()
    try:
        good = ProxyConfig(data_plane=DataPlaneConfig(model="tiny-moe", use_rollout_routing_replay=True),
                           engines=EnginesConfig(engine_url=url))
        with Proxy.start(good) as proxy:
            assert proxy.engine_check.model is proxy.config.data_plane.model
            assert proxy.config.tokenizer == "byte"
        wrong = ProxyConfig(data_plane=DataPlaneConfig(model=GLM, use_rollout_routing_replay=True),
                            engines=EnginesConfig(engine_url=url))
        with pytest.raises(EngineMismatchError, match=f"{url}.*{GLM}"):
            Proxy.start(wrong)
    finally:
        engine.stop()
    with pytest.raises(EngineUnavailable, match=f"{url} did not answer"):
        Proxy.start(dataclasses.replace(good, engines=dataclasses.replace(good.engines, engine_wait_s=0)))


def test_start_up_waits_for_an_engine_that_is_still_loading():
    mock = MockSGLang(["http://10.0.0.1:30001"])
    early = [httpx.ConnectError("connection refused"), httpx.Response(503, json={"detail": "loading"})]

    async def handler(request):
        if early:
            nxt = early.pop(0)
            if isinstance(nxt, Exception):
                raise nxt
            return nxt
        return await mock.handle(request)

    server = EnginesConfig(engine_url="http://10.0.0.1:30001")
    (info,) = fetch_engine_infos(server, transport=httpx.MockTransport(handler), wait_s=5, retry_s=0.01)
    assert info["tokenizer_path"] == "byte" and not early
    early.append(httpx.ConnectError("connection refused"))
    with pytest.raises(EngineUnavailable, match="ConnectError"):
        fetch_engine_infos(server, transport=httpx.MockTransport(handler), wait_s=0)


@pytest.mark.parametrize("status", [200, 404])
def test_a_server_that_is_not_sglang_is_named_in_one_line(status):
    page = "<!DOCTYPE html>\n<html>\n<head><title>Welcome</title></head>\n<body><h1>It works</h1></body>\n</html>\n"
    asked = []

    def handler(request):
        asked.append(request.url.path)
        return httpx.Response(status, text=page, headers={"content-type": "text/html"})

    with pytest.raises(EngineNotSglangError) as info:
        fetch_engine_infos(EnginesConfig(engine_url="http://10.0.0.1:8080"), transport=httpx.MockTransport(handler))
    msg = str(info.value)
    assert "\n" not in msg and "<" not in msg and "Start the engine first" not in msg
    assert "http://10.0.0.1:8080 is not an SGLang engine" in msg and f"HTTP {status} (text/html)" in msg
    assert msg.startswith("--engine-url: ") and info.value.code == "engine_not_sglang"
    # a 404 is asked again at the older route before the verdict; a 200 that is not JSON is final
    assert asked == (["/model_info"] if status == 200 else ["/model_info", "/get_model_info"])


def test_upstream_flag_names_are_accepted():
    from dressage.cli import build_parser
    from dressage.cli.proxy import proxy_config

    args = build_parser().parse_args([
        "proxy", "serve", "--sglang-router-url", "http://router:30000", "--tokenizer-path", "qwen3",
        "--api-key", "proxy-secret", "--engine-api-key", "sk-engine", "--num-layers", "78", "--topk", "8",
        "--num-experts", "256", "--finalize-wait", "5", "--tokenizer-from-engine", "--dressage-partial-rollout",
        "--model", GLM, "--use-rollout-routing-replay"])
    cfg = proxy_config(args)
    e = cfg.engines
    assert (e.urls, e.router, cfg.access.api_token, e.engine_api_key, cfg.sessions.finalize_wait_s,
            cfg.sessions.partial_rollout) == (("http://router:30000",), True, "proxy-secret", "sk-engine", 5.0, True)
    assert (cfg.tokenizer, cfg.num_layers, cfg.topk, cfg.num_experts, cfg.tokenizer_from_engine) == (
        "qwen3", 78, 8, 256, True)
    assert cfg.data_plane.model is get_model(GLM) and cfg.data_plane.use_rollout_routing_replay
    assert e.router_mode == "discovery"  # the default behind a router
    mode = build_parser().parse_args(["proxy", "serve", "--sglang-router-url", "http://r:1", "--router-mode",
                                      "data_path"])
    assert proxy_config(mode).engines.router_mode == "data_path"
    with pytest.raises(ConfigError, match="engines.router_mode"):
        EnginesConfig(router_url="http://r:1", router_mode="through")
    both = build_parser().parse_args(["proxy", "serve", "--sglang-router-url", "http://r:1",
                                      "--engine-url", "http://e:2"])
    with pytest.raises(ConfigError, match="router_url"):
        proxy_config(both)
    no_auth = build_parser().parse_args(["proxy", "serve", "--engine-url", "http://e:2", "--api-key", "no-auth"])
    assert proxy_config(no_auth).access.api_token is None
    with pytest.raises(ConfigError, match="--engine-url"):
        proxy_config(build_parser().parse_args(["proxy", "serve"]))
    with pytest.raises(ConfigError, match="num_layers"):
        proxy_config(build_parser().parse_args(["proxy", "serve", "--engine-url", "http://e:2", "--num-layers", "0"]))


def test_the_context_window_is_read_from_what_sglang_and_the_model_tell(tmp_path):
    from dressage.proxy.engines.model_shape import context_window

    assert context_window({"context_length": 4096}) == 4096
    assert context_window({"max_context_length": 8192}) == 8192
    # SGLang: --context-length in the server info, bounded by its KV cache and its longest prompt.
    assert context_window({}, {"context_length": 32768, "max_total_num_tokens": 20000}) == 20000
    assert context_window({}, {"context_length": None, "max_req_input_len": 40959}, {"max_position_embeddings": 40960}) \
        == 40960
    assert context_window({}, {"context_length": None}, {"text_config": {"max_position_embeddings": 2048}}) == 2048
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 1024}')
    assert context_window({"model_path": str(tmp_path)}, {}) == 1024
    assert context_window({"model_path": "/no/such/dir"}, {"context_length": 0}) is None


def test_check_engine_takes_the_smallest_window_of_the_engines():
    infos = [{"model_path": "byte", "tokenizer_path": "byte", "server_info": {"context_length": 4096}},
             {"model_path": "byte", "tokenizer_path": "byte", "server_info": {"context_length": 2048}}]
    check = check_engine(config(tokenizer="byte", r3=False), infos, urls=["http://a:1", "http://b:2"])
    assert check.context_length == 2048 and "context window 2048 tokens" in check.describe()
    no_window = [{"model_path": "byte", "tokenizer_path": "byte", "server_info": {}}]
    assert check_engine(config(tokenizer="byte", r3=False), no_window, urls=["http://a:1"]).context_length is None
