"""bench/cluster_probe.py answers its question with a record, whichever way the installed Triton goes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "bench" / "cluster_probe.py"


def test_probe_reports_the_cluster_exchange_and_its_instructions():
    run = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=600)
    record = json.loads(run.stdout)
    assert record["target"] == "sm_90" and record["num_ctas"] == 16 and record["triton"]
    assert run.returncode == (0 if record["compiled"] else 1)
    if record["compiled"]:  # the exchange went through distributed shared memory and cluster barriers
        assert all(n > 0 for n in record["ptx_counts"].values()), record
    else:  # a failure names the compiler's own error, not a crash of the probe
        assert record["error"] and record["diagnostics"], record
