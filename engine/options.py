"""Option groups that several `python -m engine` subcommands take, defined once."""

from __future__ import annotations

import argparse

from engine.shapes import SHAPES


def add_random_weights(p: argparse.ArgumentParser) -> None:
    """--random-weights --shape: time a real shape with random weights instead of a model file."""
    p.add_argument("--random-weights", action="store_true", help="a real shape with random weights (no file)")
    p.add_argument("--shape", choices=sorted(SHAPES), help="the shape for --random-weights")


def add_compile(p: argparse.ArgumentParser) -> None:
    """--compile / --no-compile, None when neither is given (the command picks by device)."""
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile each layer's dense halves (default: on for CUDA, off for the CPU)",
    )


def add_prompt_file(p: argparse.ArgumentParser) -> None:
    """--prompt-file for a timed prompt of --ctx tokens."""
    p.add_argument(
        "--prompt-file", help="prompt text, cut or tiled to --ctx tokens (default: the bundled corpus)"
    )


def add_sampling(p: argparse.ArgumentParser) -> None:
    """--temperature --top-k --top-p --seed: the sampling parameters (greedy by default)."""
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
