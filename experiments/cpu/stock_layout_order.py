#!/usr/bin/env python3
"""Descriptor ordering for workers that keep vLLM's per-layer regions under ENABLE_XLKV: the
ablation of patches/transfer_order.py where no cross-layer layout is in place.  The
harness's dense model on the block orders of a loaded server (8 blocks descending on both sides,
6 interleaved, 4 after a prefix-cache hit: cases reversed, interleaved, shared), three runs:

- stock: no flag (vLLM's order, vLLM's regions),
- keep_order: ENABLE_XLKV=true with an explicit stock layout (VLLM_KV_CACHE_LAYOUT=LBHNC on 0.29+,
  NHD before: the worker keeps per-layer regions, as sparse MLA, Mamba hybrids, pipeline parallel
  and every fallback do) and XLKV_COALESCE=false (the ordering off),
- ordered: the same with the ordering on (the default).

NIXL's own count of the descriptors it moved (after its merge of consecutive blocks) per case, bytes
compared in each.  One results file per release:

    python experiments/cpu/stock_layout_order.py --python ENV_PYTHON \\
        --out experiments/results/2026-11-26-stock-layout-order-cpu-<release>.json [--run NAME ...]
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))
from pdtools.gates import gate  # noqa: E402  (the release gates: xlkv_autopatch/releases.py)

CASES = ["--case", "reversed", "--case", "interleaved", "--case", "shared"]


#: the runs, in the order they run
NAMES = ("stock", "keep_order", "ordered")


def runs(version):
    """name -> (harness arguments, environment) for vLLM ``version``."""
    stock_layout = "LBHNC" if gate("layouts", version)[0] else "NHD"
    flag = {"ENABLE_XLKV": "true", "VLLM_KV_CACHE_LAYOUT": stock_layout}
    table = {"stock": {}, "keep_order": dict(flag, XLKV_COALESCE="false"), "ordered": flag}
    return {name: (["--family", "dense"] + CASES, table[name]) for name in NAMES}


def main(argv=None):
    """one_kv_head.py's driver with this file's runs (one harness at a time, one results file)."""
    spec = importlib.util.spec_from_file_location("one_kv_head", os.path.join(HERE, "one_kv_head.py"))
    okh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(okh)
    return okh.main(argv, runs=runs, names=NAMES, script="experiments/cpu/stock_layout_order.py", doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
