"""`make lint`: code in the product's packages (evalbot, engine, kernels) that nothing in them uses.

Two checks, each over the product's own code only, so that code kept alive by tests or benches alone is
reported too:

- vulture (60% confidence: unused functions, classes, methods, properties, attributes and variables),
  with the names the Jinja templates read counted as used, click's commands as called, and the names in
  scripts/dead_code_whitelist.py, each with the reason nothing here reads it;
- every module must be reachable by imports from an entry point: the console script, the packages'
  ``__main__``, or a module run as ``python -m`` (``ENTRY_MODULES``).

Exit status 1 and one line per finding when there is any; delete the dead code (and its tests), or, when
it really is used in a way these checks cannot see, say so in the whitelist (or ``ENTRY_MODULES``).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

import grimp
from dead_code_whitelist import USED_UNSEEN
from vulture import Vulture

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evalbot", "engine", "kernels")
MIN_CONFIDENCE = 60
# click calls the functions it decorates
IGNORE_DECORATORS = ["@*.command", "@*.group", "@click.*"]
# Modules another process runs with `python -m` (the console script and `__main__` modules are found):
ENTRY_MODULES = {
    "evalbot.reference.__main__": "the harness runs `python -m evalbot.reference score|audit` (evaluate/reference.py)",
    "evalbot.reference.compare": "`python -m evalbot.reference.compare REF TEST` sets two score files side by side",
    "evalbot.reference.build": "`make setup-dev` runs `python -m evalbot.reference.build install`",
    "evalbot.reference.registry": "`make models` and the harness run `python -m evalbot.reference.registry fetch`",
    "engine.synthetic": "`python -m engine.synthetic PATH` writes a tiny random model (README)",
    "evalbot.evaluate.gpu_probe": "the harness runs it by its path on a GPU box (evaluate/device_idle.py)",
    "evalbot.evaluate.http_relay": "the harness runs it by its path inside an HTTP engine's sandbox (evaluate/protocols.py)",
}
# `{{ x.name }}`, `attribute="name"`: the attributes the templates read
_TEMPLATE_NAME = re.compile(r"\.\s*([A-Za-z_]\w*)|attribute\s*=\s*[\"']([A-Za-z_]\w*)[\"']")


def template_names() -> set[str]:
    """Every attribute name the product's Jinja templates read."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.j2"):
            for m in _TEMPLATE_NAME.finditer(path.read_text(encoding="utf-8")):
                names.add(m.group(1) or m.group(2))
    return names


def unused_code() -> list[str]:
    """vulture's findings over the packages."""
    v = Vulture(ignore_names=sorted(template_names() | set(USED_UNSEEN)), ignore_decorators=IGNORE_DECORATORS)
    v.scavenge(list(PACKAGES))
    return [item.get_report() for item in v.get_unused_code(min_confidence=MIN_CONFIDENCE)]


def entry_modules() -> set[str]:
    """The console scripts' modules, every `__main__`, and ENTRY_MODULES."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    scripts = {target.split(":")[0] for target in project.get("scripts", {}).values()}
    mains = {f"{p}.__main__" for p in PACKAGES if (ROOT / p / "__main__.py").exists()}
    return scripts | mains | set(ENTRY_MODULES)


def unreachable_modules() -> list[str]:
    """Modules of the packages that no import chain from an entry point reaches."""
    graph = grimp.build_graph(*PACKAGES)
    missing = sorted(entry_modules() - graph.modules)
    if missing:
        raise SystemExit(f"dead_code.py: entry modules that do not exist: {', '.join(missing)}")
    seen: set[str] = set()
    todo = list(entry_modules())
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        # importing a module runs its packages' __init__ first
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(graph.find_modules_directly_imported_by(module))
    return [
        f"{m}: no import chain from an entry point reaches this module" for m in sorted(graph.modules - seen)
    ]


def main() -> int:
    os.chdir(ROOT)  # findings name paths from the repository's root
    sys.path.insert(0, str(ROOT))  # grimp finds the packages on the path
    findings = unused_code() + unreachable_modules()
    for line in findings:
        print(line, flush=True)
    if findings:
        print(f"dead code: {len(findings)} finding(s); see scripts/dead_code.py", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
