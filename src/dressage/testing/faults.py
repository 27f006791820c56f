"""Fault injection for TransferQueue deployments, through public handles only.

A unit process is signalled by the pid :meth:`TransferQueue.processes` reports (``local``: a child
process per unit; ``ray``: the actor's worker process). A stored blob is corrupted through the array an
in-process unit's ``get`` returns, which is a view of the stored bytes. Nothing here reaches into a
deployment's or a backend's private state.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from dressage.errors import TransferQueueError
from dressage.tq import StorageUnit, TransferQueue

__all__ = ["unit_pid", "kill_unit", "stopped_unit", "corrupt_blob", "wait_unit_state"]


def unit_pid(tq: TransferQueue, unit_id: str) -> int:
    """The pid of the process that holds ``unit_id``'s data (TransferQueueError if it has none)."""
    units = {u.unit_id for u in tq.units()}
    if unit_id not in units:
        raise TransferQueueError(f"no StorageUnit {unit_id!r} (units: {', '.join(sorted(units))})")
    pid = tq.processes().get(unit_id)
    if pid is None:
        raise TransferQueueError(f"the {tq.deployment} deployment runs StorageUnit {unit_id} in this process: "
                                 "there is no unit process to signal (use deployment local or ray)")
    return int(pid)


def kill_unit(tq: TransferQueue, unit_id: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` (default SIGKILL) to the unit's process; returns its pid."""
    pid = unit_pid(tq, unit_id)
    os.kill(pid, sig)
    return pid


@contextlib.contextmanager
def stopped_unit(tq: TransferQueue, unit_id: str) -> Iterator[int]:
    """SIGSTOP the unit's process for the ``with`` block (it answers nothing), SIGCONT after; yields the pid."""
    pid = kill_unit(tq, unit_id, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def corrupt_blob(unit: StorageUnit, key: str, byte: int) -> None:
    """Flip every bit of byte ``byte`` of ``key``'s stored bytes in place, as a bad DIMM would.

    Works on in-process backends whose reads are views of the stored bytes (``MemoryStorageUnit``, keys
    a ``SpillStorageUnit`` holds in memory). A remote handle, or a read that returns a fresh copy each
    time, is refused with TransferQueueError: flipping a copy would prove nothing.
    """
    if getattr(unit, "remote", False):
        raise TransferQueueError(f"unit {unit.unit_id} is a remote handle: corrupt the blob in the unit's process")
    first, second = unit.get(key), unit.get(key)
    if first.nbytes and first.ctypes.data != second.ctypes.data:
        raise TransferQueueError(f"unit {unit.unit_id} returns copies of {key!r}, not its stored bytes")
    if not 0 <= byte < first.nbytes:
        raise TransferQueueError(f"byte {byte} is outside the {first.nbytes} stored bytes of {key!r}")
    addr = first.ctypes.data + byte
    old = ctypes.c_uint8.from_address(addr).value
    ctypes.memset(addr, old ^ 0xFF, 1)


def wait_unit_state(tq: Any, unit_id: str, state: str, timeout_s: float, poll_s: float = 0.02) -> float:
    """Wait until the Controller reports ``unit_id`` in ``state`` (``live`` / ``dead``); returns the seconds
    it took. AssertionError, with the last state seen, if it does not within ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        seen = tq.unit_states()[unit_id]
        if seen["state"] == state:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{unit_id} not {state} within {timeout_s} s: {seen}")
        time.sleep(poll_s)
