"""Byte checks: P's seeded reference data, and D's blocks compared with it kernel block by
kernel block (every pulled block must equal its source, every other block must stay zero)."""
from . import model


def block_dim(shape, tensor_blocks):
    dims = [i for i, s in enumerate(shape) if s == tensor_blocks]
    assert len(dims) == 1, f"cannot find the block dim ({tensor_blocks} blocks) in {tuple(shape)}"
    return dims[0]


def replicated():
    """The model's KV cache is the same on every TP rank (MLA's latent cache: vLLM reads one remote
    rank and slices nothing), not split by KV heads."""
    return model.FAMILY == "mla"


def head_dim(shape, heads):
    """The KV-head dim of a per-layer view: FLASH_ATTN up to 0.25 gives [..., tokens, heads,
    head_size] (K/V a separate dim), 0.26+ [blocks, heads, tokens, 2 * head_size]."""
    shape = tuple(shape)
    hd = len(shape) - 2 if shape[-1] == model.HEAD_DIM else len(shape) - 3
    assert shape[-1] in (model.HEAD_DIM, 2 * model.HEAD_DIM) and shape[hd] == heads, \
        f"cannot find the {heads}-head dim in the per-layer view {shape}"
    return hd


def layer_bytes(tensors, names):
    """Each layer's bytes (bf16 seen as int16), what the rank hands to the parent."""
    import torch
    return {n: tensors[n].contiguous().view(torch.int16).numpy().tobytes() for n in names}


def fill_reference(state):
    """Seeded random data in every layer. At TP N every rank draws the same whole-model
    tensor (all KV heads) and keeps its own heads' slice, so the parent can rebuild it."""
    import torch
    g = torch.Generator().manual_seed(1234)
    tp, rank = state.get("tp", 1), state.get("tp_rank", 0)
    ref = {}
    for n in state["names"]:
        t = state["kv_caches"][n]
        if tp == 1 or replicated():  # MLA: every rank holds the same latent cache, drawn alike
            src = torch.randn(tuple(t.shape), generator=g).to(t.dtype)
        else:
            hd = head_dim(t.shape, model.NUM_KV_HEADS // tp)
            whole = list(t.shape)
            whole[hd] = model.NUM_KV_HEADS
            per = model.NUM_KV_HEADS // tp
            src = torch.randn(tuple(whole), generator=g).to(t.dtype).narrow(hd, rank * per, per)
            src = src.contiguous()
        t.copy_(src)
        ref[n] = src
    if len(state.get("kv_cache_groups") or ()) > 1:
        # several KV cache groups: layers of different groups share one tensor (vLLM's
        # hybrid allocator), so the reference is what the shared memory holds at the end
        ref = {n: state["kv_caches"][n].clone() for n in state["names"]}
    return ref


def plant_corruption(st, local_ids):
    """Planted fault (harness self-test, --plant-fault corrupt): one element of one received
    block is changed after the transfer; the parent's comparison must catch it."""
    t = st["kv_caches"][st["names"][0]]
    idx = [0] * t.dim()
    idx[block_dim(t.shape, st["tensor_blocks"])] = local_ids[0] * st["kernel_ratio"]
    t[tuple(idx)] += 1.0


def plant_group_shift(st, local_ids):
    """Planted fault (harness self-test, --plant-fault shift-group): in the LAST KV cache
    group, the first received block is replaced by the block after it, as a descriptor of
    that group shifted by one block would deliver; the per-group check must catch it."""
    groups = st.get("kv_cache_groups") or [{"layers": st["names"]}]
    ids = local_ids[-1] if local_ids and isinstance(local_ids[0], (list, tuple)) else local_ids
    t = st["kv_caches"][groups[-1]["layers"][0]]
    bd = block_dim(t.shape, st["tensor_blocks"])
    k = st["kernel_ratio"]
    lid = ids[0] * k
    t.select(bd, lid).copy_(t.select(bd, (lid + k) % st["tensor_blocks"]).clone())


def group_breakdown(groups, local_ids, remote_ids, bad):
    """The byte check per KV cache group: each group's layers x its own received blocks
    (mismatch lines of verify() that name one of its layers and one of its blocks)."""
    out = []
    for g, grp in enumerate(groups):
        lids, rids = local_ids[g], remote_ids[g]
        names = set(grp["layers"])
        n_bad = sum(1 for line in bad if line.split(" local block ")[0] in names
                    and line.split(" local block ")[1].split(" ")[0].isdigit()
                    and int(line.split(" local block ")[1].split(" ")[0]) in lids)
        out.append({"group": g, "spec": grp.get("spec"), "sliding_window": grp.get("sliding_window"),
                    "layers": len(names), "remote_block_ids": list(rids), "local_block_ids": list(lids),
                    "blocks_checked": len(lids) * len(names), "mismatches": n_bad})
    return out


def verify(p_info, d_layers, expected_owner, d_shape=None, d_rank=0, d_tp=1):
    """Compare D's per-layer views against P's reference, kernel block by kernel block
    (expected_owner maps D's logical block ids to P's). p_info's reference holds every KV
    head of the model (at P TP N: the ranks' slices joined by the parent); D rank d_rank of
    d_tp must hold exactly its heads' slice of each block."""
    import numpy as np
    shape = tuple(p_info["ref_shape"])
    d_shape = tuple(d_shape or shape)
    nblocks = p_info.get("tensor_blocks", model.NUM_BLOCKS)
    k = p_info.get("kernel_ratio", 1)
    bd = block_dim(shape, nblocks)
    heads = None
    if (d_tp > 1 or d_shape != shape) and not replicated():
        hd = head_dim(shape, model.NUM_KV_HEADS)
        per = model.NUM_KV_HEADS // d_tp
        assert d_shape[hd] == per and bd != hd, (d_shape, shape)
        heads = (hd - (1 if hd > bd else 0), d_rank * per, per)  # head dim after np.take
    owner = {lb * k + j: rb * k + j for lb, rb in expected_owner.items() for j in range(k)}
    bad = []
    for n, dbytes in d_layers.items():
        ref = np.frombuffer(p_info["reference"][n], dtype=np.int16).reshape(shape)
        got = np.frombuffer(dbytes, dtype=np.int16).reshape(d_shape)
        for b in range(nblocks):
            g = np.take(got, b, axis=bd)
            src = owner.get(b)
            if src is None:
                if np.any(g != 0):
                    bad.append(f"{n} local block {b} should be untouched (zero)")
            else:
                want = np.take(ref, src, axis=bd)
                if heads is not None:
                    want = np.take(want, range(heads[1], heads[1] + heads[2]), axis=heads[0])
                if not np.array_equal(g, want):
                    bad.append(f"{n} local block {b} != remote block {src}"
                               + (f" (D rank {d_rank}: heads {heads[1]}..{heads[1] + heads[2] - 1})"
                                  if heads is not None else ""))
    return bad


def join_reference(p_infos):
    """The whole model's reference from P's ranks: each holds its heads' slice."""
    import numpy as np
    if len(p_infos) == 1 or replicated():
        return p_infos[0]
    first = p_infos[0]
    shape = list(first["ref_shape"])
    hd = head_dim(shape, model.NUM_KV_HEADS // len(p_infos))
    joined = {}
    for n in first["reference"]:
        parts = [np.frombuffer(pi["reference"][n], dtype=np.int16).reshape(pi["ref_shape"])
                 for pi in p_infos]
        joined[n] = np.concatenate(parts, axis=hd).tobytes()
    shape[hd] = model.NUM_KV_HEADS
    return dict(first, reference=joined, ref_shape=shape)
