"""Two NIXL agents in one process on host memory (UCX: CMA reads), for the CPU probes.

    reader, src, dst, lh, rh = host_pair(n, bb)      # target owns src (random), reader dst (zeros)
    state, desc_count, ms = read(reader, lh, local_ids, rh, remote_ids)
    same = blocks_equal(dst, src, n, bb, local_ids, remote_ids)

One descriptor per block of ``bb`` bytes on each side, prepped once; ``read`` posts a READ of
the given (local, remote) block pairs, polls it to the end and returns NIXL's own descriptor
count after its merge (what vLLM's KV metrics print as "Avg number of descriptors").
"""
import time

import numpy as np


def host_pair(n, bb, names=("reader", "target"), seed=0):
    from nixl._api import nixl_agent, nixl_agent_config
    src = np.random.default_rng(seed).integers(0, 255, n * bb, dtype=np.uint8)
    dst = np.zeros_like(src)
    cfg = nixl_agent_config(backends=["UCX"], capture_telemetry=True)
    reader, target = nixl_agent(names[0], cfg), nixl_agent(names[1], cfg)
    reader.register_memory(np.array([[dst.ctypes.data, dst.nbytes, 0]], dtype=np.uint64), "DRAM")
    target.register_memory(np.array([[src.ctypes.data, src.nbytes, 0]], dtype=np.uint64), "DRAM")
    remote = reader.add_remote_agent(target.get_agent_metadata())
    table = lambda base: np.array([(base + b * bb, bb, 0) for b in range(n)], dtype=np.uint64)  # noqa: E731
    lh = reader.prep_xfer_dlist("NIXL_INIT_AGENT", table(dst.ctypes.data), "DRAM")
    rh = reader.prep_xfer_dlist(remote, table(src.ctypes.data), "DRAM")
    reader._xlkv_target = target   # keep the target agent alive as long as the reader
    return reader, src, dst, lh, rh


def read(reader, lh, local_ids, rh, remote_ids, tag=b"probe"):
    t0 = time.perf_counter()
    h = reader.make_prepped_xfer("READ", lh, list(local_ids), rh, list(remote_ids), tag)
    state = reader.transfer(h)
    while state == "PROC":
        state = reader.check_xfer_state(h)
    ms = (time.perf_counter() - t0) * 1e3
    count = int(reader.get_xfer_telemetry(h).descCount)
    reader.release_xfer_handle(h)
    return state, count, ms


def blocks_equal(dst, src, n, bb, local_ids, remote_ids):
    return bool((dst.reshape(n, bb)[list(local_ids)] == src.reshape(n, bb)[list(remote_ids)]).all())
