"""Small file helpers the checkouts and the builds share: remove a path whatever it is, read and
atomically write a JSON marker, the tail of a log; and the names of both's temporary entries."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TMP_NAME = re.compile(
    r"\.tmp-.+-(\d+)-[0-9a-f]{8}"
)  # .tmp-<name>-<pid>-<token>: a checkout or build in progress


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def tail(path: Path, n: int) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])
