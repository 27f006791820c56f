"""A link of a set rate on the loopback device, for a curve whose processes stand for several hosts.

On one host, a StorageUnit process and its writer share the machine's cores and loopback moves bytes as
fast as a core copies them: what is measured is CPU, and every pass over the bytes (a MAC, a checksum)
costs as much as the copy itself. Between two hosts the link sets the pace and each side has its own
cores. ``ShapedLoopback`` puts a token-bucket filter (``tc qdisc ... tbf``) of ``rate_gbit`` on the
loopback device for the duration of a ``with`` block, so TransferQueue and its bare-TCP floor both cross
a link of a data centre's speed. It needs root and ``tc`` (iproute2), and it shapes every loopback byte
of the machine while it is in place: it refuses to replace a root qdisc someone else set, and takes its
own away on the way out, also after a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Callable

__all__ = ["ShapedLoopback", "LinkError"]

# The bucket holds a millisecond of the rate. The kernel's tbf refills it on a high-resolution timer, so
# that is enough to hold the rate (a steady 32.8 MB send at 25 Gbit/s: 3.12 GB/s with a bucket of 3.1 MB,
# as with 12.5 MB; 2.9 GB/s with 1 MiB), while a larger bucket lets a sender that was idle run faster than
# the link for as long as it lasts: 12.5 MB is 4 ms of a 50 ms round, a burst no link between hosts allows.
_BURST_S = 0.001
_MIN_BURST = 256 << 10   # at any rate: a few of loopback's 64 KiB packets
_DEFAULT_QDISCS = ("noqueue", "pfifo_fast", "fq_codel")


class LinkError(RuntimeError):
    """The link cannot be shaped here (not root, no ``tc``, or the device has a qdisc of someone else's)."""


class ShapedLoopback:
    """``with ShapedLoopback(25): ...``: loopback at 25 Gbit/s inside the block."""

    def __init__(self, rate_gbit: float, *, device: str = "lo",
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> None:
        if not rate_gbit > 0:
            raise LinkError(f"a link rate must be positive, got {rate_gbit!r} Gbit/s")
        self.rate_gbit = float(rate_gbit)
        self.device = device
        self.burst = max(_MIN_BURST, int(self.rate_gbit * 1e9 / 8 * _BURST_S))
        self._run = run
        self._applied = False

    def add_command(self) -> list[str]:
        return ["tc", "qdisc", "add", "dev", self.device, "root", "tbf", "rate", f"{self.rate_gbit:g}gbit",
                "burst", str(self.burst), "latency", "10ms"]

    def delete_command(self) -> list[str]:
        return ["tc", "qdisc", "del", "dev", self.device, "root"]

    def describe(self) -> dict[str, Any]:
        return {"device": self.device, "rate_gbit": self.rate_gbit, "qdisc": " ".join(self.add_command()[6:])}

    def _tc(self, argv: list[str]) -> str:
        done = self._run(argv, capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise LinkError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip() or f'exit {done.returncode}'}")
        return done.stdout

    def check(self) -> None:
        """Raise :class:`LinkError` unless the link can be shaped here now (also before the run it is for)."""
        if os.geteuid() != 0:
            raise LinkError("shaping the loopback link takes root (tc qdisc on the device); run without a link rate")
        if shutil.which("tc") is None:
            raise LinkError("shaping the loopback link takes tc (iproute2: apt-get install iproute2)")
        current = self._tc(["tc", "qdisc", "show", "dev", self.device]).split()
        if len(current) >= 2 and current[0] == "qdisc" and current[1] not in _DEFAULT_QDISCS:
            raise LinkError(f"{self.device} already has a root qdisc ({' '.join(current[:3])}), not this bench's: "
                            "it is left as it is; remove it or run without a link rate")

    def __enter__(self) -> "ShapedLoopback":
        self.check()
        self._tc(self.add_command())
        self._applied = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._applied:
            self._applied = False
            self._tc(self.delete_command())
