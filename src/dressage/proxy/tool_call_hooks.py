"""Tool-call hooks: side effects a deployment runs at an agent's tool-call boundaries (upstream's plug-ins).

Two points of a chat call are step boundaries of a sandboxed agent: the request's last message is a
``tool`` result (the tools of the previous reply ran: ``after_tool_call``, before generation), and the
reply holds tool calls (the agent is about to run them: ``before_tool_call``, before the reply is
recorded and returned). A hook is a :class:`ToolCallHook` subclass loaded by reference
(``package.module:Class``, ``/path/file.py:Class``, or a module or file and the ``name`` of a hook it
defines); its methods only act (a snapshot, a network rule), they change neither request nor reply.
A ``required`` hook that fails, or overruns ``before_timeout_s``, fails the call with 502
``tool_call_hook_failed`` (nothing recorded); any other hook's failure is logged. Hooks act on the
sandbox that ``X-Dressage-Sandbox-Id`` names; a call without one dispatches nothing.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Sequence

from dressage.errors import ConfigError, ToolCallHookError

__all__ = ["ToolCallContext", "ToolCallHook", "ToolCallHookError", "ToolCallHooks", "register_tool_call_hook",
           "load_tool_call_hooks"]

log = logging.getLogger("dressage.proxy")

_MAX_DISPATCH_KEYS = 65_536  # stage keys remembered against a dispatch repeated at the same step


@dataclass(frozen=True, slots=True)
class ToolCallContext:
    """What one hook dispatch is told: the rollout ids, the step and the sandbox it acts on."""

    instance_id: str | None
    session_id: str
    turn_id: str | None
    step_index: int
    """Steps the session had recorded when the call came (the call's own step is this index)."""
    sandbox_id: str
    tool_calls: list[dict[str, Any]] | None = None
    """The reply's tool calls (``before_tool_call`` only)."""
    idempotency_key: str | None = None
    """``session:turn:step:stage``: a stage dispatched again at the same step is not run twice."""
    stage_metadata: dict[str, Any] = field(default_factory=dict)


class ToolCallHook:
    """Base class of a hook: subclass it, give it a ``name``, override either stage."""

    name: ClassVar[str] = ""
    required: ClassVar[bool] = False
    """A failure (or an overrun) of a required hook fails the call."""
    order: ClassVar[int] = 100
    """``before`` hooks run in ascending order, ``after`` hooks in descending order."""

    def applies_to(self, ctx: ToolCallContext) -> bool:  # noqa: ARG002 - every call, unless narrowed
        return True

    async def before_tool_call(self, ctx: ToolCallContext) -> None:  # noqa: ARG002
        return None

    async def after_tool_call(self, ctx: ToolCallContext) -> None:  # noqa: ARG002
        return None


def register_tool_call_hook(cls: type[ToolCallHook]) -> type[ToolCallHook]:
    """Upstream's decorator, kept so that its hook modules load unchanged: a hook class is found by its
    ``name`` in the modules the hook references load, so nothing needs registering in a global table."""
    if not (inspect.isclass(cls) and issubclass(cls, ToolCallHook)) or not str(getattr(cls, "name", "")).strip():
        raise ConfigError(f"register_tool_call_hook: {cls!r} is not a ToolCallHook subclass with a name")
    return cls


def _module_of(ref: str) -> Any:
    if ref.endswith(".py") or os.sep in ref or "/" in ref:
        path = os.path.abspath(ref)
        if not os.path.isfile(path):
            raise ConfigError(f"tool_call_hooks: no hook file {ref!r}")
        name = f"dressage_tool_call_hooks_{abs(hash(path)):x}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ConfigError(f"tool_call_hooks: loading {ref!r} failed: {exc}") from exc
        return module
    try:
        return importlib.import_module(ref)
    except Exception as exc:
        raise ConfigError(f"tool_call_hooks: importing {ref!r} failed: {exc}") from exc


def _hooks_in(module: Any) -> dict[str, type[ToolCallHook]]:
    return {str(c.name).strip(): c for c in vars(module).values()
            if inspect.isclass(c) and issubclass(c, ToolCallHook) and c is not ToolCallHook
            and str(getattr(c, "name", "")).strip() and c.__module__ == module.__name__}


def load_tool_call_hooks(refs: Iterable[str]) -> list[ToolCallHook]:
    """One instance of each hook ``refs`` names (entries may also be comma-separated); a reference
    that loads nothing, or a name no loaded module defines, is a ``ConfigError``."""
    entries = [e for ref in refs for e in str(ref).replace(",", " ").split()]
    found: dict[str, type[ToolCallHook]] = {}
    chosen: list[type[ToolCallHook]] = []
    names: list[str] = []
    for entry in entries:
        module_ref, _, attr = entry.rpartition(":") if ":" in entry else (entry, "", "")
        if not module_ref and not attr:
            continue
        is_ref = ":" in entry or entry.endswith(".py") or "/" in entry or "." in entry
        if not is_ref:
            names.append(entry)
            continue
        module = _module_of(module_ref)
        hooks = _hooks_in(module)
        found.update(hooks)
        if attr:
            cls = getattr(module, attr, None)
            if not (inspect.isclass(cls) and issubclass(cls, ToolCallHook)):
                raise ConfigError(f"tool_call_hooks: {entry!r} is not a ToolCallHook subclass")
            chosen.append(cls)
        elif len(hooks) == 1:
            chosen.extend(hooks.values())
        else:
            raise ConfigError(f"tool_call_hooks: {entry!r} defines {len(hooks)} hooks; name one ({entry}:Class)")
    for name in names:
        if name not in found:
            raise ConfigError(f"tool_call_hooks: no loaded hook is named {name!r} (known: "
                              f"{', '.join(sorted(found)) or 'none'}; load its module with module:Class first)")
        chosen.append(found[name])
    unique = list(dict.fromkeys(chosen))
    return [cls() for cls in unique]


class ToolCallHooks:
    """The hooks of one Proxy, dispatched in order; each stage of a step runs once."""

    def __init__(self, hooks: Sequence[ToolCallHook] = (), *, before_timeout_s: float | None = None) -> None:
        self.hooks = sorted(hooks, key=lambda h: h.order)
        self.before_timeout_s = before_timeout_s
        self._dispatched: OrderedDict[str, None] = OrderedDict()
        self.failures = 0
        """Hook failures (required or not) since start."""

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def _first_time(self, key: str) -> bool:
        if key in self._dispatched:
            return False
        self._dispatched[key] = None
        if len(self._dispatched) > _MAX_DISPATCH_KEYS:
            self._dispatched.popitem(last=False)
        return True

    async def dispatch(self, stage: str, ctx: ToolCallContext) -> None:
        """Run ``stage`` (``before`` / ``after``) of every hook that applies to ``ctx``."""
        if not self.hooks or (ctx.idempotency_key is not None and not self._first_time(ctx.idempotency_key)):
            return
        hooks = [h for h in self.hooks if self._applies(h, ctx)]
        for hook in hooks if stage == "before" else reversed(hooks):
            await self._run(hook, stage, ctx)

    @staticmethod
    def _applies(hook: ToolCallHook, ctx: ToolCallContext) -> bool:
        try:
            return bool(hook.applies_to(ctx))
        except Exception:
            log.warning("tool-call hook %s: applies_to failed; skipped", type(hook).__name__, exc_info=True)
            return False

    async def _run(self, hook: ToolCallHook, stage: str, ctx: ToolCallContext) -> None:
        method = hook.before_tool_call if stage == "before" else hook.after_tool_call
        label = hook.name or type(hook).__name__
        try:
            if stage == "before" and self.before_timeout_s is not None:
                await asyncio.wait_for(method(ctx), timeout=self.before_timeout_s)
            else:
                await method(ctx)
        except asyncio.TimeoutError:
            self.failures += 1
            if hook.required:
                raise ToolCallHookError(f"required tool-call hook {label} overran {self.before_timeout_s} s at "
                                        f"{stage}_tool_call", stage=stage, hook=label,
                                        session_id=ctx.session_id) from None
            log.warning("tool-call hook %s overran %s s at %s_tool_call", label, self.before_timeout_s, stage)
        except Exception as exc:
            self.failures += 1
            if hook.required:
                raise ToolCallHookError(f"required tool-call hook {label} failed at {stage}_tool_call: {exc}",
                                        stage=stage, hook=label, session_id=ctx.session_id) from exc
            log.warning("tool-call hook %s failed at %s_tool_call: %s", label, stage, exc)
