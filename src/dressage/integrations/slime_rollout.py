"""A rollout function with slime's ``--rollout-function-path`` signature that drives agents through the Proxy.

slime calls ``fn(args, rollout_id, data_source, evaluation=False)`` and reads
``RolloutFnTrainOutput(samples=list[list[Sample]], metrics)`` (or, from older code, the bare
groups). :class:`SlimeRollout` takes ``args.rollout_batch_size`` prompt groups from
``data_source.get_samples``, has its caller's agent (a :class:`RolloutAgent`) run ``len(group)``
sessions per prompt against the Proxy, takes the finalized sessions' Samples, restores their large fields and returns slime Samples
grouped by prompt. The Samples come from the :class:`~dressage.rollout.RolloutManager` the Proxy
delivers to when it runs in this process (``manager``), else over the Proxy's trajectory-read
interface (``POST /trajectory/read``, drained: the Proxy as its own service, as the seed deploys
it), with a TransferQueue reader joined from the spec the Proxy sends when TQ is on. Point slime
at it with ``--rollout-function-path dressage.integrations.slime_rollout.generate_rollout`` after
:func:`install`-ing a configured :class:`SlimeRollout`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Protocol, Sequence

from dressage.errors import ConfigError, TrajectoryError
from dressage.fields.versions import VersionTable
from dressage.integrations.slime import slime_sample_class, to_slime_groups
from dressage.rollout import RolloutManager
from dressage.rollout.manager import sample_ref_keys
from dressage.train.reader import TrainingReader
from dressage.train.remote import ProxyTrajectorySource, drain

__all__ = ["SlimeRollout", "RolloutAgent", "AgentReport", "install", "generate_rollout"]


class AgentReport(Protocol):
    """What a :class:`RolloutAgent` reports of one rollout."""

    @property
    def finalized(self) -> int:
        """Sessions the agents finalized (the count the drained trajectories must match)."""

    def to_dict(self) -> Mapping[str, Any]:
        """The report's entries; the numeric ones become ``dressage/<name>`` metrics."""


class RolloutAgent(Protocol):
    """The agents a rollout drives: the user's own, or the simulated ones of ``dressage run``.

    Called once per rollout with slime's prompts as the data source gives them (a string or chat
    messages each), it runs ``n_samples_per_prompt`` sessions per prompt through the Proxy at
    ``proxy_url`` (session (g, i) created with metadata ``group_index=g``, ``sample_index=i`` plus
    ``metadata``), at most ``concurrency`` at a time, with ``token`` as the Proxy's bearer token, and
    finalizes them. A prompt it cannot use is a ``ConfigError`` before any request.
    """

    async def __call__(self, proxy_url: str, prompts: Sequence[Any], n_samples_per_prompt: int, *,
                       concurrency: int, token: str | None, metadata: Mapping[str, Any]) -> AgentReport: ...


def _train_output(groups: list[list[Any]], metrics: dict[str, Any]) -> Any:
    try:
        from slime.rollout.base_types import RolloutFnTrainOutput  # type: ignore[import-not-found]
    except ImportError:
        return groups  # slime's call_rollout_fn accepts the bare groups too
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


class SlimeRollout:
    """Callable as slime's rollout function.

    ``agent`` runs each rollout's sessions. ``manager`` is the Proxy's sink when the Proxy runs in this
    process; ``None`` reads the finalized trajectories from the Proxy at ``proxy_url`` instead
    (``admin_token`` when it has one, ``read_groups`` prompt groups a read). ``reader`` is a
    TrainingReader (``None``: every large field is resident, or, reading over HTTP, one joined to the
    TQ the Proxy names).
    """

    def __init__(self, *, proxy_url: str, agent: RolloutAgent, manager: Any = None, reader: Any = None,
                 concurrency: int = 64, token: str | None = None, versions: VersionTable | None = None,
                 admin_token: str | None = None, read_groups: int = 8) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be a positive integer, got {concurrency!r}")
        if not isinstance(read_groups, int) or isinstance(read_groups, bool) or read_groups < 1:
            raise ConfigError(f"read_groups must be a positive integer, got {read_groups!r}")
        self.proxy_url, self.manager, self.reader = proxy_url, manager, reader
        self.agent, self.concurrency, self.token, self.versions = agent, concurrency, token, versions
        self.read_groups = read_groups
        self._source = None if manager is not None else ProxyTrajectorySource(proxy_url, token=admin_token)
        self.last_report: Any = None

    def __call__(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        n_groups = int(getattr(args, "rollout_batch_size", 0) or 0)
        if n_groups < 1:
            raise ConfigError(f"args.rollout_batch_size must be a positive integer, got {n_groups!r}")
        source = data_source.get_samples(n_groups)
        if not source or any(not g for g in source):
            raise ConfigError("the data source returned an empty group")
        per_prompt = {len(g) for g in source}
        if len(per_prompt) != 1:
            raise ConfigError(f"every group needs the same number of samples, got sizes {sorted(per_prompt)}")
        report = asyncio.run(self.agent(self.proxy_url, [g[0].prompt for g in source], per_prompt.pop(),
                                        concurrency=self.concurrency, token=self.token,
                                        metadata={"rollout_id": int(rollout_id)}))
        self.last_report = report
        manager, reader = self.manager, self.reader
        if self._source is not None:  # the Proxy is a service of its own: drain what this rollout finalized
            manager = RolloutManager()
            for read in drain(self._source, max_groups=self.read_groups):
                manager.add_samples(read.samples, sessions=read.trajectories)
            if manager.sessions_received != report.finalized:
                raise TrajectoryError(f"{self.proxy_url}: read {manager.sessions_received} finalized trajectories "
                                      f"where the agents finalized {report.finalized} (does another reader drain "
                                      "this Proxy, or did sessions of another rollout wait in it?)")
        batch = manager.take_batch(int(rollout_id))
        if reader is None and self._source is not None and sample_ref_keys(batch.samples):
            reader = TrainingReader(self._source.client())  # the TQ the Proxy named in its answers
        samples = batch.samples if reader is None else reader.restore(batch.samples)
        groups = to_slime_groups(samples, versions=self.versions, cls=slime_sample_class(),
                                 labels=[getattr(g[0], "label", None) for g in source],
                                 prompts=[g[0].prompt for g in source])
        metrics = {f"dressage/{k}": v for k, v in report.to_dict().items() if isinstance(v, (int, float))}
        if evaluation:
            flat = [s for g in groups for s in g]
            return {"dressage": {"rewards": [s.reward for s in flat],
                                 "truncated": [s.status.name == "TRUNCATED" for s in flat], "samples": flat}}
        return _train_output(groups, metrics)


_installed: SlimeRollout | None = None


def install(rollout: SlimeRollout | None) -> None:
    """Make ``rollout`` the one :func:`generate_rollout` runs (``None`` uninstalls)."""
    global _installed
    _installed = rollout


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function entry point (``--rollout-function-path``)."""
    if _installed is None:
        raise ConfigError("no Dressage rollout is installed: call dressage.integrations.slime_rollout.install() "
                          "with a SlimeRollout in the process that runs slime's RolloutManager")
    return _installed(args, rollout_id, data_source, evaluation=evaluation)
