#!/usr/bin/env python3
"""How many NIXL descriptors a 640-block P/D transfer needs after vLLM's free block queue has
been churned, per block-order policy: vLLM's real BlockPool on both sides, a simple scheduler.

The goal was at most 16 descriptors per 64 x 10240 transfer in a fragmented state; on
2xH200 (vLLM 0.26.0, 2026-11-23) the shim with transfer_order left 117-140.  transfer_order
already puts each transfer's (local, remote) pairs in the best order for NIXL's merge (a pair
can only merge with the pair whose local and remote ids are both +1, and ascending local
order puts every such pair next to it), so what is left is the block *sets* each side
allocated.  This program asks what allocating in ascending block-id order (each
`BlockPool.get_new_blocks` call returning its blocks sorted; the same blocks, the same
eviction) would leave, before anyone builds it as a patch.

What is real: vLLM's `BlockPool` (free queue, popleft_n, free_blocks: reverse order, hashed
blocks to the tail, unhashed ones to the head, eviction of cached hashes) of the installed
vLLM, and the shim's own `layout.merged_descriptor_count`.  What is a model: the scheduler.
Every tick, P prefills FCFS under a token budget (chunked prefill), allocating per chunk; a
request whose prefill is done waits for D, which admits FCFS when its whole prompt fits; the
transfer completes the next tick, then P frees its blocks and D decodes OUTPUT_LEN tokens
(one tick each) and frees.  Loads as pd_bench.sh sends them: warm-up, FRAG prompts of mixed
length (BENCH_STATE=fragmented), then REPS x N prompts of LEN tokens, all at once per phase.

Output (JSON, --out): per policy and phase, descriptors per transfer of the measured requests
in vLLM's order, in transfer_order's order, and the distinct block runs on each side.
usage: python alloc_order_sim.py [--blocks 23596] [--no-cache D|P|PD] [--out FILE]   (needs vLLM)

--no-cache: whether a side's freed blocks carry prefix-cache hashes decides where vLLM puts them
(tail when hashed, head when not) and so how fast the free queue fragments; the real servers lie
between the two, so both are worth a run.

--nixl-check K: the first K measured requests of each policy's last repetition are also moved by
real NIXL (two agents in this process, UCX on host memory, one descriptor per block as xlkv
registers them, 256-byte blocks): one READ in vLLM's order and one in transfer_order's, with
NIXL's telemetry (descCount, what vLLM's KV metrics print) and the bytes checked, next to the
counts the arithmetic above gave ("nixl" in each such request).
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout
from xlkv_autopatch import layout  # noqa: E402

BLOCK = 16


def runs(ids):
    """Maximal runs of consecutive ids in a set of block ids."""
    s = sorted(ids)
    return 1 + sum(1 for a, b in zip(s, s[1:]) if b != a + 1) if s else 0


class Side:
    """One instance's block pool (vLLM's own) and the block lists of its requests."""

    def __init__(self, name, num_blocks, sort_alloc, cache=True):
        import inspect
        from vllm.v1.core.block_pool import BlockPool
        self.name = name
        kw = {"num_gpu_blocks": num_blocks, "enable_caching": True}
        if "hash_block_size" in inspect.signature(BlockPool.__init__).parameters:  # 0.2x+
            kw["hash_block_size"] = BLOCK
        self.pool = BlockPool(**kw)
        self.sort_alloc = sort_alloc
        self.cache = cache  # False: freed blocks carry no hash (vLLM puts them at the queue's head)
        self.blocks = {}  # request id -> [KVCacheBlock] in logical order

    def free_count(self):
        return self.pool.get_num_free_blocks()

    def grow(self, rid, num_tokens):
        """Give request rid blocks for num_tokens tokens in all; False if they do not fit."""
        have = self.blocks.setdefault(rid, [])
        need = -(-num_tokens // BLOCK) - len(have)
        if need <= 0:
            return True
        if need > self.free_count():
            return False
        new = self.pool.get_new_blocks(need)
        if self.sort_alloc:
            new = sorted(new, key=lambda b: b.block_id)
        have.extend(new)
        return True

    def free(self, rid, num_tokens, tag):
        """Cache the full blocks (a unique hash each: random prompts never share a prefix), then
        free in reverse order as vLLM's managers do."""
        blocks = self.blocks.pop(rid)
        for i, b in enumerate(blocks[: num_tokens // BLOCK] if self.cache else ()):
            if b.block_hash is None:
                h = ("%s-%s-%d" % (tag, rid, i)).encode()
                if hasattr(b, "set_block_hash"):
                    b.set_block_hash(h)
                else:  # older releases: a property with a setter
                    b.block_hash = h
        self.pool.free_blocks(reversed(blocks))

    def ids(self, rid):
        return [b.block_id for b in self.blocks[rid]]


def run_phase(P, D, lens, budget, out_len, measure, tag):
    """All requests of lens arrive at once; returns per-request records of the measured ones."""
    waiting_p = deque(range(len(lens)))
    prefilling = []          # [rid, tokens done]
    waiting_d = deque()
    in_xfer = []             # rids whose transfer completes this tick
    decoding = {}            # rid -> tokens decoded
    done = 0
    recs = []
    ticks = 0
    rid_of = lambda i: "%s-%d" % (tag, i)  # noqa: E731
    while done < len(lens):
        ticks += 1
        if ticks > 200000:
            raise RuntimeError("simulation did not finish (%s)" % tag)
        # transfers of last tick complete: P frees, D caches and starts decoding
        for i in in_xfer:
            P.free(rid_of(i), lens[i], tag)
            decoding[i] = 0
        in_xfer = []
        # D: decode one token per running request; free the finished ones
        for i in list(decoding):
            decoding[i] += 1
            if not D.grow(rid_of(i), lens[i] + decoding[i]):
                decoding[i] -= 1  # no block for it this tick (vLLM would preempt; rare here)
                continue
            if decoding[i] >= out_len:
                D.free(rid_of(i), lens[i] + decoding[i], tag)
                del decoding[i]
                done += 1
        # D admits remote prefills FCFS when the whole prompt fits
        while waiting_d and D.grow(rid_of(waiting_d[0]), lens[waiting_d[0]]):
            i = waiting_d.popleft()
            if measure:
                loc, rem = D.ids(rid_of(i)), P.ids(rid_of(i))
                order = layout.ascending_order(loc) or list(range(len(loc)))
                recs.append({
                    "_ids": (loc, rem),
                    "blocks": len(loc),
                    "vllm_order": layout.merged_descriptor_count(loc, rem),
                    "transfer_order": layout.merged_descriptor_count([loc[k] for k in order],
                                                                     [rem[k] for k in order]),
                    "runs_d": runs(loc), "runs_p": runs(rem)})
            in_xfer.append(i)
        # P: chunked prefill, FCFS, token budget per tick
        left = budget
        nxt = []
        for item in prefilling:
            i, got = item
            if left <= 0:
                nxt.append(item)
                continue
            chunk = min(lens[i] - got, left)
            if not P.grow(rid_of(i), got + chunk):
                nxt.append(item)
                continue
            left -= chunk
            item[1] += chunk
            (waiting_d.append(i) if item[1] >= lens[i] else nxt.append(item))
        prefilling = nxt
        while waiting_p and left > 0:
            i = waiting_p[0]
            chunk = min(lens[i], left)
            if not P.grow(rid_of(i), chunk):
                break
            waiting_p.popleft()
            left -= chunk
            if chunk >= lens[i]:
                waiting_d.append(i)
            else:
                prefilling.append([i, chunk])
    return recs, ticks


def simulate(a, sort_alloc):
    rng = random.Random(a.seed)
    P = Side("P", a.blocks, sort_alloc, cache="P" not in a.no_cache)
    D = Side("D", a.blocks, sort_alloc, cache="D" not in a.no_cache)
    phases = []
    run_phase(P, D, [a.len] * a.warmup, a.budget, a.output_len, False, "warm")
    if a.frag:
        frag = [max(1, int(a.frag_len * rng.uniform(1 - a.frag_range, 1 + a.frag_range))) for _ in range(a.frag)]
        run_phase(P, D, frag, a.budget, a.frag_output_len, False, "frag")
    for rep in range(a.reps):
        recs, ticks = run_phase(P, D, [a.len] * a.n, a.budget, a.output_len, True, "rep%d" % rep)
        phases.append({"rep": rep + 1, "ticks": ticks, "requests": recs,
                       **{k + "_mean": statistics.mean(r[k] for r in recs)
                          for k in ("vllm_order", "transfer_order", "runs_d", "runs_p")}})
    return phases


def nixl_check(num_blocks, recs, block_bytes=256):
    """Move each request's blocks with real NIXL in vLLM's order and in transfer_order's order
    (D reads its blocks from P's); adds rec["nixl"] = {vllm_order, transfer_order: NIXL's
    descCount, bytes_ok}."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _nixl_pair import blocks_equal, host_pair, read
    n, bb = num_blocks, block_bytes
    d_agent, src, dst, lh, rh = host_pair(n, bb, ("sim-d", "sim-p"))
    for rec in recs:
        loc, rem = rec["_ids"]
        order = layout.ascending_order(loc) or list(range(len(loc)))
        got, ok = {}, True
        for name, (l_ids, r_ids) in (("vllm_order", (loc, rem)),
                                     ("transfer_order", ([loc[k] for k in order], [rem[k] for k in order]))):
            dst[:] = 0
            state, got[name], _ = read(d_agent, lh, l_ids, rh, r_ids, b"sim")
            ok &= state == "DONE" and blocks_equal(dst, src, n, bb, l_ids, r_ids)
        rec["nixl"] = dict(got, bytes_ok=ok)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=23596, help="KV blocks per side (D's registration on 2xH200, 0.26.0)")
    ap.add_argument("--budget", type=int, default=8192, help="P's tokens per tick (max_num_batched_tokens)")
    ap.add_argument("--len", type=int, default=10240)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--frag", type=int, default=400, help="fragmenting prompts (0: the fresh state)")
    ap.add_argument("--frag-len", type=int, default=2048)
    ap.add_argument("--frag-range", type=float, default=0.9)
    ap.add_argument("--frag-output-len", type=int, default=16)
    ap.add_argument("--no-cache", default="", help="sides (P, D, PD) whose freed blocks carry no prefix-cache hash")
    ap.add_argument("--seed", type=int, default=77)
    ap.add_argument("--nixl-check", type=int, default=0, metavar="K",
                    help="move the first K measured requests of each policy's last repetition with real NIXL")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import vllm
    t0 = time.time()
    res = {"command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), "vllm_version": vllm.__version__,
           "params": vars(a), "policies": {}}
    for name, sort_alloc in (("vllm_allocation", False), ("sorted_allocation", True)):
        phases = simulate(a, sort_alloc)
        if a.nixl_check and phases:
            nixl_check(a.blocks, phases[-1]["requests"][:a.nixl_check])
        for ph in phases:
            for r in ph["requests"]:
                r.pop("_ids", None)
        res["policies"][name] = phases
        for ph in phases:
            print("%-17s rep %d: descriptors per %d-block transfer: vLLM order %.1f, transfer_order %.1f; "
                  "block runs D %.1f, P %.1f (%d ticks)" % (
                      name, ph["rep"], a.len // BLOCK, ph["vllm_order_mean"], ph["transfer_order_mean"],
                      ph["runs_d_mean"], ph["runs_p_mean"], ph["ticks"]))
    res["seconds"] = round(time.time() - t0, 1)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print("written: %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
