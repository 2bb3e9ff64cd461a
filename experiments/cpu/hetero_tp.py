#!/usr/bin/env python3
"""Heterogeneous tensor parallelism on the CPU P/D harness: every prefill/decode TP pairing
that 2 cores can start, stock (no flag) and xlkv (ENABLE_XLKV=true on both sides), the same pairing
in both, bytes compared per decode rank against the reference fill of every prefill rank's heads,
and per decode rank the descriptors handed to NIXL per block (each read is one remote rank's head
slice: with several source ranks, descs/block counts one per source), NIXL's own count after its
merge, and the regions each side registered.

    python experiments/cpu/hetero_tp.py --python ENV_PYTHON \\
        --out experiments/results/2026-11-26-hetero-tp-cpu-<release>.json [--run NAME ...]

Pairings (KV heads of the dense model: 4 unless named): 1->2, 2->1, 1->4, 4->2 (six ranks), 1->2 and
2->1 at 2 KV heads (one KV head per rank on the wider side: page_contiguous.py's whole rows against
a two-head row), the gpt-oss-shaped sliding-window hybrid 1->2 and 2->2 (2 KV heads, several KV cache
groups; 2->2 is one KV head per rank on both sides)
and the MLA model 1->2 (its latent cache replicated on every rank); the dense model on TRITON_ATTN 1->2 (a
blocks-first backend: 0.20-0.28 keep the stock layout for it); ``equal_`` runs: the flag and XLKV_EQUAL_TP=true
(cross-layer blocks that cannot be sliced by KV heads are kept, and the pair is refused).  MQA (one KV head) does not run
on the harness at TP > 1 (it splits KV heads over ranks).  Stdlib only; one harness at a time.
"""
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
XLKV = {"ENABLE_XLKV": "true"}

#: (family, KV heads or None for the family's, prefill TP, decode TP) of each pairing, by name
PAIRINGS = {
    "dense4_1to2": ("dense", 4, 1, 2),
    "dense4_2to1": ("dense", 4, 2, 1),
    "dense4_1to4": ("dense", 4, 1, 4),
    "dense4_4to2": ("dense", 4, 4, 2),
    "dense2_1to2": ("dense", 2, 1, 2),
    "dense2_2to1": ("dense", 2, 2, 1),
    "swa_1to2": ("sliding-window", None, 1, 2),
    "swa_2to2": ("sliding-window", None, 2, 2),
    "mla_1to2": ("mla", None, 1, 2),
    # a blocks-first backend (cross-layer blocks cannot be sliced by KV heads; 0.20-0.28)
    "triton4_1to2": ("dense", 4, 1, 2, "TRITON_ATTN"),
}
#: the pairings also run with XLKV_EQUAL_TP=true (the ``equal_`` runs): where xlkv keeps the stock layout
#: so that every TP pairing is served, the knob keeps the cross-layer blocks and the pair is refused
EQUAL_TP = ("swa_1to2", "triton4_1to2", "dense4_1to2")
NAMES = tuple("%s_%s" % (config, name) for name in PAIRINGS for config in ("stock", "xlkv", "equal")
              if config != "equal" or name in EQUAL_TP)


def runs(version):
    """name -> (harness arguments, environment); the same on every release."""
    out = {}
    for name, (family, heads, p_tp, d_tp, *backend) in PAIRINGS.items():
        args = ["--family", family, "--p-tp", str(p_tp), "--d-tp", str(d_tp)]
        if heads:
            args += ["--kv-heads", str(heads)]
        if backend:
            args += ["--attn-backend", backend[0]]
        out["stock_" + name] = (args, {})
        out["xlkv_" + name] = (args, XLKV)
        if name in EQUAL_TP:
            out["equal_" + name] = (args, dict(XLKV, XLKV_EQUAL_TP="true"))
    return out


def annotate(path):
    """Adds to each run of a results file its pairing (family, KV heads, prefill and decode TP), the
    prefill ranks each decode rank reads (vLLM's mapping: one where decode TP >= prefill TP or for MLA,
    else prefill TP / decode TP), and per case the descriptors per block each decode rank handed NIXL
    divided by those sources: ``descriptors_per_block_per_remote_rank`` (one value per decode rank)."""
    with open(path) as f:
        res = json.load(f)
    for name, r in res["runs"].items():
        family, heads, p_tp, d_tp, *backend = PAIRINGS[name.split("_", 1)[1]]
        sources = 1 if family == "mla" or d_tp >= p_tp else p_tp // d_tp
        r.update(family=family, kv_heads=heads, prefill_tp=p_tp, decode_tp=d_tp, remote_ranks_per_decode_rank=sources,
                 attn_backend=backend[0] if backend else "FLASH_ATTN")
        for case in (r.get("cases") or {}).values():
            ranks = case.get("ranks") or [case]
            per = [x.get("xfer_descs_per_block") for x in ranks]
            case["descriptors_per_block_per_remote_rank"] = [None if v is None else v / sources for v in per]
    with open(path, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")


def main(argv=None):
    """one_kv_head.py's driver with this file's runs (one harness at a time, one results file), then
    each run annotated with its pairing (annotate)."""
    spec = importlib.util.spec_from_file_location("one_kv_head", os.path.join(HERE, "one_kv_head.py"))
    okh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(okh)
    argv = sys.argv[1:] if argv is None else list(argv)
    rc = okh.main(argv, runs=runs, names=NAMES, script="experiments/cpu/hetero_tp.py", doc=__doc__)
    annotate(argv[argv.index("--out") + 1])  # okh.main required --out
    return rc


if __name__ == "__main__":
    sys.exit(main())
