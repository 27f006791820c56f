"""Trajectory export: finalized sessions from a running Proxy or a journal to Parquet, JSONL, slime's
debug-rollout dump, or the self-contained session viewer page.

Sits above the Proxy and the trainer (it reads one and restores like the other); the Proxy itself
never imports it.
"""

from dressage.trajectory.rows import ExportedSession, segment_rows
from dressage.export.sources import from_journal, from_proxy, reading_proxy
from dressage.export.writers import FORMATS, write_html, write_jsonl, write_parquet, write_slime

__all__ = ["ExportedSession", "segment_rows", "from_proxy", "reading_proxy", "from_journal", "FORMATS", "write_jsonl",
           "write_parquet", "write_slime", "write_html"]
