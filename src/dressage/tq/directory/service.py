"""The Controller over ZMQ: its server (with the Janitor) and its remote twin.

``RemoteController`` has the same methods as :class:`Controller`, so clients do not care where the
directory lives. The process entry point is :mod:`dressage.tq.directory.main`; with
``$DRESSAGE_TQ_SECRET`` set, every frame is authenticated. Leased placements, a put's only message to the
Controller, go on a stream socket of its own (``ControllerServer.stream``) rather than ZMQ.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dressage.errors import ProtocolError, StorageUnitUnavailable
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import KeyState, UnitInfo
from dressage.tq.directory.ops import LEASE_OPS, lease_op, opt_str, place_items, str_list, unit_from_wire
from dressage.tq.directory.janitor import Janitor
from dressage.tq.transport.bulk_rpc import BulkClient, BulkServer
from dressage.tq.directory.lease import SoonCommits
from dressage.tq.transport.zmq import RpcClient, RpcServer
from dressage.tq.transport.wire import MAX_KEY_BYTES, key_pages, max_keys, text, uint

__all__ = ["ControllerServer", "RemoteController"]

log = logging.getLogger(__name__)


def _no_payload(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)  # never more than 0 bytes: the stream's limit refuses any payload


class ControllerServer:
    """Serves a Controller: every op is a short in-memory call, so the loop never waits on anyone.

    Besides the ZMQ socket it serves the same ops on a stream socket of its own (``tq/transport/bulk_rpc.py``,
    one thread per connection; the Controller takes its lock for every op): a leased put's placement
    goes there, a plain TCP round trip instead of one through ZMQ's I/O threads on both sides. Its
    port is in the ``lease`` and ``ping`` replies (``stream_port``). The stream's rules are the bulk
    socket's: every message tagged and checked with a secret, nothing pickled, a refusal answered."""

    def __init__(self, controller: Controller, *, host: str = "127.0.0.1", port: int = 0,
                 janitor: Janitor | None = None, secret: bytes | None = None, stream: bool = True) -> None:
        self.controller = controller
        self.janitor = janitor
        self.rpc = RpcServer(self._handle, host=host, port=port, name="controller", secret=secret)
        self.stream: BulkServer | None = None
        if stream:
            try:
                self.stream = BulkServer(self._handle, host=host, port=0, name="controller-stream", secret=secret,
                                         max_message_bytes=0, alloc=_no_payload)
            except BaseException:
                self.rpc.stop()
                raise

    @property
    def address(self) -> str:
        return self.rpc.address

    @property
    def stream_port(self) -> int | None:
        return self.stream.port if self.stream is not None else None

    def start(self) -> "ControllerServer":
        if self.stream is not None:
            self.stream.start()
        self.rpc.start()
        return self

    def start_stream(self) -> None:
        """Start only the stream socket (the process entry point runs the ZMQ loop itself)."""
        if self.stream is not None:
            self.stream.start()

    def stop(self) -> None:
        self.rpc.stop()
        if self.stream is not None:
            self.stream.stop()

    def _handle(self, c: dict[str, Any], frames: list[Any]) -> tuple[dict[str, Any], Sequence[Any]]:
        if frames:
            raise ProtocolError("controller requests carry no payload frames")
        ctl, op = self.controller, c["op"]
        if op == "place":
            checked = place_items(c.get("items"))
            unit = ctl.place_many(checked, node_id=opt_str(c.get("node_id"), "node_id"),
                                  batch=opt_str(c.get("batch"), "batch"))
            return {"unit_id": unit}, ()
        if op in LEASE_OPS:
            reply = lease_op(ctl, op, c)
            if op == "lease" and self.stream is not None:
                reply["stream_port"] = self.stream.port
            return reply, ()
        if op == "commit":
            ctl.commit_many(str_list(c.get("keys"), "keys"), unit_id=opt_str(c.get("unit_id"), "unit_id"))
            return {}, ()
        if op == "abort":
            unit_down = c.get("unit_down", False)
            if not isinstance(unit_down, bool):
                raise ProtocolError("'unit_down' must be true or false")
            ctl.abort_many(str_list(c.get("keys"), "keys"), unit_down=unit_down)
            return {}, ()
        if op == "consumed":
            return {"n": ctl.mark_consumed(str_list(c.get("keys"), "keys"))}, ()
        if op == "touch":
            return {"n": ctl.touch(str_list(c.get("keys"), "keys"))}, ()
        if op == "retention":
            return {"retention_s": ctl.retention()}, ()
        if op == "set_batch":
            return {"n": ctl.set_batch(str_list(c.get("keys"), "keys"), opt_str(c.get("batch"), "batch"))}, ()
        if op == "delete":
            return {"placement": ctl.delete(str_list(c.get("keys"), "keys"))}, ()
        if op == "deleted":
            ctl.deleted(text(c.get("unit_id"), "unit_id", max_len=MAX_KEY_BYTES, empty=False),
                        str_list(c.get("keys"), "keys"))
            return {}, ()
        if op == "clear":
            batch = text(c.get("batch"), "batch")
            # One page of the batch per answer, so no clear builds an answer past the request bounds.
            limit = min(uint(c.get("limit", max_keys()), "limit", 1 << 62), max_keys()) or max_keys()
            return {"placement": ctl.clear(batch, limit=limit)}, ()
        if op == "state":
            state = ctl.state(text(c.get("key"), "key", max_len=MAX_KEY_BYTES))
            return {"state": None if state is None else state.value}, ()
        if op == "where":
            return {"where": ctl.where(str_list(c.get("keys"), "keys"))}, ()
        if op == "keys":  # paged like every call that carries keys
            page, nxt = ctl.keys_page(opt_str(c.get("batch"), "batch"), start=uint(c.get("start", 0), "start", 1 << 62),
                                      limit=max_keys())
            return {"keys": page, "next": nxt}, ()
        if op == "total_keys":
            return {"n": ctl.total_keys()}, ()
        if op == "stats":
            return {"stats": ctl.stats(), "pid": os.getpid()}, ()
        if op == "units":
            return {"units": [u.to_wire() for u in ctl.units()]}, ()
        if op == "add_unit":
            ctl.add_unit(unit_from_wire(c.get("unit")))
            return {}, ()
        if op == "unit_state":
            uid, state = text(c.get("unit_id"), "unit_id", max_len=MAX_KEY_BYTES), c.get("state")
            if state not in ("live", "dead"):
                raise ProtocolError("unit_state needs a unit_id and a state of 'live' or 'dead'")
            if state == "dead":
                return {"changed": ctl.mark_unit_dead(uid, text(c.get("reason", ""), "reason"))}, ()
            return {"changed": ctl.mark_unit_live(uid)}, ()
        if op == "unit_states":
            return {"states": ctl.unit_states()}, ()
        if op == "sweep":
            # Admin/test hook: runs unit deletions on this loop, bounded by the units' timeouts.
            return {"removed": self.janitor.run_once() if self.janitor else 0}, ()
        if op == "ping":
            return {"pid": os.getpid(), "stream_port": self.stream_port}, ()
        raise ProtocolError(f"unknown controller op {op!r:.40}")


class _StreamPlacement:
    """A placement sent on the Controller's stream. A stream that breaks before its reply (a connection
    reset or a reply that did not come in time, not a refusal) is no verdict on the Controller: the same
    placement is sent again on ZMQ and its answer, or its timeout, is the put's. (The unit may already hold
    the put's copy: placing the put again elsewhere would then meet it as a write-once conflict.) Had the
    first one been applied (a Controller that stalled past the timeout applies it when it resumes), the
    second carries the same placement id and is answered as the first was."""

    __slots__ = ("_owner", "_pending", "_control", "_keys")

    def __init__(self, owner: "RemoteController", pending: Any, control: dict[str, Any], keys: list[str]) -> None:
        self._owner, self._pending, self._control, self._keys = owner, pending, control, keys

    def wait(self) -> tuple[dict[str, Any], list[Any]]:
        try:
            return self._pending.wait()
        except StorageUnitUnavailable:
            owner = self._owner
            owner._drop_stream(self._pending.client)
            return owner._rpc.call("place_leased", self._control, keys=self._keys)


class RemoteController:
    """Client-side twin of :class:`Controller` (same method names and results)."""

    remote = True

    def __init__(self, address: str, *, timeout_s: float = 30.0, secret: bytes | None = None) -> None:
        self.address = address
        self._rpc = RpcClient(address, timeout_s=timeout_s, name="TransferQueue controller", secret=secret)
        self._secret = secret
        self._soon = SoonCommits(self._send_commits)
        self._stream: BulkClient | None = None  # the Controller's stream socket, once a reply named it
        self._stream_lock = threading.Lock()
        self._closed = False

    def _learn_stream(self, port: Any) -> None:
        """A reply named the Controller's stream port: leased placements go there from now on."""
        if self._stream is not None or port is None:
            return
        with self._stream_lock:
            if self._stream is None and not self._closed:
                self._stream = BulkClient.beside(self.address, port, timeout_s=self._rpc.timeout_s,
                                                 name=self._rpc.name, secret=self._secret)

    def place(self, key: str, nbytes: int, *, node_id: str | None = None, batch: str | None = None,
              field: str = "") -> str:
        return self.place_many([(key, nbytes, field)], node_id=node_id, batch=batch)

    def place_many(self, items: Sequence[tuple[str, int, str]], *, node_id: str | None = None,
                   batch: str | None = None) -> str:
        wire_items = [[k, int(n), f] for k, n, f in items]
        r, _ = self._rpc.call("place", {"items": wire_items, "node_id": node_id, "batch": batch},
                              keys=[i[0] for i in wire_items])
        return str(r["unit_id"])

    def lease(self, nbytes: int, *, node_id: str | None = None, returning: str | None = None) -> dict[str, Any] | None:
        r, _ = self._rpc.call("lease", {"nbytes": int(nbytes), "node_id": node_id, "returning": returning})
        self._learn_stream(r.get("stream_port"))
        return r.get("grant")

    def place_leased_begin(self, lease_id: str, unit_id: str, items: Sequence[tuple[str, int, str]], *,
                           batch: str | None = None, states: bool = False) -> Any:
        """Send ``place_leased`` and return at once; ``.wait()`` on the result raises what it raised, and
        with ``states`` its reply carries ``unit_states()`` too. On the Controller's stream socket once a
        lease reply named it, else on ZMQ."""
        wire_items = [[k, int(n), f] for k, n, f in items]
        owed = self._soon.take()  # the commits of earlier puts ride along
        control = {"lease": lease_id, "unit_id": unit_id, "items": wire_items, "batch": batch, "states": states,
                   "commits": owed or None, "put": secrets.token_hex(8)}
        keys = [i[0] for i in wire_items]
        try:
            stream = self._stream
            if stream is not None:
                try:
                    return _StreamPlacement(self, stream.begin("place_leased", control, keys=keys), control, keys)
                except StorageUnitUnavailable:  # the stream is gone (not the Controller, maybe): ZMQ then
                    self._drop_stream(stream)
            return self._rpc.begin("place_leased", control, keys=keys)
        except BaseException:
            self._soon.give_back(owed)
            raise

    def _drop_stream(self, stream: BulkClient) -> None:
        """The stream broke: placements go on ZMQ until a lease reply names the stream again."""
        with self._stream_lock:
            if self._stream is stream:
                self._stream = None
        stream.close()

    def place_leased(self, lease_id: str, unit_id: str, items: Sequence[tuple[str, int, str]], *,
                     batch: str | None = None) -> None:
        self.place_leased_begin(lease_id, unit_id, items, batch=batch).wait()

    def return_lease(self, lease_id: str, *, wait: bool = False) -> None:
        """``wait`` (a closing client): awaited for at most 1 s, as a one-way send could die with the
        closing socket; a Controller that is gone must not hold the close up (the lease expires anyway)."""
        if wait:
            self._rpc.call("return_lease", {"lease": lease_id}, timeout_s=min(self._rpc.timeout_s, 1.0))
        else:
            self._rpc.send_oneway("return_lease", {"lease": lease_id})

    def requeue_deletions(self, unit_id: str, keys: Iterable[str]) -> None:
        for page in key_pages(list(keys)):
            self._rpc.call("requeue", {"unit_id": unit_id, "keys": page}, keys=page)

    def deleted(self, unit_id: str, keys: Iterable[str]) -> None:
        """One-way: a notice lost on the way only means the janitor deletes these keys again."""
        for page in key_pages(list(keys)):
            self._rpc.send_oneway("deleted", {"unit_id": unit_id, "keys": page}, keys=page)

    def commit(self, key: str) -> None:
        self.commit_many([key])

    def commit_many(self, keys: Iterable[str], *, unit_id: str | None = None, wait: bool = True,
                    soon: bool = False) -> None:
        """``wait=False`` sends the commit without waiting for its reply (saves a round trip per put);
        pass ``unit_id`` then, so a commit that arrives too late deletes its unit copy. ``soon``: send it
        with the next placement or within ``lease.COMMIT_SOON_S`` (a leased put's commit)."""
        keys = list(keys)
        if soon and len(keys) <= max_keys():
            self._soon.owe(keys, unit_id)
            return
        for page in key_pages(keys):
            if wait or soon:
                self._rpc.call("commit", {"keys": page, "unit_id": unit_id}, keys=page)
            else:
                self._rpc.send_oneway("commit", {"keys": page, "unit_id": unit_id}, keys=page)

    def abort(self, key: str, *, unit_down: bool = False) -> None:
        self.abort_many([key], unit_down=unit_down)

    def abort_many(self, keys: Iterable[str], *, unit_down: bool = False) -> None:
        for page in key_pages(list(keys)):
            self._rpc.call("abort", {"keys": page, "unit_down": unit_down}, keys=page)

    def mark_consumed(self, keys: Iterable[str]) -> int:
        return sum(int(self._rpc.call("consumed", {"keys": page}, keys=page)[0]["n"])
                   for page in key_pages(list(keys)))

    def touch(self, keys: Iterable[str]) -> int:
        return sum(int(self._rpc.call("touch", {"keys": page}, keys=page)[0]["n"])
                   for page in key_pages(list(keys)))

    def retention(self) -> float | None:
        value = self._rpc.call("retention")[0].get("retention_s")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ProtocolError(f"the Controller's retention answer is not a positive number of seconds: {value!r:.40}")
        return None if value is None else float(value)

    def set_batch(self, keys: Iterable[str], batch: str | None) -> int:
        return sum(int(self._rpc.call("set_batch", {"keys": page, "batch": batch}, keys=page)[0]["n"])
                   for page in key_pages(list(keys)))

    def delete(self, keys: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for page in key_pages(list(keys)):
            _merge(out, self._rpc.call("delete", {"keys": page}, keys=page)[0]["placement"])
        return out

    def clear(self, batch: str, *, limit: int | None = None) -> dict[str, list[str]]:
        """Drop ``batch``'s keys; with ``limit``, one page of at most that many (call again until it
        answers ``{}``), else every page."""
        if limit is not None:
            return dict(self._rpc.call("clear", {"batch": batch, "limit": min(int(limit), max_keys())})[0]["placement"])
        out: dict[str, list[str]] = {}
        while page := self._rpc.call("clear", {"batch": batch, "limit": max_keys()})[0]["placement"]:
            _merge(out, page)
        return out

    def state(self, key: str) -> KeyState | None:
        s = self._rpc.call("state", {"key": key}, keys=[key])[0]["state"]
        return None if s is None else KeyState(s)

    def where(self, keys: Iterable[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for page in key_pages(list(keys)):
            out.update(self._rpc.call("where", {"keys": page}, keys=page)[0]["where"])
        return out

    def keys(self, batch: str | None = None) -> list[str]:
        """Every key (of ``batch``), a page of at most ``wire.max_keys()`` per request. Keys added or
        dropped while the pages are read may be missed; none is listed twice."""
        out: list[str] = []
        seen: set[str] = set()
        start = 0
        while True:
            reply = self._rpc.call("keys", {"batch": batch, "start": start})[0]
            nxt = reply.get("next")
            if nxt is not None and (not isinstance(nxt, int) or isinstance(nxt, bool) or nxt <= start):
                raise ProtocolError("the Controller's keys answer names no later page")
            for key in str_list(reply.get("keys"), "keys"):
                if key not in seen:
                    seen.add(key)
                    out.append(key)
            if nxt is None:
                return out
            start = nxt

    def total_keys(self) -> int:
        return int(self._rpc.call("total_keys")[0]["n"])

    def stats(self) -> dict[str, dict[str, Any]]:
        return dict(self._rpc.call("stats")[0]["stats"])

    def units(self) -> list[UnitInfo]:
        return [UnitInfo.from_wire(u) for u in self._rpc.call("units")[0]["units"]]

    def add_unit(self, unit: UnitInfo) -> None:
        self._rpc.call("add_unit", {"unit": unit.to_wire()})

    def mark_unit_dead(self, unit_id: str, reason: str) -> bool:
        return bool(self._rpc.call("unit_state", {"unit_id": unit_id, "state": "dead", "reason": reason})[0]["changed"])

    def mark_unit_live(self, unit_id: str) -> bool:
        return bool(self._rpc.call("unit_state", {"unit_id": unit_id, "state": "live"})[0]["changed"])

    def unit_states(self, timeout_s: float | None = None) -> dict[str, dict[str, Any]]:
        return dict(self._rpc.call("unit_states", timeout_s=timeout_s)[0]["states"])

    def run_janitor(self) -> int:
        return int(self._rpc.call("sweep")[0]["removed"])

    def ping(self, timeout_s: float | None = None) -> int:
        return int(self._rpc.call("ping", timeout_s=timeout_s)[0]["pid"])

    def _send_commits(self, owed: list[list[Any]], last: bool) -> None:
        if last:  # at close, and bounded: a Controller that is gone must not hold the close up
            self._rpc.call("commits", {"commits": owed}, timeout_s=min(self._rpc.timeout_s, 1.0))
        else:
            self._rpc.send_oneway("commits", {"commits": owed})

    def close(self) -> None:
        self._soon.close()
        with self._stream_lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        self._rpc.close()


def _merge(into: dict[str, list[str]], placement: dict[str, list[str]]) -> None:
    """A page's ``{unit_id: keys}`` added to the whole."""
    for unit_id, keys in placement.items():
        into.setdefault(unit_id, []).extend(keys)
