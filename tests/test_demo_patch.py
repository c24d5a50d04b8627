"""The demo's contributor patch must keep applying to main, or `make demo` breaks."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_patch_applies_to_this_checkout():
    patches = sorted((ROOT / "demo").glob("*.patch"))
    assert patches, "demo/ holds no patch"
    for patch in patches:
        proc = subprocess.run(
            ["git", "-C", str(ROOT), "apply", "--check", str(patch)], capture_output=True, text=True
        )
        assert proc.returncode == 0, f"{patch.name} no longer applies: {proc.stderr}"
