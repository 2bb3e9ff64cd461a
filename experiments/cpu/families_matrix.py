#!/usr/bin/env python3
"""Model families on the CPU P/D harness (tests/harness/): for every family of pdharness/model.py (dense, one-kv-head,
mla, sliding-window) and the configs stock, native (vLLM's own best setting) and xlkv (ENABLE_XLKV=true
on P and D), one harness run; D's registration (regions, descriptors and bytes per block id,
KV cache groups) and one transfer (descriptors handed to NIXL, descriptors NIXL moved, bytes
compared per group) go into one results file per release.

    python experiments/cpu/families_matrix.py --python ENV_PYTHON \
        --out experiments/results/2026-11-25-families-cpu-<release>.json [--family F ...]

ENV_PYTHON: a vLLM environment's python with the shim installed (tests/harness/mkenv.sh, then
`pip install --no-deps -e .`). native: VLLM_KV_CACHE_LAYOUT=BLNHC on both sides (0.29+),
kv_connector_extra_config enable_cross_layers_blocks=true (0.16-0.28; the harness always runs
the V1 model runner's allocation, so Model Runner V2's ignoring the opt-in does not show here),
none before 0.16. Stdlib only; runs one harness at a time.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))
from pdtools.gates import gate  # noqa: E402  (the release gates: xlkv_autopatch/releases.py)
HARNESS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "harness", "pd_harness.py")
FAMILIES = ("mla", "sliding-window", "one-kv-head", "dense")
CONFIGS = ("stock", "native", "xlkv")


def release(python):
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out


def config_args(config, version):
    """Harness arguments and environment of one config on vLLM ``version`` (None: n/a); vLLM's own
    setting is the release table's (pdtools/gates.py)."""
    if config == "stock":
        return [], {}
    if config == "xlkv":
        return [], {"ENABLE_XLKV": "true"}
    if gate("layouts", version)[0]:
        return ["--env", "VLLM_KV_CACHE_LAYOUT=BLNHC"], {}
    if gate("native", version)[0]:
        return ["--native-opt-in"], {}
    return None


def summarize(r):
    """What the results file keeps of one harness result."""
    keep = {k: r.get(k) for k in ("family", "vllm", "backend", "kv_layout", "cross_layer", "num_regions",
                                  "descs_per_block", "block_len", "transfer_verified", "registered",
                                  "hybrid_allocator", "env_p", "env_d", "native_opt_in",
                                  "p_d_layout_match", "timing_s")}
    keep["errors"] = [e[:1500] for e in r.get("errors") or []][:5]
    keep["kv_cache_groups"] = [{k: g.get(k) for k in ("spec", "sliding_window", "block_size", "page_size_bytes")}
                               | {"num_layers": len(g.get("layers") or [])}
                               for g in r.get("kv_cache_groups") or []]
    keep["d_worker"] = {k: (r.get("d") or {}).get("worker", {}).get(k)
                        for k in ("num_regions", "num_descs", "num_blocks", "block_len_per_layer",
                                  "kv_cache_layout", "_has_packed_cache", "use_mla", "backend_name")}
    keep["xlkv_log_d"] = [line[:400] for line in (r.get("d") or {}).get("xlkv_log") or []][-8:]
    keep["cases"] = {}
    for name, c in (r.get("cases") or {}).items():
        keep["cases"][name] = {k: c.get(k) for k in ("ok", "bytes_ok", "recv_done", "num_mismatches", "block_ids",
                                                     "xfer_descs", "xfer_descs_per_block", "nixl_descs",
                                                     "groups", "failure_reason")}
    return keep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", required=True, help="the vLLM environment's python (shim installed)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", action="append", choices=FAMILIES)
    ap.add_argument("--config", action="append", choices=CONFIGS)
    ap.add_argument("--timeout", type=float, default=45)
    ap.add_argument("--collect", nargs="+", metavar="RESULT_JSON",
                    help="no runs: summarize harness results already written, each named "
                         "<family>-<config>.json (e.g. those of tests/real/test_model_families.py)")
    args = ap.parse_args(argv)
    if args.collect:
        return collect(args)
    ver = release(args.python)
    chosen = "".join(" --family " + f for f in args.family or ()) + "".join(" --config " + c for c in args.config or ())
    ports = " ".join("%s=%s" % (k, os.environ[k]) for k in ("XLKV_P_PORT", "XLKV_D_PORT", "XLKV_SETUP_TIMEOUT")
                     if os.environ.get(k))
    res = {"vllm": ver, "date": time.strftime("%Y-%m-%d"),
           "command": "%spython experiments/cpu/families_matrix.py --python ENV_PYTHON%s --out %s"
                      % (ports + " " if ports else "", chosen, args.out),
           "runs": {}}
    work = os.path.join("/tmp", "families-%s-%d" % (ver, os.getpid()))
    os.makedirs(work, exist_ok=True)
    for fam in args.family or FAMILIES:
        for cfg in args.config or CONFIGS:
            ca = config_args(cfg, ver)
            if ca is None:
                res["runs"].setdefault(fam, {})[cfg] = {"n/a": "vLLM %s has no cross-layer setting" % ver}
                continue
            extra, env = ca
            out = os.path.join(work, "%s-%s.json" % (fam, cfg))
            base = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "PYTHONPATH")}
            base.update(env)
            cmd = [args.python, HARNESS, "--out", out, "--timeout", str(args.timeout), "--family", fam,
                   "--case", "groups"] + extra
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, env=base, cwd="/", timeout=900)
            if os.path.exists(out):
                r = summarize(json.load(open(out)))
            else:
                r = {"transfer_verified": False, "errors": ["no result: " + (p.stdout + p.stderr)[-3000:]]}
            r["harness_args"] = cmd[4:] + ["%s=%s" % kv for kv in env.items()]
            r["wall_s"] = round(time.time() - t0, 1)
            res["runs"].setdefault(fam, {})[cfg] = r
            write(args.out, res)  # after every run: a cut-off matrix keeps what it measured
            c = (r.get("cases") or {}).get("groups") or {}
            print("%-6s %-7s verified=%s regions=%s descs/block=%s sent/block-id=%s moved=%s (%ss)%s" % (
                fam, cfg, r.get("transfer_verified"), r.get("num_regions"), r.get("descs_per_block"),
                c.get("xfer_descs_per_block"), c.get("nixl_descs"), r["wall_s"],
                "" if r.get("transfer_verified") else "  " + str((r.get("errors") or [""])[0])[:300]),
                flush=True)
    write(args.out, res)
    return 0


def collect(args):
    ver = release(args.python)
    res = {"vllm": ver, "date": time.strftime("%Y-%m-%d"),
           "command": "python experiments/cpu/families_matrix.py --python ENV_PYTHON --out %s --collect ..."
                      % args.out, "runs": {}}
    for path in args.collect:
        fam, cfg = os.path.basename(path)[:-len(".json")].split("-", 1)
        r = summarize(json.load(open(path)))
        assert r["vllm"] in (None, ver), (path, r["vllm"], ver)
        res["runs"].setdefault(fam, {})[cfg] = r
    write(args.out, res)
    return 0


def write(path, res):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
