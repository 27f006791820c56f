"""``dressage proxy journal check|repair PATH``: verify a Proxy journal, or cut it to its intact prefix.

``check`` replays the journal (every frame's length, sequence number and CRC32C, and every record
against the sessions it rebuilds) and exits 0 when it is intact, 1 when it is damaged. ``repair``
cuts a damaged journal back to its intact prefix, keeping the removed bytes beside it as
``PATH.damaged-OFFSET``, and ``--compact`` also drops the records of forgotten sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dressage.flags import ConfigTree, flag

__all__ = ["register", "check", "repair", "JournalCheckConfig", "JournalRepairConfig"]


@dataclass(kw_only=True, slots=True)
class JournalCheckConfig:
    """Replay a journal and report damage (exit 1 when damaged)."""

    path: str = field(metadata=flag(positional=True, metavar="PATH"))
    """The journal file (the Proxy's --journal PATH)."""
    json: bool = False
    """Print the report as JSON."""


@dataclass(kw_only=True, slots=True)
class JournalRepairConfig:
    """Cut a journal to its intact prefix (the rest is kept aside)."""

    path: str = field(metadata=flag(positional=True, metavar="PATH"))
    """The journal file (the Proxy's --journal PATH)."""
    compact: bool = False
    """Also drop the records of forgotten sessions."""
    json: bool = False
    """Print the report as JSON."""


def register(proxy_subparsers: argparse._SubParsersAction) -> None:
    j = proxy_subparsers.add_parser("journal", help="check or repair a Proxy journal (--journal PATH)")
    jsub = j.add_subparsers(dest="journal_command", metavar="ACTION")
    jsub.required = True
    c = jsub.add_parser("check", help="replay a journal and report damage (exit 1 when damaged)")
    ConfigTree(JournalCheckConfig).add_to(c)
    c.set_defaults(func=_run_check)
    r = jsub.add_parser("repair", help="cut a journal to its intact prefix (the rest is kept aside)")
    ConfigTree(JournalRepairConfig).add_to(r)
    r.set_defaults(func=_run_repair)


def check(path: str | os.PathLike[str]) -> dict:
    """The replay report of ``path`` as a dict (``ok``: replays to its end)."""
    from dressage.errors import JournalError
    from dressage.proxy.journal.log import Journal
    from dressage.proxy.journal.wal import count_frames_after

    p = Path(path)
    if not p.is_file():
        raise JournalError(f"no journal file at {p}")
    _, report = Journal.replay(p)
    out = {"path": str(p), "ok": report.damage is None, "file_bytes": p.stat().st_size,
           "records": report.records, "intact_bytes": report.intact_bytes, "duplicates": report.duplicates,
           "ended_steps": len(report.ended_steps),
           "sessions": {"active": len(report.active), "finalized": len(report.finalized),
                        "aborted": len(report.aborted)},
           "damage": None, "frames_after_damage": 0, "sessions_after_damage": 0}
    if report.damage is not None:
        out["damage"] = report.damage.to_dict()
        out["frames_after_damage"] = count_frames_after(p, report.damage.offset)
        out["sessions_after_damage"] = len(report.sessions_after_damage)
    return out


def repair(path: str | os.PathLike[str], *, compact: bool = False) -> dict:
    """Cut ``path`` to its intact prefix (and compact it); returns the check before and after."""
    from dressage.proxy.journal.log import Journal
    from dressage.proxy.journal.wal import FILE_MAGIC

    p = Path(path)
    before = check(p)
    aside = None
    damage = before["damage"]
    if damage is not None and damage["kind"] == "not_a_journal":
        # Nothing in it can be recovered: keep the whole file aside and start an empty journal.
        aside = p.with_name(f"{p.name}.damaged-0")
        os.replace(p, aside)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, FILE_MAGIC)
            os.fsync(fd)
        finally:
            os.close(fd)
    else:
        journal = Journal(p, fsync="always", compact_min_bytes=None, intact_bytes=before["intact_bytes"])
        try:
            if compact:
                journal.compact()
        finally:
            journal.close()
        aside = journal.set_aside
    return {"before": before, "after": check(p), "set_aside": None if aside is None else str(aside)}


def _print_check(report: dict) -> None:
    s = report["sessions"]
    print(f"{report['path']}: {report['records']} records, {report['file_bytes']} bytes; sessions: "
          f"{s['active']} active, {s['finalized']} finalized, {s['aborted']} aborted"
          + (f"; {report['duplicates']} duplicated records skipped" if report["duplicates"] else "")
          + (f"; {report['ended_steps']} step records of sessions that had ended skipped" if report["ended_steps"]
             else ""))
    d = report["damage"]
    if d is None:
        print("intact")
    else:
        print(f"DAMAGED: {d['kind']} at byte {d['offset']}: {d['detail']}; "
              f"{d['dropped_bytes']} bytes ({report['frames_after_damage']} well-formed records of "
              f"{report['sessions_after_damage']} sessions) after it are not recovered; the first "
              f"{report['records']} records are intact: `dressage proxy journal repair {report['path']}` keeps "
              "them and sets the rest aside (or start the Proxy with --journal-recover truncate)")


def _run_check(args: argparse.Namespace) -> int:
    cfg = ConfigTree(JournalCheckConfig).build(args)
    report = check(cfg.path)
    if cfg.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        _print_check(report)
    return 0 if report["ok"] else 1


def _run_repair(args: argparse.Namespace) -> int:
    cfg = ConfigTree(JournalRepairConfig).build(args)
    out = repair(cfg.path, compact=cfg.compact)
    if cfg.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        _print_check(out["before"])
        if out["set_aside"]:
            print(f"damaged bytes kept in {out['set_aside']}")
        print(f"repaired: {out['after']['records']} records, {out['after']['file_bytes']} bytes")
    return 0 if out["after"]["ok"] else 1
