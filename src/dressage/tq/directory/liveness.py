"""StorageUnit liveness: the Controller's probes, and the clients' cached view of who is dead.

``LivenessMonitor`` runs next to the Controller: one thread per unit pings it every
``heartbeat_interval_s``; a unit silent for ``unit_dead_after_s`` is marked dead, and its next answer
makes it live again (a SIGSTOPped process that was resumed). Deployments add faster signals of their
own (a child's exit, a Ray actor's death). ``LivenessView`` is what a client asks before and while it
waits on a unit, so a read of a dead unit's keys fails at once instead of after the request timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from dressage.errors import TransferQueueError

__all__ = ["LivenessMonitor", "LivenessView"]

log = logging.getLogger(__name__)
# How stale a client's copy of the unit states may be; bounds the extra delay of a fail-fast read.
VIEW_TTL_S = 0.2
# How long a refresh waits for a remote Controller's answer (an idle one answers in about a millisecond).
VIEW_ASK_S = 0.2
# After a refresh that got no answer, the view keeps its last states this long before asking again, doubling
# up to VIEW_BACKOFF_MAX_S while the Controller stays silent: a stalled Controller costs a reader one
# VIEW_ASK_S wait per backoff period, not a wait per check.
VIEW_BACKOFF_S = 1.0
VIEW_BACKOFF_MAX_S = 8.0


class LivenessMonitor:
    """Probes units and reports to ``controller`` (``mark_unit_live`` / ``mark_unit_dead``)."""

    def __init__(self, controller: Any, handles: Mapping[str, Any], *, interval_s: float, dead_after_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._controller = controller
        self._handles = dict(handles)
        self._interval = float(interval_s)
        self._dead_after = float(dead_after_s)
        self._clock = clock
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(uid,), name=f"tq-liveness-{uid}", daemon=True)
                         for uid in self._handles]
        self.probes = 0

    def start(self) -> "LivenessMonitor":
        for t in self._threads:
            t.start()
        return self

    def _watch(self, unit_id: str) -> None:
        handle = self._handles[unit_id]
        last_ok = self._clock()
        while not self._stop.is_set():
            started = self._clock()
            what = "probe"
            try:
                # A stopped process never answers: the probe itself waits out the dead-after bound.
                handle.ping(timeout_s=self._dead_after)
                # Answered only once reported live: a unit whose inventory a restarted Controller still
                # awaits is live once that inventory is in (``recovery.LateAdoption``), and one that answers
                # pings but never its inventory goes dead like one that answers nothing.
                what = "inventory request"
                self._controller.mark_unit_live(unit_id)
                last_ok = self._clock()
            except TransferQueueError as exc:
                silent = self._clock() - last_ok
                if silent >= self._dead_after:
                    self._controller.mark_unit_dead(unit_id, f"answered no {what} for {silent:.1f} s ({exc})")
            except Exception:  # the monitor must outlive any surprise; the next probe tries again
                log.exception("liveness probe of unit %s failed", unit_id)
            self.probes += 1
            self._stop.wait(max(self._interval - (self._clock() - started), 0.0))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=self._dead_after + 1)


class LivenessView:
    """A client's copy of the Controller's unit states, refreshed at most every ``ttl_s``.

    ``reason(unit_id)`` is None for a live unit, else why it is dead. While the Controller answers, the
    copy is at most ``ttl_s`` old. A refresh waits at most ``ask_s`` for a remote Controller (one with
    ``remote = True``, whose ``unit_states`` takes ``timeout_s``); one that cannot be asked leaves the last
    known states in place and is asked again only after ``backoff_s`` (doubling, at most
    ``VIEW_BACKOFF_MAX_S``, while it stays silent): a failing or stalled directory must neither fail nor
    slow down reads that would work.
    """

    def __init__(self, controller: Any, *, ttl_s: float = VIEW_TTL_S, ask_s: float = VIEW_ASK_S,
                 backoff_s: float = VIEW_BACKOFF_S) -> None:
        self._controller = controller
        self._remote = bool(getattr(controller, "remote", False))
        self._ttl = ttl_s
        self._ask = ask_s
        self._backoff_first = backoff_s
        self._backoff = backoff_s
        self._lock = threading.Lock()
        self._states: dict[str, dict[str, Any]] = {}
        self._at = float("-inf")
        self.failed_refreshes = 0  # refreshes the Controller did not answer (in time)

    def _refresh(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            if now - self._at < self._ttl:
                return self._states
            self._at = now  # one refresher at a time; the others use what is there
        try:
            states = (self._controller.unit_states(timeout_s=self._ask) if self._remote
                      else self._controller.unit_states())
        except TransferQueueError as exc:
            with self._lock:
                # Not asked again before the backoff ends: ``_at`` lies that far minus ttl ahead.
                self._at = time.monotonic() + self._backoff - self._ttl
                wait, self._backoff = self._backoff, min(self._backoff * 2, VIEW_BACKOFF_MAX_S)
                self.failed_refreshes += 1
            log.debug("unit states not refreshed (%s); the last known stay for %.1f s", exc, wait)
            return self._states
        with self._lock:
            self._states = states
            self._backoff = self._backoff_first
        return states

    def begin_refresh(self) -> bool:
        """Claim the next refresh when the view is stale (True), for a caller that will get the states
        from a reply it is waiting for anyway; until ``finish_refresh`` the others use what is there."""
        now = time.monotonic()
        with self._lock:
            if now - self._at < self._ttl:
                return False
            self._at = now
            return True

    def finish_refresh(self, states: dict[str, dict[str, Any]] | None) -> None:
        """The states a claimed refresh got (None: it got none; the next check asks the Controller)."""
        with self._lock:
            if states is None:
                self._at = float("-inf")
            else:
                self._states = dict(states)

    def reason(self, unit_id: str) -> str | None:
        st = self._refresh().get(unit_id)
        if st is None or st.get("state") != "dead":
            return None
        return f"marked dead by the Controller {st.get('for_s', 0):.1f} s ago: {st.get('reason', '')}"

    def checker(self, unit_id: str) -> Callable[[], str | None]:
        return lambda: self.reason(unit_id)
