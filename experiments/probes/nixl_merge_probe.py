#!/usr/bin/env python3
"""Does NIXL merge descriptors whose memory is contiguous on both sides?  (CPU.)

One READ of N cross-layer blocks (one descriptor per block, as xlkv registers them) between
two NIXL agents in this process (UCX on host memory), for several orders of the (local,
remote) block-id pairs, with NIXL telemetry on.  Reports the descriptors NIXL says it moved
(``get_xfer_telemetry(handle).descCount``, what vLLM prints as "Avg number of descriptors")
and checks the bytes.  The orders:

  ascending      local 0..N-1  <- remote 0..N-1   (contiguous and increasing on both sides)
  descending     local N-1..0  <- remote N-1..0   (what vLLM's free-block queue hands out after
                                                   a request's blocks were freed in reverse)
  sorted         the descending pairs sorted by local id (what a coalescing patch would send)
  mixed          local ascending <- remote descending (contiguous, opposite directions)
  random         a random permutation on both sides

    python experiments/probes/nixl_merge_probe.py [--blocks 64] [--block-bytes 1835008] [--out FILE]

Needs numpy and nixl (a tests/harness/mkenv.sh env).
"""
import argparse
import json
import os
import sys
from importlib import metadata

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _nixl_pair import blocks_equal, host_pair, read  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-bytes", type=int, default=1835008, help="default: a Qwen3-0.6B cross-layer block")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    n, bb = a.blocks, a.block_bytes
    rng = np.random.default_rng(0)
    reader, src, dst, lh, rh = host_pair(n, bb, ("probe-reader", "probe-target"))
    up, down = list(range(n)), list(range(n - 1, -1, -1))
    perm_l, perm_r = rng.permutation(n).tolist(), rng.permutation(n).tolist()
    orders = {
        "ascending": (up, up),
        "descending": (down, down),
        "sorted": tuple(map(list, zip(*sorted(zip(down, down))))),
        "mixed": (up, down),
        "random": (perm_l, perm_r),
    }
    out = {"nixl": metadata.version("nixl"), "blocks": n, "block_bytes": bb,
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "orders": {}}
    for name, (loc, rem) in orders.items():
        dst[:] = 0
        state, count, ms = read(reader, lh, loc, rh, rem)
        ok = state == "DONE" and blocks_equal(dst, src, n, bb, loc, rem)
        out["orders"][name] = {"descriptors_given": len(loc), "descCount": count, "bytes_ok": ok,
                               "ms": round(ms, 3)}
        print("%-10s given %4d  NIXL descCount %4d  bytes %s  %.1f ms" % (name, len(loc), count,
                                                                         "ok" if ok else "WRONG", ms))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(o["bytes_ok"] for o in out["orders"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
