"""CPU-only prefill->decode proof harness for vLLM's real NixlConnector + real NIXL (UCX).

Run with the python of an env made by mkenv.sh:
    python tests/harness/pd_harness.py --out result.json [--case NAME] [--native-opt-in]
                                      [--p-env KEY=VAL] [--d-env KEY=VAL] [--timeout 60]

Two processes (spawn): P (prefill, the NIXL READ target) and D (decode, the reader); at TP N
one per rank, those of a side with several ranks forked from one process of that side that
imported vLLM first (procs.Ranks.start_side; XLKV_HARNESS_FORK_RANKS=0 spawns each).
Each one does what the installed release's GPU worker / V1 GPUModelRunner does:
  * KV cache config from the release's own planner (get_kv_cache_configs),
  * on 0.29+ the layout from the release's own resolve_kv_cache_layout (which consults
    the connector's get_required_kvcache_layout and VLLM_KV_CACHE_LAYOUT),
  * the connector from ensure_kv_transfer_initialized (the real factory),
  * allocation by calling the release's own GPUModelRunner.initialize_kv_cache_tensors
    (0.12-0.28: use_uniform_kv_cache -> allocate_uniform_kv_caches or the per-layer path;
    0.29+: allocate_kv_cache) on a runner object that is NOT __init__'ed (no GPU): only
    the attributes those methods read are set,
  * registration exactly as GPUModelRunner.initialize_kv_cache does
    (register_cross_layers_kv_cache(tensor, backend) or register_kv_caches(dict)),
  * P/D handshake through vLLM's own zmq side channel, start_load_kv / get_finished.
The harness never looks at the xlkv shim: if the shim makes prefer_cross_layer_blocks True
(0.12-0.28) or get_required_kvcache_layout return a block-outermost layout (0.29+), the
release code above takes the cross-layer path by itself.

TEST-HARNESS PATCHING (not product code): the platform is forced to a CpuPlatform subclass
"fakecuda" (device_type "cuda", NIXL memory DRAM, set_device no-op) and its
get_attn_backend_cls returns FLASH_ATTN, so the connector takes its GPU code paths with the
tensors in host memory. Nothing of vLLM's KV/NIXL logic is mocked. make_prepped_xfer is
wrapped pass-through only to count the descriptors really handed to NIXL.
"""
# Modules, one job each (module level is stdlib only: spawned rank workers import them):
#   model        the tiny model's shape (layers, KV heads, blocks) and its config folder
#   cases        the block-order cases: which of P's blocks D pulls into which of its own
#   procs        processes and ports: side-channel environments, the ranks' processes, their queues
#   worker       a rank worker process (P or D): set-up, then the parent's commands; a side's
#                fork parent (side_main)
#   rank_setup   one rank's set-up through the release's own code (config, KV cache, connector)
#   connector_io scheduler steps, handshake metadata, pass-through NIXL descriptor counters
#   compat       calls that differ between vLLM releases
#   logs         log capture inside a rank (errors, warnings, the shim's lines)
#   checks       P's reference bytes and D's blocks compared with them
#   session      the parent's run: start, handshake, cases, the result dict
#   netns        --netns: P and D in two network namespaces joined by a veth pair
#   cli          the command line (tests/harness/pd_harness.py calls cli.main)
