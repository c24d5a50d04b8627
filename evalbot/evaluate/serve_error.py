"""How a serving process failed: `ServeError`, raised by the process, its reader, its freezing and its
scheduling alike."""

from __future__ import annotations


class ServeError(RuntimeError):
    """A serving process broke the protocol, died, flooded its output or ran out of time; `stage` says
    which (protocol, run, output, timeout, serve) and the message says how."""

    def __init__(self, message: str, tail: str = "", stage: str = "serve"):
        super().__init__(message)
        self.tail, self.stage = tail, stage
