"""`evalbot` as a box without cgroup delegation runs it: every serving process metered from /proc and frozen
by SIGSTOP, on a box that has the cgroup v2 freezer. An experiment on the freezing path (is a result the
box's, or the path's?), never how evalbot runs.

    .venv/bin/python bench/sigstop_evalbot.py calibrate --repo . --rev HEAD --runs 2 --profile cpu ...

The engines then show state T (stopped) while frozen, and no evalbot cgroup exists under /sys/fs/cgroup.
"""

import sys

from evalbot.evaluate import cpumeter

_make_meter = cpumeter.make_meter


def _proc_meter(label, *, root=cpumeter.CGROUP_ROOT, prefer="cgroup"):
    return _make_meter(label, root=root, prefer="proc")


cpumeter.make_meter = _proc_meter  # served_model looks it up at each start

from evalbot.cli import main  # noqa: E402

sys.exit(main())
