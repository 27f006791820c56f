"""The Proxy's one weight-version policy: which version tokens carry, and which a session may mix.

:class:`WeightVersions` owns the current policy version of a Proxy and every rule about it:

- The engine is the authority. An answer's ``meta_info.weight_version`` (SGLang sends it on
  every answer) stamps that answer's tokens and becomes the current version (:meth:`stamp`).
- The Proxy's own version (set by ``POST /v1/rollout/resume``, :meth:`set`) is only the fallback
  for engines that report none, or SGLang's unset ``"default"``.
- Versions are engine strings; tokens store int32 codes from a
  :class:`dressage.fields.versions.VersionTable` (a plain integer string is that integer, any
  other string the next code from ``NAMED_BASE`` in order of first sight). The codes are the
  order the trainer compares (staleness = how far a token's code is behind the current one).
  Each recorded step keeps the engine strings of its named codes in its metadata
  (``weight_versions``), so a journal replay rebuilds the same table (:meth:`restore`) and a
  Sample's ``weight_versions`` lists the engine's strings as they were sent.
- With partial rollout off, a session keeps the version of its first step: checked before a call
  (:meth:`check_current`) and on its generated tokens (:meth:`check_generated`).
- With partial rollout on and ``max_preempts`` set, a session's tokens may span at most
  ``max_preempts + 1`` versions; the same two checks refuse a call that would add one more
  (``PartialRolloutStalenessError``, nothing recorded).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dressage.errors import PartialRolloutStalenessError, WeightVersionChangedError, WeightVersionMismatchError
from dressage.fields.versions import NAMED_BASE, VersionTable

__all__ = ["codes_of", "WeightVersions", "UNSET_ENGINE_VERSION", "STEP_LABELS_KEY"]

UNSET_ENGINE_VERSION = "default"
"""SGLang's ``weight_version`` before anyone set one: it says nothing about the weights."""

STEP_LABELS_KEY = "weight_versions"
"""StepRecord metadata key: ``{str(code): engine string}`` for the step's named versions."""


def codes_of(token_versions: Any) -> list[int]:
    """The distinct version codes of a response's tokens, ascending (``np.unique``'s answer; a
    response of one version, the usual case, is told by one comparison instead of a sort)."""
    tv = np.asarray(token_versions)
    if tv.size and (tv == tv.flat[0]).all():
        return [int(tv.flat[0])]
    return np.unique(tv).tolist()


class WeightVersions:
    """Current version, engine-string table and per-session pins of one Proxy."""

    def __init__(self, initial: int | str = 0, *, partial_rollout: bool = False,
                 max_preempts: int | None = None) -> None:
        self.table = VersionTable()
        self.current = self.table.code(initial)
        self.partial_rollout = bool(partial_rollout)
        self.max_preempts = max_preempts if self.partial_rollout else None
        self.from_engine = 0
        """Answers whose tokens carry the engine's own version (not the fallback)."""
        self._pins: dict[str, int] = {}
        self._spans: dict[str, set[int]] = {}
        """Versions the recorded tokens of each session span (kept only under ``max_preempts``)."""

    # ------------------------------------------------------------ the current version
    @property
    def label(self) -> str:
        """The current version as the engine names it."""
        return self.table.label(self.current)

    def set(self, version: int | str) -> int:
        """A new policy version (a number, or the engine's string): the fallback from now on."""
        self.current = self.table.code(version)
        return self.current

    def stamp(self, engine_version: str | None, fallback: int) -> int:
        """The version of one answer's tokens: the engine's (which becomes current) or ``fallback``
        (the version current when the request was sent) when the engine told nothing."""
        if engine_version is None or engine_version == UNSET_ENGINE_VERSION:
            return fallback
        self.current = self.table.code(engine_version)
        self.from_engine += 1
        return self.current

    # ------------------------------------------------------------ engine strings
    def labels(self, codes: Iterable[int]) -> dict[str, str]:
        """``{str(code): engine string}`` for the named codes among ``codes`` (numbers name themselves)."""
        return {str(c): self.table.label(c) for c in sorted({int(c) for c in codes}) if c >= NAMED_BASE}

    def restore(self, sessions: Iterable[Any]) -> None:
        """Take back what a journal replay recovered: the named versions its steps recorded, the
        newest version as the current one, and the version each active session keeps."""
        for session in sessions:
            steps = list(session.steps.values())
            for step in steps:
                for code, label in step_labels(step.metadata).items():
                    self.table.restore(label, int(code))
                if len(step.token_versions):
                    self.current = max(self.current, int(step.token_versions.max()))
            if steps and session.state == "active" and len(steps[0].token_versions):
                self.recorded(session.session_id, int(steps[0].token_versions[0]),
                              [c for step in steps for c in codes_of(step.token_versions)])

    # ------------------------------------------------------------ per-session rule
    # With partial rollout off a call meets the rule twice, and the two checks are different facts:
    # :meth:`check_current` before the engine request (a session pinned to an older version takes no
    # new call once the policy moved on), :meth:`check_generated` once the tokens are back (a pause
    # and resume may have changed the version while the call ran, and siblings of one call must agree).
    def check(self, session_id: str, codes: Iterable[int]) -> None:
        """Tokens of ``codes`` may join the session (with partial rollout: within ``max_preempts``)."""
        if self.partial_rollout:
            self._check_span(session_id, codes)
            return
        first = self._pins.get(session_id)
        if first is None:
            return
        self._refuse_other(session_id, first, codes)

    def _check_span(self, session_id: str, codes: Iterable[int]) -> None:
        if self.max_preempts is None:
            return
        span = self._spans.get(session_id, set()) | {int(c) for c in codes if int(c) >= 0}
        if len(span) - 1 > self.max_preempts:
            labels = [self.table.label(c) for c in sorted(span)]
            raise PartialRolloutStalenessError(
                f"session {session_id} would span weight versions {', '.join(labels)}: more than the "
                f"{self.max_preempts} version change(s) --max-partial-rollout-preempts allows; the call is refused",
                session_id=session_id, versions=labels, version_span=len(span), version_switches=len(span) - 1,
                max_preempts=self.max_preempts, max_version_span=self.max_preempts + 1)

    def _refuse_other(self, session_id: str, first: int, codes: Iterable[int]) -> None:
        for v in codes:
            if int(v) != first:
                raise WeightVersionChangedError(
                    f"session {session_id} started under weight version {self.table.label(first)} and the "
                    f"policy is now at version {self.table.label(int(v))}; with partial rollout off a "
                    "trajectory keeps one version (finalize it, or start the Proxy with --partial-rollout)")

    def check_current(self, session_id: str) -> None:
        """A new call of the session may start under the current version."""
        self.check(session_id, (self.current,))

    def check_generated(self, session_id: str, responses: Sequence[Any]) -> None:
        """The token versions of a call's responses (one per sample) may all join the session.

        A session with no step yet is pinned by the first response's first token, as
        :meth:`recorded` will pin it; every later sibling is held to that version.
        """
        if not responses:
            return
        if self.partial_rollout:
            self._check_span(session_id, [c for tv in responses for c in codes_of(tv)])
            return
        if session_id not in self._pins:
            pin = int(np.asarray(responses[0]).flat[0])
            for tv in responses[1:]:
                self._refuse_other(session_id, pin, codes_of(tv))
            return
        for tv in responses:
            self.check(session_id, codes_of(tv))

    def check_expected(self, session_id: str, expected: str, responses: Sequence[Any]) -> None:
        """Every generated token carries weight version ``expected`` (the engine's string, or the
        number the Proxy was resumed at), else ``WeightVersionMismatchError``: the policy moved."""
        codes = sorted({c for tv in responses for c in codes_of(tv) if c >= 0})
        observed = [self.table.label(c) for c in codes]
        if any(label != str(expected) for label in observed):
            raise WeightVersionMismatchError(
                f"the call expected weight version {expected} and was served by {', '.join(observed)}; "
                "nothing of it is recorded", expected=str(expected), observed=observed[-1],
                observed_versions=observed, session_id=session_id)

    def recorded(self, session_id: str, first_code: int, codes: Iterable[int] = ()) -> None:
        """A step of the session was recorded: its first token's version pins the session, and under
        ``max_preempts`` its versions (``codes``) join the session's span."""
        self._pins.setdefault(session_id, int(first_code))
        if self.max_preempts is not None:
            self._spans.setdefault(session_id, set()).update(int(c) for c in codes if int(c) >= 0)

    def forget(self, session_id: str) -> None:
        self._pins.pop(session_id, None)
        self._spans.pop(session_id, None)

    def state(self) -> dict[str, Any]:
        return {"weight_version": self.current, "version": self.label, "from_engine": self.from_engine,
                "named_versions": len(self.table.named())}


def step_labels(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The named versions a StepRecord's metadata recorded (empty when all were numbers)."""
    return dict(metadata.get(STEP_LABELS_KEY) or {})
