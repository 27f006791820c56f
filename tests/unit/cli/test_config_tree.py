"""One config tree per command: dotted flags and today's flat flags build the same config, a YAML file
configures a whole tree (flags override it), ``--help`` lists the sections, and a bad value names its
dotted field."""

from __future__ import annotations

import argparse

import pytest
import yaml

from dressage.cli import build_parser, main
from dressage.errors import ConfigError
from dressage.flags import ConfigTree, config_to_dict


@pytest.fixture(autouse=True)
def _no_token_env(monkeypatch):
    monkeypatch.delenv("DRESSAGE_PROXY_TOKEN", raising=False)
    monkeypatch.delenv("DRESSAGE_ADMIN_TOKEN", raising=False)


def _proxy(argv):
    from dressage.cli.proxy import proxy_config

    return proxy_config(build_parser().parse_args(["proxy", "serve", *argv]))


def _run(argv):
    from dressage.cli.run import run_config

    return run_config(build_parser().parse_args(["run", *argv]))


def _engine(argv):
    from dressage.cli.engine import config_from_args

    return config_from_args(build_parser().parse_args(["engine", "serve", *argv]))


def _capacity(argv):
    from dressage.cli.capacity import config_from_args

    return config_from_args(build_parser().parse_args(["capacity", *argv]))


def _trainer(argv):
    from dressage.cli.trainer import trainer_config

    return trainer_config(build_parser().parse_args(["trainer", *argv]))


def _process(root):
    def build(argv):
        parser = argparse.ArgumentParser()
        tree = ConfigTree(root)
        tree.add_to(parser)
        return tree.build(parser.parse_args(argv))
    return build


def _unit(argv):
    from dressage.tq.storage.config import UnitProcessConfig

    return _process(UnitProcessConfig)(["--unit-id", "u0", "--memory-budget", "1024", *argv])


def _controller(argv):
    from dressage.tq.directory.config import ControllerProcessConfig

    return _process(ControllerProcessConfig)(["--units", "-", *argv])


# command: (build, flat flags, the same by dotted names, the flags every config of the command needs)
CASES = {
    "proxy serve": (_proxy,
                    ["--engine-url", "http://e:1", "--port", "9001", "--context-window", "4096", "--partial-rollout",
                     "--journal-fsync", "never", "--enable-transfer-queue", "--transfer-queue-spec", "tq.json",
                     "--transfer-queue-spec-out", "out.json",
                     "--model", "tiny-moe", "--request-timeout", "7", "--api-token", "agent-token"],
                    ["--engines.engine_urls", "http://e:1", "--server.port", "9001", "--limits.context_length", "4096",
                     "--sessions.partial_rollout", "true", "--journal.fsync", "never",
                     "--data_plane.enable_transfer_queue", "true", "--transfer_queue.spec", "tq.json",
                     "--transfer_queue.spec_out", "out.json",
                     "--data_plane.model", "tiny-moe", "--engines.request_timeout_s", "7",
                     "--access.api_token", "agent-token"],
                    ["--engine-url", "http://e:1"]),
    "run": (_run,
            ["--num-rollouts", "3", "--context-length", "8K", "--engine-url", "http://e:1", "--ray-address", "auto",
             "--no-progress", "--json", "r.json", "--enable-transfer-queue", "--transfer-queue-config", "tq.yaml"],
            ["--rollout.num_rollouts", "3", "--agents.context_length", "8K", "--inference.engine_url", "http://e:1",
             "--cluster.ray_address", "auto", "--report.progress", "false", "--report.json", "r.json",
             "--data_plane.enable_transfer_queue", "true", "--transfer_queue.config", "tq.yaml"],
            []),
    "engine serve": (_engine,
                     ["--model", "tiny-moe", "--num-layers", "3", "--topk", "1", "--vocab-size", "600"],
                     ["--model.preset", "tiny-moe", "--model.num_layers", "3", "--model.topk", "1",
                      "--model.vocab_size", "600"],
                     []),
    "capacity": (_capacity,
                 ["--model", "glm-5.2-744b-a40b", "--context-length", "64K", "--rollout-batch-size", "8",
                  "--plot", "p.png", "--json"],
                 ["--model.preset", "glm-5.2-744b-a40b", "--context-length", "64K", "--rollout-batch-size", "8",
                  "--output.plot", "p.png", "--output.json", "true"],
                 ["--model", "tiny-moe", "--context-length", "1K", "--rollout-batch-size", "1"]),
    "trainer": (_trainer,
                ["--proxy-url", "http://p:1", "--admin-token-file", "token.txt"],
                ["--proxy.url", "http://p:1", "--proxy.admin_token_file", "token.txt"],
                ["--proxy-url", "http://p:2"]),
    "storage unit": (_unit,
                     ["--host", "127.0.0.2", "--port", "7", "--no-shared-memory", "--max-message-bytes", "99"],
                     ["--server.host", "127.0.0.2", "--server.port", "7", "--server.shared_memory", "false",
                      "--server.max_message_bytes", "99"],
                     []),
    "controller": (_controller,
                   ["--timeout-s", "2", "--heartbeat-s", "0.5", "--dead-after-s", "3"],
                   ["--liveness.timeout_s", "2", "--liveness.heartbeat_s", "0.5", "--liveness.dead_after_s", "3"],
                   []),
}


@pytest.mark.parametrize("command", sorted(CASES))
def test_flat_alias_and_dotted_name_build_the_same_config(command):
    build, flat, dotted, base = CASES[command]
    from_flat, from_dotted, default = build(flat), build(dotted), build(base)
    assert from_flat == from_dotted
    assert from_flat != default  # the flags did set something


def test_generated_flags_mean_what_they_say():
    cfg = _proxy(CASES["proxy serve"][1])
    assert (cfg.server.port, cfg.limits.context_length, cfg.sessions.partial_rollout) == (9001, 4096, True)
    assert cfg.engines.urls == ("http://e:1",) and cfg.transfer_queue.spec == "tq.json"
    assert cfg.transfer_queue.spec_out == "out.json"
    assert _proxy(["--engine-url", "http://e:1"]).server.port == 8000  # the command's default, not the library's
    run = _run(CASES["run"][1])
    assert (run.rollout.num_rollouts, run.agents.context_length, run.cluster.ray) == (3, 8192, True)
    engine = _engine(CASES["engine serve"][1])
    assert (engine.model.name, engine.model.num_layers, engine.model.topk, engine.model.vocab_size) == \
        ("tiny-moe", 3, 1, 600)
    assert _engine(["--backend", "transformers"]).model.name == "tiny-qwen3-moe"
    assert _unit(["--no-checksums"]).checksums is False and _unit([]).checksums is True


def test_yaml_configures_proxy_serve_whole_and_round_trips(tmp_path):
    cfg = _proxy(["--engine-url", "http://e:1", "--engine-url", "http://e:2", "--port", "9001",
                  "--served-model-name", "policy", "--max-sessions", "9", "--session-timeout", "60",
                  "--context-window", "4096", "--max-output-tokens", "512", "--journal", str(tmp_path / "j"),
                  "--enable-transfer-queue", "--use-rollout-routing-replay", "--transfer-params", "routed_experts",
                  "--routed-experts-dtype", "uint8", "--model", "glm-5.2-744b-a40b", "--tokenizer", "qwen3",
                  "--num-layers", "78", "--health-check-failures", "2", "--admin-token", "admin-token"])
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg)))
    assert _proxy(["--config", str(path)]) == cfg
    # a flag given on the command line wins over the file
    over = _proxy(["--config", str(path), "--port", "9002", "--limits.max_output_tokens", "64"])
    assert (over.server.port, over.limits.max_output_tokens) == (9002, 64)
    assert over.sessions == cfg.sessions and over.data_plane == cfg.data_plane


def test_a_partial_yaml_keeps_every_other_default(tmp_path):
    path = tmp_path / "proxy.yaml"
    path.write_text("engines:\n  engine_urls: [http://e:1]\nsessions:\n  max_sessions: 3\n")
    cfg = _proxy(["--config", str(path)])
    assert cfg.sessions.max_sessions == 3 and cfg.engines.urls == ("http://e:1",)
    assert cfg.server == _proxy(["--engine-url", "http://e:1"]).server


def test_help_lists_the_sections():
    sub = {name: p for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
           for name, p in a.choices.items()}
    serve = next(p for a in sub["proxy"]._actions if isinstance(a, argparse._SubParsersAction)
                 for name, p in a.choices.items() if name == "serve")
    text = serve.format_help()
    for section in ("server:", "access:", "engines:", "limits:", "sessions:", "journal:", "transfer_queue:",
                    "data_plane:", "--config FILE"):
        assert f"\n{section}" in text or section == "--config FILE" and section in text, section
    assert "--server.port N, --port N" in text
    run = sub["run"].format_help()
    for section in ("rollout:", "agents:", "inference:", "cluster:", "data_plane:", "transfer_queue:", "report:"):
        assert f"\n{section}" in run, section
    assert "\nmodel:" in sub["capacity"].format_help() and "\nproxy:" in sub["trainer"].format_help()


@pytest.mark.parametrize("argv, dotted", [
    (["proxy", "serve", "--engine-url", "http://e:1", "--server.port", "70000"], "server.port"),
    (["proxy", "serve", "--engine-url", "http://e:1", "--max-sessions", "0"], "sessions.max_sessions"),
    (["proxy", "serve", "--engine-url", "ftp://e:1"], "engines.engine_urls[0]"),
    (["run", "--max-turns", "0"], "agents.max_turns"),
    (["run", "--dp-size", "0"], "rollout.dp_size"),
    (["engine", "serve", "--model.topk", "0"], "model.topk"),
    (["trainer", "--proxy-url", "localhost:1"], "proxy.url"),
    (["trainer", "--proxy-url", "http://127.0.0.1:9", "--timeout", "-1"], "timeout_s"),
    (["trainer", "--proxy-url", "http://127.0.0.1:9", "--timeout", "1e12"], "timeout_s"),
    (["trainer", "--proxy-url", "http://127.0.0.1:9", "--timeout", "nan"], "timeout_s"),
    (["trainer", "--proxy-url", "http://127.0.0.1:9", "--expect-sessions", "0"], "expect_sessions"),
    (["capacity", "--model", "tiny-moe", "--context-length", "64K", "--rollout-batch-size", "8",
      "--mean-segments", "1e308"], "--mean-segments"),
    (["capacity", "--model", "tiny-moe", "--context-length", "1e100", "--rollout-batch-size", "8"],
     "--context-length"),
    (["capacity", "--model", "tiny-moe", "--context-length", "64K", "--rollout-batch-size", "8",
      "--segments-distribution", "1:1,1:1"], "--segments-distribution"),
])
def test_a_bad_value_names_its_dotted_field(capsys, argv, dotted):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert dotted in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("flag, path, needle", [
    ("--admin-token-file", "/nonexistent/token", "proxy.admin_token_file (--admin-token-file): cannot read"),
    ("--json", "/proc/dressage-nope/report.json", "json (--json): cannot write"),
    ("--json", "DIR", "is a directory"),
])
def test_trainer_files_it_cannot_use_are_one_line_errors_before_it_drains(tmp_path, capsys, flag, path, needle):
    path = str(tmp_path) if path == "DIR" else path
    # The Proxy is never asked: nothing listens on port 9, and the file is refused first.
    assert main(["trainer", "--proxy-url", "http://127.0.0.1:9", flag, path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dressage trainer: error: ") and needle in err and err.count("\n") == 1


def test_a_yaml_key_the_tree_does_not_have_names_its_dotted_path(tmp_path, capsys):
    path = tmp_path / "proxy.yaml"
    path.write_text("engines:\n  engine_urls: [http://e:1]\nserver:\n  prot: 1\n")
    assert main(["proxy", "serve", "--config", str(path)]) == 2
    assert "server.prot: unknown setting" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not a map of settings"):
        path.write_text("- 1\n")
        _proxy(["--config", str(path)])


def test_required_settings_name_their_flag():
    with pytest.raises(ConfigError, match=r"proxy\.url: required \(--proxy-url\)"):
        _trainer([])
    with pytest.raises(ConfigError, match=r"context_length: required \(--context-length\)"):
        _capacity(["--model", "tiny-moe", "--rollout-batch-size", "1"])


def test_the_shipped_proxy_example_configures_proxy_serve():
    from pathlib import Path

    from dressage.tq.config import TransferQueueConfig

    example = Path(__file__).resolve().parents[3] / "examples" / "proxy.yaml"
    cfg = _proxy(["--config", str(example)])
    assert cfg.server.port == 8000 and cfg.engines.urls == ("http://127.0.0.1:30000",)
    assert cfg.data_plane.offloaded == ("logprobs", "routed_experts") and cfg.data_plane.routed_experts_dtype == "uint8"
    assert cfg.transfer_queue.settings() == TransferQueueConfig(unit_memory_budget="4GiB")
    assert _proxy(["--config", str(example), "--engine-url", "http://e:9"]).engines.urls == ("http://e:9",)


@pytest.mark.parametrize("command", ["run", "engine serve", "trainer", "storage unit", "controller"])
def test_yaml_round_trips_every_tree(tmp_path, command):
    build, flat, _, _ = CASES[command]
    cfg = build(flat)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg)))
    assert build(["--config", str(path)]) == cfg


def test_every_section_is_slotted_and_kw_only_and_every_setting_has_a_docstring():
    import dataclasses

    from dressage.capacity.config import CapacityConfig
    from dressage.cli.journal import JournalCheckConfig, JournalRepairConfig
    from dressage.engine.config import EngineConfig
    from dressage.flags import field_docs
    from dressage.proxy.config import ProxyConfig
    from dressage.harness.run.config import RunConfig
    from dressage.tq.directory.config import ControllerProcessConfig
    from dressage.tq.storage.config import UnitProcessConfig
    from dressage.train.config import TrainerConfig

    problems = []
    for root in (ProxyConfig, RunConfig, EngineConfig, CapacityConfig, TrainerConfig, JournalCheckConfig,
                 JournalRepairConfig, UnitProcessConfig, ControllerProcessConfig):
        for path, cls in ConfigTree(root).sections:
            docs = field_docs(cls)
            problems += [f"{root.__name__}: {path or '<root>'}.{f.name}: no docstring"
                         for f in dataclasses.fields(cls) if f.name not in docs]
            if not hasattr(cls, "__slots__") or not all(f.kw_only for f in dataclasses.fields(cls)):
                problems.append(f"{cls.__name__}: not slotted and kw-only")
    assert not problems, problems


@pytest.mark.parametrize("argv", [
    ["run", "--transfer-queue-config", "tq.yaml"],
    ["run", "--transfer-queue-retention-seconds", "60"],
    ["proxy", "serve", "--engine-url", "http://e:1", "--transfer-queue-config", "tq.yaml"],
    ["proxy", "serve", "--engine-url", "http://e:1", "--transfer_queue.retention_s", "60"],
])
def test_a_transfer_queue_setting_without_the_transfer_queue_is_an_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "set, but data_plane.enable_transfer_queue (--enable-transfer-queue) is off" in err
    assert "transfer_queue.config (--transfer-queue-config)" in err or "transfer_queue.retention_s" in err


@pytest.mark.parametrize("argv", [
    ["capacity", "--context-length", "64K", "--rollout-batch-size", "8"],
    ["proxy", "serve", "--engine-url", "http://e:1", "--skip-engine-check"],
    ["engine", "serve"],
])
def test_a_model_name_with_no_preset_points_to_the_shape_flags(capsys, argv):
    assert main([*argv, "--model", "Qwen/Qwen3-30B-A3B"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'Qwen/Qwen3-30B-A3B'" in err and "known presets: qwen3.6-35b-a3b" in err
    assert "leave out --model and give its shape: --num-layers N --topk K --num-experts E" in err


def _run_yaml(tmp_path, text, *argv):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return _run(["--config", str(path), *argv])


@pytest.mark.parametrize("text, expected", [
    ("true", True), ("false", False), ('"false"', False), ('"no"', False), ('"off"', False), ("'0'", False),
    ('"yes"', True), ("1", True), ("0", False),
])
def test_a_yaml_boolean_is_read_as_its_flag_reads_it(tmp_path, text, expected):
    cfg = _run_yaml(tmp_path, f"compare_without_tq: {text}\ndata_plane:\n  use_rollout_routing_replay: {text}\n"
                              f"  enable_transfer_queue: {text}\n")
    assert cfg.data_plane.use_rollout_routing_replay is expected
    assert cfg.data_plane.enable_transfer_queue is expected and cfg.compare_without_tq is expected


@pytest.mark.parametrize("text, needle", [
    ('data_plane: {use_rollout_routing_replay: "yes please"}',
     "data_plane.use_rollout_routing_replay (--use-rollout-routing-replay): expected true or false, got 'yes please'"),
    ('data_plane: {enable_transfer_queue: [true]}',
     "data_plane.enable_transfer_queue (--enable-transfer-queue): expected true or false, got a list"),
    ("compare_without_tq: 2.0", "compare_without_tq (--compare-without-tq): expected true or false, got a number"),
    ("rollout: 5", "rollout: expected a map of settings, got a number (5)"),
    ("data_plane: []", "data_plane: expected a map of settings, got a list"),
    ("data_plane: {model: 5}", "data_plane.model (--model): expected a name or a map, got a number (5)"),
    ("data_plane: {model: {num_layers: 4, topk: 2, num_experts: 16}}",
     "data_plane.model.name: required (given as a map, data_plane.model needs name, num_layers, topk, num_experts)"),
    ("data_plane: {model: {name: m, num_layers: 4, topk: 2, num_experts: 16, layers: 3}}",
     "data_plane.model.layers: unknown setting"),
    ("data_plane: {model: {name: m, num_layers: '4', topk: 2.5, num_experts: 16}}",
     "data_plane.model.topk: invalid int value: '2.5'"),
    ("cluster: {ray_address: 5}", "cluster.ray_address (--ray-address): expected text, got a number (5)"),
    ("report: {json: 5}", "report.json (--json): expected text, got a number (5)"),
    ("report: {html: [a.html]}", "report.html (--html): expected text, got a list"),
    ("rollout: {num_rollouts: 2.5}", "rollout.num_rollouts (--num-rollouts): invalid int value: '2.5'"),
    ("rollout: {num_rollouts: null}", "rollout.num_rollouts (--num-rollouts): expected a value, got null"),
    ("rollout: {num_rollouts: true}", "rollout.num_rollouts (--num-rollouts): expected a number, got a boolean"),
    ("agents: {context_length: 2.5X}", "agents.context_length (--context-length): unknown suffix 'x' in '2.5X'"),
    ("inference: {backend: vllm}", "inference.backend (--engine): invalid choice: 'vllm' (choose from builtin"),
    ("data_plane: {enable_transfer_queue: true, transfer_params: [logprobs, nope]}",
     "data_plane.transfer_params[1] (--transfer-params): invalid choice: 'nope'"),
])
def test_a_bad_yaml_value_is_one_line_naming_its_key_and_flag(tmp_path, capsys, text, needle):
    path = tmp_path / "run.yaml"
    path.write_text(text + "\n")
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dressage run: error: ") and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_yaml_values_take_the_flag_formats(tmp_path):
    cfg = _run_yaml(tmp_path, "agents: {context_length: 2.5K, retry_rate: '0.25'}\nrollout: {num_rollouts: '3'}\n"
                              "data_plane: {enable_transfer_queue: true, transfer_params: logprobs}\n"
                              "transfer_queue: {retention_s: 1e3}\n")
    assert cfg.agents.context_length == 2560 and cfg.agents.retry_rate == 0.25 and cfg.rollout.num_rollouts == 3
    # one value where the flag takes several: what ``--transfer-params logprobs`` gives
    assert cfg.data_plane.transfer_params == ("logprobs",)
    assert cfg.transfer_queue.retention_s == 1000.0  # YAML reads 1e3 as text; the flag's float() reads it
    assert cfg == _run(["--context-length", "2.5K", "--retry-rate", "0.25", "--num-rollouts", "3",
                        "--enable-transfer-queue", "--transfer-params", "logprobs",
                        "--transfer-queue-retention-seconds", "1e3"])


def test_a_null_section_keeps_its_defaults_and_a_null_optional_setting_is_unset(tmp_path):
    cfg = _run_yaml(tmp_path, "data_plane:\nreport: {json: null}\ncluster: null\n")
    assert cfg == _run([])


def test_a_shape_map_in_yaml_is_the_model(tmp_path):
    cfg = _run_yaml(tmp_path, "data_plane: {model: {name: mine, num_layers: 4, topk: 2, num_experts: 16}}\n")
    assert (cfg.data_plane.model.name, cfg.data_plane.model.num_layers, cfg.data_plane.model.topk,
            cfg.data_plane.model.num_experts) == ("mine", 4, 2, 16)


def test_yaml_with_flags_reads_every_tree_as_its_flags(tmp_path):
    # The proxy's repeated flag and a capacity count read from YAML as from the command line.
    path = tmp_path / "proxy.yaml"
    path.write_text("engines: {engine_urls: http://e:1}\nserver: {port: '9001'}\n")
    assert _proxy(["--config", str(path)]) == _proxy(["--engine-url", "http://e:1", "--port", "9001"])
    path.write_text("context_length: 64K\n")
    assert _capacity(["--config", str(path), "--model", "tiny-moe", "--rollout-batch-size", "8"]) == \
        _capacity(["--context-length", "64K", "--model", "tiny-moe", "--rollout-batch-size", "8"])


def test_the_proxys_token_counts_read_k_and_m_as_model_cards_write_them(tmp_path):
    cfg = _proxy(["--engine-url", "http://e:1", "--context-window", "256K", "--default-max-tokens", "1K",
                  "--max-output-tokens", "0.5K"])
    assert (cfg.limits.context_length, cfg.limits.default_max_new_tokens, cfg.limits.max_output_tokens) == \
        (262144, 1024, 512)
    path = tmp_path / "proxy.yaml"
    path.write_text("engines: {engine_urls: [http://e:1]}\nlimits: {context_length: 4K, default_max_new_tokens: 2048}\n")
    cfg = _proxy(["--config", str(path)])
    assert (cfg.limits.context_length, cfg.limits.default_max_new_tokens) == (4096, 2048)
    with pytest.raises(SystemExit):
        _proxy(["--engine-url", "http://e:1", "--context-window", "4Q"])
