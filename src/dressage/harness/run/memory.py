"""Memory figures for ``dressage run``: this process's PSS on a timer, and bytes each component holds."""

from __future__ import annotations

import gc
import threading

import psutil

from dressage.proxy.recording.heap import trim_heap

__all__ = ["PssSampler", "process_pss", "process_vitals"]


def process_pss(pid: int | None = None) -> int:
    """Proportional set size of a process (falls back to RSS where smaps is unavailable)."""
    p = psutil.Process(pid)
    try:
        return int(p.memory_full_info().pss)
    except (AttributeError, psutil.AccessDenied):
        return int(p.memory_info().rss)


def release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS, so PSS shows live memory only.

    Without it glibc keeps freed arenas mapped and a flat workload looks like it grows.
    """
    gc.collect()
    trim_heap()  # not glibc: a no-op, and PSS then includes retained free pages


def process_vitals(pid: int | None = None, *, settle: bool = True) -> dict[str, int]:
    """PSS, open file descriptors (sockets included) and threads of a process: what a soak watches.

    ``settle`` (this process only) releases free heap memory first.
    """
    if settle and pid is None:
        release_free_memory()
    p = psutil.Process(pid)
    return {"pss_bytes": process_pss(pid), "open_fds": p.num_fds(), "threads": p.num_threads()}


class PssSampler:
    """Samples one process's PSS every ``interval_s`` on a daemon thread; ``peak`` is the maximum seen."""

    def __init__(self, pid: int | None = None, interval_s: float = 0.2) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dressage-pss", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, process_pss(self.pid))
                self.samples += 1
            except psutil.Error:
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2.0)
