"""The llama.cpp reference build: one pinned version, one portable instruction set, one identity.

A native build (llama.cpp's default, ``-march=native``) makes the reference's numerics depend on the
box that built it, and on a Sapphire Rapids VM its AMX path died with SIGILL. So the reference is
built here, and only here, from the llama-cpp-python sdist with a fixed x86-64-v3 instruction set:
SSE4.2, AVX, AVX2, FMA, F16C and BMI2 on; AVX-VNNI, AVX-512 and AMX off. Every x86-64 box of the
last ten years runs the same code, and ``check-isa`` proves it by disassembly.

The wheel is built once per (version, flags) into a cache directory named by their hash, next to pip's
own cache (pip's wheel cache keys on the sdist's URL alone, so it would hand back a build made with
other flags). ``identity()`` is what every score record, cache key, report and receipt carries.

    python -m evalbot.reference.build install     # build (once) and install the pinned wheel here
    python -m evalbot.reference.build identity    # the installed build's identity, as JSON
    python -m evalbot.reference.build check-isa   # disassemble libggml*.so: no zmm or tmm register
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from evalbot.reference.registry import sha256_file

VERSION = "0.3.36"
# The one place the reference's build flags live (the Makefile and CI call `install`, which reads them).
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AVX512_VBMI=OFF",
    "-DGGML_AVX512_VNNI=OFF",
    "-DGGML_AVX512_BF16=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DGGML_BACKEND_DL=OFF",
    "-DGGML_CPU_ALL_VARIANTS=OFF",
    "-DLLAVA_BUILD=OFF",
)
# Features that must never be compiled in, as llama.cpp's system info names them.
FORBIDDEN_FEATURES = (
    "AVX512",
    "AVX512_VBMI",
    "AVX512_VNNI",
    "AVX512_BF16",
    "AMX_INT8",
    "AMX_BF16",
    "AVX_VNNI",
)
# AVX-512 code uses zmm (and k mask) registers; AMX uses tmm tiles. Either in the disassembly fails.
_FORBIDDEN_REGISTER = re.compile(r"%(zmm\d+|tmm\d)\b")
_LIB_GLOB = ("libggml*.so*", "libllama*.so*")


class BuildFailure(RuntimeError):
    """The reference could not be built, installed or inspected; the message says which and why."""


def build_key() -> str:
    """The cache key of the wheel: version and flags (12 hex digits of their sha256)."""
    blob = json.dumps({"version": VERSION, "cmake_args": list(CMAKE_ARGS)}, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def wheel_cache_root() -> Path:
    """$EVALBOT_REFERENCE_WHEELS, else evalbot-reference/ inside pip's cache (which CI keeps)."""
    explicit = os.environ.get("EVALBOT_REFERENCE_WHEELS")
    if explicit:
        return Path(explicit)
    pip_cache = os.environ.get("PIP_CACHE_DIR")
    if pip_cache:
        return Path(pip_cache) / "evalbot-reference"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pip" / "evalbot-reference"


def cached_wheel(root: Path | None = None) -> Path | None:
    """The built wheel for this version and these flags, if one is cached."""
    folder = (root or wheel_cache_root()) / f"{VERSION}-{build_key()}"
    found = sorted(folder.glob("llama_cpp_python-*.whl"))
    return found[0] if found else None


def build_environ(environ: dict[str, str], jobs: int) -> dict[str, str]:
    """The environment of the sdist build: our flags, all cores, nothing native inherited."""
    env = {k: v for k, v in environ.items() if k not in ("CMAKE_ARGS", "CFLAGS", "CXXFLAGS", "FORCE_CMAKE")}
    return env | {
        "CMAKE_ARGS": " ".join(CMAKE_ARGS),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
        "FORCE_CMAKE": "1",
    }


def build_wheel(root: Path | None = None, log=print) -> Path:
    """The cached wheel, building it from the sdist first when missing (5-25 minutes on 2 cores)."""
    hit = cached_wheel(root)
    if hit is not None:
        return hit
    folder = (root or wheel_cache_root()) / f"{VERSION}-{build_key()}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    log(
        f"building llama-cpp-python {VERSION} from source, portable ({' '.join(CMAKE_ARGS)}); this takes a while"
    )
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}-", dir=folder.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-binary",
            "llama-cpp-python",
            "--no-cache-dir",
            "-w",
            tmp,
            f"llama-cpp-python=={VERSION}",
        ]
        proc = subprocess.run(
            cmd,
            env=build_environ(dict(os.environ), os.cpu_count() or 1),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            raise BuildFailure(
                f"building llama-cpp-python {VERSION} failed (exit {proc.returncode}):\n{tail}"
            )
        wheels = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if not wheels:
            raise BuildFailure(f"pip wheel succeeded but left no llama_cpp_python wheel in {tmp}")
        offenders = scan_wheel(wheels[0])
        if offenders:
            raise BuildFailure(f"the built wheel holds AVX-512 or AMX code, refusing it: {offenders}")
        staged = Path(tmp) / "done"
        staged.mkdir()
        shutil.move(str(wheels[0]), staged / wheels[0].name)
        shutil.rmtree(folder, ignore_errors=True)
        staged.rename(folder)  # the folder appears whole or not at all
    hit = cached_wheel(root)
    assert hit is not None
    return hit


def installed_lib_dir() -> Path | None:
    """The directory holding the installed llama_cpp's shared libraries (without importing llama_cpp)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib if lib.is_dir() else None


def _libs(folder: Path) -> list[Path]:
    found: set[Path] = set()
    for pattern in _LIB_GLOB:
        found |= {p for p in folder.glob(pattern) if p.is_file() and not p.is_symlink()}
    return sorted(found)


def lib_digests(folder: Path) -> dict[str, str]:
    """sha256 of every llama.cpp and ggml shared library in folder, by its shortest name (a wheel holds
    libggml.so, libggml.so.0 and libggml.so.0.25.3 as three copies of one file)."""
    by_digest: dict[str, str] = {}
    for p in _libs(folder):
        digest = sha256_file(p)
        name = by_digest.get(digest)
        by_digest[digest] = p.name if name is None or len(p.name) < len(name) else name
    return {name: digest for digest, name in sorted(by_digest.items(), key=lambda kv: kv[1])}


def combined_digest(digests: dict[str, str]) -> str:
    """One sha256 naming the whole set of libraries."""
    return hashlib.sha256("".join(f"{n} {d}\n" for n, d in sorted(digests.items())).encode()).hexdigest()


def installed_matches(wheel: Path) -> bool:
    """True when the installed llama_cpp's libraries are byte-identical to the wheel's."""
    lib = installed_lib_dir()
    if lib is None:
        return False
    want: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            base = name.rsplit("/", 1)[-1]
            if name.startswith("llama_cpp/lib/") and any(Path(base).match(g) for g in _LIB_GLOB):
                want[base] = hashlib.sha256(zf.read(name)).hexdigest()
    have = {sha256_file(p) for p in _libs(lib)}
    return bool(want) and have == set(want.values())


def compiled_features(system_info: str) -> dict[str, bool]:
    """`FEATURE = 1` pairs of llama.cpp's system info (the CPU backend's compiled-in instruction sets)."""
    return {m.group(1): m.group(2) == "1" for m in re.finditer(r"([A-Z0-9_]+) = (\d)", system_info)}


def identity(llama_cpp: Any = None) -> dict[str, Any]:
    """Version, pinned flags, library digests and compiled features of the llama.cpp in this interpreter."""
    if llama_cpp is None:  # imported by name: lint type-checks this file where llama.cpp is not built
        llama_cpp = importlib.import_module("llama_cpp")
    lib = Path(llama_cpp.__file__).parent / "lib"
    digests = lib_digests(lib) if lib.is_dir() else {}
    raw = llama_cpp.llama_print_system_info()
    info = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    features = compiled_features(info)
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "pinned_version": VERSION,
        "cmake_args": " ".join(CMAKE_ARGS),
        "build_key": build_key(),
        "libs": digests,
        "lib_sha256": combined_digest(digests),
        "features": sorted(k for k, on in features.items() if on),
    }


def portability_problems(ident: dict[str, Any]) -> list[str]:
    """Why an installed reference is not the pinned portable build (empty when it is)."""
    problems = []
    if ident.get("llama_cpp_python") != VERSION:
        problems.append(
            f"llama-cpp-python {ident.get('llama_cpp_python')} is installed, the pin is {VERSION}"
        )
    bad = sorted(set(ident.get("features", ())) & set(FORBIDDEN_FEATURES))
    if bad:
        problems.append(f"it was compiled with {', '.join(bad)} (a native build?)")
    if not ident.get("libs"):
        problems.append("no llama.cpp shared library was found beside the module")
    return problems


def forbidden_registers(disassembly: str) -> dict[str, int]:
    """Counts of zmm/tmm registers in objdump output (AVX-512 and AMX instructions)."""
    counts: dict[str, int] = {}
    for m in _FORBIDDEN_REGISTER.finditer(disassembly):
        kind = m.group(1).rstrip("0123456789")
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def scan_library(path: Path) -> dict[str, int]:
    """Disassemble one shared library with objdump; the forbidden registers it uses."""
    objdump = shutil.which("objdump")
    if objdump is None:
        raise BuildFailure("objdump is not installed (Debian: binutils); it is needed to check the build")
    proc = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildFailure(f"objdump -d {path} failed: {proc.stderr.strip()[-500:]}")
    return forbidden_registers(proc.stdout)


def scan_folder(folder: Path) -> dict[str, dict[str, int]]:
    """Forbidden registers per library in folder; empty when every library is portable."""
    libs = _libs(folder)
    if not libs:
        raise BuildFailure(f"no libggml*/libllama* shared library in {folder}")
    return {p.name: hits for p in libs if (hits := scan_library(p))}


def scan_wheel(wheel: Path) -> dict[str, dict[str, int]]:
    """scan_folder over the libraries inside a wheel."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("llama_cpp/lib/"):
                zf.extract(name, tmp)
        return scan_folder(Path(tmp) / "llama_cpp" / "lib")


def install(log=print) -> Path:
    """Build (once) and install the pinned portable wheel into this interpreter; the wheel's path."""
    wheel = build_wheel(log=log)
    if installed_matches(wheel):
        return wheel
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q", str(wheel)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildFailure(f"installing {wheel.name} failed: {(proc.stdout + proc.stderr).strip()[-2000:]}")
    # llama-cpp-python's own runtime dependencies (numpy, jinja2, diskcache, typing-extensions)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", str(wheel)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildFailure(
            f"installing the dependencies of {wheel.name} failed: {proc.stderr.strip()[-2000:]}"
        )
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evalbot.reference.build", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="build (once, cached) and install the pinned portable wheel")
    sub.add_parser("identity", help="print the installed reference's identity as JSON")
    check = sub.add_parser(
        "check-isa", help="fail if any installed llama.cpp library holds AVX-512 or AMX code"
    )
    check.add_argument(
        "--lib-dir", type=Path, default=None, help="scan this folder instead of the installed one"
    )
    sub.add_parser("flags", help="print the pinned CMake flags")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            wheel = install(log=lambda m: print(m, file=sys.stderr))
            print(wheel)
        elif args.command == "flags":
            print(" ".join(CMAKE_ARGS))
        elif args.command == "identity":
            print(json.dumps(identity(), indent=2))
        else:
            folder = args.lib_dir or installed_lib_dir()
            if folder is None:
                raise BuildFailure(
                    "llama-cpp-python is not installed; run: python -m evalbot.reference.build install"
                )
            offenders = scan_folder(folder)
            if offenders:
                print(f"error: AVX-512 or AMX code in {folder}: {json.dumps(offenders)}", file=sys.stderr)
                return 1
            print(f"ok: no zmm or tmm register in {len(_libs(folder))} libraries under {folder}")
    except (BuildFailure, OSError, zipfile.BadZipFile) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
