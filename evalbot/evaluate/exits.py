"""How a process ended, in words a maintainer can act on: the signal by name, the exit code, the time limit."""

from __future__ import annotations

import signal


def signal_name(signum: int) -> str | None:
    """'SIGILL, illegal instruction' for 4; None for a number that names no signal."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return None
    text = (signal.strsignal(signum) or "").split(":")[0].strip().lower()
    return f"{name}, {text}" if text else name


def describe_exit(returncode: int, *, timed_out: bool = False, timeout_s: float | None = None) -> str:
    """One phrase for how a process ended: a death by signal (directly, or as 128+N from a sandbox or
    shell) names the signal, anything else gives the exit code."""
    if timed_out:
        return (
            f"was stopped at its time limit ({timeout_s:.0f} s)"
            if timeout_s
            else "was stopped at its time limit"
        )
    if returncode < 0:
        name = signal_name(-returncode)
        return f"died of {name} (exit code {returncode})" if name else f"exited with code {returncode}"
    if 128 < returncode <= 128 + 64:
        name = signal_name(returncode - 128)
        if name:
            return f"died of {name} (exit code {returncode} = 128 + {returncode - 128})"
    return f"exited with code {returncode}"
