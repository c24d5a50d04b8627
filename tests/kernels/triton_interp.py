"""Triton's interpreter for the kernel tests on the CPU, shared by every kernel test module.

Triton decides whether its own ``tl`` helpers (``tl.max``, ``tl.cdiv``...) are interpreted when it is first
imported, so `import_triton` sets ``TRITON_INTERPRET`` just around that import (without CUDA, if nothing
imported triton earlier) and restores it. If something did import it earlier in the same pytest process,
the in-process kernel tests skip and `run_in_fresh_interpreter` runs the module in a subprocess instead,
so they are never silently lost.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def import_triton() -> bool:
    """Import triton (interpreted where there is no CUDA); whether its interpreter is ready in-process."""
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        import triton.language  # noqa: F401

        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.cdiv, InterpretedFunction)


def run_in_fresh_interpreter(path: str) -> None:
    """Run a kernel test module's CPU tests in a fresh process with the interpreter on; assert they pass."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", path]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
