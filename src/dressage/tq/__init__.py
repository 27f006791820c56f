"""TransferQueue: large trajectory fields live in StorageUnits; only FieldRefs travel.

``TransferQueue.start(config)`` brings up a deployment (embedded, local processes, Ray actors, or the
public TransferQueue on Ray); ``.client()`` puts arrays and gets them back by reference. See docs/transferqueue.md.
"""

from dressage.tq.client.client import ClientCounters, TransferQueueClient
from dressage.tq.config import TransferQueueConfig, load_config
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo
from dressage.tq.deploy.transfer_queue import TransferQueue
from dressage.fields.refs import FieldRef
from dressage.tq.storage import MemoryStorageUnit, SpillStorageUnit, StorageUnit

__all__ = [
    "FieldRef", "TransferQueue", "TransferQueueClient", "ClientCounters", "TransferQueueConfig",
    "load_config", "Controller", "KeyState", "UnitInfo", "StorageUnit", "MemoryStorageUnit",
    "SpillStorageUnit",
]
