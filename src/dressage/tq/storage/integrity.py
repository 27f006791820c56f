"""Payload integrity: an xxh3-64 checksum per row block of every stored blob, verified on read.

A blob is cut into blocks of whole rows of about ``BLOCK_BYTES``; a row-range read verifies only the
blocks it touches (at most two blocks more than the rows asked for), so a Segment reading 256 rows of a
256K-row blob does not hash the whole blob. A mismatch is :class:`IntegrityError`, never data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import xxhash

from dressage.errors import IntegrityError

__all__ = ["BLOCK_BYTES", "COPY_BYTES", "Checksums", "block_rows_for", "checksum", "copy_and_checksum",
           "write_and_checksum", "block_span", "verify_rows", "verify_blocks"]

# Small enough that a block just copied is still in cache when it is hashed, large enough that the
# per-block Python cost (~1 us) stays under 1 % of hashing it.
BLOCK_BYTES = 256 * 1024
# copy_and_checksum copies this much (whole blocks) at a time, then hashes those blocks: small enough to
# stay in a core's L2 between the copy and the hash.
COPY_BYTES = 1 << 20

_hash = xxhash.xxh3_64_intdigest


class Checksums(NamedTuple):
    """``digests[i]`` is the xxh3-64 of rows ``[i * block_rows, (i + 1) * block_rows)`` (a named tuple:
    one is made on every put, and a tuple costs a fraction of a dataclass to build)."""

    block_rows: int
    digests: np.ndarray  # uint64, one per block

    def to_bytes(self) -> bytes:
        """Little-endian ``block_rows`` then the digests (the trailer of a spill file)."""
        return np.uint64(self.block_rows).tobytes() + self.digests.astype("<u8").tobytes()


def block_rows_for(shape: tuple[int, ...], itemsize: int) -> int:
    row_nbytes = itemsize
    for d in shape[1:]:
        row_nbytes *= int(d)
    return max(1, BLOCK_BYTES // row_nbytes) if row_nbytes else max(1, int(shape[0]) if shape else 1)


def _blocks(flat: np.ndarray, shape: tuple[int, ...], itemsize: int) -> tuple[int, int, int]:
    rows = int(shape[0]) if shape else 1
    block_rows = block_rows_for(shape, itemsize)
    row_nbytes = flat.nbytes // rows if rows else 0
    return rows, block_rows, row_nbytes


def checksum(array: np.ndarray) -> Checksums:
    """Per-block checksums of a C-contiguous array (rows on the first axis)."""
    flat = array.reshape(-1).view(np.uint8)
    rows, block_rows, row_nbytes = _blocks(flat, array.shape, array.itemsize)
    step = block_rows * row_nbytes
    n = -(-rows // block_rows) if rows else 0
    digests = np.empty(n, dtype=np.uint64)
    for i in range(n):
        digests[i] = _hash(flat[i * step:(i + 1) * step])
    return Checksums(block_rows, digests)


def copy_and_checksum(dst: np.ndarray, src: np.ndarray) -> Checksums:
    """Copy ``src`` into ``dst`` (C-contiguous, same size) and hash each block of ``dst`` while it is
    still in cache: the copy goes in pieces of ``COPY_BYTES`` (whole blocks), and each piece's blocks are
    hashed right after it, so the payload is read once from the source and once more from cache instead
    of a copy followed by a second pass over memory. One copy call a piece rather than one a block: a
    1 MiB piece still fits in L2, and at four blocks a MiB the per-call cost of copying block by block
    was more than the cache saved (57 against 51 us a MiB here). The digest is of what was stored, not
    of the source (a source written to during the copy cannot leave a stored block that fails). Blocks
    are copied and hashed through memoryviews: a slice of one costs a fraction of a numpy view."""
    shape = src.shape
    rows = shape[0] if shape else 1
    nbytes = src.nbytes
    if not rows:
        return Checksums(block_rows_for(shape, src.itemsize), np.empty(0, dtype=np.uint64))
    row_nbytes = nbytes // rows
    block_rows = block_rows_for(shape, src.itemsize)  # the one rule checksum() and the readers share
    if not nbytes:  # rows of zero bytes: one empty block (a memoryview with a zero in its shape cannot cast)
        return Checksums(block_rows, np.array((_hash(b""),), dtype=np.uint64))
    d = memoryview(dst).cast("B")
    s = memoryview(src if src.flags.c_contiguous else np.ascontiguousarray(src)).cast("B")
    step = block_rows * row_nbytes
    if step >= nbytes:  # one block
        d[:] = s
        return Checksums(block_rows, np.array((_hash(d),), dtype=np.uint64))
    piece = max(1, COPY_BYTES // step) * step
    digests = []
    for lo in range(0, nbytes, piece):
        hi = min(lo + piece, nbytes)
        d[lo:hi] = s[lo:hi]
        for b in range(lo, hi, step):
            digests.append(_hash(d[b:b + step]))
    return Checksums(block_rows, np.array(digests, dtype=np.uint64))


def write_and_checksum(write: Callable[[memoryview, int], None], src: np.ndarray) -> Checksums:
    """Hand ``src`` (C-contiguous) to ``write(piece, offset)`` block by block and hash each block of the
    source right after it was written, while it is still in cache (a writer filling a shared-memory
    segment: the digests are what the unit stores, so it never reads the segment to hash it)."""
    shape = src.shape
    rows = shape[0] if shape else 1
    nbytes = src.nbytes
    block_rows = block_rows_for(shape, src.itemsize)
    if not rows or not nbytes:
        write(memoryview(b""), 0)
        return checksum(src)
    s = memoryview(src).cast("B")
    step = block_rows * (nbytes // rows)
    digests = []
    for lo in range(0, nbytes, step):
        piece = s[lo:lo + step]
        write(piece, lo)
        digests.append(_hash(piece))
    return Checksums(block_rows, np.array(digests, dtype=np.uint64))


def block_span(start: int, stop: int, block_rows: int, rows: int) -> tuple[int, int, int, int]:
    """The whole blocks that rows ``[start, stop)`` (non-empty) of a ``rows``-row blob touch: the first
    and last block, and the rows ``[lo, hi)`` they cover."""
    first, last = start // block_rows, (stop - 1) // block_rows
    return first, last, first * block_rows, min((last + 1) * block_rows, rows)


def verify_rows(blob: np.ndarray, sums: Checksums, start: int, stop: int, what: str) -> None:
    """Verify the blocks of a whole stored ``blob`` that rows ``[start, stop)`` touch."""
    if stop <= start:
        return
    first, _, lo, hi = block_span(start, stop, sums.block_rows, blob.shape[0])
    verify_blocks(blob[lo:hi], sums, first, what)


def verify_blocks(rows: np.ndarray, sums: Checksums, first_block: int, what: str) -> None:
    """Verify ``rows``, which start at block ``first_block`` and end on a block boundary or the blob's end."""
    flat = rows.reshape(-1).view(np.uint8)
    n_rows = rows.shape[0]
    if not n_rows:
        return
    step = (flat.nbytes // n_rows) * sums.block_rows
    n = -(-n_rows // sums.block_rows)
    for i in range(n):
        got = _hash(flat[i * step:(i + 1) * step])
        want = int(sums.digests[first_block + i])
        if got != want:
            b = first_block + i
            raise IntegrityError(
                f"{what}: checksum mismatch in rows [{b * sums.block_rows}, {(b + 1) * sums.block_rows}) "
                f"(xxh3-64 {got:016x}, stored {want:016x}); the stored bytes are corrupted"
            )
