"""Fake NIXL connector worker, at the import path of releases <= 0.19 (``v1.nixl_connector``):
the fake server says it is 0.21.0, whose NIXL code is the ``v1.nixl`` package, and a shim
installed in the test interpreter applies its 0.21 patch set when that package is imported (and
would look for the real connector there); this path is one the registration hook watches too.

The fake ``vllm serve`` builds one and calls ``register_kv_caches`` at start-up, so that the
registration report of experiments/negative_control/ (XLKV_REGISTRATION_REPORT, its import hook
on D's PYTHONPATH) runs its real code path: it wraps this class's ``register_kv_caches`` and
reads the attributes set here, named as vLLM 0.33 names them.  What is "registered" follows the
fake server's transfers: ``regions`` regions of ``block_bytes / regions`` bytes each, indexed by
the block ids of every one of ``groups`` KV cache groups (region group id -1, shared, when there
are several: a sliding-window hybrid whose layers of different groups share tensors).
"""

import types


class FullAttentionSpec:
    sliding_window = None


class SlidingWindowSpec:
    def __init__(self, window):
        self.sliding_window = window


class NixlConnectorWorker:
    def __init__(self, regions, block_bytes, groups=1, window_tokens=272, mla=False, layout="NHD",
                 backend="FLASH_ATTN"):
        self._regions, self._block_bytes, self._groups = regions, block_bytes, groups
        specs = [FullAttentionSpec()] + [SlidingWindowSpec(window_tokens) for _ in range(groups - 1)]
        self.kv_cache_config = types.SimpleNamespace(kv_cache_groups=[
            types.SimpleNamespace(kv_cache_spec=s, layer_names=["l%d.%d" % (g, i) for i in range(2)])
            for g, s in enumerate(specs)])
        self.use_mla = mla
        self.kv_cache_layout = layout
        self.backend_name = backend
        self.tp_rank = 0
        self.block_size = 16
        self.num_blocks = 1000
        self.block_len_per_layer = []
        self.region_group_ids = []
        self.num_regions = 0

    def register_kv_caches(self, kv_caches):
        self.block_len_per_layer = [self._block_bytes // self._regions] * self._regions
        self.region_group_ids = [0 if self._groups == 1 else -1] * self._regions
        self.num_regions = self._regions
        self.num_descs = self._regions * self.num_blocks
