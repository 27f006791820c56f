"""A StorageUnit whose bytes live in a running public TransferQueue (PyPI ``transferqueue``), reached
through its ``kv_put`` / ``kv_batch_get`` / ``kv_clear`` / ``kv_list`` API in the step layout that
upstream Dressage's transport writes, so that trainers built for that layout read our Proxy's Steps.

Layout: a Proxy key ``{session}/{incarnation}.{call}/{field}`` is the column ``STEP_COLUMNS[field]`` of the row
``{store_id}:{session}:{incarnation}:step:{call}`` in partition ``dressage:{store_id}:steps``, tagged with
``expires_at`` (Unix seconds), ``trajectory_id`` and ``incarnation_id``. ``logprobs`` is a float32 tensor
(``response_logprobs``); ``routed_experts`` is one chunk ``{"data", "row_count", "dtype"}`` in its storage
dtype (``response_routed_experts_chunks``). Any other key is the column ``value`` of ``{store_id}:{key}``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.errors import KeyNotFoundError, StorageFullError, StorageUnitUnavailable, TransferQueueError
from dressage.tq.storage.base import BlobInfo, RowRequest, StorageUnit

__all__ = ["KVStorageUnit", "KVLocation", "STEP_COLUMNS", "step_partition", "kv_location", "upstream_field_ref"]

STEP_COLUMNS = {"logprobs": "response_logprobs", "routed_experts": "response_routed_experts_chunks"}
"""Our StepRecord's offloaded fields and the columns upstream's transport stores them under."""
_CHUNKED = "response_routed_experts_chunks"
_OTHER_COLUMN = "value"
# ``{session}/{incarnation}.{call}/{field}``: the keys ProxyCore gives each offloaded field of a Step.
_STEP_KEY = re.compile(r"^(?P<session>.+)/(?P<incarnation>[^/.]+)\.(?P<call>0|[1-9]\d*)/(?P<field>[^/]+)$")


def step_partition(store_id: str) -> str:
    """The partition upstream's transport keeps a store's Steps in."""
    return f"dressage:{store_id}:steps"


@dataclass(frozen=True, slots=True)
class KVLocation:
    """Where one of our keys lives in the public TransferQueue: a row (``kv_key``) and a column."""

    kv_key: str
    column: str
    tag: dict[str, Any]


def kv_location(store_id: str, key: str) -> KVLocation:
    """The row, column and retention tag (less ``expires_at``) of ``key`` in store ``store_id``."""
    m = _STEP_KEY.match(key)
    if m is not None and m["field"] in STEP_COLUMNS:
        session, incarnation = m["session"], m["incarnation"]
        return KVLocation(f"{store_id}:{session}:{incarnation}:step:{int(m['call'])}", STEP_COLUMNS[m["field"]],
                          {"trajectory_id": session, "incarnation_id": incarnation})
    return KVLocation(f"{store_id}:{key}", _OTHER_COLUMN, {})


def upstream_field_ref(store_id: str, key: str) -> dict[str, Any]:
    """Upstream Dressage's reference (``dressage.tq.field-ref.v1``) to the column holding ``key``: what its
    trainer's hydration reads with ``kv_batch_get(keys=[key], partition_id=partition, select_fields=field)``."""
    loc = kv_location(store_id, key)
    return {"schema_version": "dressage.tq.field-ref.v1", "store_id": store_id, "partition": step_partition(store_id),
            "key": loc.kv_key, "field": loc.column, "incarnation_id": loc.tag.get("incarnation_id", "")}


class KVStorageUnit(StorageUnit):
    """Blobs stored as columns of rows in a public TransferQueue already initialised in this process
    (``transfer_queue.init``). What the unit knows of each blob (dtype, shape, size) stays here, so
    ``info``/``exists``/``list`` cost no round trip; reads fetch whole columns and cut the rows here.

    ``memory_budget`` bounds the bytes this unit has written and not yet deleted (the public
    TransferQueue has no byte budget of its own). ``retention_s`` sets each row's ``expires_at`` tag.
    """

    supports_spill = False

    def __init__(self, unit_id: str, *, store_id: str, api: Any = None, node_id: str | None = None,
                 memory_budget: int = 4 << 30, retention_s: float | None = None) -> None:
        super().__init__(unit_id, node_id=node_id, memory_budget=memory_budget)
        if not isinstance(store_id, str) or not store_id or ":" in store_id:
            raise TransferQueueError(f"store_id must be a non-empty string without ':', got {store_id!r}")
        if api is None:
            import transfer_queue as api  # the optional extra ``transferqueue``
        self._api = api
        self.store_id = store_id
        self.partition = step_partition(store_id)
        self.retention_s = retention_s
        self._blobs: dict[str, tuple[BlobInfo, KVLocation]] = {}
        self._rows: dict[str, set[str]] = {}     # kv_key -> our keys stored in its columns
        self._bytes = 0
        self._fetched: dict[str, np.ndarray] | None = None

    # docstrings inherited from tq/storage/base.py:StorageUnit
    def _write(self, key: str, array: np.ndarray, *, copy: bool, sums: Any = None, tag: Any = None) -> BlobInfo:
        import torch

        if self._bytes + array.nbytes > self.memory_budget:
            raise StorageFullError(f"unit {self.unit_id}: {array.nbytes} bytes do not fit in "
                                   f"{self.memory_budget - self._bytes} left of its budget")
        loc = kv_location(self.store_id, key)
        if loc.column == _CHUNKED:
            value: Any = [{"data": np.ascontiguousarray(array).reshape(-1).copy(), "row_count": int(array.shape[0]),
                           "dtype": array.dtype.name}]
        else:
            # A private copy: the put is serialised before kv_put returns, but the tensor must not
            # share the caller's buffer (nor be read-only, which torch refuses).
            value = torch.from_numpy(np.array(array, copy=True))
        tag = dict(loc.tag)
        tag["expires_at"] = float("inf") if self.retention_s is None else time.time() + self.retention_s
        self._call("kv_put", key=loc.kv_key, partition_id=self.partition, fields={loc.column: value}, tag=tag)
        info = BlobInfo(key, array.dtype.name, tuple(array.shape), int(array.nbytes))
        self._blobs[key] = (info, loc)
        self._rows.setdefault(loc.kv_key, set()).add(key)
        self._bytes += info.nbytes
        return info

    def _info(self, key: str) -> BlobInfo | None:
        entry = self._blobs.get(key)
        return None if entry is None else entry[0]

    def get_many(self, requests: Sequence[RowRequest]) -> list[np.ndarray]:
        # One kv_batch_get per column for every stored key asked for; ``_read`` then cuts rows.
        with self._lock:
            self._fetched = self._fetch([k for k, _, _ in requests if k in self._blobs])
            try:
                return super().get_many(requests)
            finally:
                self._fetched = None

    def _fetch(self, keys: list[str]) -> dict[str, np.ndarray]:
        by_column: dict[str, list[str]] = {}
        for key in dict.fromkeys(keys):
            by_column.setdefault(self._blobs[key][1].column, []).append(key)
        out: dict[str, np.ndarray] = {}
        for column, ours in by_column.items():
            rows = list(dict.fromkeys(self._blobs[k][1].kv_key for k in ours))
            data = self._call("kv_batch_get", keys=rows, partition_id=self.partition, select_fields=column,
                              missing=ours)
            try:
                values = data[column]
            except KeyError:
                raise KeyNotFoundError(f"column {column!r} of {len(rows)} row(s) not found in TransferQueue "
                                       f"partition {self.partition!r} (unit {self.unit_id})") from None
            index = {row: i for i, row in enumerate(rows)}
            for key in ours:
                info, loc = self._blobs[key]
                out[key] = self._decode(values[index[loc.kv_key]], info)
        return out

    @staticmethod
    def _decode(item: Any, info: BlobInfo) -> np.ndarray:
        item = getattr(item, "data", item)
        if isinstance(item, list):  # routed-expert chunks, concatenated in order
            parts = [np.asarray(getattr(c, "data", c)["data"]) for c in item]
            flat = np.concatenate(parts) if parts else np.zeros(0, dtype=info.dtype)
        else:
            flat = item.detach().cpu().numpy() if hasattr(item, "detach") else np.asarray(item)
        arr = np.ascontiguousarray(flat, dtype=np.dtype(info.dtype)).reshape(info.shape)
        arr.flags.writeable = False
        return arr

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        fetched = self._fetched
        whole = fetched[key] if fetched is not None and key in fetched else self._fetch([key])[key]
        return whole[start:stop]

    def delete(self, keys: Iterable[str]) -> int:
        with self._lock:
            emptied: list[str] = []
            removed = 0
            for key in dict.fromkeys(keys):
                entry = self._blobs.pop(key, None)
                if entry is None:
                    continue
                removed += 1
                self._bytes -= entry[0].nbytes
                left = self._rows.get(entry[1].kv_key)
                if left is not None:
                    left.discard(key)
                    if not left:  # a row goes once none of its columns is referenced any more
                        del self._rows[entry[1].kv_key]
                        emptied.append(entry[1].kv_key)
            if emptied:
                self._call("kv_clear", keys=emptied, partition_id=self.partition)
            self._counts["deletes"] += removed
            return removed

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._blobs

    def list(self) -> list[str]:
        with self._lock:
            return list(self._blobs)

    def usage(self) -> dict[str, int]:
        with self._lock:
            return {"keys": len(self._blobs), "bytes": self._bytes, "memory_bytes": self._bytes,
                    "spilled_bytes": 0}

    # -- the public TransferQueue's own view ---------------------------------------------------
    def kv_rows(self) -> dict[str, dict[str, Any]]:
        """``{kv_key: tag}`` of every row of this store's partition, as ``kv_list`` reports them (rows
        other writers of the same store put there included)."""
        listing = self._call("kv_list", partition_id=self.partition)
        return dict((listing or {}).get(self.partition, {}))

    def sweep_expired(self, now: float | None = None) -> int:
        """Clear every row of the partition whose ``expires_at`` tag has passed (whoever wrote it),
        forgetting the blobs this unit held in them; returns the number of rows cleared."""
        deadline = time.time() if now is None else float(now)
        with self._lock:
            expired = sorted(row for row, tag in self.kv_rows().items()
                             if float((tag or {}).get("expires_at", float("inf"))) <= deadline)
            if not expired:
                return 0
            self._call("kv_clear", keys=expired, partition_id=self.partition)
            for row in expired:
                for key in self._rows.pop(row, ()):
                    info, _ = self._blobs.pop(key)
                    self._bytes -= info.nbytes
            return len(expired)

    def _call(self, verb: str, *, missing: Sequence[str] = (), **kwargs: Any) -> Any:
        """One call of the public API, its errors translated: a missing row is KeyNotFoundError, any
        other failure StorageUnitUnavailable."""
        try:
            return getattr(self._api, verb)(**kwargs)
        except ValueError as exc:
            if missing and "not found" in str(exc):
                raise KeyNotFoundError(
                    f"{len(missing)} key(s) not found in unit {self.unit_id} (TransferQueue partition "
                    f"{self.partition!r}): {', '.join(map(repr, list(missing)[:8]))}") from exc
            raise StorageUnitUnavailable(f"TransferQueue {verb} failed for unit {self.unit_id}: {exc}") from exc
        except Exception as exc:  # Ray, ZMQ and TransferQueue errors: the store is out of reach
            raise StorageUnitUnavailable(f"TransferQueue {verb} failed for unit {self.unit_id}: {exc}") from exc
