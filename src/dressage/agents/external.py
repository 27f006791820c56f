"""The user's own agent, as one rollout session sees it: a context in, a reward out.

An agent is ``async (ctx: SessionContext) -> float | Mapping[str, Any]``: it talks to the Proxy at
``ctx.base_url`` (OpenAI) or ``ctx.anthropic_base_url`` (Anthropic Messages) and returns the session's
reward. :class:`CommandAgent` is such an agent made of a command (a coding CLI) run once per session.
"""

from __future__ import annotations

import asyncio
import json
import math
import numbers
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
from typing import Any, Awaitable, Callable, Mapping, Sequence, Union

from dressage.errors import AgentCommandError, ConfigError

__all__ = ["SessionContext", "Agent", "Reward", "CommandResult", "CommandAgent", "reward_number"]

Reward = Union[float, Mapping[str, Any]]
"""A session's reward: a number, or a mapping of named rewards (slime's ``--reward-key`` picks one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionContext:
    """Everything an agent needs to run one session against the Proxy.

    ``base_url`` is the session's OpenAI base URL (``{proxy}/sessions/{id}/v1``), ``anthropic_base_url``
    its Anthropic one (``{proxy}/sessions/{id}``); ``headers`` name the session and its prompt group
    for clients that call the Proxy's shared ``/v1`` instead. ``prompt``, ``label`` and ``metadata`` are
    the data source's; ``sampling_params`` slime's rollout sampling settings, for agents that pass them on.
    """

    session_id: str
    base_url: str
    anthropic_base_url: str
    api_key: str
    headers: Mapping[str, str]
    model: str
    prompt: Any
    label: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    group_index: int = 0
    index: int | None = None
    rollout_id: int = 0
    evaluation: bool = False
    sampling_params: Mapping[str, Any] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """Environment variables that point OpenAI- and Anthropic-style clients (and CLIs) at this session."""
        return {
            "OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url, "ANTHROPIC_AUTH_TOKEN": self.api_key,
            "ANTHROPIC_API_KEY": self.api_key, "ANTHROPIC_MODEL": self.model,
            "DRESSAGE_SESSION_ID": self.session_id, "DRESSAGE_INSTANCE_ID": str(self.group_index),
        }


Agent = Callable[[SessionContext], Awaitable[Reward]]
"""The user's agent: runs one session, returns its reward."""


def reward_number(reward: Any, reward_key: str | None) -> float:
    """The number a reward finalizes with: the reward itself, or ``reward[reward_key]`` for a mapping.

    :class:`ConfigError` for a mapping without ``reward_key`` (or without that key), :class:`ValueError`
    for a value that is not a finite number.
    """
    if isinstance(reward, Mapping):
        if not reward_key:
            raise ConfigError("the agent returned a reward mapping; set --reward-key (args.reward_key) to pick "
                              f"the number to train on (keys: {sorted(map(str, reward))})")
        if reward_key not in reward:
            raise ConfigError(f"reward_key {reward_key!r} is not in the agent's reward {sorted(map(str, reward))}")
        reward = reward[reward_key]
    # Any real number (numpy's np.float32 and np.int64 too), but not a boolean.
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real):
        raise ValueError(f"a reward must be a number, got {type(reward).__name__} {str(reward)[:100]!r}")
    value = float(reward)
    if not math.isfinite(value):
        raise ValueError(f"a reward must be finite, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How one run of a :class:`CommandAgent`'s command ended."""

    returncode: int
    stdout: str
    stderr: str
    workdir: str
    wall_s: float


def _tail(text: str, limit: int = 800) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


class CommandAgent:
    """An agent that runs ``argv`` once per session, in a fresh working directory.

    The command's environment is this process's, plus ``ctx.env()``, ``DRESSAGE_PROMPT_FILE`` (a JSON
    file of ``prompt``, ``label`` and ``metadata``), ``DRESSAGE_REWARD_FILE``, ``DRESSAGE_WORKDIR``, plus
    ``env``. ``argv`` may hold ``{prompt}`` (the prompt as text), ``{prompt_file}``, ``{workdir}`` and
    ``{session_id}``, replaced literally (other braces stay as they are). The reward is
    ``await reward(ctx, result)`` when ``reward`` is given, else the JSON number or object the command
    wrote to ``$DRESSAGE_REWARD_FILE``. At ``timeout_s`` the command's whole process group is killed and
    the session fails. The directory is made under ``cwd`` (a temporary
    directory without it) and removed afterwards unless ``keep_workdir``.
    """

    PLACEHOLDERS = ("prompt", "prompt_file", "workdir", "session_id")

    def __init__(self, argv: Sequence[str], *, reward: Callable[[SessionContext, CommandResult], Awaitable[Reward]]
                 | None = None, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 timeout_s: float = 3600.0, keep_workdir: bool = False) -> None:
        if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
            raise ConfigError(f"argv must be a non-empty list of strings, got {argv!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ConfigError(f"timeout_s must be a number > 0, got {timeout_s!r}")
        if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ConfigError("env must map strings to strings")
        if reward is not None and not callable(reward):
            raise ConfigError(f"reward must be an async callable (ctx, result) -> reward, got {reward!r}")
        self.argv, self.reward, self.env = list(argv), reward, dict(env or {})
        self.cwd, self.timeout_s, self.keep_workdir = cwd, float(timeout_s), keep_workdir

    async def __call__(self, ctx: SessionContext) -> Reward:
        workdir = tempfile.mkdtemp(prefix=f"dressage-{ctx.session_id[:16]}-", dir=self.cwd)
        try:
            return await self._run(ctx, workdir)
        finally:
            if not self.keep_workdir:
                shutil.rmtree(workdir, ignore_errors=True)

    async def _run(self, ctx: SessionContext, workdir: str) -> Reward:
        prompt_file = os.path.join(workdir, ".dressage_prompt.json")
        reward_file = os.path.join(workdir, ".dressage_reward.json")
        with open(prompt_file, "w") as f:
            json.dump({"prompt": ctx.prompt, "label": ctx.label, "metadata": dict(ctx.metadata)}, f, default=str)
        text = ctx.prompt if isinstance(ctx.prompt, str) else json.dumps(ctx.prompt, default=str)
        values = {"prompt": text, "prompt_file": prompt_file, "workdir": workdir, "session_id": ctx.session_id}
        argv = [_substitute(a, values) for a in self.argv]
        env = {**os.environ, **ctx.env(), "DRESSAGE_PROMPT_FILE": prompt_file, "DRESSAGE_REWARD_FILE": reward_file,
               "DRESSAGE_WORKDIR": workdir, **self.env}
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(*argv, cwd=workdir, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise AgentCommandError(f"{argv[0]}: cannot start the agent command: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            raise AgentCommandError(f"{argv[0]}: killed after {self.timeout_s:g} s (session {ctx.session_id})") \
                from None
        except BaseException:
            _kill_group(proc.pid)  # the session was cancelled: no process of the command may outlive it
            await proc.wait()
            raise
        result = CommandResult(int(proc.returncode), out.decode(errors="replace"), err.decode(errors="replace"),
                               workdir, time.monotonic() - t0)
        if self.reward is not None:
            return await self.reward(ctx, result)
        return _read_reward(reward_file, argv[0], result)


def _substitute(arg: str, values: Mapping[str, str]) -> str:
    # Literal replacement, not str.format: a command line often holds braces of its own (JSON, code).
    for name, value in values.items():
        arg = arg.replace("{" + name + "}", value)
    return arg


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the command's own session: its children die with it
    except ProcessLookupError:
        pass


def _read_reward(path: str, command: str, result: CommandResult) -> Reward:
    def fail(why: str) -> AgentCommandError:
        return AgentCommandError(f"{command}: {why} {path} (exit code {result.returncode}; stderr: "
                                 f"{_tail(result.stderr) or '<empty>'})")

    try:
        with open(path) as f:
            value = json.load(f)
    except FileNotFoundError:
        raise fail("wrote no reward to") from None
    except (OSError, ValueError) as exc:
        raise fail(f"wrote an unreadable reward ({exc}) to") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise fail(f"wrote {str(value)[:80]!r} (not a JSON number or object) to")
    return value
