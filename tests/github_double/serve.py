"""Running the double: a context manager serving a GitHubState, and an instant fake clock for the adapter."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from tests.github_double.server import make_handler
from tests.github_double.state import START, GitHubState


@dataclass
class Double:
    """A running double: its state, and the base URL to give a GitHub client."""

    state: GitHubState
    base_url: str

    @property
    def repo(self) -> str:
        """The repository's "owner/name"."""
        return f"{self.state.owner}/{self.state.name}"


@dataclass
class FakeClock:
    """A clock and a sleep: sleeping only records the wait and moves the clock, so tests never wait."""

    now: float = float(START)
    sleeps: list[float] = field(default_factory=list)

    def time(self) -> float:
        """The current fake epoch second."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """Record a wait and advance the clock by it."""
        self.sleeps.append(seconds)
        self.now += seconds


@contextmanager
def serve(state: GitHubState | None = None) -> Iterator[Double]:
    """Serve ``state`` (a fresh one by default) on 127.0.0.1 at a free port until the block ends."""
    state = state or GitHubState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    server.daemon_threads = True  # a request hanging on purpose (a timeout fault) must not block shutdown
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll interval makes shutdown quick; the server is idle between tests anyway.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), name="github-double", daemon=True)
    thread.start()
    try:
        yield Double(state, state.base_url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
