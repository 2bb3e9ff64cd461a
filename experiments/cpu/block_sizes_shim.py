"""Different block sizes on prefill and decode with the shim (ENABLE_XLKV=true on both; its receive
restage, patches/block_size_restage.py, and the handshake's layout.block_sizes_served): the CPU harness
(experiments/cpu/pd_harness.py, real NixlConnector + NIXL, D's bytes checked token by token) for one
vLLM release, one harness run per row, the summary as JSON.

    python experiments/cpu/block_sizes_shim.py PYTHON RELEASE OUT.json [--port BASE] [--source]

PYTHON: an environment with that vLLM release and the shim installed (tests/real/conftest.py's), or
with --source one without it (needs wrapt): the shim of this checkout, PYTHONPATH=<repo> (its
sitecustomize.py activates it).
Rows: dense 16->32 and 16->64 at TP 1->1 and 1->2, dense 32->16 (TP 1), sliding-window hybrid 16->32 (TP 1).
Not for CI: about 100 s a row on a 2-core machine."""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

#: (family, prefill TP, decode TP, prefill block size, decode block size)
ROWS = (("dense", 1, 1, 16, 32), ("dense", 1, 1, 16, 64), ("dense", 1, 2, 16, 32), ("dense", 1, 2, 16, 64),
        ("dense", 1, 1, 32, 16), ("sliding-window", 1, 1, 16, 32))

KEEP = ("num_tokens", "ok", "recv_done", "bytes_ok", "num_mismatches", "block_ids", "remote_block_ids_count",
        "xfer_descs", "xfer_descs_per_block", "invalid_block_ids", "mismatches")


def outcome(r):
    if r.get("transfer_verified"):
        return "bytes exact on every decode rank"
    text = json.dumps(r.get("errors"))
    if "NIXL handshake refused" in text:
        return "refused at the handshake (xlkv's XlkvMismatchError)"
    if any(c.get("bytes_ok") is False for c in r.get("cases", {}).values()):
        return "bytes WRONG"
    return "failed (see errors)"


def run(python, release, family, p_tp, d_tp, p_bs, d_bs, port, scratch, source=False):
    name = "%s-tp%d%s-%d-%d" % (family, p_tp, "" if p_tp == d_tp else "to%d" % d_tp, p_bs, d_bs)
    out = os.path.join(scratch, name + ".json")
    args = ["experiments/cpu/pd_harness.py", "--out", out, "--p-port", str(port), "--d-port", str(port + 1),
            "--family", family, "--p-block-size", str(p_bs), "--d-block-size", str(d_bs)]
    if p_tp != 1 or d_tp != 1:
        args += ["--p-tp", str(p_tp), "--d-tp", str(d_tp)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLKV_VLLM_VERSION")}
    env["ENABLE_XLKV"] = "true"
    prefix = "ENABLE_XLKV=true"
    if source:
        env["PYTHONPATH"] = ROOT
        prefix += " PYTHONPATH=<repo>"
    start = time.time()
    subprocess.run([python] + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    took = round(time.time() - start)
    r = json.load(open(out)) if os.path.exists(out) else {"errors": ["no result"]}
    errors = [e[:600] for e in (r.get("errors") or [])][:2]
    return {"name": name, "command": "%s %s %s" % (prefix, python, " ".join(args).replace(out, "$OUT/%s.json"
                                                                                                   % name)),
            "family": family, "tp": "%d->%d" % (p_tp, d_tp), "block_sizes": {"p": p_bs, "d": d_bs},
            "kv_layout": r.get("kv_layout"), "num_regions": r.get("num_regions"),
            "transfer_verified": r.get("transfer_verified"),
            "cases": {k: {f: v.get(f) for f in KEEP} for k, v in (r.get("cases") or {}).items()},
            "errors": errors, "outcome": outcome(r), "seconds": took,
            "d_shim_lines": [x for x in (r.get("d") or {}).get("xlkv_log") or [] if "restage" in x or "smaller" in x]}


def main(argv):
    python, release, dest = argv[:3]
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 7200
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, row in enumerate(ROWS):
            rows.append(run(python, release, *row, port=port + 4 * i, scratch=scratch, source="--source" in argv))
            print(rows[-1]["name"], rows[-1]["outcome"], rows[-1]["seconds"], file=sys.stderr)
    with open(dest, "w") as f:
        json.dump({"what": "Different block sizes on prefill and decode with the shim, ENABLE_XLKV=true on both (the "
                           "receive restage, patches/block_size_restage.py; the handshake's "
                           "layout.block_sizes_served): CPU harness, real vLLM NixlConnector + real NIXL over host "
                           "memory, D's bytes compared with P's token by token (pdharness/blocksizes.py)",
                   "vllm": release, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                   "made_by": "python experiments/cpu/block_sizes_shim.py %s" % " ".join(argv),
                   "run_from": "the repository root", "commit_base": commit,
                   "cases": "bs-full: 4 x the larger block size tokens; bs-partial: 2 x the larger + 5; bs-groups "
                            "(several KV cache groups): 4 x the larger",
                   "rows": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
