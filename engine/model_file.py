"""Which GGUF file a `--model` argument names: a path, or the name of a model evalbot's fetcher cached
(``python -m evalbot.reference.registry fetch NAME`` writes ``<cache>/models/NAME.gguf``), and its sha256.
The engine fetches nothing itself."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


class ModelFileError(ValueError):
    """A --model that names no GGUF file."""


def models_dir() -> Path:
    """Where evalbot's fetcher caches models: $EVALBOT_CACHE/models, else $XDG_CACHE_HOME/evalbot/models, else
    ~/.cache/evalbot/models."""
    if root := os.environ.get("EVALBOT_CACHE"):
        return Path(root) / "models"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evalbot" / "models"


def resolve(model: str) -> Path:
    """A GGUF path, or a cached model's name, as an existing file."""
    path = Path(model)
    if path.is_file():
        return path
    if "/" not in model and (cached := models_dir() / f"{model}.gguf").is_file():
        return cached
    raise ModelFileError(
        f"no such model file {model!r}, nor a model of that name in {models_dir()} (fetch one with: "
        f"python -m evalbot.reference.registry fetch NAME)"
    )


def model_sha256(path: Path) -> str:
    """The file's sha256: the fetcher's sidecar (``NAME.gguf.sha256``: "SIZE:MTIME_NS DIGEST") where it still
    describes the file, else computed."""
    st = path.stat()
    try:
        key, digest = path.with_name(path.name + ".sha256").read_text().split()
        if key == f"{st.st_size}:{st.st_mtime_ns}" and len(digest) == 64:
            return digest
    except (OSError, ValueError):
        pass
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
