"""Fixtures shared by the unit tests of one area."""

from __future__ import annotations

import pytest

from dressage.tq.storage import MemoryStorageUnit
from dressage.tq.storage.remote import RemoteStorageUnit
from dressage.tq.storage.server import StorageUnitServer

SHM_SECRET = b"s" * 32


@pytest.fixture
def served():
    """A memory StorageUnit served over its sockets with a secret (``SHM_SECRET``), and a handle of it
    from this process: ``(backend, server, remote)``. On a host with /dev/shm the handle's puts take
    the shared-memory path."""
    backend = MemoryStorageUnit("m0", memory_budget=8 << 20)
    server = StorageUnitServer(backend, secret=SHM_SECRET).start()
    remote = RemoteStorageUnit.describe("m0", server.address, timeout_s=5, secret=SHM_SECRET)
    yield backend, server, remote
    remote.close()
    server.stop()
    backend.close()


@pytest.fixture
def intruder(served):
    """A handle of the ``served`` unit on its host (shared memory, stream socket) holding the wrong
    secret."""
    _, server, remote = served
    d, _ = remote._rpc.call("describe")
    handle = RemoteStorageUnit("m0", server.address, timeout_s=5, host_id=d["host_id"], shm_token=d["shm_token"],
                               secret=b"w" * 32, bulk_port=d["bulk_port"])
    yield handle
    handle.close()
