"""What `evalbot evaluate` shows while it works: a live rich display on a terminal, plain lines elsewhere.

On a terminal the log scrolls above a status block: the stage, and per context the pairs measured so
far, the running ratio and CI, and the time left in the profile's A/B budget. In CI and workflow logs
(no terminal) every message is one plain line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Log = Callable[[str], None]
Progress = Callable[[dict[str, Any]], None]


def _status(state: dict[int, dict[str, Any]], stage: str) -> Any:
    from rich.table import Table

    table = Table(title=f"evalbot: {stage}", show_edge=False, expand=False)
    for col in ("context", "block", "pairs", "ratio", "95% CI", "budget left"):
        table.add_column(col, justify="right")
    for ctx, e in sorted(state.items()):
        ci = e.get("ci")
        table.add_row(
            str(ctx),
            f"{e['block']}/{e['blocks_max']}",
            f"{e['pairs']}/{e['pairs_max']}",
            f"{e['ratio']:.4f}x",
            f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "—",
            f"{e['eta_s']:.0f} s",
        )
    return table


@contextmanager
def reporter(tty: bool | None = None) -> Iterator[tuple[Log, Progress | None]]:
    """(log, progress) for one evaluation: a live display on a terminal, plain stderr lines otherwise."""
    if not (sys.stderr.isatty() if tty is None else tty):
        yield (lambda msg: print(f"evalbot: {msg}", file=sys.stderr, flush=True)), None
        return
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    state: dict[int, dict[str, Any]] = {}
    stage = ["starting"]
    with Live(_status(state, stage[0]), console=console, refresh_per_second=4, transient=False) as live:

        def log(msg: str) -> None:
            live.console.log(msg)
            if not msg.startswith("block "):
                stage[0] = msg[:80]
                live.update(_status(state, stage[0]))

        def progress(event: dict[str, Any]) -> None:
            if event.get("stage") == "A/B" and "context" in event:
                state[int(event["context"])] = event
                stage[0] = f"A/B runs, block {event['block']} of at most {event['blocks_max']}"
                live.update(_status(state, stage[0]))

        yield log, progress
