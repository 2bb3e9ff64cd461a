"""What runs without a GPU, the one copy of it (the main job's CPU path and every GPU job on a
machine without GPUs): ``xlkv_autopatch status``, then real P->D KV transfers through the installed
vLLM's own NixlConnector + NIXL on host memory (tests/harness/pd_harness.py), stock and
ENABLE_XLKV=true, every block compared byte for byte, and their table (the shim must bring the
descriptors per block down, to at most 2).
"""

import json
import os
import subprocess
import sys

from .settings import EXIT_FAIL, EXIT_NO_GPU, REPO_DIR, LabExit, die, log


def cpu_checks(py, out, settings, env):
    """PYTHON ``py`` needs vLLM, nixl and the shim importable; results OUT/cpu-{stock,xlkv}.json
    (and .log); ``env``: the children's environment.  True when every check passed."""
    os.makedirs(out, exist_ok=True)
    ok = subprocess.run([py, "-m", "xlkv_autopatch", "status"], cwd="/", env=env).returncode == 0
    sys.stdout.flush()
    rows = []
    for cfg in ("stock", "xlkv"):
        print("--- P->D transfer, %s" % cfg, flush=True)
        run_env = dict(env)
        if cfg == "xlkv":
            run_env["ENABLE_XLKV"] = "true"
        path = os.path.join(out, "cpu-%s.json" % cfg)
        with open(os.path.join(out, "cpu-%s.log" % cfg), "w") as logf:
            try:
                subprocess.run([py, os.path.join(REPO_DIR, "tests", "harness", "pd_harness.py"), "--out", path], env=run_env,
                               stdout=logf, stderr=subprocess.STDOUT,
                               timeout=settings.get_int("HARNESS_TIMEOUT", "900"))
            except subprocess.TimeoutExpired:
                pass
        d = json.load(open(path)) if os.path.exists(path) else {
            "errors": ["no result (see %s)" % path.replace(".json", ".log")]}
        rows.append((cfg, d))
    passed = all(bool(d.get("transfer_verified")) for _, d in rows)
    print("%-6s %-8s %-12s %-8s %-16s %s" % ("config", "vLLM", "cross-layer", "regions", "descs per block",
                                              "bytes verified"))
    for cfg, d in rows:
        print("%-6s %-8s %-12s %-8s %-16s %s" % (cfg, d.get("vllm"), d.get("cross_layer"), d.get("num_regions"),
                                                d.get("descs_per_block"), d.get("transfer_verified")))
        for e in d.get("errors") or []:
            print("   error: %s" % str(e)[:300])
    s, x = rows[0][1].get("descs_per_block"), rows[1][1].get("descs_per_block")
    if passed and isinstance(s, int) and isinstance(x, int):
        passed = x < s and x <= 2
        print("descriptors per block: stock %s -> xlkv %s (%s)" % (s, x, "OK" if passed else "NOT fewer"))
    print("CPU checks: %s (GPU runs skipped: no GPU)" % ("PASS" if passed else "FAIL"), flush=True)
    return ok and passed


def cpu_only_checks(settings, env):
    """A GPU job's CPU checks: cpu_checks with XLKV_HARNESS_PYTHON (a Python whose vLLM runs on
    CPU, e.g. from tests/harness/mkenv.sh; default $PY), results in WORK; ``env``: the job's
    children's.  CPU_CHECKS_CMD replaces it (a shell command; tests use it)."""
    if settings.get("CPU_CHECKS_CMD"):
        sys.stdout.flush()
        return subprocess.run(["bash", "-c", settings.get("CPU_CHECKS_CMD")], env=env).returncode == 0
    return cpu_checks(settings.get("XLKV_HARNESS_PYTHON") or settings.get("PY"), settings.get("WORK"), settings, env)


def require_gpus_or_cpu_checks(pair):
    """The start of every GPU job: GPUs found, or the CPU checks run and the job ends with
    EXIT_NO_GPU (passed) or EXIT_FAIL."""
    if pair.detect_gpus():
        counts = {}
        for n in pair.gpu_names:
            counts[n] = counts.get(n, 0) + 1
        log("GPUs: %d (%s)" % (pair.ngpu, " ".join("%d %s" % (c, n) for n, c in counts.items())))
        return
    print("no GPU on this machine: running CPU checks only", file=sys.stderr)
    print("(vLLM's 'Failed to import from vllm._C: ... libcuda.so.1' warnings below are its own, harmless "
          "without CUDA)", file=sys.stderr, flush=True)
    if cpu_only_checks(pair.settings, pair.child_env()):
        print("CPU checks passed; GPU experiments skipped (exit %d)" % EXIT_NO_GPU, file=sys.stderr)
        raise LabExit(EXIT_NO_GPU)
    die(EXIT_FAIL, "no GPU, and the CPU checks failed")
