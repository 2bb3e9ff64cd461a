"""One rank's set-up, as the release's engine core and GPU worker do it: config, the
connector from the real factory, the KV cache from the release's own planner and model
runner, and the registration with the connector.  Runs inside a rank worker process.

TEST-HARNESS PATCHING (not product code): force_platform and the --kernel-block-size
override below, --plant-fault uneven-regions (a self-test), and cpu_packed_storage (vLLM
0.24-0.28's packed registration reads the CUDA device index of the KV storage, which a host
tensor has none of); nothing of vLLM's KV/NIXL logic is mocked."""
import json
import os

from . import model
from .compat import current_backends, has, kernel_block_sizes, kw


#: --attn-backend: the attention backend class the fake CUDA platform names (its KV cache shape and
#: stride order only; no kernel runs), where the release's registry does not say
BACKEND_PATHS = {"FLASH_ATTN": "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend",
                 "TRITON_ATTN": "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"}


def force_platform(attn_backend=None):
    """Harness-only: force a CPU platform that looks like CUDA to the connector."""
    import vllm.platforms as P
    from vllm.platforms.cpu import CpuPlatform

    name = attn_backend or "FLASH_ATTN"

    def _fa_path():
        for mod in ("vllm.v1.attention.backends.registry", "vllm.attention.backends.registry"):
            try:
                return getattr(__import__(mod, fromlist=["AttentionBackendEnum"]).AttentionBackendEnum,
                               name).get_path()
            except Exception:
                pass
        return BACKEND_PATHS[name]

    mla_path = []  # resolved once, on the first MLA request

    class FakeCudaPlatform(CpuPlatform):
        device_type = "cuda"
        device_name = "cuda"

        @classmethod
        def get_nixl_memory_type(cls):
            return "DRAM"

        @classmethod
        def set_device(cls, device):
            return None

        @classmethod
        def get_attn_backend_cls(cls, *args, **kwargs):
            if model.is_mla():  # --family mla: the MLA backend vLLM's CUDA platform would pick
                if not mla_path:
                    mla_path.append(_mla_backend_path())
                return mla_path[0]
            return _fa_path()

    P._current_platform = FakeCudaPlatform()
    return "fakecuda"


def _mla_backend_path():
    """--family mla: FLASH_ATTN_MLA (what vLLM picked for an MLA model on an H100) where its
    class imports, else TRITON_MLA (the portable Triton backend, block sizes multiple of 16;
    FLASH_ATTN_MLA needs the CUDA flash-attention extension, so on this CPU platform it is
    TRITON_MLA). The backend is never run: the harness needs only its KV cache shape, stride
    order and layouts."""
    enum = None
    for mod in ("vllm.v1.attention.backends.registry", "vllm.attention.backends.registry"):
        try:
            enum = __import__(mod, fromlist=["AttentionBackendEnum"]).AttentionBackendEnum
            break
        except Exception:
            continue
    for n in ("FLASH_ATTN_MLA", "TRITON_MLA"):
        try:
            member = getattr(enum, n)
            member.get_class()
            return member.get_path()
        except Exception:
            continue
    return "vllm.v1.attention.backends.mla.triton_mla.TritonMLABackend"


#: What prelude() returned in the process a side's ranks were forked from (worker.side_main); a
#: rank started on its own (spawn) runs prelude itself.
PRELUDE = None


def prelude(args):
    """A rank's first steps, the same for every rank of a side: the platform, vLLM's general
    plugins, vLLM's modules.  Most of a rank's start-up is here (importing vLLM 0.33: ≈ 12 s of
    CPU), so a side of several ranks runs it once and forks its ranks from that process, as
    vLLM's engine core has imported vLLM before its workers start (worker.side_main)."""
    state = {"platform": force_platform(getattr(args, "attn_backend", None))}

    # what the engine core / worker do first: load general plugins (the shim may be one)
    # as in vLLM, an exception from a plugin ends the process (it is not a warning)
    from vllm.plugins import load_general_plugins
    load_general_plugins()

    # vLLM's modules, imported in this order before any of them is used (the helpers below
    # name them again)
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: F401
                             SchedulerConfig, VllmConfig, set_current_vllm_config)
    from vllm.distributed import (init_distributed_environment,  # noqa: F401
                                  initialize_model_parallel)
    from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: F401
    from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: F401
    _no_pinned_memory()
    return state


def _no_pinned_memory():
    """Harness-only: vLLM's ``PIN_MEMORY`` (utils/torch_utils.py, computed at import from the platform it
    found) off where torch has no pinned-memory allocator (a +cpu build: 0.29.0's receive post-processing
    of a block-size ratio called ``torch.tensor(..., pin_memory=True)`` and the decode rank died)."""
    import torch
    try:
        import vllm.utils.torch_utils as tu
    except ImportError:
        return
    if getattr(tu, "PIN_MEMORY", False) and not torch.cuda.is_available():
        try:
            torch.empty(1).pin_memory()
        except RuntimeError:
            tu.PIN_MEMORY = False


def preload_for_fork():
    """In the process a side's ranks are forked from, after prelude: the module every rank imports
    next to allocate its KV cache (_allocate_like_gpu_model_runner; ≈ 5 s of CPU on vLLM 0.33),
    as an engine core has it imported before its workers fork.  A release without it: nothing."""
    import importlib
    try:
        importlib.import_module("vllm.v1.worker.gpu_model_runner")
    except ImportError:
        pass


def setup(role, args, tmpdir):
    """Build config, connector, KV cache, registration. Returns a dict of state."""
    import importlib.metadata as md

    state = {"role": role, "plant_fault": getattr(args, "plant_fault", None), "family": model.FAMILY,
             "restage_rows": bool(getattr(args, "restage_rows", False))}
    state.update(PRELUDE if PRELUDE is not None else prelude(args))
    state["vllm"] = md.version("vllm")
    cfg = _vllm_config(role, args, tmpdir, state)
    state["cfg"] = cfg
    # what VllmConfig decided for the hybrid KV cache manager (several KV cache groups)
    state["hybrid_allocator"] = not getattr(cfg.scheduler_config, "disable_hybrid_kv_cache_manager", True)
    state["use_v2_model_runner"] = _use_v2_model_runner(cfg)
    _init_distributed(cfg, args, tmpdir, state)

    backends = current_backends(cfg)
    backend = backends[0]
    state["backend"] = backend.get_name()
    # --kernel-block-size K: the attention backend supports only K-token kernel blocks, so
    # the release's own prepare_kernel_block_sizes splits each logical block (harness-only
    # override of the backend's capability, like the platform above)
    kernel_bs = getattr(args, f"{role}_kernel_block_size", None) or getattr(args, "kernel_block_size", None)
    if kernel_bs:
        backend.get_supported_kernel_block_sizes = staticmethod(lambda *a, **k: [kernel_bs])

    names = model.layer_names()
    specs = {n: _attention_spec(cfg, backend, state, kind) for n, kind in model.layer_kinds().items()}
    spec = specs[names[0]]
    layout_api = _resolve_layout(cfg, backends, specs, state)
    kvcc = _plan_kv_cache(cfg, specs, spec, layout_api)
    state["kv_cache_groups"] = _groups(kvcc)
    state["num_blocks"] = kvcc.num_blocks
    extra_blocks = _over_allocate(kvcc, args)
    state["kernel_ratio"] = state["block_size"] // kernel_bs if kernel_bs else 1
    state["tensor_blocks"] = (model.NUM_BLOCKS + extra_blocks) * state["kernel_ratio"]

    _init_connector(cfg, kvcc, layout_api, state)
    _allocate_and_register(cfg, kvcc, backend, names, state)
    state["names"] = names
    state["kvcc"] = kvcc
    return state


def _connector_extra(args):
    extra = {}
    if args.native_opt_in:
        extra["enable_cross_layers_blocks"] = "True"
    for item in getattr(args, "kv_extra", None) or []:  # --kv-extra KEY=JSON (both sides)
        key, value = item.split("=", 1)
        extra[key] = json.loads(value)
    return extra


def _kv_transfer_config(role, args, tmpdir, state):
    from vllm.config import KVTransferConfig
    extra = _connector_extra(args)
    # --kv-buffer-device cpu: NIXL's host-buffer mode (the GPU path copies through host buffers)
    buffer_device = getattr(args, "kv_buffer_device", None) or "cuda"
    engine_id = getattr(args, "engine_id", None) or f"{role}-engine"
    connector = getattr(args, f"{role}_connector", None) or "nixl"
    state["connector_kind"] = connector
    if connector == "nixl":
        # --transfer push: vLLM's NixlPushConnector (P WRITEs into D's blocks), where the
        # release has it; default: NixlConnector (D READs from P)
        name = "NixlPushConnector" if getattr(args, "transfer", "pull") == "push" else "NixlConnector"
        return kw(KVTransferConfig, kv_connector=name, kv_role="kv_both",
                  kv_buffer_device=buffer_device, engine_id=engine_id,
                  kv_connector_extra_config=extra)
    # --p-connector/--d-connector multi: NixlConnector inside a MultiConnector (what
    # dynamo and LMCache deployments run); multi-mixed adds the release's example
    # storage connector, which never takes cross-layer blocks
    children = [dict(kv_connector="NixlConnector", kv_role="kv_both",
                     kv_buffer_device=buffer_device, kv_connector_extra_config=extra)]
    if connector == "multi-mixed":
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        names = getattr(KVConnectorFactory, "_registry", {})
        example = "ExampleConnector" if "ExampleConnector" in names else "SharedStorageConnector"
        children.append(dict(kv_connector=example, kv_role="kv_both",
                             kv_connector_extra_config={
                                 "shared_storage_path": os.path.join(tmpdir, f"storage-{role}")}))
    return kw(KVTransferConfig, kv_connector="MultiConnector", kv_role="kv_both",
              kv_buffer_device=buffer_device, engine_id=engine_id,
              kv_connector_extra_config={"connectors": children})


def _vllm_config(role, args, tmpdir, state):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    model_dir = os.path.join(tmpdir, "tinyllama")
    mc = kw(ModelConfig, model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
            dtype="bfloat16", max_model_len=model.MAX_MODEL_LEN, seed=0)
    # --p-block-size / --d-block-size: a P/D block-size mismatch
    block_size = getattr(args, f"{role}_block_size", None) or model.BLOCK_SIZE
    state["block_size"] = block_size
    kvt = _kv_transfer_config(role, args, tmpdir, state)
    sc = kw(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=512,
            is_encoder_decoder=False)
    cc = kw(CacheConfig, block_size=block_size)
    # --p-tp / --d-tp N: this side runs N tensor-parallel worker ranks, one process each
    tp = getattr(args, f"{role}_tp", 1) or 1
    tp_rank = getattr(args, "tp_rank", 0) or 0
    state["tp"], state["tp_rank"] = tp, tp_rank
    extra_cfg = {}
    if tp > 1:
        from vllm.config import ParallelConfig
        # "mp": what vLLM picks for one node; named so that no device count is consulted
        extra_cfg["parallel_config"] = kw(ParallelConfig, tensor_parallel_size=tp,
                                          distributed_executor_backend="mp")
    return kw(VllmConfig, model_config=mc, cache_config=cc, scheduler_config=sc,
              kv_transfer_config=kvt, device_config=DeviceConfig("cpu"), **extra_cfg)


def _use_v2_model_runner(cfg):
    """0.22+: which model runner this engine would use on a GPU machine (the shim forces V1 on
    0.22-0.28). Harness-only: vLLM's config module sees no Triton driver here and would pick
    V1 for that reason alone, so Triton is reported available for this one evaluation."""
    try:
        import vllm.config.vllm as _cv
        had = getattr(_cv, "HAS_TRITON", None)
        if had is not None:
            _cv.HAS_TRITON = True
        try:
            return getattr(cfg, "use_v2_model_runner", None)
        finally:
            if had is not None:
                _cv.HAS_TRITON = had
    except Exception as e:
        return f"n/a ({e!r})"


def _init_distributed(cfg, args, tmpdir, state):
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    ctx = set_current_vllm_config(cfg)
    ctx.__enter__()
    state["_ctx"] = ctx  # keep a reference: GC would exit the context
    # a real gloo process group over this side's ranks (world size 1 at TP 1), as the
    # release's GPU worker initialises it (with NCCL there)
    tp, tp_rank = state["tp"], state["tp_rank"]
    init_distributed_environment(world_size=tp, rank=tp_rank, local_rank=tp_rank,
                                 distributed_init_method=f"file://{tmpdir}/dist-{getattr(args, 'engine_id', None) or state['role']}",
                                 backend="gloo")
    initialize_model_parallel(tp, 1)


def _attention_spec(cfg, backend, state, kind="full"):
    """One layer's KV cache spec, as the model's attention layer builds it: ``kind`` (the
    family table's) full -> FullAttentionSpec, sliding -> SlidingWindowSpec, mla ->
    MLAAttentionSpec (one latent head of kv_lora_rank + rope per token, no K/V split)."""
    import dataclasses
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    tp = state["tp"]
    if kind == "mla":
        from vllm.v1.kv_cache_interface import MLAAttentionSpec
        # vLLM's MLAAttention layer: num_kv_heads=1 whatever TP (the latent is replicated)
        spec = kw(MLAAttentionSpec, block_size=state["block_size"], num_kv_heads=1,
                  head_size=model.HEAD_DIM, dtype=torch.bfloat16, cache_dtype_str="auto")
    else:
        assert model.NUM_KV_HEADS % tp == 0, f"{model.NUM_KV_HEADS} KV heads do not split over TP {tp}"
        # each rank holds its share of the KV heads (vLLM's Attention layer divides them by TP)
        common = dict(block_size=state["block_size"], num_kv_heads=model.NUM_KV_HEADS // tp,
                      head_size=model.HEAD_DIM, dtype=torch.bfloat16)
        if kind == "sliding":
            from vllm.v1.kv_cache_interface import SlidingWindowSpec
            spec = kw(SlidingWindowSpec, sliding_window=model.SLIDING_WINDOW, **common)
        else:
            spec = kw(FullAttentionSpec, **common)
    # mirrors GPUModelRunner.get_kv_cache_spec (0.24-0.28): the runner stamps each
    # AttentionSpec with its backend's indexes_kv_by_block_stride() under the current config
    if "indexes_kv_by_block_stride" in {f.name for f in dataclasses.fields(spec)} and \
            hasattr(backend, "indexes_kv_by_block_stride"):
        with set_current_vllm_config(cfg):
            spec = dataclasses.replace(
                spec, indexes_kv_by_block_stride=backend.indexes_kv_by_block_stride())
    return spec


def _groups(kvcc):
    """The planner's KV cache groups: each group's spec type, window and layers."""
    out = []
    for g in kvcc.kv_cache_groups:
        sp = g.kv_cache_spec
        out.append({"spec": type(sp).__name__, "layers": list(g.layer_names),
                    "sliding_window": getattr(sp, "sliding_window", None),
                    "block_size": getattr(sp, "block_size", None),
                    "page_size_bytes": getattr(sp, "page_size_bytes", None)})
    return out


def _resolve_layout(cfg, backends, specs, state):
    """0.29+: resolve the KV cache layout once, as the engine core does. Returns whether the
    release has that API."""
    layout_api = has("vllm.v1.attention.backends.utils", "resolve_kv_cache_layout")
    if layout_api:
        from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                      resolve_kv_cache_layout)
        supported = [[l.name for l in get_supported_kv_cache_layouts(backends)]]
        layout = resolve_kv_cache_layout(cfg, supported, list(specs.values()))
        state["kv_layout"] = layout.name
        state["layout_block_outermost"] = bool(getattr(layout, "is_block_outermost", False))
    return layout_api


def _plan_kv_cache(cfg, specs, spec, layout_api):
    """KV cache config from the release's own planner (engine core side)."""
    import importlib
    import inspect
    try:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    except ImportError:  # 0.33: moved to kv_cache_planning
        from vllm.v1.core.kv_cache_planning import get_kv_cache_configs
    cfg.cache_config.num_gpu_blocks_override = model.NUM_BLOCKS
    # memory for NUM_BLOCKS blocks in every layer, twice (the planner's max-model-len check
    # on a hybrid model wants more than one group's share); the override fixes the count
    mem = 2 * sum(sp.page_size_bytes for sp in specs.values()) * model.NUM_BLOCKS
    if "global_kv_cache_groups" in inspect.signature(get_kv_cache_configs).parameters:
        # 0.33: the engine core computes the global groups first (same module)
        ggroups = importlib.import_module(get_kv_cache_configs.__module__) \
            .get_global_kv_cache_groups(cfg, [specs])
        kvcc = get_kv_cache_configs(cfg, [specs], [mem], ggroups)[0]
    else:
        kvcc = get_kv_cache_configs(cfg, [specs], [mem])[0]
    if layout_api and hasattr(kvcc, "kv_cache_layout"):
        kvcc.kv_cache_layout = cfg.cache_config.kv_cache_layout
    return kvcc


def _over_allocate(kvcc, args):
    """--over-allocate N: the allocator hands over tensors with N blocks more than the
    scheduler's budget (virtual capacity, as kvcached does); the budget stays NUM_BLOCKS.
    Returns N."""
    import dataclasses
    extra_blocks = getattr(args, "over_allocate", 0) or 0
    if extra_blocks:
        for i, t in enumerate(kvcc.kv_cache_tensors):
            try:
                t.size = t.size + extra_blocks * t.size // model.NUM_BLOCKS
            except dataclasses.FrozenInstanceError:
                kvcc.kv_cache_tensors[i] = dataclasses.replace(
                    t, size=t.size + extra_blocks * t.size // model.NUM_BLOCKS)
    return extra_blocks


def _init_connector(cfg, kvcc, layout_api, state):
    """Worker side: the connector via the real factory."""
    from vllm.distributed.kv_transfer import kv_transfer_state as kvts
    kw(kvts.ensure_kv_transfer_initialized, vllm_config=cfg, kv_cache_config=kvcc)
    outer = kvts.get_kv_transfer_group()  # what the model runner talks to
    # the NixlConnector (inside a MultiConnector: its child) runs the transfers below
    conn = next((c for c in getattr(outer, "_connectors", []) if "Nixl" in type(c).__name__), outer)
    state["outer"] = outer
    state["conn"] = conn
    state["connector_class"] = f"{type(outer).__module__}.{type(outer).__qualname__}"
    try:
        state["prefer_cross_layer_blocks"] = bool(outer.prefer_cross_layer_blocks)
    except Exception:
        state["prefer_cross_layer_blocks"] = None
    if not layout_api:
        try:
            from vllm.v1.attention.backends.utils import get_kv_cache_layout
            state["kv_layout"] = get_kv_cache_layout()
        except Exception as e:
            state["kv_layout"] = f"n/a ({e!r})"


def plant_uneven_regions(state):
    """--plant-fault uneven-regions (harness self-test of a refusal; D only): the connector
    worker's register_kv_caches gets regions that disagree on their block count, as an
    allocator whose tensors differ in size would hand them over: a per-layer registration
    (0.29+ views; several entries) gets its first layer one block short; a registration of one
    entry (the cross-layer tensor, 0.12-0.28) gets that entry as vLLM's list of regions plus a
    view of it holding one block fewer.  A harness wrapper on the worker instance, outside
    anything that patched its class; vLLM's registration code itself is untouched."""
    worker = getattr(state["conn"], "connector_worker", None)
    if worker is None:
        return
    registered = worker.register_kv_caches

    def uneven(kv_caches, *args, **kwargs):
        kv_caches = dict(kv_caches)
        name = next(iter(kv_caches))
        value = kv_caches[name]
        if len(kv_caches) > 1 and not isinstance(value, (list, tuple)):
            kv_caches[name] = value[:-1]
        else:
            regions = list(value) if isinstance(value, (list, tuple)) else [value]
            kv_caches[name] = regions + [regions[0][:-1]]
        return registered(kv_caches, *args, **kwargs)

    worker.register_kv_caches = uneven


def plant_head_offset(state):
    """--plant-fault head-offset (harness self-test of the per-rank byte check; D only, vLLM 0.29+):
    vLLM's head slot of this decode rank inside a remote block is taken as 0 on every rank, so a
    rank other than the first reads the first rank's heads (a wrong head offset, as a layout whose
    heads are not where the slicing assumes would give).  A harness wrapper of the module function
    vLLM's TP mapping calls (``nixl/tp_mapping.py`` compute_head_offset); nothing else changes."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import tp_mapping

    tp_mapping.compute_head_offset = lambda *args, **kwargs: 0
    state["planted_head_offset"] = True


def restage_rows(state):
    """--restage-rows (D only, vLLM 0.29+, a block-outermost BHLNC layout, decode blocks a multiple of
    prefill blocks): a stand-in, on the worker instance, for the shim's receive restage
    (xlkv_autopatch/patches/block_size_restage.py; docs/mechanism.md, "Different block sizes on prefill
    and decode"), for runs without the shim (VLLM_KV_CACHE_LAYOUT=BHLNC).  vLLM reads each prefill block's row (its
    head range) into one of the ``ratio`` equal parts of the decode block's row; before vLLM's own
    receive post-processing (which zeroes the tokens past what prefill sent, on its per-layer views),
    each received row is permuted with the shim's pure arithmetic (xlkv_autopatch.block_sizes
    .staged_order: [R, H, L, n, C] -> [H, L, R, n, C]) and vLLM's own per-layer conversion is turned off
    (``convert=False``: 0.29 would run it on any layout).  The rows are the views' one storage, one block
    stride apart (what vLLM registered as one region per row).""" 
    import torch
    from xlkv_autopatch import block_sizes

    worker = state["conn"].connector_worker
    original = worker.post_process_device_kv_on_receive
    state["restage_rows"] = []

    def restaged(block_size_ratio, block_ids_list, *args, **kwargs):
        if block_size_ratio > 1:
            # vLLM's own conversion is per layer (0.29 runs it on every layout; 0.33 only on block-contiguous
            # ones, never on BHLNC): the rows are in token order after the permutation, so it is turned off
            args, kwargs = (), dict(kwargs, convert=False)
            v = next(iter(worker.device_kv_caches.values()))
            stride = v.stride(0) * v.element_size()
            storage = v.untyped_storage()
            nrows = storage.nbytes() // stride
            rows = torch.empty(0, dtype=torch.uint8, device=v.device).set_(storage)[:nrows * stride].view(nrows, stride)
            tokens, content = worker.block_size, v.shape[3] * v.element_size()  # [B, H, N, C] or [B, N, H, C]
            assert tokens in tuple(v.shape[1:3]), (tuple(v.shape), tokens)
            heads = v.shape[1] * v.shape[2] // tokens
            layers = stride // (heads * tokens * content)
            assert layers * heads * tokens * content == stride, (stride, heads, tokens, content)
            names, perm = block_sizes.staged_order("HLNC", block_size_ratio)
            sizes = {"R": block_size_ratio, "H": heads, "L": layers, "N": tokens // block_size_ratio, "C": content}
            for *_group, block_ids, covered in block_ids_list:  # 0.33: (group, ids, covered); 0.29: (ids, covered)
                full, part = divmod(covered, block_size_ratio)
                ids = list(block_ids)[:full + (1 if part else 0)]
                idx = torch.tensor(ids, dtype=torch.long)
                sel = rows.index_select(0, idx).view(len(ids), *[sizes[a] for a in names])
                rows.index_copy_(0, idx, sel.permute(0, *[p + 1 for p in perm]).reshape(len(ids), stride))
                state["restage_rows"].append({"ratio": block_size_ratio, "rows": ids, "axes": sizes})
        return original(block_size_ratio, block_ids_list, *args, **kwargs)

    worker.post_process_device_kv_on_receive = restaged
    try:  # a shim whose handshake asks for the receive restage's mark (the design's diff applied): set it
        from xlkv_autopatch.patches import _state
        if hasattr(_state, "mark_restages"):
            _state.mark_restages(worker)
            state["restage_marked"] = True
    except Exception:
        pass


class _HostStorage:
    """A host tensor's storage as vLLM's packed registration reads a GPU one: its device index is
    0, the device id vLLM's per-layer registration gives host tensors (``max(get_device(), 0)``)."""

    def __init__(self, storage):
        import types
        self._storage = storage
        self.device = types.SimpleNamespace(index=0, type=storage.device.type)

    def __getattr__(self, name):
        return getattr(self._storage, name)


def cpu_packed_storage(state):
    """Harness-only (0.24-0.28): vLLM's ``_register_packed_kv_cache`` asserts the KV storage has a
    CUDA device index; on this CPU platform it gets the host storage behind an index of 0 (as the
    per-layer path registers host tensors), through an attribute on the worker instance, outside
    anything that patched its class. The registration code itself runs unchanged."""
    worker = getattr(state["conn"], "connector_worker", None)
    registered = getattr(worker, "_register_packed_kv_cache", None)
    if registered is None:
        return

    def on_host(storage, *args, **kwargs):
        if getattr(storage.device, "index", 0) is None:
            state["packed_storage_on_host"] = True
            storage = _HostStorage(storage)
        return registered(storage, *args, **kwargs)

    worker._register_packed_kv_cache = on_host


def _allocate_and_register(cfg, kvcc, backend, names, state):
    outer = state["outer"]
    cpu_packed_storage(state)
    if state["role"] == "d" and state.get("plant_fault") == "uneven-regions":
        plant_uneven_regions(state)
    if state["role"] == "d" and state.get("plant_fault") == "head-offset":
        plant_head_offset(state)
    restage = state["role"] == "d" and state.get("restage_rows")
    runner, kv_caches = _allocate_like_gpu_model_runner(cfg, kvcc, backend, names)
    view = tuple(kv_caches[names[0]].shape)
    if state["tensor_blocks"] not in view and model.NUM_BLOCKS * state["kernel_ratio"] in view:
        # 0.29+ per-layer views cover the budget only, whatever the allocation holds
        state["tensor_blocks"] = model.NUM_BLOCKS * state["kernel_ratio"]
    state["runner"] = runner
    state["kv_caches"] = kv_caches

    # registration exactly as GPUModelRunner.initialize_kv_cache does
    xl = getattr(runner, "cross_layers_kv_cache", None)
    # <=0.28: the model runner allocated a cross-layer tensor; 0.29+: the resolved layout is
    # block-outermost (the only form cross-layer takes there)
    state["cross_layer"] = xl is not None or state.get("layout_block_outermost", False)
    if xl is not None:
        state["cross_layer_shape"] = list(xl.shape)
        outer.register_cross_layers_kv_cache(xl, runner.cross_layers_attn_backend)
    else:
        outer.register_kv_caches(kv_caches)
    try:
        from vllm.v1.worker.gpu_model_runner import copy_kv_blocks  # noqa
        if hasattr(outer, "set_host_xfer_buffer_ops"):
            outer.set_host_xfer_buffer_ops(copy_kv_blocks)
    except Exception:
        pass
    state["layer_view_shape"] = list(kv_caches[names[0]].shape)
    if restage:  # after registration: the worker's own post-processing method exists from __init__ on
        restage_rows(state)


def _allocate_like_gpu_model_runner(cfg, kvcc, backend, names):
    """Call the release's own GPUModelRunner.initialize_kv_cache_tensors on a runner object
    that was not __init__'ed (no GPU). Only the attributes those methods read are set."""
    import dataclasses
    import types
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker import utils as wutils

    runner = GPUModelRunner.__new__(GPUModelRunner)
    ag_fields = {f.name for f in dataclasses.fields(wutils.AttentionGroup)}
    attn_groups = []  # one attention group per KV cache group (one backend per family)
    for gid, group in enumerate(kvcc.kv_cache_groups):
        ag_kwargs = dict(backend=backend, layer_names=list(group.layer_names),
                         kv_cache_spec=group.kv_cache_spec, kv_cache_group_id=gid)
        if "metadata_builders" in ag_fields:
            ag_kwargs["metadata_builders"] = []
        attn_groups.append([wutils.AttentionGroup(**{k: v for k, v in ag_kwargs.items() if k in ag_fields})])

    class _LayerStub:  # stand-in for the Attention modules bind_kv_cache attaches caches to
        def __init__(self):
            self.kv_cache = []

        def bind_kv_cache(self, kv_cache):
            self.kv_cache = kv_cache

    fwd = {n: _LayerStub() for n in names}
    attrs = dict(
        vllm_config=cfg, model_config=cfg.model_config, cache_config=cfg.cache_config,
        parallel_config=cfg.parallel_config, scheduler_config=cfg.scheduler_config,
        kv_cache_config=kvcc, device=torch.device("cpu"), attn_groups=attn_groups,
        runner_only_attn_layers=set(), shared_kv_cache_layers={}, kv_caches=[],
        compilation_config=types.SimpleNamespace(static_forward_context=fwd),
        cross_layers_kv_cache=None, cross_layers_attn_backend=None,
        speculative_config=None, kv_sharing_fast_prefill_eligible_layers=set(),
        dtype=cfg.model_config.dtype,
    )
    for k, v in attrs.items():
        try:
            setattr(runner, k, v)
        except Exception:
            pass
    kv_caches = runner.initialize_kv_cache_tensors(kvcc, kernel_block_sizes(runner, kvcc))
    return runner, kv_caches


def worker_state(state):
    """What the connector worker made of the registration (regions, descriptors, topology)."""
    w = state["conn"].connector_worker
    out = {}
    for a in ("num_regions", "num_descs", "num_blocks", "block_size", "block_len",
              "block_len_per_layer", "kv_cache_layout", "backend_name",
              "_physical_blocks_per_logical_kv_block", "_has_packed_cache", "use_mla",
              "tp_rank", "world_size"):
        if hasattr(w, a):
            v = getattr(w, a)
            if isinstance(v, (int, float, str, bool, list, tuple)) or v is None:
                out[a] = list(v) if isinstance(v, tuple) else v
    out["device_views_are_the_runners"] = _device_views_are_the_runners(w, state.get("kv_caches"))
    sbd = getattr(w, "src_blocks_data", None)
    if isinstance(sbd, list):
        out["len_src_blocks_data"] = len(sbd)
    out["registered"] = registered_per_block(w, sbd)
    topo = getattr(w, "transfer_topo", None) or getattr(w, "kv_topo", None)
    if topo is not None:
        out["topology"] = _topology(topo)
    return out


def _device_views_are_the_runners(w, kv_caches):
    """Does the worker keep, as ``device_kv_caches`` (what its receive post-processing and block zeroing
    read), the very views the model runner registered (shape, strides, data_ptr), not views a registration
    wrapper handed it?  None where the worker keeps no such dict (0.12-0.28 cross-layer tensors)."""
    kept = getattr(w, "device_kv_caches", None)
    if not isinstance(kept, dict) or not isinstance(kv_caches, dict) or set(kept) != set(kv_caches):
        return None
    return all(getattr(kept[n], "shape", None) == kv_caches[n].shape and kept[n].stride() == kv_caches[n].stride()
               and kept[n].data_ptr() == kv_caches[n].data_ptr() for n in kv_caches)


def registered_per_block(w, sbd):
    """Per-block figures the way vLLM REGISTERED them (not from a dense K/V formula): the
    local descriptors of the registration, their bytes, per block id (one block id of one KV
    cache group: with several groups every group's ids index the same regions).
    src_blocks_data is one (addr, len, device) per descriptor (a list up to 0.28, an Nx3 array
    0.29-0.32) or, 0.33, an Nx5 array of strided descriptors (addr, len, device, stride, count)."""
    reg = {"num_regions": getattr(w, "num_regions", None), "num_blocks": getattr(w, "num_blocks", None)}
    for a in ("region_num_blocks", "region_group_ids", "block_len_per_layer", "block_stride_per_layer"):
        v = getattr(w, a, None)
        if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
            reg[a] = list(v)
    descs = nbytes = None
    try:
        if isinstance(sbd, list) and sbd:
            descs, nbytes = len(sbd), sum(int(d[1]) for d in sbd)
        elif sbd is not None and getattr(sbd, "ndim", 0) == 2 and sbd.shape[1] == 5:
            descs = int(sbd[:, 4].sum())
            nbytes = int((sbd[:, 1] * sbd[:, 4]).sum())
        elif sbd is not None and getattr(sbd, "ndim", 0) == 2 and len(sbd):  # 0.29-0.32: (addr, len, device) rows
            descs, nbytes = len(sbd), int(sbd[:, 1].sum())
    except Exception as e:
        reg["error"] = repr(e)
    nb = reg["num_blocks"]
    if descs and nb:
        reg["descs"] = descs
        reg["descs_per_block_id"] = descs / nb if descs % nb else descs // nb
        reg["bytes_per_block_id"] = nbytes / nb if nbytes % nb else nbytes // nb
        reg["bytes_per_descriptor"] = sorted({int(d[1]) for d in sbd})
    return reg


def _topology(topo):
    t = {}
    for a in ("cross_layers_blocks", "_cross_layers_blocks", "split_k_and_v",
              "is_kv_layout_blocks_first", "tensor_shape", "block_size_position"):
        try:
            v = getattr(topo, a)
        except Exception:
            continue
        if isinstance(v, (int, bool, str)) or v is None:
            t[a] = v
        elif isinstance(v, (tuple, list)) or hasattr(v, "__len__"):
            try:
                t[a] = list(v)
            except Exception:
                pass
    return t
