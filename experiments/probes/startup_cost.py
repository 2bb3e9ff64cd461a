"""Interpreter start-up cost of the .pth hook: no shim vs shim installed (flag off) vs flag on.

    python experiments/probes/startup_cost.py [--runs 60] [--rounds 5] [--out experiments/results/startup-cost.json]

Two throw-away virtual environments of this interpreter: one with only a path file (the
package importable, no start-up hook) and one with ``xlkv_autopatch.pth`` as pip installs it.
Each round times RUNS starts of ``python -c pass`` per configuration, interleaved so that
machine noise hits all three alike; the JSON keeps every round's median and the raw times.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


def make_env(base, with_pth, pkgroot, deps):
    venv.EnvBuilder(with_pip=False, symlinks=True).create(base)
    py = os.path.join(base, "bin", "python")
    site = subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    with open(os.path.join(site, "0_paths.pth"), "w") as f:
        f.write(pkgroot + "\n" + deps + "\n")
    if with_pth:
        shutil.copy(os.path.join(ROOT, "xlkv_autopatch.pth"), site)
    return py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "startup-cost.json"))
    args = ap.parse_args()
    import wrapt  # the shim's dependency must be importable for the flag-on case

    deps = os.path.dirname(os.path.dirname(os.path.abspath(wrapt.__file__)))
    tmp = tempfile.mkdtemp(prefix="xlkv-startup-")
    pkgroot = os.path.join(tmp, "pkg")
    os.makedirs(pkgroot)
    os.symlink(os.path.join(ROOT, "xlkv_autopatch"), os.path.join(pkgroot, "xlkv_autopatch"))
    plain = make_env(os.path.join(tmp, "plain"), False, pkgroot, deps)
    hooked = make_env(os.path.join(tmp, "hooked"), True, pkgroot, deps)
    base_env = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "PYTHONPATH")}
    configs = {
        "no_shim": (plain, dict(base_env)),
        "shim_flag_off": (hooked, dict(base_env)),
        "shim_flag_on": (hooked, dict(base_env, ENABLE_XLKV="true")),
    }
    raw = {k: [] for k in configs}
    for _ in range(args.rounds):
        for _ in range(args.runs):
            for name, (py, env) in configs.items():
                t0 = time.perf_counter()
                subprocess.run([py, "-c", "pass"], env=env, check=True)
                raw[name].append((time.perf_counter() - t0) * 1000.0)
    per_round = {k: [statistics.median(v[i * args.runs:(i + 1) * args.runs]) for i in range(args.rounds)]
                 for k, v in raw.items()}
    result = {
        "command": "python experiments/probes/startup_cost.py --runs %d --rounds %d" % (args.runs, args.rounds),
        "python": sys.version.split()[0], "machine": platform.platform(), "cpus": os.cpu_count(),
        "unit": "ms wall clock per `python -c pass`",
        "median_ms": {k: round(statistics.median(v), 2) for k, v in raw.items()},
        "round_medians_ms": {k: [round(x, 2) for x in v] for k, v in per_round.items()},
        "round_spread_ms": {k: [round(min(v), 2), round(max(v), 2)] for k, v in per_round.items()},
        "raw_ms": {k: [round(x, 3) for x in v] for k, v in raw.items()},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({k: result[k] for k in ("median_ms", "round_medians_ms")}, indent=1))


if __name__ == "__main__":
    main()
