"""The shared secret of one deployment: configured, or generated when none is.

Every ``local`` and ``ray`` deployment (and an embedded one once it is served over ZMQ) authenticates
its frames, on loopback too: any local user can connect to a loopback port, and without the secret
must not be able to mark units dead, add units or delete keys. With no ``auth_secret`` and no
``$DRESSAGE_TQ_SECRET`` a random one is made per deployment, written to a 0600 file in a 0700
directory of its own (for other processes of the same run to read) and handed to the child
processes through their environment, to Ray actors as an argument and to ``client_spec()``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

from dressage.tq.config import TransferQueueConfig

__all__ = ["DeploymentSecret"]


class DeploymentSecret:
    """``value``: the MAC key (None only with ``authenticate: false``); ``path``: the file a
    generated key was written to (removed by :meth:`remove`)."""

    def __init__(self, config: TransferQueueConfig) -> None:
        self.value: bytes | None = config.secret
        self.path: Path | None = None
        self.generated = False
        if self.value is None and config.authenticate:
            self.value = secrets.token_urlsafe(32).encode()
            self.generated = True
            folder = Path(tempfile.mkdtemp(prefix="dressage-tq-"))  # created 0700
            path = folder / "secret"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, self.value)
            finally:
                os.close(fd)
            self.path = path

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path.parent, ignore_errors=True)
            self.path = None
