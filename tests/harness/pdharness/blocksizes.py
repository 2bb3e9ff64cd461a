"""Different block sizes on P and D (--p-block-size != --d-block-size): the requests, and D's
bytes checked token by token against P's.

A request of N tokens holds cdiv(N, P's block size) blocks on P and cdiv(N, D's) on D (a
sliding-window group only its in-window tail on each side, cut with that side's block size, as
each side's NIXL scheduler cuts it: blocks_per_sw, get_exchange_clipped_blocks).  Token g of the
request lives in P's block at sequence index g // Bp (token g % Bp) and in D's at g // Bd (token
g % Bd).  After the transfer every token of a received D block whose P block was sent must equal
P's; every other token of D's cache must stay zero (never written, or zeroed by vLLM: the tail past
what P sent).  Module level is stdlib only."""
import random

from . import model

#: the cases of a run with different block sizes: (name, tokens as a multiple of the larger block
#: size, extra tokens); "bs-groups" replaces both on a model with several KV cache groups
BS_CASES = (("bs-full", 4, 0), ("bs-partial", 2, 5))


def cdiv(a, b):
    return -(-a // b)


def side_ids(rng, ntok, block_size, groups, used):
    """One side's block ids per group (disjoint, never block 0) for ``ntok`` tokens: the whole
    sequence, a sliding-window group its last cdiv(window, block size) + 1 blocks."""
    n = cdiv(ntok, block_size)
    out = []
    for grp in groups:
        window = grp.get("sliding_window")
        keep = min(n, cdiv(window, block_size) + 1) if window else n
        pool = [b for b in range(1, model.NUM_BLOCKS) if b not in used]
        assert len(pool) >= keep, "%d blocks wanted, %d free" % (keep, len(pool))
        ids = rng.sample(pool, keep)
        used.update(ids)
        out.append(ids)
    return out


def cases(p_bs, d_bs, groups):
    """{name: [(suffix, remote ids, local ids, num tokens)]}: flat id lists with one KV cache
    group, one list per group with several (as the other cases spell them)."""
    groups = groups or [{}]
    big = max(p_bs, d_bs)
    specs = [("bs-groups", 4, 0)] if len(groups) > 1 else BS_CASES
    out = {}
    for i, (name, mult, extra) in enumerate(specs):
        rng = random.Random(11 + i)
        ntok = mult * big + extra
        remote = side_ids(rng, ntok, p_bs, groups, set())
        local = side_ids(rng, ntok, d_bs, groups, set())
        if len(groups) == 1:
            remote, local = remote[0], local[0]
        out[name] = [(name.split("-", 1)[1][0], remote, local, ntok)]
    return out


def token_sources(remote, local, ntok, p_bs, d_bs):
    """{D block: [(P block, P token) or None for each of its d_bs tokens]} for one request.
    A group's lists cover its sequence's tail (sliding window) or all of it."""
    if not (local and isinstance(local[0], (list, tuple))):
        remote, local = [remote], [local]
    out = {}
    for rg, lg in zip(remote, local):
        p_first = cdiv(ntok, p_bs) - len(rg)  # sequence index of the first block listed
        d_first = cdiv(ntok, d_bs) - len(lg)
        for i, lb in enumerate(lg):
            row = []
            for t in range(d_bs):
                pos = (d_first + i) * d_bs + t
                j = pos // p_bs - p_first
                row.append((rg[j], pos % p_bs) if 0 <= j < len(rg) else None)
            out[lb] = row
    return out


def token_dim(shape, block_size, block_dim):
    dims = [i for i, s in enumerate(shape) if s == block_size and i != block_dim]
    assert len(dims) == 1, "cannot find the %d-token dim in %s" % (block_size, tuple(shape))
    return dims[0]


def verify_tokens(p_info, d_layers, sources, d_shape, d_bs, d_rank=0, d_tp=1, replicated=False):
    """D's layers against P's reference token by token (``sources``: D block -> its tokens' P
    sources, of every request so far).  Returns the mismatch lines."""
    import numpy as np
    from .checks import block_dim, head_dim
    shape = tuple(p_info["ref_shape"])
    d_shape = tuple(d_shape)
    nblocks = model.NUM_BLOCKS
    p_bs = p_info["block_size"]
    bd = block_dim(shape, nblocks)
    pt = token_dim(shape, p_bs, bd) - (1 if token_dim(shape, p_bs, bd) > bd else 0)
    dt = token_dim(d_shape, d_bs, bd) - (1 if token_dim(d_shape, d_bs, bd) > bd else 0)
    heads = None
    if d_tp > 1 and not replicated:
        hd = head_dim(shape, model.NUM_KV_HEADS)
        per = model.NUM_KV_HEADS // d_tp
        heads = (hd - (1 if hd > bd else 0), d_rank * per, per)
    bad = []
    for n, dbytes in d_layers.items():
        ref = np.frombuffer(p_info["reference"][n], dtype=np.int16).reshape(shape)
        got = np.frombuffer(dbytes, dtype=np.int16).reshape(d_shape)
        for b in range(nblocks):
            g = np.take(got, b, axis=bd)
            row = sources.get(b)
            if row is None:
                if np.any(g != 0):
                    bad.append(f"{n} local block {b} should be untouched (zero)")
                continue
            wrong, stray = [], []
            for t, src in enumerate(row):
                gt = np.take(g, t, axis=dt)
                if src is None:
                    if np.any(gt != 0):
                        stray.append(t)
                    continue
                want = np.take(np.take(ref, src[0], axis=bd), src[1], axis=pt)
                if heads is not None:
                    want = np.take(want, range(heads[1], heads[1] + heads[2]),
                                   axis=heads[0] - (1 if heads[0] > pt else 0))
                if not np.array_equal(gt, want):
                    wrong.append(t)
            if wrong:
                bad.append(f"{n} local block {b} tokens {_ranges(wrong)} != their remote tokens"
                           + (f" (D rank {d_rank})" if d_tp > 1 else ""))
            if stray:
                bad.append(f"{n} local block {b} tokens {_ranges(stray)} have no remote source and should be zero"
                           + (f" (D rank {d_rank})" if d_tp > 1 else ""))
    return bad


def _ranges(ts):
    out, start = [], ts[0]
    for a, b in zip(ts, ts[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)
