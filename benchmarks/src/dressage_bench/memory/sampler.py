"""Per-component memory of the master's trajectory data plane, sampled on a timer in its own thread.

A component is a set of processes plus shared-memory files. Its figure is the sum over its pids of
``Pss - Pss_Shmem`` plus the ``st_blocks * 512`` of every shared-memory file it maps or holds open,
each file counted once (the Ray object store is the plasma file its raylet holds open).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

__all__ = ["ComponentSpec", "Timeline", "MemorySampler", "smaps_private", "plasma_file", "raylet_pid"]

_SHM_DIR = "/dev/shm/"
# Open fds and maps are re-scanned this often (seconds): shared-memory files come and go slowly.
_RESCAN_S = 1.0


def smaps_private(pid: int) -> int:
    """``Pss - Pss_Shmem`` of a process in bytes (0 once it exited)."""
    pss = shmem = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Pss_Shmem:"):
                    shmem = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    return pss - shmem


def raylet_pid(store_socket: str) -> int | None:
    """The raylet whose command line names ``store_socket`` (one simulated node's raylet)."""
    import psutil

    want = f"--store_socket_name={store_socket}"
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if "raylet" in (p.info["name"] or "") and want in (p.info["cmdline"] or ()):
                return p.pid
        except psutil.Error:
            continue
    return None


def plasma_file(raylet: int) -> str | None:
    """``/proc/<raylet>/fd/N`` of the raylet's object store file (stat-able although deleted)."""
    try:
        fds = os.listdir(f"/proc/{raylet}/fd")
    except OSError:
        return None
    for fd in fds:
        path = f"/proc/{raylet}/fd/{fd}"
        try:
            if "plasma" in os.readlink(path):
                return path
        except OSError:
            continue
    return None


def _shm_files(pid: int) -> dict[tuple[int, int], str]:
    """``{(st_dev, st_ino): path to stat}`` of the /dev/shm files (plasma excluded) a process maps or holds open."""
    out: dict[tuple[int, int], str] = {}
    paths = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if _SHM_DIR in line and "plasma" not in line:
                    paths.append(f"/proc/{pid}/map_files/{line.split()[0]}")
    except OSError:
        return out
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target.startswith(_SHM_DIR) and "plasma" not in target:
                paths.append(link)
    except OSError:
        pass
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.setdefault((st.st_dev, st.st_ino), p)
    return out


@dataclass(frozen=True, slots=True)
class ComponentSpec:
    """What one component is made of: processes, and optionally a file to count whole (an object store)."""

    name: str
    pids: tuple[int, ...] = ()
    file: str | None = None
    in_metric: bool = True
    """Part of M_master (components outside it are recorded for context only)."""


@dataclass(slots=True)
class Timeline:
    """Samples of every component (bytes) at times ``t`` (seconds since the sampler started)."""

    names: tuple[str, ...]
    metric: tuple[str, ...]
    t: list[float] = field(default_factory=list)
    values: dict[str, list[int]] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)

    def master(self) -> list[int]:
        """M_master at each sample: the metric components' sum at one instant."""
        return [sum(self.values[n][i] for n in self.metric) for i in range(len(self.t))]

    def peak(self, name: str, since: float = 0.0) -> int:
        vals = [v for t, v in zip(self.t, self.values[name]) if t >= since]
        return max(vals, default=0)

    def master_peak(self, since: float = 0.0) -> tuple[int, float]:
        """(peak of the sum, when)."""
        best, when = 0, 0.0
        for t, v in zip(self.t, self.master()):
            if t >= since and v > best:
                best, when = v, t
        return best, when

    def mean_between(self, name: str, start: float, stop: float) -> int:
        vals = [v for t, v in zip(self.t, self.values[name]) if start <= t <= stop]
        return int(sum(vals) / len(vals)) if vals else 0

    def to_dict(self) -> dict[str, object]:
        return {"t": [round(t, 3) for t in self.t], "values": self.values, "master": self.master(),
                "marks": [{"t": round(t, 3), "label": label} for t, label in self.marks]}


class MemorySampler:
    """Samples every component each ``interval_s`` on a daemon thread (``with`` starts and stops it)."""

    def __init__(self, components: Sequence[ComponentSpec], interval_s: float = 0.15,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.components = list(components)
        self.interval_s = float(interval_s)
        self._clock = clock
        self.timeline = Timeline(names=tuple(c.name for c in self.components),
                                 metric=tuple(c.name for c in self.components if c.in_metric))
        for c in self.components:
            self.timeline.values[c.name] = []
        self._t0 = clock()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="dressage-memory-sampler", daemon=True)
        self._shm: dict[str, dict[tuple[int, int], str]] = {}
        self._last_scan = -_RESCAN_S

    def now(self) -> float:
        return self._clock() - self._t0

    def mark(self, label: str) -> None:
        """Annotate the timeline (a phase boundary of the loop)."""
        with self._lock:
            self.timeline.marks.append((self.now(), label))

    def sample_once(self) -> Mapping[str, int]:
        now = self.now()
        if now - self._last_scan >= _RESCAN_S:
            self._rescan()
            self._last_scan = now
        row: dict[str, int] = {}
        for c in self.components:
            total = sum(smaps_private(pid) for pid in c.pids)
            if c.file is not None:
                try:
                    total += os.stat(c.file).st_blocks * 512
                except OSError:
                    pass
            for path in self._shm.get(c.name, {}).values():
                try:
                    total += os.stat(path).st_blocks * 512
                except OSError:
                    pass  # unmapped or closed since the last scan: it no longer counts
            row[c.name] = total
        with self._lock:
            self.timeline.t.append(now)
            for name, v in row.items():
                self.timeline.values[name].append(v)
        return row

    def _rescan(self) -> None:
        # A file mapped by two components is charged once, to the one listed last: StorageUnits come
        # after their writers, and a StorageUnit keeps the segment a writer only passed through.
        seen: set[tuple[int, int]] = set()
        shm: dict[str, dict[tuple[int, int], str]] = {}
        for c in reversed(self.components):
            own: dict[tuple[int, int], str] = {}
            for pid in c.pids:
                for ident, path in _shm_files(pid).items():
                    if ident not in seen:
                        seen.add(ident)
                        own[ident] = path
            shm[c.name] = own
        self._shm = shm

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = self._clock()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (self._clock() - start)))

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
