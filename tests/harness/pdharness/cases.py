"""Block-order cases: which of P's blocks D pulls into which of its own, per request."""
from .model import BLOCK_SIZE, NUM_BLOCKS

CASES = {
    # name: list of (request id suffix, remote block ids, local block ids, num tokens)
    "noncontig": [("a", [7, 3, 12, 5], [30, 2, 17, 9], 4 * BLOCK_SIZE)],
    "partial": [("b", [20, 21, 22], [5, 6, 7], 2 * BLOCK_SIZE + 5)],
    "reuse": [("c", [25, 1, 33], [30, 2, 11], 3 * BLOCK_SIZE)],
}
CASE_ORDER = ["noncontig", "partial", "reuse"]
# Block orders a loaded server hands out (its free queue returns blocks in reverse), for the
# descriptor merge NIXL does: both sides descending, two interleaved runs, and a prefix-cache
# hit on D (D lists only its 4 uncomputed blocks; vLLM pairs them with P's last 4); and the
# order of a fresh server, both sides ascending (NIXL merges a stock per-layer region's run
# into one descriptor per region: the case where a layout with more regions loses).
ORDER_CASES = {
    "ascending": [("u", list(range(10, 18)), list(range(0, 8)), 8 * BLOCK_SIZE)],
    "reversed": [("r", list(range(19, 11, -1)), list(range(39, 31, -1)), 8 * BLOCK_SIZE)],
    "interleaved": [("i", [8, 24, 9, 25, 10, 26], [14, 20, 15, 21, 16, 22], 6 * BLOCK_SIZE)],
    "shared": [("s", [11, 10, 9, 8, 7, 6], [29, 28, 27, 26], 6 * BLOCK_SIZE)],
}
CASES.update(ORDER_CASES)
# --refused-peer-*: the engine id of the second prefill and the request D sends it first
# (local blocks no case writes: they must stay zero)
REFUSED_PEER = {"engine_id": "p-refused-engine", "request": ("x", [1, 2, 3], [23, 24, 25])}
CASE_ORDER += list(ORDER_CASES)


# "groups": one request of GROUP_CASE_BLOCKS full blocks on a model with one or several KV
# cache groups, block ids per group as vLLM's scheduler hands them over (group_case); the
# default case of a run with several groups (flat cases above name one group's ids only)
GROUP_CASE_BLOCKS = 6
CASE_CHOICES = CASE_ORDER + ["groups"]


def group_case(groups, block_size=BLOCK_SIZE):
    """[(suffix, remote ids per group, local ids per group, num tokens)] for the "groups" case.
    Every KV cache group takes its own block ids from the one block pool (disjoint, never the
    null block 0), for the whole prompt; a sliding-window group then keeps only its in-window
    tail, cdiv(window, block size) + 1 blocks, on both sides (vLLM's NIXL scheduler:
    blocks_per_sw and get_exchange_clipped_blocks, 0.33 nixl/base_scheduler.py)."""
    import random
    n = GROUP_CASE_BLOCKS
    rng = random.Random(7)
    rpool = rng.sample(range(1, NUM_BLOCKS), n * len(groups))
    lpool = rng.sample(range(1, NUM_BLOCKS), n * len(groups))
    remote, local = [], []
    for g, grp in enumerate(groups):
        r, l_ = rpool[g * n:(g + 1) * n], lpool[g * n:(g + 1) * n]
        window = grp.get("sliding_window")
        if window:
            keep = -(-window // (grp.get("block_size") or block_size)) + 1
            r, l_ = r[-keep:], l_[-keep:]
        remote.append(r)
        local.append(l_)
    return [("g", remote, local, n * block_size)]


def expected_pairs(remote, local):
    """(D block, P block) pairs vLLM transfers: D lists only the blocks it must fill, so
    with fewer local than remote blocks (a prefix-cache hit on D) they pair with P's last."""
    if local and isinstance(local[0], (list, tuple)):  # one list per KV cache group
        return [p for r, l_ in zip(remote, local) for p in expected_pairs(r, l_)]
    return list(zip(local, remote[len(remote) - len(local):]))


def selected(names, over_allocate):
    """The cases to run: ``names`` (default: all, in order), plus "virtual" with
    --over-allocate N >= 3: blocks beyond the scheduler's budget, which only the
    over-allocated tensors hold."""
    cases = list(names or CASE_ORDER)
    if over_allocate >= 3:
        top = NUM_BLOCKS + over_allocate - 1
        CASES["virtual"] = [("v", [top, NUM_BLOCKS, 3], [top - 1, NUM_BLOCKS + 1, 6], 3 * BLOCK_SIZE)]
        cases.append("virtual")
    return cases
