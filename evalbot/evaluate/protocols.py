"""How a serving process is started for the protocol engine.yaml names. Pure, given the interpreter.

`evalbot.serve/1` engines are started as their argv says. An HTTP engine (`llama-server/1`) is started
behind the harness's relay (`http_relay.py`, run by its path with the harness's own base interpreter in
isolated mode, never the engine's): the relay is the sandbox's first process, speaks evalbot.serve/1 to the
harness and HTTP to the engine on the sandbox's private loopback, at {port}.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from evalbot.rules.schema import HTTP_PROTOCOLS

RELAY = Path(__file__).with_name("http_relay.py")
SANDBOX_PORT = 8080  # each sandbox has a loopback of its own: no other process can hold it


@dataclass(frozen=True)
class Serving:
    """What to start, and the paths beyond the engine's own that its sandbox must show read-only."""

    argv: list[str]
    binds: tuple[Path, ...] = ()


def port_for(protocol: str, sandboxed: bool) -> str:
    """{port}: fixed in a sandbox (its loopback is its own), a free one of the host's without (a trusted
    engine checked --no-sandbox); empty for a stdio protocol."""
    if protocol not in HTTP_PROTOCOLS:
        return ""
    if sandboxed:
        return str(SANDBOX_PORT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def relay_python() -> str:
    """The harness's base interpreter (a venv's python is a link into a folder the sandbox does not show;
    the base install is among its system binds)."""
    return str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())


def serving(protocol: str, engine_argv: list[str], port: str) -> Serving:
    """The argv that serves `protocol` from the engine's own argv (its {port} already filled in)."""
    if protocol not in HTTP_PROTOCOLS:
        return Serving(engine_argv)
    return Serving([relay_python(), "-I", str(RELAY), "--port", port, "--", *engine_argv], (RELAY,))
