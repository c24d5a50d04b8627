"""Unpacking a workflow run's artifact zip safely: every member checked (no escaping paths, links or unusable
names) before anything is written, sizes capped as declared and as actually read, and the folder swapped
in whole. Plain zipfile, no PyGithub: ``adapter`` downloads the archive and hands its bytes here."""

from __future__ import annotations

import io
import re
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from evalbot.github.port import MAX_ARTIFACT_BYTES, ArtifactRejected


def extract_zip_safely(data: bytes, dest: Path, max_bytes: int = MAX_ARTIFACT_BYTES) -> Path:
    """Unpack zip bytes into ``dest`` (replaced if present), refusing escapes, links and oversize content."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ArtifactRejected(f"artifact is not a zip archive: {exc}") from exc
    with archive:
        members = archive.infolist()
        for member in members:  # all checked before anything is written
            _check_member(member)
        declared = sum(m.file_size for m in members)
        if declared > max_bytes:
            raise ArtifactRejected(
                f"artifact unpacks to {declared} bytes, more than the limit of {max_bytes}"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        try:
            written = 0
            for member in members:
                target = staging.joinpath(*PurePosixPath(member.filename).parts)
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as out:
                    # Declared sizes can lie; count what actually comes out.
                    while chunk := src.read(1 << 16):
                        written += len(chunk)
                        if written > max_bytes:
                            raise ArtifactRejected(f"artifact unpacks to more than {max_bytes} bytes")
                        out.write(chunk)
            if dest.exists():
                shutil.rmtree(dest)
            staging.rename(dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return dest


def _check_member(member: zipfile.ZipInfo) -> None:
    name = member.filename
    path = PurePosixPath(name)
    if not name or "\x00" in name or "\\" in name:
        raise ArtifactRejected(f"artifact member {name!r} has an unusable name")
    if path.is_absolute() or re.match(r"^[A-Za-z]:", name) or ".." in path.parts:
        raise ArtifactRejected(f"artifact member {name!r} would be written outside the artifact folder")
    if stat.S_ISLNK(member.external_attr >> 16):
        raise ArtifactRejected(f"artifact member {name!r} is a symbolic link")


__all__ = ["extract_zip_safely"]
