"""Whether a built venv imports main's harness byte for byte (rules: policy.harness_modules).

A PR that touches no harness file can still change what its venv imports as the harness: packaging
(pyproject.toml, setup.py, package data, a .pth file) can put other bytes in place of a file the PR never
touched. So each built venv is asked, without running any of its code, how it resolves every harness
module and which start-up files it holds, and the head's answer must be main's.

The question is asked by the trusted toolchain's interpreter, reading the venv's files as data: never by
the venv's own `bin/python`, which the PR's build may have replaced with a program of its own (it would
run on the host, outside the sandbox, as the bot's user).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evalbot.evaluate.checkout import BuildError
from evalbot.evaluate.exits import describe_exit

# Runs under the trusted toolchain's interpreter (the one that made the venv) with -I -S, the venv's path
# as its first argument: nothing of the venv runs. It resolves each module the way the venv's site would
# set sys.path (its site directories, plus the plain directories its .pth files add), without importing
# anything, and lists every file that runs at start-up (.pth, sitecustomize, usercustomize) with its sha256.
_HARNESS_PROBE = """\
import hashlib, importlib.machinery as mach, json, os, sys, sysconfig
def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
venv = os.path.abspath(sys.argv[1])
cfg = os.path.join(venv, "pyvenv.cfg")
if not os.path.isfile(cfg):
    raise SystemExit("not a venv: " + venv)
want = "%d.%d" % sys.version_info[:2]
for line in open(cfg, encoding="utf-8", errors="replace"):
    key, _, value = line.partition("=")
    if key.strip() in ("version", "version_info") and not value.strip().startswith(want + "."):
        raise SystemExit("the venv is Python " + value.strip() + ", the toolchain " + want)
site = []
for key in ("purelib", "platlib"):
    p = sysconfig.get_paths(vars={"base": venv, "platbase": venv})[key]
    if p not in site and os.path.isdir(p):
        site.append(p)
startup, search = {}, list(site)
for d in site:
    for name in sorted(os.listdir(d)):
        full = os.path.join(d, name)
        if name.endswith(".pth") or name.split(".")[0] in ("sitecustomize", "usercustomize"):
            startup[name] = digest(full) if os.path.isfile(full) else "not a file"
        if name.endswith(".pth") and os.path.isfile(full):
            for line in open(full, encoding="utf-8", errors="replace"):
                line = line.strip()
                extra = os.path.join(d, line)
                if line and not line.startswith(("#", "import ", "import\t")) and os.path.isdir(extra):
                    search.append(extra)
found = {}
for module in sys.argv[2:]:
    name = module[: -len(".__init__")] if module.endswith(".__init__") else module
    parts, where, spec = name.split("."), search, None
    for i in range(len(parts)):
        spec = mach.PathFinder.find_spec(".".join(parts[: i + 1]), where)
        if spec is None:
            break
        where = list(spec.submodule_search_locations or [])
    origin = spec.origin if spec is not None and spec.has_location else None
    base = next((d for d in search if origin and origin.startswith(d + os.sep)), None)
    found[module] = None if spec is None else {
        "loader": type(spec.loader).__name__,
        "file": os.path.relpath(origin, base) if base else origin,
        "sha256": digest(origin) if origin and os.path.isfile(origin) else None,
    }
print(json.dumps({"modules": found, "startup": startup}, sort_keys=True))
"""


def harness_fingerprint(
    venv: Path, modules: Iterable[str], python: str | Path, timeout_s: float = 60
) -> dict[str, Any]:
    """How a built venv resolves each harness module (loader, file, sha256) and which start-up files
    (.pth, sitecustomize) it holds, asked by the trusted interpreter `python` (the toolchain that made the
    venv), never the venv's own; BuildError if the probe cannot run."""
    try:
        proc = subprocess.run([str(python), "-I", "-S", "-c", _HARNESS_PROBE, str(venv), *modules],
                              capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})  # fmt: skip
        if proc.returncode != 0:
            raise BuildError(
                f"cannot inspect the harness modules of {venv}: the probe {describe_exit(proc.returncode)}: "
                f"{proc.stderr.strip()[-500:]}"
            )
        return json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise BuildError(f"cannot inspect the harness modules of {venv}: {exc}") from exc


def harness_drift(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """How the head's built harness differs from main's (empty when byte-identical). Pure."""
    out = []
    for module, want in sorted(base.get("modules", {}).items()):
        got = head.get("modules", {}).get(module)
        if got != want:
            shown = "missing" if got is None else f"{got.get('file')} ({got.get('loader')})"
            out.append(f"{module} resolves to {shown}, not main's {want and want.get('file')}")
    b, h = base.get("startup", {}), head.get("startup", {})
    for name in sorted(set(b) | set(h)):
        if b.get(name) != h.get(name):
            out.append(
                f"start-up file {name} {'is new' if name not in b else 'differs from main' if name in h else 'is gone'}"
            )
    return out
