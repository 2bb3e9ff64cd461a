"""CPU benchmark: the same KV bytes moved with stock per-layer descriptors vs cross-layer ones.

    python experiments/probes/cpu_desc_bench.py [--runs 7] [--blocks 640] [--pool 1024]
                                         [--out experiments/results/cpu-desc-bench.json]

Real NIXL (UCX backend, default transports: CMA zero-copy reads on one host) on host memory,
two agents in one process, a READ of ``--blocks`` shuffled KV blocks out of a pool of
``--pool``.  Each side registers one buffer, viewed two ways, exactly as vLLM's worker
builds its descriptor lists:

* stock: one region per layer and per K/V (FlashAttention, vLLM <= 0.25): a block is
  ``2 * layers`` descriptors of ``block_size * kv_heads * head_dim * 2`` bytes;
* cross-layer (xlkv): the block is one contiguous row: 1 descriptor of all of it.

Both move identical bytes (checked after every run).  Descriptor lists are prepared once
(vLLM does that at registration); each run times ``make_prepped_xfer`` + ``transfer`` +
completion.  Shapes: Qwen3-0.6B (28 layers) and Llama-3-8B (32 layers), 8 KV heads, head
dim 128, bf16, 16-token blocks.  Needs numpy and nixl (e.g. a tests/harness/mkenv.sh env).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

MODELS = {
    "qwen3-0.6b": dict(layers=28, kv_heads=8, head_dim=128, dtype_bytes=2, block_size=16),
    "llama-3-8b": dict(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2, block_size=16),
}


def dlists(base, pool, layers, chunk):
    """Per-layer (region-major) and cross-layer (block-major) descriptor tables."""
    block = 2 * layers * chunk
    per_layer = np.array([(base + (r * pool + b) * chunk, chunk, 0) for r in range(2 * layers) for b in range(pool)],
                         dtype=np.uint64)
    cross = np.array([(base + b * block, block, 0) for b in range(pool)], dtype=np.uint64)
    return per_layer, cross


def desc_ids(block_ids, pool, regions):
    """vLLM's indexing: region * num_blocks + block."""
    return [r * pool + b for r in range(regions) for b in block_ids]


def run_model(name, shape, blocks, pool, runs, seed):
    from nixl._api import nixl_agent, nixl_agent_config

    chunk = shape["block_size"] * shape["kv_heads"] * shape["head_dim"] * shape["dtype_bytes"]
    layers = shape["layers"]
    block_bytes = 2 * layers * chunk
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 255, pool * block_bytes, dtype=np.uint8)
    dst = np.zeros_like(src)
    reader = nixl_agent("reader-%s" % name, nixl_agent_config(backends=["UCX"]))
    target = nixl_agent("target-%s" % name, nixl_agent_config(backends=["UCX"]))
    reg = lambda a: np.array([[a.ctypes.data, a.nbytes, 0]], dtype=np.uint64)  # noqa: E731
    reader.register_memory(reg(dst), "DRAM")
    target.register_memory(reg(src), "DRAM")
    remote = reader.add_remote_agent(target.get_agent_metadata())
    local_pl, local_x = dlists(dst.ctypes.data, pool, layers, chunk)
    remote_pl, remote_x = dlists(src.ctypes.data, pool, layers, chunk)
    handles = {
        "stock": (reader.prep_xfer_dlist("NIXL_INIT_AGENT", local_pl, "DRAM"),
                  reader.prep_xfer_dlist(remote, remote_pl, "DRAM"), 2 * layers),
        "xlkv": (reader.prep_xfer_dlist("NIXL_INIT_AGENT", local_x, "DRAM"),
                 reader.prep_xfer_dlist(remote, remote_x, "DRAM"), 1),
    }
    out = {"shape": shape, "block_bytes": block_bytes, "blocks_per_transfer": blocks, "pool_blocks": pool,
           "bytes_per_transfer": blocks * block_bytes, "configs": {}}
    for cfg in handles:
        out["configs"][cfg] = {"descriptors_per_block": handles[cfg][2], "ms": []}
    # interleave configs run by run so machine noise hits both alike; one untimed warm-up each
    for i in range(runs + 1):
        remote_ids = rng.permutation(pool)[:blocks].tolist()
        local_ids = rng.permutation(pool)[:blocks].tolist()
        for cfg, (lh, rh, regions) in handles.items():
            dst[:] = 0
            t0 = time.perf_counter()
            h = reader.make_prepped_xfer("READ", lh, desc_ids(local_ids, pool, regions), rh,
                                         desc_ids(remote_ids, pool, regions), b"bench")
            state = reader.transfer(h)
            while state == "PROC":
                state = reader.check_xfer_state(h)
            dt = (time.perf_counter() - t0) * 1000.0
            reader.release_xfer_handle(h)
            if state != "DONE":
                raise RuntimeError("%s %s transfer ended in %s" % (name, cfg, state))
            # each view's own notion of "block b": region-major for stock, block-major for xlkv
            view = (regions, pool, -1) if regions > 1 else (1, pool, -1)
            d, s = dst.reshape(view), src.reshape(view)
            if not (d[:, local_ids] == s[:, remote_ids]).all():
                raise RuntimeError("%s %s: transferred bytes differ" % (name, cfg))
            if i:
                out["configs"][cfg]["ms"].append(round(dt, 3))
    for cfg, c in out["configs"].items():
        c["descriptors_per_transfer"] = c["descriptors_per_block"] * blocks
        c["median_ms"] = round(statistics.median(c["ms"]), 3)
        c["min_ms"], c["max_ms"] = min(c["ms"]), max(c["ms"])
        c["median_gbps"] = round(out["bytes_per_transfer"] / c["median_ms"] / 1e6, 3)
    out["stock_over_xlkv"] = round(out["configs"]["stock"]["median_ms"] / out["configs"]["xlkv"]["median_ms"], 3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--blocks", type=int, default=640, help="blocks per transfer (640 = a 10240-token prompt)")
    ap.add_argument("--pool", type=int, default=1024, help="blocks registered per side")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                                                  "cpu-desc-bench.json"))
    args = ap.parse_args()
    from importlib import metadata

    result = {
        "command": "python experiments/probes/cpu_desc_bench.py " + " ".join(sys.argv[1:]),
        "machine": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "nixl": metadata.version("nixl"), "ucx_tls": os.environ.get("UCX_TLS", "(default)"),
        "runs": args.runs, "models": {},
    }
    for name in args.models.split(","):
        result["models"][name] = run_model(name, MODELS[name], args.blocks, args.pool, args.runs, seed=1234)
        m = result["models"][name]
        print("%-11s %4d blocks of %7d B: stock %5d descs %8.2f ms (min %.2f max %.2f) | xlkv %4d descs %8.2f ms "
              "(min %.2f max %.2f) | stock/xlkv %.2fx" % (
                  name, args.blocks, m["block_bytes"], m["configs"]["stock"]["descriptors_per_transfer"],
                  m["configs"]["stock"]["median_ms"], m["configs"]["stock"]["min_ms"],
                  m["configs"]["stock"]["max_ms"], m["configs"]["xlkv"]["descriptors_per_transfer"],
                  m["configs"]["xlkv"]["median_ms"], m["configs"]["xlkv"]["min_ms"], m["configs"]["xlkv"]["max_ms"],
                  m["stock_over_xlkv"]), flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
