"""The Janitor: a background thread that runs the Controller's retention sweep and queued deletions.

The Controller only decides what to delete; the Janitor does the unit I/O, off every client's path.
Every ``reconcile_s`` it also compares each live unit's contents with the directory: a blob the
directory does not place on that unit (a put that landed after its key was aborted or deleted, a
deletion lost with a restarted Controller) is an orphan, and one still orphaned at the next
reconciliation is deleted. Waiting one round means a key whose placement is in flight is never
taken for an orphan (a key is placed in the directory before its blob is written). A unit that a
restarted Controller could not ask for its inventory is not reconciled until that inventory is adopted
(``recovery.py``): what it holds are committed keys the directory has yet to learn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from dressage.tq.directory.controller import Controller
from dressage.tq.transport.wire import key_pages

__all__ = ["Janitor", "sweep_interval"]

log = logging.getLogger(__name__)


def sweep_interval(retention_s: float | None) -> float:
    """How often the Janitor runs: often enough for retention and queued deletes, never busy."""
    if retention_s is None:
        return 1.0
    return min(max(retention_s / 10.0, 0.05), 5.0)


class Janitor:
    """Background thread: runs the retention sweep and performs queued unit deletions.

    ``resolve(unit_id)`` returns something with ``delete(keys)`` (a StorageUnit or remote handle).
    A unit that fails keeps its keys queued for the next round; the loop never raises.
    """

    def __init__(self, controller: Controller, resolve: Callable[[str], Any], *, interval_s: float,
                 reconcile_s: float | None = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._controller = controller
        self._resolve = resolve
        self._interval = interval_s
        self._reconcile_s = reconcile_s
        self._clock = clock
        self._next_reconcile = clock() + (reconcile_s or 0.0)
        self._suspects: dict[str, set[str]] = {}
        self.orphans_removed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tq-janitor", daemon=True)

    def start(self) -> "Janitor":
        self._thread.start()
        return self

    def run_once(self) -> int:
        self._controller.expire()
        removed = 0
        for unit_id, keys in self._controller.take_deletions().items():
            removed += self._delete(unit_id, keys)
        if self._reconcile_s is not None and self._clock() >= self._next_reconcile:
            self._next_reconcile = self._clock() + self._reconcile_s
            removed += self.reconcile()
        return removed

    def _delete(self, unit_id: str, keys: list[str]) -> int:
        """``keys`` deleted from the unit a bounded page per request; from the first page that fails on,
        they stay queued for the next round (a dead unit must not kill the sweep)."""
        removed = done = 0
        try:
            unit = self._resolve(unit_id)
            if unit is None:
                return 0
            for page in key_pages(keys):
                removed += unit.delete(page)
                done += len(page)
        except Exception as exc:
            log.warning("janitor: deleting %d of %d key(s) from unit %s failed: %s",
                        len(keys) - done, len(keys), unit_id, exc)
            self._controller.requeue_deletions(unit_id, keys[done:])
        return removed

    def reconcile(self) -> int:
        """One reconciliation round over the live units whose contents the directory knows; returns how
        many orphan blobs were deleted."""
        removed = 0
        for info in self._controller.units():
            uid = info.unit_id
            # A unit whose inventory a restarted directory has not adopted yet holds committed keys the
            # directory does not know: none of them is an orphan.
            if self._controller.dead_reason(uid) is not None or self._controller.awaits_inventory(uid):
                continue
            try:
                unit = self._resolve(uid)
                if unit is None:
                    continue
                stored = unit.list()
                placed = self._controller.where(stored)
                orphans = {k for k in stored if placed.get(k) != uid}
                confirmed = sorted(orphans & self._suspects.get(uid, set()))
                self._suspects[uid] = orphans - set(confirmed)
                if confirmed:
                    # Asked again right before deleting: a key placed meanwhile is not an orphan.
                    again = self._controller.where(confirmed)
                    confirmed = [k for k in confirmed if again.get(k) != uid]
                    n = sum(unit.delete(page) for page in key_pages(confirmed))
                    if n:
                        log.info("janitor: removed %d orphan blob(s) from unit %s", n, uid)
                    removed += n
                    self.orphans_removed += n
            except Exception as exc:  # a unit that does not answer is reconciled next round
                log.warning("janitor: reconciling unit %s failed: %s", uid, exc)
        return removed

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
