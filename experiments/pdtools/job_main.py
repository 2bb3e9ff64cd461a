"""xlkv_autopatch's main job (experiments/main.sh): the P/D greedy-output equivalence and the TTFT
benchmark on this machine's GPUs (the equivalence job, then the bench job), stock vs
ENABLE_XLKV=true (and vLLM's own opt-in where the release has one).

On a machine without GPUs it says so and runs what can run here: `xlkv_autopatch status` and real
prefill->decode KV transfers through the installed vLLM's own NixlConnector code with real NIXL
on host memory (tests/harness/pd_harness.py), stock vs ENABLE_XLKV=true, every block compared
byte for byte.  The vLLM for that comes from XLKV_HARNESS_PYTHON (a Python with vLLM + nixl) or is
installed by tests/harness/mkenv.sh (XLKV_VLLM, default 0.21.0) under XLKV_ENVS (default
/work/envs; about 9 GB on a first run).  Results: XLKV_MAIN_OUT (default /tmp/xlkv-main).

Exit: 0 pass, 1 a check failed, 2 set-up problem.
"""

import os
import subprocess
import sys

from . import job_bench, job_equivalence
from .cpuchecks import cpu_checks
from .pair import gpu_names
from .settings import EXIT_FAIL, EXIT_SETUP, EXP_DIR, REPO_DIR, run_job

NO_GPU = """==========================================================================================
no GPU on this machine: the GPU equivalence and TTFT benchmark (experiments/pd_equivalence.sh,
experiments/pd_bench.sh) cannot run here.  Running the CPU checks instead:
  1. python -m xlkv_autopatch status  (installed vLLM, flag, activation paths, patch targets)
  2. real P->D KV transfers through vLLM's NixlConnector + NIXL/UCX on host memory,
     stock vs ENABLE_XLKV=true, byte-for-byte (tests/harness/pd_harness.py)
Results and logs go to %(out)s (XLKV_MAIN_OUT)."""
INSTALL = """vLLM: %(ver)s (XLKV_VLLM), from the environments folder %(envs)s (XLKV_ENVS).
  If it is not there yet, tests/harness/mkenv.sh installs it now: vLLM, the CUDA torch it pins
  and NIXL from PyPI, about 9 GB of disk and about 5 minutes on a new machine; later runs reuse
  it.  XLKV_HARNESS_PYTHON=/path/to/python uses a Python that already has vLLM + nixl instead."""
NOISE = """Expected noise on a machine without CUDA (vLLM's and torch's own import-time messages, harmless):
  "Failed to import from vllm._C: ImportError('libcuda.so.1: ...')" (several times: vLLM tries
  its CUDA extension), "No CUDA runtime is found", "Triton ... 0 active driver(s)", and on some
  releases a Transformers deprecation warning ("Support for Transformers v4 is deprecated").
=========================================================================================="""


def main(settings):
    """The main job with the door's ``settings``; its exit code."""
    s = settings
    os.chdir(REPO_DIR)
    out = s.get("XLKV_MAIN_OUT", "/tmp/xlkv-main")
    os.makedirs(out, exist_ok=True)
    ngpu = len(gpu_names())
    if ngpu:
        eq_json = s.get("EQ_JSON") or os.path.join(out, "equivalence.json")   # the bench reads it too
        rc = run_job(job_equivalence.main, s, eq_json=eq_json)
        if rc:
            return rc
        # TTFT is compared with one GPU each for P and D: on fewer, P's and D's compute compete
        # (the KV itself moves at device speed there, pair.shared_gpu_ucx), so the main job skips it
        if ngpu < s.get_int("TP_P") + s.get_int("TP_D"):
            print("the TTFT benchmark is skipped: P and D would share a GPU, where their compute competes.")
            print("The equivalence above ran with P and D sharing the GPU; run this on a machine with a GPU")
            print("each for P and D for the benchmark (pd_bench.sh times a shared GPU too, marked shared_gpu).")
            return 0
        return run_job(job_bench.main, s, eq_json=eq_json)
    print(NO_GPU % {"out": out})
    py = s.get("XLKV_HARNESS_PYTHON")
    if py:
        print("vLLM: the Python in XLKV_HARNESS_PYTHON (%s); nothing is downloaded." % py)
    else:
        print(INSTALL % {"ver": s.get("XLKV_VLLM", "0.21.0"), "envs": s.get("XLKV_ENVS", "/work/envs")})
    print(NOISE, flush=True)
    if not py:
        ver = s.get("XLKV_VLLM", "0.21.0")
        print("installing or reusing vLLM %s + nixl for the CPU checks (tests/harness/mkenv.sh)" % ver, flush=True)
        r = subprocess.run(["bash", os.path.join(REPO_DIR, "tests", "harness", "mkenv.sh"), ver], env=s.environ,
                           stdout=subprocess.PIPE, text=True)
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or not lines:
            print("ERROR: could not install vLLM %s" % ver, file=sys.stderr)
            return EXIT_SETUP
        py = lines[-1]
    for args in (["wrapt>=1.14", "packaging>=21"], ["--no-deps", "-e", "."]):
        r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + args,
                           env=s.environ, capture_output=True, text=True)
        for line in (r.stdout + r.stderr).splitlines():
            if line.startswith("ERROR"):
                print(line)
    return 0 if cpu_checks(py, out, s, s.environ) else EXIT_FAIL
