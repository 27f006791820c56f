"""The Controller's wire operations: each request's fields checked (``ProtocolError`` for anything
malformed, before the directory is touched) and the directory called, for both of its sockets."""

from __future__ import annotations

import logging
from typing import Any

from dressage.errors import ProtocolError, TransferQueueError
from dressage.tq.directory.controller import Controller
from dressage.tq.directory.entries import UnitInfo
from dressage.tq.transport.wire import MAX_KEY_BYTES, MAX_NBYTES, max_keys, text, text_list, uint

__all__ = ["LEASE_OPS", "lease_op", "apply_commits", "place_items", "str_list", "opt_str", "unit_from_wire"]

log = logging.getLogger("dressage.tq.directory.service")

_UNIT_FIELDS = {"unit_id", "node_id", "memory_budget", "address", "host_id", "shm_token", "heartbeat", "head"}


def str_list(value: Any, what: str) -> list[str]:
    return text_list(value, what)


def opt_str(value: Any, what: str) -> str | None:
    return text(value, what, optional=True)


def place_items(items: Any) -> list[tuple[str, int, str]]:
    if not isinstance(items, list) or not 0 < len(items) <= max_keys():
        raise ProtocolError(f"place needs a list of 1 to {max_keys()} [key, nbytes, field] items")
    checked = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 3):
            raise ProtocolError(f"bad place item {item!r:.100}")
        checked.append((text(item[0], "key", max_len=MAX_KEY_BYTES, empty=False),
                        uint(item[1], "nbytes", MAX_NBYTES), text(item[2], "field", max_len=MAX_KEY_BYTES)))
    total = sum(n for _, n, _ in checked)
    if total > MAX_NBYTES:  # one blob's limit bounds a whole placement too
        raise ProtocolError(f"place: {len(checked)} items of {total} bytes in all exceed {MAX_NBYTES} per request")
    return checked


LEASE_OPS = ("lease", "place_leased", "return_lease", "requeue", "commits")


def apply_commits(ctl: Controller, commits: Any) -> None:
    """Commits that rode on another message (``lease.SoonCommits``); one whose keys are gone is logged."""
    if not isinstance(commits, list) or len(commits) > max_keys():
        raise ProtocolError(f"'commits' must be a list of at most {max_keys()} [keys, unit_id]")
    checked = []
    for item in commits:
        if not (isinstance(item, list) and len(item) == 2):
            raise ProtocolError(f"bad commit {item!r:.100}")
        checked.append((str_list(item[0], "keys"), opt_str(item[1], "unit_id")))
    for keys, unit_id in checked:
        try:
            ctl.commit_many(keys, unit_id=unit_id)
        except TransferQueueError as exc:
            log.info("late commit: %s", exc)


def lease_op(ctl: Controller, op: str, c: dict[str, Any]) -> dict[str, Any]:
    """Placement leases (``tq/directory/lease.py``) and the re-queueing of unit copies a refused write left."""
    if op == "lease":
        return {"grant": ctl.lease(uint(c.get("nbytes"), "nbytes", MAX_NBYTES),
                                   node_id=opt_str(c.get("node_id"), "node_id"),
                                   returning=opt_str(c.get("returning"), "returning"))}
    if op == "commits":
        apply_commits(ctl, c.get("commits"))
        return {}
    if op == "place_leased":
        if c.get("commits") is not None:  # first: a refused placement does not undo the puts before it
            apply_commits(ctl, c.get("commits"))
        ctl.place_leased(text(c.get("lease"), "lease", max_len=MAX_KEY_BYTES),
                         text(c.get("unit_id"), "unit_id", max_len=MAX_KEY_BYTES, empty=False),
                         place_items(c.get("items")), batch=opt_str(c.get("batch"), "batch"),
                         put_id=text(c.get("put"), "put", max_len=MAX_KEY_BYTES, optional=True))
        return {"states": ctl.unit_states()} if c.get("states") is True else {}
    if op == "return_lease":
        ctl.return_lease(text(c.get("lease"), "lease", max_len=MAX_KEY_BYTES))
        return {}
    ctl.requeue_deletions(text(c.get("unit_id"), "unit_id", max_len=MAX_KEY_BYTES, empty=False),
                          str_list(c.get("keys"), "keys"))
    return {}


def unit_from_wire(unit: Any) -> UnitInfo:
    """An ``add_unit`` request's unit description, every field checked."""
    if not isinstance(unit, dict) or set(unit) - _UNIT_FIELDS:
        raise ProtocolError(f"add_unit needs a unit description, got {unit!r:.100}")
    if not isinstance(unit.get("head", False), bool):
        raise ProtocolError(f"add_unit: head must be true or false, got {unit.get('head')!r:.40}")
    text(unit.get("unit_id"), "unit_id", max_len=MAX_KEY_BYTES, empty=False)
    uint(unit.get("memory_budget", 0), "memory_budget", MAX_NBYTES)
    for name in ("node_id", "address", "host_id", "shm_token", "heartbeat"):
        text(unit.get(name), name, max_len=MAX_KEY_BYTES, optional=True)
    try:
        return UnitInfo.from_wire(unit)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"add_unit needs a unit description, got {unit!r:.100}") from exc
