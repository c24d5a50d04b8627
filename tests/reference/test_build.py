"""The pinned, portable llama.cpp reference build: flags in one place, no AVX-512 or AMX code, an identity."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evalbot.reference import build as rb

ROOT = Path(__file__).resolve().parents[2]


def test_the_flags_turn_native_off_and_pin_x86_64_v3():
    flags = dict(a.removeprefix("-D").split("=") for a in rb.CMAKE_ARGS)
    assert flags["GGML_NATIVE"] == "OFF"
    assert all(flags[f] == "ON" for f in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C"))
    off = [k for k in flags if k.startswith(("GGML_AVX512", "GGML_AMX")) or k == "GGML_AVX_VNNI"]
    assert len(off) == 8 and all(flags[k] == "OFF" for k in off)


def test_the_makefile_installs_through_the_one_place_that_holds_the_flags():
    makefile = (ROOT / "Makefile").read_text()
    assert "evalbot.reference.build install" in makefile
    assert "GGML_" not in makefile and "CMAKE_ARGS" not in makefile  # no second copy of the flags
    assert "llama-cpp-python==" not in (ROOT / "pyproject.toml").read_text()  # no unpinned-flags route in


def test_build_environment_overrides_inherited_native_flags():
    env = rb.build_environ({"CMAKE_ARGS": "-DGGML_NATIVE=ON", "CFLAGS": "-march=native", "PATH": "/bin"}, 2)
    assert env["CMAKE_ARGS"] == " ".join(rb.CMAKE_ARGS) and "CFLAGS" not in env
    assert env["CMAKE_BUILD_PARALLEL_LEVEL"] == "2" and env["PATH"] == "/bin"


def test_build_key_names_version_and_flags():
    assert len(rb.build_key()) == 12
    assert rb.build_key() == rb.build_key()


def test_forbidden_registers_are_found_in_objdump_text():
    text = """
    1000:	vmovups %ymm0,(%rax)
    1004:	vfmadd231ps %zmm1,%zmm2,%zmm3
    1010:	tilezero %tmm0
    1014:	vpxor  %xmm5,%xmm5,%xmm5
    """
    assert rb.forbidden_registers(text) == {"zmm": 3, "tmm": 1}
    assert rb.forbidden_registers("vaddps %ymm1,%ymm2,%ymm3\n") == {}


def test_system_info_features_and_portability_problems():
    info = (
        "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 |"
    )
    feats = rb.compiled_features(info)
    assert feats["AVX2"] and feats["AVX512"] and feats["AMX_INT8"]
    ident = {
        "llama_cpp_python": rb.VERSION,
        "features": sorted(k for k, v in feats.items() if v),
        "libs": {"a": "b"},
    }
    problems = rb.portability_problems(ident)
    assert len(problems) == 1 and "AMX_INT8" in problems[0] and "AVX512" in problems[0]
    assert rb.portability_problems({**ident, "features": ["AVX", "AVX2", "FMA"]}) == []
    old = rb.portability_problems({**ident, "llama_cpp_python": "0.3.1", "features": []})
    assert "0.3.1" in old[0]


def test_check_isa_on_a_folder_without_libraries_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "evalbot.reference.build", "check-isa", "--lib-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "no libggml" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.reference
def test_the_built_reference_holds_no_avx512_or_amx_code():
    """objdump -d of every libggml*/libllama* in the installed llama_cpp: not one zmm or tmm register."""
    folder = rb.installed_lib_dir()
    assert folder is not None, "llama-cpp-python is not installed (make test installs it)"
    libs = sorted(p.name for p in folder.glob("libggml*.so*"))
    assert any("cpu" in n for n in libs), libs  # the CPU backend, where AVX-512/AMX kernels would live
    assert rb.scan_folder(folder) == {}


@pytest.mark.reference
def test_the_installed_reference_is_the_pinned_portable_build():
    ident = rb.identity()
    assert rb.portability_problems(ident) == []
    assert ident["cmake_args"] == " ".join(rb.CMAKE_ARGS) and len(ident["lib_sha256"]) == 64
    assert {"AVX2", "FMA", "F16C"} <= set(ident["features"])
