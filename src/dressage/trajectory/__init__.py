"""Trajectory semantics, no I/O: sessions, StepRecords, lineage / timeline Segments, Samples, sharding.

Large fields are handled through :mod:`dressage.trajectory.pieces`, so nothing here knows
whether TransferQueue is on.
"""

from dressage.trajectory.pieces import Fill, FieldValue, Piece, RowSource, concat_pieces, num_rows
from dressage.trajectory.sample import SAMPLE_LARGE_FIELDS, Sample
from dressage.trajectory.segment import Segment, build_segments, lineage_chains, materialize_pieces, timeline_chains
from dressage.trajectory.session import RouteDecision, Session
from dressage.trajectory.sharding import shard_samples, shard_token_counts
from dressage.trajectory.step import LARGE_FIELDS, Boundary, PartialResponse, StepRecord

__all__ = [
    "Session", "RouteDecision", "StepRecord", "Boundary", "PartialResponse", "LARGE_FIELDS",
    "Segment", "build_segments", "materialize_pieces", "lineage_chains", "timeline_chains",
    "Sample", "SAMPLE_LARGE_FIELDS", "shard_samples", "shard_token_counts",
    "Piece", "Fill", "FieldValue", "RowSource", "concat_pieces", "num_rows",
]
