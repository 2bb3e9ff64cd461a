#!/usr/bin/env python3
"""One KV head per tensor-parallel rank on the CPU P/D harness: the harness's
dense model (4 layers, 2 KV heads) at TP 2 -> 2, one KV head per rank, stock, native
(VLLM_KV_CACHE_LAYOUT=BLNHC on both sides) and xlkv (ENABLE_XLKV=true on both), every block-order
case with bytes compared on every decode rank; the pairs xlkv must refuse with the cause while
decode serves on: TP 1 -> 2 and TP 2 -> 1 (two KV heads per rank on one side, one on the other),
and TP 2 -> 2 with vLLM's own BLNHC on prefill and ENABLE_XLKV on decode only; and the mqa model
(one KV head) at TP 1 (the harness splits KV heads over TP ranks, so MQA runs at TP 1 only).

    python experiments/cpu/one_kv_head.py --python ENV_PYTHON \
        --out experiments/results/2026-11-25-one-kv-head-cpu-<release>.json [--run NAME ...]

ENV_PYTHON: a vLLM 0.29+ environment's python with the shim installed (mkenv.sh, then
`pip install --no-deps -e .`).  Ports: XLKV_P_PORT / XLKV_D_PORT as for the harness.  Stdlib
only; one harness at a time; the file is rewritten after every run (--run: added to it).
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "harness", "pd_harness.py")
XLKV = {"ENABLE_XLKV": "true"}
BLNHC = ["--env", "VLLM_KV_CACHE_LAYOUT=BLNHC"]
#: name -> (harness arguments, environment)
RUNS = {
    "stock_2to2": (["--family", "dense", "--p-tp", "2", "--d-tp", "2"], {}),
    "native_2to2": (["--family", "dense", "--p-tp", "2", "--d-tp", "2"] + BLNHC, {}),
    "xlkv_2to2": (["--family", "dense", "--p-tp", "2", "--d-tp", "2"], XLKV),
    "xlkv_1to2": (["--family", "dense", "--d-tp", "2"], XLKV),
    "xlkv_2to1": (["--family", "dense", "--p-tp", "2"], XLKV),
    "native_p_xlkv_d_2to2": (["--family", "dense", "--p-tp", "2", "--d-tp", "2", "--p-env",
                              "VLLM_KV_CACHE_LAYOUT=BLNHC", "--d-env", "ENABLE_XLKV=true"], {}),
    "mqa_stock": (["--family", "one-kv-head"], {}),
    "mqa_native": (["--family", "one-kv-head"] + BLNHC, {}),
    "mqa_xlkv": (["--family", "one-kv-head"], XLKV),
}


def _families_matrix():
    spec = importlib.util.spec_from_file_location("families_matrix", os.path.join(HERE, "families_matrix.py"))
    fm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fm)
    return fm


def summarize(r, fm):
    keep = fm.summarize(r)
    for side in ("p_ranks", "d_ranks"):
        keep[side] = [{"tp_rank": x.get("tp_rank"), "cross_layer": x.get("cross_layer"),
                       "layer_view_shape": x.get("layer_view_shape"),
                       "num_regions": (x.get("worker") or {}).get("num_regions"),
                       "kv_cache_layout": (x.get("worker") or {}).get("kv_cache_layout"),
                       "block_len_per_layer": (x.get("worker") or {}).get("block_len_per_layer"),
                       "xlkv_log": [line[:400] for line in x.get("xlkv_log") or []][-6:]}
                      for x in r.get(side) or []]
    for name, c in (r.get("cases") or {}).items():
        keep["cases"][name]["ranks"] = c.get("ranks")
        keep["cases"][name]["p_done_sending"] = c.get("p_done_sending")
    return keep


def main(argv=None, runs=None, script="experiments/cpu/one_kv_head.py", doc=__doc__, names=None):
    """Runs the named harness runs of ``runs`` (name -> (harness arguments, environment); default
    this file's RUNS) into one results file.  Other drivers (stock_layout_order.py) pass theirs:
    a table, or a function of the release under test that returns one, with its run ``names``."""
    runs = runs or RUNS
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run", action="append", choices=list(names or runs))
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--setup-timeout", type=float, default=400)
    args = ap.parse_args(argv)
    fm = _families_matrix()
    ver = fm.release(args.python)
    if callable(runs):
        runs = runs(ver)
    res = json.load(open(args.out)) if os.path.exists(args.out) and args.run else {"runs": {}}
    res.update(vllm=ver, date=time.strftime("%Y-%m-%d"),
               command="python %s --python ENV_PYTHON --out %s%s" % (
                   script, args.out, "".join(" --run " + n for n in args.run or [])))
    work = os.path.join("/tmp", "%s-%s-%d" % (os.path.basename(script)[:-3], ver, os.getpid()))
    os.makedirs(work, exist_ok=True)
    for name in args.run or runs:
        extra, env = runs[name]
        out = os.path.join(work, name + ".json")
        base = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "PYTHONPATH")}
        base.update(env)
        cmd = [args.python, HARNESS, "--out", out, "--timeout", str(args.timeout), "--setup-timeout",
               str(args.setup_timeout)] + extra
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, env=base, cwd="/", timeout=1800)
        if os.path.exists(out):
            r = summarize(json.load(open(out)), fm)
        else:
            r = {"transfer_verified": False, "errors": ["no result: " + (p.stdout + p.stderr)[-3000:]]}
        r["harness_args"] = cmd[4:] + ["%s=%s" % kv for kv in env.items()]
        r["wall_s"] = round(time.time() - t0, 1)
        res["runs"][name] = r
        fm.write(args.out, res)
        cases = r.get("cases") or {}
        print("%-22s verified=%s layout=%s regions=%s descs/block=%s sent/block=%s moved=%s (%ss) %s" % (
            name, r.get("transfer_verified"), r.get("kv_layout"), r.get("num_regions"), r.get("descs_per_block"),
            sorted({str(c.get("xfer_descs_per_block")) for c in cases.values()}),
            {n: c.get("nixl_descs") for n, c in cases.items()}, r["wall_s"],
            "" if r.get("transfer_verified") else str((r.get("errors") or [""])[0])[:400]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
