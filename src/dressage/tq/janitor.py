"""The Janitor: a background thread that runs the Controller's retention sweep and queued deletions.

The Controller only decides what to delete; the Janitor does the unit I/O, off every client's path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from dressage.tq.controller import Controller

__all__ = ["Janitor"]

log = logging.getLogger(__name__)


class Janitor:
    """Background thread: runs the retention sweep and performs queued unit deletions.

    ``resolve(unit_id)`` returns something with ``delete(keys)`` (a StorageUnit or remote handle).
    A unit that fails keeps its keys queued for the next round; the loop never raises.
    """

    def __init__(self, controller: Controller, resolve: Callable[[str], Any], *, interval_s: float) -> None:
        self._controller = controller
        self._resolve = resolve
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tq-janitor", daemon=True)

    def start(self) -> "Janitor":
        self._thread.start()
        return self

    def run_once(self) -> int:
        self._controller.expire()
        removed = 0
        for unit_id, keys in self._controller.take_deletions().items():
            try:
                unit = self._resolve(unit_id)
                if unit is not None:
                    removed += unit.delete(keys)
            except Exception as exc:  # a dead unit must not kill the sweep; retried next round
                log.warning("janitor: deleting %d key(s) from unit %s failed: %s", len(keys), unit_id, exc)
                self._controller.requeue_deletions(unit_id, keys)
        return removed

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
