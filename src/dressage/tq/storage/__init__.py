"""StorageUnit backends behind one interface: in-process memory, memory with spill to disk, remote (ZMQ)."""

from dressage.tq.storage.base import BlobInfo, RowRequest, StorageUnit
from dressage.tq.storage.memory import MemoryStorageUnit
from dressage.tq.storage.spill import SpillStorageUnit

__all__ = ["StorageUnit", "BlobInfo", "RowRequest", "MemoryStorageUnit", "SpillStorageUnit",
           "RemoteStorageUnit", "make_storage_unit"]


def make_storage_unit(unit_id: str, *, node_id: str | None, memory_budget: int, on_full: str,
                      spill_dir: str | None, checksums: bool = True,
                      verify_local_reads: bool = False) -> StorageUnit:
    """The backend a config asks for: spilling when ``on_full == "spill"``, plain memory otherwise."""
    if on_full == "spill":
        return SpillStorageUnit(unit_id, node_id=node_id, memory_budget=memory_budget, spill_dir=spill_dir,
                                checksums=checksums, verify_local_reads=verify_local_reads)
    return MemoryStorageUnit(unit_id, node_id=node_id, memory_budget=memory_budget, checksums=checksums,
                             verify_local_reads=verify_local_reads)


def __getattr__(name: str):
    if name == "RemoteStorageUnit":  # imports zmq; only when asked for
        from dressage.tq.storage.remote import RemoteStorageUnit

        return RemoteStorageUnit
    raise AttributeError(name)
