"""Engine request ids (``rid``) that no abort can confuse.

SGLang aborts every request whose rid *starts with* the rid it is given, so a rid that is a
prefix of another (``p-s-1`` of ``p-s-10``, ``x`` of ``x-r1``) lets a pause of one call kill an
unrelated one. Every rid made here has the same length and shape::

    dr<proxy:6 hex><session:16 hex>_t<call:010d>_r<chunk:03d>

so none is a proper prefix of another. The session part is a hash of the session id, and the
``_t``/``_r`` suffixes are what a model gateway strips to find the conversation key, so every
call of one session also routes as one conversation.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import threading

from dressage.errors import ConfigError

__all__ = ["RidFactory", "chunk_rid", "RID_LENGTH", "MAX_CHUNKS"]

MAX_CHUNKS = 1000
"""Engine requests one call may take (a resume after each pause is one more)."""
_CALLS = 10 ** 10
RID_LENGTH = len("dr") + 6 + 16 + len("_t") + 10 + len("_r") + 3


def _session_key(session_id: str) -> str:
    return hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).hexdigest()


class RidFactory:
    """Makes the base rid of each model call; ``proxy_tag`` (6 hex) tells Proxies apart."""

    def __init__(self, proxy_tag: str | None = None) -> None:
        tag = proxy_tag if proxy_tag is not None else secrets.token_hex(3)
        if len(tag) != 6 or any(c not in "0123456789abcdef" for c in tag):
            raise ConfigError(f"a rid proxy tag is 6 lowercase hex digits, got {tag!r}")
        self.tag = tag
        self._calls = itertools.count()
        self._lock = threading.Lock()

    def call(self, session_id: str) -> str:
        """The base rid of the next call of ``session_id`` (its first engine request's rid)."""
        with self._lock:
            n = next(self._calls) % _CALLS
        return f"dr{self.tag}{_session_key(session_id)}_t{n:010d}_r000"

    def session_key(self, session_id: str) -> str:
        """The part every rid of ``session_id`` shares (a gateway's conversation key)."""
        return f"dr{self.tag}{_session_key(session_id)}"


def chunk_rid(base: str, chunk: int) -> str:
    """The rid of engine request ``chunk`` (0, 1, ... after each resume) of the call ``base``.

    A base that is not of :class:`RidFactory`'s shape gets a fixed-width chunk suffix appended,
    which keeps a caller's own rids apart from one another only if the caller made them so.
    """
    if not 0 <= int(chunk) < MAX_CHUNKS:
        raise ConfigError(f"a call may take at most {MAX_CHUNKS} engine requests, this is number {chunk}")
    if len(base) == RID_LENGTH and base.startswith("dr") and base[-5:-3] == "_r":
        return f"{base[:-3]}{int(chunk):03d}"
    return f"{base}_r{int(chunk):03d}"
