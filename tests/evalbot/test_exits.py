"""How a harness step died, in the words a report gives: the signal by name, the exit code, the limit."""

from __future__ import annotations

import signal
import subprocess
import sys

from evalbot.evaluate.exits import describe_exit, signal_name


def test_a_signal_is_named_whether_reported_directly_or_as_128_plus_n():
    assert describe_exit(-signal.SIGILL) == "died of SIGILL, illegal instruction (exit code -4)"
    assert (
        describe_exit(128 + signal.SIGSEGV)
        == "died of SIGSEGV, segmentation fault (exit code 139 = 128 + 11)"
    )
    assert signal_name(signal.SIGKILL) == "SIGKILL, killed"


def test_exit_codes_and_time_limits():
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(2) == "exited with code 2"
    assert describe_exit(-999) == "exited with code -999"
    assert describe_exit(0, timed_out=True, timeout_s=60) == "was stopped at its time limit (60 s)"


def test_a_real_process_killed_by_sigill():
    proc = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    assert "SIGILL, illegal instruction" in describe_exit(proc.returncode)
