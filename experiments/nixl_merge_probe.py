#!/usr/bin/env python3
"""Does NIXL merge descriptors whose memory is contiguous on both sides?  (Issue 14, CPU.)

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

    python experiments/nixl_merge_probe.py [--blocks 64] [--block-bytes 1835008] [--out FILE]

Needs numpy and nixl (a tests/compat/mkenv.sh env).
"""
import argparse
import json
import os
import sys
import time
from importlib import metadata

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-bytes", type=int, default=1835008, help="default: a Qwen3-0.6B cross-layer block")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    from nixl._api import nixl_agent, nixl_agent_config

    n, bb = a.blocks, a.block_bytes
    rng = np.random.default_rng(0)
    src = rng.integers(0, 255, n * bb, dtype=np.uint8)
    dst = np.zeros_like(src)
    cfg = nixl_agent_config(backends=["UCX"], capture_telemetry=True)
    reader, target = nixl_agent("probe-reader", cfg), nixl_agent("probe-target", cfg)
    reg = lambda arr: np.array([[arr.ctypes.data, arr.nbytes, 0]], dtype=np.uint64)  # noqa: E731
    reader.register_memory(reg(dst), "DRAM")
    target.register_memory(reg(src), "DRAM")
    remote = reader.add_remote_agent(target.get_agent_metadata())
    table = lambda base: np.array([(base + b * bb, bb, 0) for b in range(n)], dtype=np.uint64)  # noqa: E731
    lh = reader.prep_xfer_dlist("NIXL_INIT_AGENT", table(dst.ctypes.data), "DRAM")
    rh = reader.prep_xfer_dlist(remote, table(src.ctypes.data), "DRAM")
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
        t0 = time.perf_counter()
        h = reader.make_prepped_xfer("READ", lh, loc, rh, rem, b"probe")
        state = reader.transfer(h)
        while state == "PROC":
            state = reader.check_xfer_state(h)
        ms = (time.perf_counter() - t0) * 1e3
        tel = reader.get_xfer_telemetry(h)
        reader.release_xfer_handle(h)
        ok = state == "DONE" and bool((dst.reshape(n, bb)[loc] == src.reshape(n, bb)[rem]).all())
        out["orders"][name] = {"descriptors_given": len(loc), "descCount": int(tel.descCount), "bytes_ok": ok,
                               "ms": round(ms, 3)}
        print("%-10s given %4d  NIXL descCount %4d  bytes %s  %.1f ms" % (name, len(loc), tel.descCount,
                                                                         "ok" if ok else "WRONG", ms))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(o["bytes_ok"] for o in out["orders"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
