"""slime's ``args`` as the rollout function's settings: the ``dressage_*`` keys, refusals, eval prompts.

slime sets every key of its ``--custom-config-path`` YAML as an attribute of ``args``; this module
reads the ``dressage_*`` ones (validated once, each error naming its key), refuses the slime flags
whose Samples the Proxy cannot honour, and loads the eval datasets' prompts.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shlex
from typing import Any, Mapping, NamedTuple, Sequence

from dressage.errors import ConfigError

__all__ = ["load_object", "sampling_params", "rollout_settings", "trainer_proxy", "trainer_metrics_address",
           "check_against_proxy", "check_trainer_handoff", "eval_prompt_sets", "eval_sampling_params", "EvalSet",
           "RESTORE_MODES",
           "TRAINER_CONVERSION", "TRAIN_ENTRY_MARK"]

RESTORE_MODES = ("rollout", "trainer")
"""``rollout``: the rollout function restores the large fields and releases their TQ keys;
``trainer``: the Samples keep their FieldRefs and each trainer rank restores its own shard."""

TRAINER_CONVERSION = "dressage.integrations.slime_train.convert_samples_to_train_data"
"""slime's ``--custom-convert-samples-to-train-data-path`` for ``dressage_restore: trainer``: the one conversion
that carries the refs past slime's DP split (slime's own drops ``metadata["dressage_refs"]``)."""

TRAIN_ENTRY_MARK = "dressage_train_entry"
"""The attribute :func:`dressage.integrations.slime_train.train` sets on slime's ``args`` before it creates
the RolloutManager (which gets those args, pickled, and hands them to the rollout function): its training
actors restore and release the refs. slime's ``train.py`` does not set it."""


def load_object(path: Any, key: str) -> Any:
    """The object at import path ``pkg.mod:name`` or ``pkg.mod.name`` (``key`` names the setting)."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{key}: expected an import path pkg.mod:name, got {path!r}")
    module, sep, name = path.strip().partition(":")
    if not sep:
        module, _, name = path.strip().rpartition(".")
    if not module or not name:
        raise ConfigError(f"{key}: expected an import path pkg.mod:name or pkg.mod.name, got {path!r}")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{key}: cannot import {module!r} ({exc})") from None
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{key}: {module!r} has no attribute {name!r}") from None
    return obj


def sampling_params(args: Any) -> dict[str, Any]:
    """slime's rollout sampling settings, as an agent may pass them on to its model calls."""
    return {"temperature": getattr(args, "rollout_temperature", 1.0), "top_p": getattr(args, "rollout_top_p", 1.0),
            "top_k": getattr(args, "rollout_top_k", -1),
            "max_new_tokens": getattr(args, "rollout_max_response_len", None),
            "stop": getattr(args, "rollout_stop", None),
            "stop_token_ids": getattr(args, "rollout_stop_token_ids", None)}


# An eval dataset's sampling setting: its own entry's key, then these args in order (slime's
# ``DATASET_RUNTIME_SPECS``: ``--eval-*`` before the rollout's), then the rollout's default.
_EVAL_SAMPLING = {"temperature": ("temperature", ("eval_temperature", "rollout_temperature"), 1.0),
                  "top_p": ("top_p", ("eval_top_p", "rollout_top_p"), 1.0),
                  "top_k": ("top_k", ("eval_top_k", "rollout_top_k"), -1),
                  "max_new_tokens": ("max_response_len", ("eval_max_response_len", "rollout_max_response_len"), None),
                  "stop": ("stop", ("rollout_stop",), None),
                  "stop_token_ids": ("stop_token_ids", ("rollout_stop_token_ids",), None)}


def _first(entry: Any, key: str, args: Any, attrs: Sequence[str], default: Any) -> Any:
    value = _cfg(entry, key)
    for attr in attrs:
        if value is not None:
            break
        value = getattr(args, attr, None)
    return default if value is None else value


def eval_sampling_params(args: Any, entry: Any) -> dict[str, Any]:
    """An eval dataset's sampling settings, resolved as slime resolves them for its own eval rollout."""
    return {name: _first(entry, key, args, attrs, default) for name, (key, attrs, default) in _EVAL_SAMPLING.items()}


class EvalSet(NamedTuple):
    """One of ``args.eval_datasets``: its name, its Samples and the sampling settings its agents get."""

    name: str
    samples: list[Any]
    sampling: dict[str, Any]


def _int(args: Any, key: str, default: int | None, low: int) -> int | None:
    value = getattr(args, key, None)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{key} must be an integer >= {low}, got {value!r}")
    return value


def _token(args: Any, key: str) -> str | None:
    name = getattr(args, key, None)
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key} must name an environment variable, got {name!r}")
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"{key}: the environment variable {name} is not set (or empty)")
    return value


def rollout_settings(args: Any) -> dict[str, Any]:
    """The keyword arguments of ``SlimeRollout`` that ``args``' ``dressage_*`` keys give.

    A ``dressage_*`` key that holds a token itself is refused: tokens come from the environment
    variables that ``dressage_agent_token_env`` / ``dressage_admin_token_env`` name, never from YAML.
    """
    keys = vars(args) if hasattr(args, "__dict__") else {}
    for key in keys:
        if key.startswith("dressage_") and "token" in key and not key.endswith("_token_env"):
            raise ConfigError(f"{key}: a token does not belong in the config file; put it in an environment "
                              f"variable and name that variable in {key}_env")
    url = getattr(args, "dressage_proxy_url", None) or os.environ.get("DRESSAGE_PROXY_URL")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"dressage_proxy_url must be the Proxy's http(s)://host:port (or set DRESSAGE_PROXY_URL), "
                          f"got {url!r}")
    agent_path = getattr(args, "dressage_agent", None)
    command = getattr(args, "dressage_agent_command", None)
    if (agent_path is None) == (command is None):
        raise ConfigError("set exactly one of dressage_agent (an import path of an async agent) and "
                          "dressage_agent_command (a command run per session)")
    timeout_s = getattr(args, "dressage_agent_timeout_s", None)
    timeout_s = 3600.0 if timeout_s is None else timeout_s
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0 \
            or not math.isfinite(timeout_s):
        raise ConfigError(f"dressage_agent_timeout_s must be a number > 0, got {timeout_s!r}")
    reward = getattr(args, "dressage_agent_reward", None)
    if agent_path is not None:
        if reward is not None:
            raise ConfigError("dressage_agent_reward goes with dressage_agent_command; an agent returns its reward")
        agent = load_object(agent_path, "dressage_agent")
        if not callable(agent):
            raise ConfigError(f"dressage_agent: {agent_path!r} is not callable")
    else:
        from dressage.agents import CommandAgent

        if isinstance(command, str):
            command = shlex.split(command)
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise ConfigError(f"dressage_agent_command must be a command line or a list of strings, got {command!r}")
        agent = CommandAgent(command, reward=None if reward is None else load_object(reward, "dressage_agent_reward"),
                             timeout_s=float(timeout_s))
    restore = getattr(args, "dressage_restore", None) or "rollout"
    if restore not in RESTORE_MODES:
        raise ConfigError(f"dressage_restore must be one of {', '.join(RESTORE_MODES)}, got {restore!r}")
    if restore == "trainer":
        check_trainer_handoff(args)
    return {"proxy_url": url, "agent": agent,
            "concurrency": _int(args, "dressage_agent_concurrency", 64, 1),
            "timeout_s": float(timeout_s),
            "session_retries": _int(args, "dressage_session_retries", 1, 0),
            "max_group_replacements": _int(args, "dressage_max_group_replacements", None, 0),
            "token": _token(args, "dressage_agent_token_env"),
            "admin_token": _token(args, "dressage_admin_token_env"),
            "restore": restore}


def check_trainer_handoff(args: Any) -> None:
    """Refuse ``dressage_restore: trainer`` where nobody would restore and release the rollout's TransferQueue
    keys: once the rollout function returns, only slime's Samples know them, so slime must convert with
    :data:`TRAINER_CONVERSION`, split and train (not ``--debug-rollout-only``), under the training entry
    whose actors restore (:data:`TRAIN_ENTRY_MARK`). One :class:`ConfigError` names every fix needed."""
    fixes = []
    conversion = getattr(args, "custom_convert_samples_to_train_data_path", None)
    if conversion != TRAINER_CONVERSION:
        fixes.append(f"--custom-convert-samples-to-train-data-path {TRAINER_CONVERSION} (got {conversion!r}: "
                     "no other conversion carries the refs past slime's DP split)")
    if getattr(args, "debug_rollout_only", False):
        fixes.append("no --debug-rollout-only (slime then converts and trains nothing)")
    if not getattr(args, TRAIN_ENTRY_MARK, False):
        fixes.append("python -m dressage.integrations.slime_train <slime args> in place of slime's train.py "
                     "(its training actors restore and release the refs, slime's do not)")
    if fixes:
        raise ConfigError("dressage_restore: trainer leaves the large fields in TransferQueue and, once the rollout "
                          "function returns, only slime's Samples know their keys, so every key would be left. It "
                          "needs " + "; ".join(fixes) + ". Or use dressage_restore: rollout")


def trainer_proxy(args: Any) -> tuple[str | None, str | None]:
    """``(url, admin_token)`` of the Proxy a training process talks to: ``dressage_proxy_url`` (slime sets the
    YAML's keys on the args every actor gets), else ``DRESSAGE_PROXY_URL`` (``None``: no Proxy); the token
    from the environment variable ``dressage_admin_token_env`` names, else ``DRESSAGE_ADMIN_TOKEN``."""
    url = getattr(args, "dressage_proxy_url", None) or os.environ.get("DRESSAGE_PROXY_URL") or None
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise ConfigError(f"dressage_proxy_url must be the Proxy's http(s)://host:port (or set DRESSAGE_PROXY_URL), "
                          f"got {url!r}")
    token = _token(args, "dressage_admin_token_env") or os.environ.get("DRESSAGE_ADMIN_TOKEN") or None
    return url, token


def trainer_metrics_address(args: Any) -> tuple[str, int] | None:
    """``(host, port)`` a training rank serves its ``/metrics`` on (``None``: it serves none):
    ``dressage_metrics_port`` (the YAML's key, else ``DRESSAGE_METRICS_PORT``) plus the rank's
    ``LOCAL_RANK``, so the ranks of one node do not collide (0: each a free port); ``dressage_metrics_host``
    (default ``0.0.0.0``)."""
    port = getattr(args, "dressage_metrics_port", None)
    if port is None:
        env = os.environ.get("DRESSAGE_METRICS_PORT") or None
        if env is None:
            return None
        try:
            port = int(env)
        except ValueError:
            raise ConfigError(f"DRESSAGE_METRICS_PORT must be a port number, got {env!r}") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"dressage_metrics_port must be a port number 0..65535, got {port!r}")
    host = getattr(args, "dressage_metrics_host", None) or "0.0.0.0"
    if not isinstance(host, str):
        raise ConfigError(f"dressage_metrics_host must be a host name or address, got {host!r}")
    local = os.environ.get("LOCAL_RANK") or "0"
    if port and not local.isdigit():
        raise ConfigError(f"LOCAL_RANK must be a rank number, got {local!r}")
    if port and port + int(local) > 65535:
        raise ConfigError(f"dressage_metrics_port {port} + LOCAL_RANK {local} is past 65535")
    return host, port + int(local) if port else 0


def check_against_proxy(args: Any, caps: Mapping[str, Any]) -> None:
    """Refuse, naming the flag, what the Samples of this Proxy cannot honour."""
    top_p = getattr(args, "rollout_top_p", 1.0)
    if top_p is not None and float(top_p) != 1.0:
        raise ConfigError(f"--rollout-top-p {top_p}: slime then replays top-p token ids the Proxy does not record; "
                          "use --rollout-top-p 1.0")
    if not getattr(args, "use_rollout_routing_replay", False):
        return
    features = caps.get("features") if isinstance(caps.get("features"), Mapping) else {}
    if not features.get("rollout_routing_replay"):
        raise ConfigError("--use-rollout-routing-replay: the Proxy records no routed experts (start it with R3 on)")
    model = caps.get("model") if isinstance(caps.get("model"), Mapping) else {}
    for flag, attr, field in (("--num-layers", "num_layers", "num_layers"), ("--moe-router-topk", "moe_router_topk",
                                                                              "topk")):
        want, have = getattr(args, attr, None), model.get(field)
        if want is not None and have is not None and int(want) != int(have):
            raise ConfigError(f"{flag} {want}: the Proxy records routed experts of shape "
                              f"[T-1, {model.get('num_layers')}, {model.get('topk')}] ({model.get('name')}), so R3 "
                              "rows would not fit the model slime trains")
        if want is not None and have is None:
            raise ConfigError(f"{flag}: the Proxy does not say the {field} of the routed experts it records")


def _cfg(entry: Any, key: str, default: Any = None) -> Any:
    value = entry.get(key) if isinstance(entry, Mapping) else getattr(entry, key, None)
    return default if value is None else value


def eval_prompt_sets(args: Any, sample_cls: type) -> list[EvalSet]:
    """``args.eval_datasets``, one :class:`EvalSet` each: the dataset's JSONL prompts (``input_key``,
    ``label_key``, ``metadata_key``, as slime's dataset reads them, without a tokenizer),
    ``n_samples_per_eval_prompt`` Samples each, indexed 0.. in order, and its sampling settings. Each
    setting is the entry's, else slime's ``--eval-*`` argument, else the rollout's (as slime resolves them)."""
    out = []
    for entry in getattr(args, "eval_datasets", None) or []:
        name, path = _cfg(entry, "name"), _cfg(entry, "path")
        if not isinstance(name, str) or not isinstance(path, str):
            raise ConfigError(f"eval_datasets: each entry needs a name and a path, got {entry!r}")
        if not path.endswith(".jsonl"):
            raise ConfigError(f"eval_datasets {name}: the rollout function reads .jsonl prompts, got {path!r}")
        input_key = _first(entry, "input_key", args, ("eval_input_key", "input_key"), "input")
        label_key = _first(entry, "label_key", args, ("eval_label_key", "label_key"), None)
        metadata_key = _cfg(entry, "metadata_key", getattr(args, "metadata_key", None) or "metadata")
        n = int(_first(entry, "n_samples_per_eval_prompt", args, ("n_samples_per_eval_prompt", "n_samples_per_prompt"),
                       1))
        samples: list[Any] = []
        try:
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as exc:
            raise ConfigError(f"eval_datasets {name}: cannot read {path} ({exc})") from None
        # What slime's ``EvalDatasetConfig.inject_metadata`` adds to each Sample's metadata: the dataset's
        # ``rm_type``, then its ``metadata_overrides``.
        overrides = dict(_cfg(entry, "metadata_overrides", {}))
        if _cfg(entry, "rm_type") is not None:
            overrides = {"rm_type": _cfg(entry, "rm_type"), **overrides}
        for g, row in enumerate(rows):
            if not isinstance(row, dict) or input_key not in row:
                raise ConfigError(f"eval_datasets {name}: line {g + 1} of {path} has no {input_key!r}")
            for _ in range(n):
                samples.append(sample_cls(group_index=g, index=len(samples), prompt=row[input_key],
                                          label=row.get(label_key) if label_key else None,
                                          metadata={**(row.get(metadata_key) or {}), **overrides}))
        out.append(EvalSet(name, samples, eval_sampling_params(args, entry)))
    return out
