"""Retention renewal: a holder keeps the keys it still needs out of the retention sweep.

Retention (``retention_s``) is the safety net for keys nobody will ever read: a writer that died, a batch
nobody released. A key someone still means to read must not expire however long its reader takes, and
nothing else touches a key between its write and its read. So a holder (the Proxy, for the sessions it
holds: live, or finalized and not yet acknowledged) runs a :class:`KeyRenewal`: every
``retention_s / RENEW_SHARE`` it touches every key ``held()`` names (``TransferQueueClient.touch``, a page
per request), and a key it hands on (:meth:`KeyRenewal.hand_off`) is touched once more at once, so its next
holder has a whole ``retention_s`` from the hand-off. A holder that dies stops renewing, and its keys
expire ``retention_s`` after its last round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from dressage.errors import DressageError

__all__ = ["KeyRenewal", "RENEW_SHARE"]

log = logging.getLogger(__name__)

RETENTION_RETRY_S = (1.0, 30.0)
"""The first and the longest wait between two asks of a Controller that has not said its retention yet."""

RENEW_SHARE = 4
"""Held keys are renewed every ``retention_s / RENEW_SHARE``: three rounds in a row may fail (a Controller
restarting) before one could expire."""


class KeyRenewal:
    """Renews the keys ``held()`` names on a thread of its own, started by :meth:`start`.

    ``client`` has ``touch(keys)`` and ``retention()`` (a :class:`~dressage.tq.TransferQueueClient`); the
    thread asks the retention until the Controller answers (a Controller out of reach is asked again,
    first 1 s later, then less and less often: ``RETENTION_RETRY_S``), and ends at once when there is
    none: hand-offs are dropped from then on. A round that fails (the Controller out of reach) is logged
    and counted, and the next round tries again; so is a round whose ``held()`` raised.
    """

    def __init__(self, client: Any, held: Callable[[], Iterable[str]], *, name: str = "tq-renewal") -> None:
        self._client = client
        self._held = held
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._handed: list[str] = []
        self._off = False  # the Controller keeps keys until cleared: nothing to renew or hand off
        self._thread: threading.Thread | None = None
        self.period_s: float | None = None
        """Seconds between rounds, once the thread learnt the retention (None: not yet, or no retention)."""
        self.rounds = 0
        """Rounds over every held key."""
        self.renewed = 0
        """Keys the directory held when they were touched, every round and hand-off together."""
        self.failures = 0
        """Touches that failed (logged; the keys are touched again next round)."""

    def start(self) -> None:
        """Start renewing (once; not after :meth:`close`)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def hand_off(self, keys: Iterable[str]) -> None:
        """``keys`` leave the holder (a trainer acknowledged them): touch them once more, now, on the
        renewal's thread, so their next holder has a whole ``retention_s`` from this moment."""
        keys = list(keys)
        if not keys or self._stop.is_set():
            return
        with self._lock:  # under the lock: a hand-off racing the thread's finding no retention keeps nothing
            if self._off:
                return
            self._handed.extend(keys)
        self.start()
        self._wake.set()

    def renew(self) -> int:
        """One round over every held key now; returns how many the directory held."""
        try:
            held = list(dict.fromkeys(self._held()))
        except Exception:  # the holder's bookkeeping failed this once: its keys are asked for again next round
            self.failures += 1
            log.warning("retention renewal could not list the held keys (tried again next round)", exc_info=True)
            return 0
        n = self._touch(held)
        self.rounds += 1
        return n

    def _touch(self, keys: list[str]) -> int:
        if not keys:
            return 0
        try:
            n = int(self._client.touch(keys))
        except DressageError as exc:
            self.failures += 1
            log.warning("retention renewal of %d TransferQueue key(s) failed (tried again next round): %s",
                        len(keys), exc)
            return 0
        self.renewed += n
        return n

    def _retention(self) -> float | None:
        """The Controller's ``retention_s``, asked until it answers or the renewal is closed (then None)."""
        wait, longest = RETENTION_RETRY_S
        while not self._stop.is_set():
            try:
                return self._client.retention()
            except DressageError as exc:
                self.failures += 1
                log.warning("TransferQueue retention renewal waits for the Controller to say its retention_s "
                            "(asked again in %.0f s): %s", wait, exc)
            self._stop.wait(wait)
            wait = min(wait * 2, longest)
        return None

    def _run(self) -> None:
        retention = self._retention()
        if retention is None:  # keys are kept until cleared (or the renewal closed): nothing to renew
            with self._lock:
                self._off = True
                self._handed.clear()
            return
        self.period_s = period = float(retention) / RENEW_SHARE
        due = time.monotonic()  # a first round at once: a holder that restarted may hold old keys
        while not self._stop.is_set():
            with self._lock:
                handed, self._handed = self._handed, []
            self._touch(list(dict.fromkeys(handed)))
            if time.monotonic() >= due:
                self.renew()
                due = time.monotonic() + period
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()

    def close(self, wait: bool = True) -> None:
        """Stop renewing (the holder is done: what it held is released or handed on)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
