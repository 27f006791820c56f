"""A trainer in its own process: read finalized trajectories from a Proxy, restore them from TQ.

``POST /trajectory/read`` with ``"format": "samples"`` answers each trajectory's Samples in wire form
(large fields as FieldRefs) and, in ``meta_info.transfer_queue``, the client spec of the Proxy's
TransferQueue (``GET /transfer_queue/spec`` answers it alone). This module joins that TQ, so the large
fields go StorageUnit -> trainer directly. Reads are two-phase: a batch is leased, restored, then
acknowledged (``/trajectory/ack``); a batch that cannot be restored is released and stays on the Proxy.
A reader releases the TQ keys of exactly the sessions the Proxy says its ack covered
(:meth:`TrajectoryBatch.acknowledged_keys`): a session a named read took over meanwhile is that reader's.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import msgpack

from dressage.errors import (ConfigError, DressageError, NoTransferQueueError, ProxyConnectionError,
                             ProxyStatusError, SampleWireError)
from dressage.rollout.manager import sample_ref_keys
from dressage.trajectory.sample_wire import MSGPACK_MEDIA_TYPE, sample_from_wire
from dressage.trajectory import Sample

__all__ = ["ProxyTrajectorySource", "TrajectoryBatch", "drain", "consume"]

log = logging.getLogger(__name__)

_ACK_RETRY_S = (0.2, 1.0)
"""Waits before an ack whose answer was lost is sent again (idempotent: a repeat answers what it forgot)."""
ACK_TRIES = len(_ACK_RETRY_S) + 1
"""How many times :meth:`ProxyTrajectorySource.ack` sends an ack whose answer did not arrive."""


def _samples_of(answer: Any) -> list[Sample]:
    """The Samples of a ``format: samples`` read answer; a bad one is :class:`SampleWireError` naming the
    trajectory it came in."""
    if not isinstance(answer, Mapping) or not isinstance(answer.get("data"), list):
        raise SampleWireError(f"trajectory read answer has no 'data' list: {str(answer)[:200]}")
    samples: list[Sample] = []
    for traj in answer["data"]:
        if not isinstance(traj, Mapping) or not isinstance(traj.get("samples"), list):
            raise SampleWireError("each trajectory must carry 'samples' (ask with format 'samples')")
        try:
            samples.extend(sample_from_wire(s) for s in traj["samples"])
        except SampleWireError as exc:
            name = traj.get("trajectory_id") or traj.get("session_id")
            raise SampleWireError(f"trajectory {str(name)[:80]!r}: {exc}") from None
    return samples


@dataclass(slots=True)
class TrajectoryBatch:
    """Samples read from a Proxy (refs attached) and the TQ client spec they refer to."""

    samples: list[Sample]
    transfer_queue: dict[str, Any] | None
    trajectories: int = 0
    meta_info: dict[str, Any] = field(default_factory=dict)
    read_id: str | None = None
    """The lease the Proxy holds these trajectories under (a leasing read): ack or release it."""
    session_ids: list[str] = field(default_factory=list)
    """The sessions read, in the answer's order."""
    ref_keys: dict[str, set[str]] = field(default_factory=dict)
    """The TQ keys each session's Samples referenced when read (a restore drops the refs it read)."""
    acknowledged: list[str] = field(default_factory=list)
    """The sessions the Proxy forgot for this read, as its ack (or release) answered: their TQ keys are
    this reader's to release once it is done. A session a named read took over is not among them."""

    def acknowledged_keys(self) -> list[str]:
        """The TQ keys of the acknowledged sessions, sorted. Keys are per session; one that a session not
        acknowledged also referenced would still be another reader's, and is left out."""
        held = set(self.acknowledged)
        mine: set[str] = set()
        theirs: set[str] = set()
        for sid, keys in self.ref_keys.items():
            (mine if sid in held else theirs).update(keys)
        return sorted(mine - theirs)

    def unacknowledged(self) -> list[str]:
        """The sessions read that the Proxy did not forget for this read (taken over, released, not acked)."""
        held = set(self.acknowledged)
        return [sid for sid in self.session_ids if sid not in held]


class ProxyTrajectorySource:
    """Reads a Proxy's finalized trajectories as Samples; ``client()`` joins its TransferQueue.

    ``token`` is the Proxy's admin token (reads and drains need it when the Proxy has tokens).
    """

    def __init__(self, proxy_url: str, *, token: str | None = None, timeout_s: float = 60.0) -> None:
        if not isinstance(proxy_url, str) or not proxy_url.startswith(("http://", "https://")):
            raise ConfigError(f"proxy_url: expected http(s)://host:port, got {proxy_url!r}")
        self.url = proxy_url.rstrip("/")
        self.token = token
        self.timeout_s = float(timeout_s)
        self._client: Any = None
        self._spec: dict[str, Any] | None = None

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        return self._call("POST", path, json.dumps(body).encode())

    def _get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def _call(self, method: str, path: str, data: bytes | None) -> Any:
        # msgpack first: resident large fields (TQ off) come as raw bytes instead of base64 in JSON.
        headers = {"accept": f"{MSGPACK_MEDIA_TYPE}, application/json"}
        if data is not None:
            headers["content-type"] = "application/json"
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
                kind = resp.headers.get("content-type", "")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise ProxyStatusError(f"{self.url}{path}: HTTP {exc.code}: {detail}", status_code=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ProxyConnectionError(f"{self.url}{path}: {getattr(exc, 'reason', exc)}") from None
        if kind.startswith(MSGPACK_MEDIA_TYPE):
            try:
                return msgpack.unpackb(raw, raw=False)
            except (ValueError, msgpack.UnpackException) as exc:
                raise SampleWireError(f"{self.url}{path}: answer is not msgpack ({exc})") from None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise SampleWireError(f"{self.url}{path}: answer is not JSON ({exc})") from None

    def read(self, *, drain: bool = False, lease: bool = False, lease_s: float | None = None,
             max_groups: int | None = None, instance_id: str | None = None,
             session_ids: Sequence[str] | None = None, min_group_size: int | None = None,
             group_timeout_s: float | None = None) -> TrajectoryBatch:
        """Finalized trajectories as Samples. ``lease`` hands them out under the batch's ``read_id``:
        :meth:`ack` once they were restored (the Proxy forgets them; the TQ keys stay until the reader
        releases those of ``batch.acknowledged``), :meth:`release` when they could not be. ``drain``
        leases, decodes, then acknowledges before answering: the batch holds the acknowledged sessions
        only, and an answer that cannot be decoded (or never arrives) forgets nothing. (The wire's
        one-call ``"drain": true`` forgets once the answer was written, before the client decoded it.)
        With neither, the read only looks. ``session_ids`` reads exactly those sessions (each must be
        finalized and not acknowledged), whatever else waits in the Proxy. ``min_group_size`` /
        ``group_timeout_s``: only prompt groups with that many finalized sessions, or that waited that
        long (default: the Proxy's ``reads`` settings); the groups held back are in
        ``meta_info["incomplete_groups"]``."""
        body: dict[str, Any] = {"format": "samples", "lease": lease or drain}
        for key, value in (("max_groups", max_groups), ("instance_id", instance_id), ("lease_s", lease_s),
                           ("min_group_size", min_group_size), ("group_timeout_s", group_timeout_s)):
            if value is not None:
                body[key] = value
        if session_ids is not None:
            body["session_ids"] = [str(s) for s in session_ids]
        answer = self._post("/trajectory/read", body)
        read_id = answer.get("read_id") if isinstance(answer, Mapping) else None
        read_id = read_id if isinstance(read_id, str) else None
        try:
            samples = _samples_of(answer)
        except SampleWireError:
            # Nothing of a leased read reached the caller: hand it back at once rather than leave its
            # trajectories held (and every batch they are in unreadable) until the lease runs out.
            self.release(TrajectoryBatch([], None, read_id=read_id), quiet=True)
            raise
        meta = answer.get("meta_info") or {}
        spec = meta.get("transfer_queue") if isinstance(meta, Mapping) else None
        if spec is not None:
            self._spec = dict(spec)
        ref_keys: dict[str, set[str]] = {}
        for s in samples:
            ref_keys.setdefault(s.session_id, set()).update(sample_ref_keys([s]))
        batch = TrajectoryBatch(samples, spec, len(answer["data"]), dict(meta) if isinstance(meta, Mapping) else {},
                                read_id=read_id, session_ids=[str(t.get("session_id")) for t in answer["data"]],
                                ref_keys=ref_keys)
        if drain and read_id is not None:
            try:
                self.ack(batch)
            except BaseException:
                self.release(batch, quiet=True)
                raise
            held = set(batch.acknowledged)  # what a named read took meanwhile is its reader's
            batch.samples = [s for s in batch.samples if s.session_id in held]
            batch.session_ids = [sid for sid in batch.session_ids if sid in held]
            batch.trajectories = len(batch.session_ids)
        return batch

    def ack(self, batch: TrajectoryBatch) -> int:
        """The batch was restored: the Proxy forgets its trajectories. Returns how many it forgot now;
        ``batch.acknowledged`` then names every session the read's ack covers (also on a repeat), the
        ones whose TQ keys are this reader's. An ack whose answer did not arrive (the connection failed:
        it may or may not have been applied) is sent again, up to ``ACK_TRIES`` times in all: a repeated
        ack answers what the first one forgot."""
        if batch.read_id is None:
            return 0
        for wait in (*_ACK_RETRY_S, None):
            try:
                answer = self._post("/trajectory/ack", {"read_id": batch.read_id})
                break
            except ProxyConnectionError as exc:
                if wait is None:
                    raise
                log.warning("ack of read %s: no answer (%s); sent again in %.1f s", batch.read_id, exc, wait)
                time.sleep(wait)
        answer = answer if isinstance(answer, Mapping) else {}
        batch.acknowledged = _acknowledged(answer, batch.session_ids)
        return int(answer.get("acknowledged", 0))

    def release(self, batch: TrajectoryBatch, *, quiet: bool = False) -> None:
        """The batch could not be used: its trajectories are readable again at once.

        Sessions an ack of this read already had the Proxy forget (one whose answer was lost, also before
        a Proxy restart) cannot go back: the answer names them (``batch.acknowledged``), and since this
        reader gives them up, their TQ keys are released here: no key is left without a reader.
        ``quiet``: a failed release is logged, not raised (for a caller that is failing already; the
        lease then runs out on its own)."""
        if batch.read_id is None:
            return
        try:
            answer = self._post("/trajectory/release", {"read_id": batch.read_id})
            batch.acknowledged = _acknowledged(answer if isinstance(answer, Mapping) else {}, [])
            keys = batch.acknowledged_keys()
            if keys:
                from dressage.train.reader import release_batch

                log.warning("read %s: %d sessions were acknowledged before it was released; their %d TQ keys "
                            "are released with it", batch.read_id, len(batch.acknowledged), len(keys))
                release_batch(self.client(), keys)
        except DressageError as exc:
            if not quiet:
                raise
            log.warning("could not release read %s: %s", batch.read_id, exc)

    def session_document(self, session_id: str) -> dict[str, Any]:
        """One session's step tree and Segments (``GET /admin/sessions/{id}``, an admin endpoint)."""
        from urllib.parse import quote

        doc = self._get("/admin/sessions/" + quote(session_id, safe=""))
        if not isinstance(doc, Mapping) or "steps" not in doc:
            raise SampleWireError(f"{self.url}: not a session document: {str(doc)[:200]}")
        return dict(doc)

    def transfer_queue_spec(self) -> dict[str, Any]:
        """The client spec of the Proxy's TransferQueue (``GET /transfer_queue/spec``, an admin endpoint:
        the spec may carry the TQ's secret), without reading any trajectory. A Proxy without TQ is a
        :class:`NoTransferQueueError`."""
        try:
            spec = self._get("/transfer_queue/spec")
        except ProxyStatusError as exc:
            if exc.status_code == 409 and NoTransferQueueError.code in str(exc):
                raise NoTransferQueueError(f"{self.url} runs without TransferQueue (start it with "
                                           "--enable-transfer-queue): it has no spec to join") from None
            raise
        if not isinstance(spec, Mapping) or "spec_version" not in spec:
            raise SampleWireError(f"{self.url}/transfer_queue/spec: not a TransferQueue client spec: {str(spec)[:200]}")
        self._spec = dict(spec)
        return dict(spec)

    def client(self) -> Any:
        """A TransferQueue client joined to the Proxy's TQ: the spec of the last read that carried one,
        else the one :meth:`transfer_queue_spec` asks for."""
        if self._client is None:
            spec = self._spec if self._spec is not None else self.transfer_queue_spec()
            from dressage.tq import TransferQueueClient

            self._client = TransferQueueClient.connect(spec)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _acknowledged(answer: Mapping[str, Any], assumed: Sequence[str]) -> list[str]:
    """The sessions an ack or release answer says the read acknowledged; ``assumed`` for a Proxy whose
    answers do not name them."""
    sids = answer.get("acknowledged_session_ids")
    return [str(s) for s in sids] if isinstance(sids, list) else list(assumed)


def drain(source: ProxyTrajectorySource, *, max_groups: int | None = None, min_group_size: int | None = None,
          group_timeout_s: float | None = None) -> Iterator[TrajectoryBatch]:
    """The Proxy's finalized trajectories, ``max_groups`` prompt groups a read (what one answer holds
    in memory on both sides; None: all in one), until a read finds none. Each batch is leased: it is
    acknowledged when the consumer asks for the next one, released when the consumer raised. A session a
    named read took over before the ack is then in ``batch.unacknowledged()``: a consumer that kept the
    batch's Samples withdraws those (their reader is the other read). Groups still short of
    ``min_group_size`` (and younger than ``group_timeout_s``) stay on the Proxy."""
    while True:
        batch = source.read(lease=True, max_groups=max_groups, min_group_size=min_group_size,
                            group_timeout_s=group_timeout_s)
        if batch.trajectories == 0:
            return
        try:
            yield batch
        except BaseException:
            source.release(batch, quiet=True)
            raise
        source.ack(batch)


def consume(source: ProxyTrajectorySource, *, dp_size: int = 1, expect_sessions: int | None = None,
            timeout_s: float = 60.0, poll_s: float = 0.2, on_lost: str = "fail") -> dict[str, Any]:
    """Read the Proxy (leased), shard by DP rank, restore each shard from TQ, check, then per read:
    acknowledge it and release the keys of the sessions its ack covered. A restore or check that fails
    releases the reads: nothing is lost. An ack that fails releases that read and the ones after it
    (readable again at once); the reads acknowledged before it have had their keys released.

    Reads until ``expect_sessions`` trajectories arrived (or once, when ``None``). Answers what a
    driver logs: samples, sessions, the samples digest, bytes restored and the keys left in TQ.
    """
    from dressage.train.checks import check_sample
    from dressage.train.digest import samples_digest
    from dressage.train.reader import TrainingReader, count_keys_left, release_batch
    from dressage.trajectory import shard_samples

    if not isinstance(dp_size, int) or isinstance(dp_size, bool) or dp_size < 1:
        raise ConfigError(f"dp_size must be a positive integer, got {dp_size!r}")
    samples: list[Sample] = []
    batches: list[TrajectoryBatch] = []
    sessions, spec = 0, None
    deadline = time.monotonic() + timeout_s
    while True:
        batch = source.read(lease=True)
        batches.append(batch)
        samples += batch.samples
        sessions += batch.trajectories
        spec = batch.transfer_queue or spec
        if expect_sessions is None or sessions >= expect_sessions:
            break
        if time.monotonic() > deadline:
            raise ProxyConnectionError(f"{source.url}: {sessions} of {expect_sessions} trajectories "
                                       f"arrived within {timeout_s:.0f} s")
        time.sleep(poll_s)
    keys = sample_ref_keys(samples)
    restored_bytes = 0
    try:
        if keys:
            reader = TrainingReader(source.client(), on_lost=on_lost)
            kept: list[Sample] = []
            for shard in shard_samples(samples, dp_size, keep_groups=True):
                kept += reader.restore(shard)  # one batched read per StorageUnit per rank
            samples = kept
        for s in samples:
            check_sample(s)
            restored_bytes += sum(int(a.nbytes) for n, a in s.field_arrays().items() if n.startswith("rollout_"))
    except BaseException:
        for batch in batches:  # nothing restored is acknowledged: the Proxy keeps every trajectory
            source.release(batch, quiet=True)
        raise
    acknowledged = released = 0
    for i, batch in enumerate(batches):
        try:
            source.ack(batch)
        except BaseException:
            for rest in batches[i:]:  # not acknowledged: readable again at once, not after the lease
                source.release(rest, quiet=True)
            raise
        acknowledged += len(batch.acknowledged)
        mine = batch.acknowledged_keys()  # at once: a later ack that fails leaves none of these behind
        released += release_batch(source.client(), mine) if mine else 0
    keys_left, uncounted = count_keys_left(source.client() if spec is not None else None)
    report = {"sessions": sessions, "acknowledged": acknowledged, "samples": len(samples), "dp_size": dp_size,
              "samples_digest": samples_digest(samples), "large_field_bytes_restored": restored_bytes,
              "tq_keys_read": len(keys), "tq_keys_released": released, "tq_keys_left": keys_left,
              "transfer_queue": spec is not None}
    if keys_left is None:
        report["tq_keys_uncounted"] = uncounted  # a StorageUnit did not answer the count
    return report
