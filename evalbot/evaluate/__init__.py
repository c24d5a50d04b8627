"""Evaluation: worktrees, builds, the sandbox, the A/B runner; returns Measurements, never a verdict."""
