"""``dressage export``: finalized trajectories of a running Proxy or of a journal, written to a file.

``--format parquet|jsonl|slime --out PATH`` writes one row per Segment (or slime's debug-rollout
dump); ``--html OUT`` writes the session viewer with the data inside. A Proxy is read without
draining unless ``--drain``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from dressage.errors import ConfigError
from dressage.flags import ConfigTree, check_writable, flag

__all__ = ["register", "ExportConfig", "export"]

_FORMATS = ("parquet", "jsonl", "slime")


@dataclass(kw_only=True, slots=True)
class ExportConfig:
    """Export finalized trajectories to a file."""

    proxy_url: str | None = None
    """A running Proxy to read (its admin read; the trajectories stay unless --drain)."""
    journal: str | None = None
    """A Proxy journal to replay, read only (instead of --proxy-url)."""
    format: str | None = field(default=None, metadata=flag(choices=_FORMATS))
    """What --out holds: parquet or jsonl (one row per Segment), or slime's debug-rollout dump."""
    out: str | None = None
    """The file to write (with --format)."""
    html: str | None = None
    """Also (or only) write the session viewer page, data inside, to this file."""
    drain: bool = False
    """Have the Proxy forget what was exported (acknowledge the read)."""
    admin_token_file: str | None = None
    """A file holding the Proxy's admin token (the token alone, stripped; an empty file is refused);
    default: the environment's."""
    tq_spec: str | None = None
    """A TransferQueue client spec file (the Proxy's --transfer-queue-spec-out): restores a journal's large
    fields kept as refs."""
    tokenizer: str | None = None
    """Show a journal's tokens as text in the --html page, decoded with this tokenizer ('byte', 'qwen3', or a
    tokenizer path: the Proxy's --tokenizer). A Proxy's pages come decoded by its own."""
    segment_view: str = field(default="lineage", metadata=flag(choices=("lineage", "timeline")))
    """How a journal's sessions are cut into Segments (the Proxy's --segment-view)."""
    timeout_s: float = 60.0
    """HTTP timeout for the Proxy's reads."""

    def __post_init__(self) -> None:
        if (self.proxy_url is None) == (self.journal is None):
            raise ConfigError("export: give exactly one of --proxy-url and --journal")
        if self.out is None and self.html is None:
            raise ConfigError("export: give --format with --out, or --html OUT")
        if (self.out is None) != (self.format is None):
            raise ConfigError("export: --format and --out go together")
        if self.drain and self.proxy_url is None:
            raise ConfigError("export: --drain reads a Proxy (--proxy-url); a journal is only read")
        if not self.timeout_s > 0:
            raise ConfigError(f"export.timeout_s must be positive, got {self.timeout_s!r}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a Proxy's or a journal's trajectories as Parquet, JSONL, a slime "
                                      "dump or a session viewer page")
    ConfigTree(ExportConfig).add_to(p)
    p.set_defaults(func=_run)


def export(cfg: ExportConfig) -> dict:
    """Read, write, and answer what was written. The files' paths are checked before anything is read, and
    a Proxy's read is acknowledged (``--drain``) only once every file was written."""
    from dressage.export import from_journal, reading_proxy

    for path, what in ((cfg.out, "out (--out)"), (cfg.html, "html (--html)")):
        if path is not None:
            check_writable(path, what, make_parents=True)
    if cfg.proxy_url is not None:
        from dressage.proxy.config import admin_token_of

        token = admin_token_of(cfg.admin_token_file, "admin_token_file (--admin-token-file)")
        with reading_proxy(cfg.proxy_url, token=token, drain=cfg.drain,
                           timeout_s=cfg.timeout_s) as sessions:
            return _write(cfg, sessions)
    spec = None
    if cfg.tq_spec is not None:
        from dressage.tq.client.spec import load_client_spec

        spec = load_client_spec(cfg.tq_spec)
    token_text = None
    if cfg.tokenizer is not None:
        from dressage.tokenizer import load_tokenizer
        from dressage.trajectory.view import TokenText

        token_text = TokenText(load_tokenizer(cfg.tokenizer).decode)
    return _write(cfg, from_journal(cfg.journal, tq_spec=spec, segment_view=cfg.segment_view, token_text=token_text))


def _write(cfg: ExportConfig, sessions: list) -> dict:
    from dressage.export import write_html, write_jsonl, write_parquet, write_slime

    samples = [s for ex in sessions for s in ex.samples]
    report = {"sessions": len(sessions), "segments": len(samples),
              "trained_tokens": int(sum(int(s.loss_mask.sum()) for s in samples)),
              "large_fields_as_refs": sum(1 for s in samples if s.remote), "drained": cfg.drain, "written": []}
    if cfg.out is not None:
        writer = {"parquet": write_parquet, "jsonl": write_jsonl, "slime": write_slime}[cfg.format]
        report["written"].append(str(writer(sessions, cfg.out)))
    if cfg.html is not None:
        report["written"].append(str(write_html(sessions, cfg.html)))
    return report


def _run(args: argparse.Namespace) -> int:
    cfg = ConfigTree(ExportConfig).build(args)
    report = export(cfg)
    note = (f"; {report['large_fields_as_refs']} Segments keep large fields as TransferQueue refs (sizes only: "
            "give --tq-spec to restore them)" if report["large_fields_as_refs"] else "")
    print(f"dressage export: {report['sessions']} sessions, {report['segments']} Segments, "
          f"{report['trained_tokens']} trained tokens -> {', '.join(report['written'])}{note}")
    return 0
