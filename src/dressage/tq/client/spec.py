"""Build a TransferQueueClient from a client spec: the plain dict ``TransferQueue.client_spec()`` returns.

A spec carries the TQ's secret: its file is written 0600 (in a 0700 directory when one is made for
it), one that others can read is refused, and every value is checked before any socket is opened.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from typing import Any

from dressage.errors import ConfigError, TransferQueueError
from dressage.tq.client.node import current_node_id
from dressage.tq.config import MAX_WAIT_S
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.directory.service import RemoteController
from dressage.tq.storage.remote import RemoteStorageUnit

__all__ = ["SPEC_VERSION", "make_spec", "connect_spec", "write_client_spec", "load_client_spec", "check_spec",
           "check_controller", "check_spec_path", "CONTROLLER_CHECK_S"]

SPEC_VERSION = 1
CONTROLLER_CHECK_S = 5.0  # how long a joining process waits for the spec's Controller to answer at start
_ON_FULL = ("spill", "wait", "error")
_MIN_SECRET = 16


def make_spec(controller_address: str, units: list[UnitInfo], *, supports_spill: bool, timeout_s: float,
              on_full: str, full_wait_s: float, secret: bytes | None = None) -> dict[str, Any]:
    """The spec a client in another process connects with. With authentication on it carries the
    shared secret: hand it only to processes of this run (Ray actors, trainer ranks)."""
    spec = {
        "spec_version": SPEC_VERSION,
        "controller": controller_address,
        "units": [{**u.to_wire(), "supports_spill": supports_spill} for u in units],
        "request_timeout_s": timeout_s,
        "on_full": on_full,
        "full_wait_s": full_wait_s,
    }
    if secret is not None:
        spec["auth_secret"] = secret.decode()
    return spec


def _address(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.startswith("tcp://") or len(value) > 300 \
            or not value.rpartition(":")[2].isdigit():
        raise ConfigError(f"TransferQueue client spec: {what}: expected an address tcp://HOST:PORT, got {value!r:.80}")
    return value


def _optional_text(value: Any, what: str) -> None:
    if value is not None and (not isinstance(value, str) or len(value) > 300):
        raise ConfigError(f"TransferQueue client spec: {what}: expected a string or null, got {value!r:.80}")


def _number(value: Any, what: str, *, zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero) or value > MAX_WAIT_S:
        raise ConfigError(f"TransferQueue client spec: {what}: expected {'>= 0' if zero else '> 0'} seconds, "
                          f"at most {MAX_WAIT_S:g} (a week), got {value!r:.80}")


def check_spec(spec: Any) -> dict[str, Any]:
    """``spec`` when every value is of its type and range, else ConfigError naming the one that is not
    (one line, no traceback: a spec file is edited by hand too)."""
    if not isinstance(spec, Mapping) or spec.get("spec_version") != SPEC_VERSION or "controller" not in spec:
        raise ConfigError(f"TransferQueue client spec: not a spec of version {SPEC_VERSION} "
                          "(write it with TransferQueue.write_client_spec or dressage tq serve)")
    _address(spec.get("controller"), "controller")
    units = spec.get("units")
    if not isinstance(units, list) or not 0 < len(units) <= 4096:
        raise ConfigError("TransferQueue client spec: units: expected a list of 1 to 4096 unit descriptions")
    seen = set()
    for i, u in enumerate(units):
        where = f"units[{i}]"
        if not isinstance(u, Mapping):
            raise ConfigError(f"TransferQueue client spec: {where}: expected a map, got {u!r:.80}")
        uid = u.get("unit_id")
        if not isinstance(uid, str) or not uid or len(uid) > 200 or uid in seen:
            raise ConfigError(f"TransferQueue client spec: {where}.unit_id: expected a unique name, got {uid!r:.80}")
        seen.add(uid)
        _address(u.get("address"), f"{where}.address")
        for key in ("node_id", "host_id", "shm_token", "heartbeat"):
            _optional_text(u.get(key), f"{where}.{key}")
        budget = u.get("memory_budget")
        if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget < 1 << 62:
            raise ConfigError(f"TransferQueue client spec: {where}.memory_budget: expected bytes as an integer, "
                              f"got {budget!r:.80}")
    _number(spec.get("request_timeout_s", 30.0), "request_timeout_s", zero=False)
    _number(spec.get("full_wait_s", 30.0), "full_wait_s", zero=True)
    if spec.get("on_full", "spill") not in _ON_FULL:
        raise ConfigError(f"TransferQueue client spec: on_full: expected one of {', '.join(_ON_FULL)}, "
                          f"got {spec.get('on_full')!r:.80}")
    secret = spec.get("auth_secret")
    if secret is not None and (not isinstance(secret, str) or len(secret) < _MIN_SECRET):
        raise ConfigError(f"TransferQueue client spec: auth_secret: expected a string of at least {_MIN_SECRET} "
                          "characters")
    return dict(spec)


def check_controller(spec: Mapping[str, Any], timeout_s: float = CONTROLLER_CHECK_S) -> int:
    """Ping the spec's Controller once, within ``timeout_s``: its pid, or ConfigError saying it does not
    answer (a process that joins a TQ learns at start, not at its first call, that nothing serves it)."""
    check_spec(spec)
    secret = str(spec["auth_secret"]).encode() if spec.get("auth_secret") else None
    controller = RemoteController(str(spec["controller"]), timeout_s=timeout_s, secret=secret)
    try:
        return controller.ping(timeout_s=timeout_s)
    except TransferQueueError as exc:
        raise ConfigError(f"TransferQueue client spec: its Controller at {spec['controller']} does not answer "
                          f"within {timeout_s:g} s ({type(exc).__name__}); is the TransferQueue running "
                          "(dressage tq serve)?") from None
    finally:
        controller.close()


def connect_spec(cls: Any, spec: Mapping[str, Any], *, node_id: str | None = None, **client_options: Any) -> Any:
    """A ``cls`` (TransferQueueClient) over ZMQ handles of the spec's Controller and units;
    ``client_options`` go to its constructor."""
    spec = check_spec(spec)
    timeout = float(spec.get("request_timeout_s", 30.0))
    secret = str(spec["auth_secret"]).encode() if spec.get("auth_secret") else None
    if node_id is None and spec.get("deployment") == "ray":
        node_id = current_node_id()  # a writer inside a Ray actor prefers its own node's unit
    controller = RemoteController(str(spec["controller"]), timeout_s=timeout, secret=secret)
    units = {}
    for u in spec["units"]:
        if not u.get("address"):
            raise ConfigError(f"transfer_queue client spec: unit {u.get('unit_id')!r} has no address")
        units[u["unit_id"]] = RemoteStorageUnit(
            u["unit_id"], u["address"], node_id=u.get("node_id"), memory_budget=int(u["memory_budget"]),
            timeout_s=timeout, supports_spill=bool(u.get("supports_spill")), host_id=u.get("host_id"),
            shm_token=u.get("shm_token"), secret=secret)
    return cls(controller, units, node_id=node_id, on_full=str(spec.get("on_full", "spill")),
               full_wait_s=float(spec.get("full_wait_s", 30.0)), owns_handles=True, spec=dict(spec),
               **client_options)


def write_client_spec(spec: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a client spec as a JSON file only its owner can read (it carries the TQ's secret when the
    TQ has one), replacing ``path`` at once, so a process that starts later joins with
    :func:`load_client_spec` (``dressage proxy serve --transfer-queue-spec FILE``)."""
    if not isinstance(spec, Mapping) or spec.get("spec_version") != SPEC_VERSION:
        raise ConfigError(f"write_client_spec: not a TransferQueue client spec (spec_version {SPEC_VERSION})")
    name = os.fspath(path)
    if os.path.isdir(name):
        raise ConfigError(f"TransferQueue client spec {name!r}: is a directory, not a file")
    tmp = f"{name}.tmp-{os.getpid()}"
    try:
        folder = os.path.dirname(os.path.abspath(name))
        os.makedirs(folder, mode=0o700, exist_ok=True)  # a directory made for it is its owner's alone
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ConfigError(f"TransferQueue client spec {name!r}: cannot write it: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o600)  # a leftover temporary file keeps its mode through O_TRUNC
        with os.fdopen(fd, "w") as f:
            json.dump(dict(spec), f)
        os.replace(tmp, name)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ConfigError(f"TransferQueue client spec {name!r}: cannot write it: {exc.strerror or exc}") \
                from None
        raise


def check_spec_path(path: str | os.PathLike[str]) -> None:
    """ConfigError naming ``path`` unless :func:`write_client_spec` can write it: checked before a
    TransferQueue is started for it, so nothing starts only to fail at its spec. Leaves no file behind."""
    name = os.fspath(path)
    if os.path.isdir(name):
        raise ConfigError(f"TransferQueue client spec {name!r}: is a directory, not a file")
    folder = os.path.dirname(os.path.abspath(name))
    probe = f"{name}.tmp-{os.getpid()}"
    missing = []
    parent = folder
    while not os.path.isdir(parent) and os.path.dirname(parent) != parent:
        missing.append(parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"TransferQueue client spec {name!r}: cannot write it: {exc.strerror or exc}") from None
    finally:
        for made in missing:  # write_client_spec makes them again, 0700
            try:
                os.rmdir(made)
            except OSError:
                break


def load_client_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The client spec :func:`write_client_spec` wrote; a missing, unreadable, foreign or malformed file,
    or one that its group or others can read (it carries the secret), is a one-line ConfigError naming it."""
    name = os.fspath(path)
    try:
        with open(path, "rb") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            text = f.read(1 << 24)
    except OSError as exc:
        raise ConfigError(f"TransferQueue client spec {name!r}: {exc.strerror or exc}") from None
    if mode & 0o044:
        raise ConfigError(f"TransferQueue client spec {name!r} is readable by its group or others (mode {mode:04o}) "
                          f"and carries the TransferQueue's secret: chmod 600 {name}")
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(f"TransferQueue client spec {name!r} is not JSON: {why}") from None
    try:
        return check_spec(spec)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("TransferQueue client spec:", f"TransferQueue client spec {name!r}:", 1)) \
            from None
