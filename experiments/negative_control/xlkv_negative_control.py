"""Negative control for the P/D equivalence checks: corrupt the KV that the decode side received.

EXPERIMENTS ONLY.  This is a planted fault, never part of the installed package: it is loaded
only by ``experiments/negative_control/sitecustomize.py``, and only in a process started with
that folder first on ``PYTHONPATH`` and ``XLKV_NEGATIVE_CONTROL`` set (pd_equivalence.sh does so
for D of its ``nc-<config>`` runs; tests/real/test_negative_control.py for D of the CPU harness).
A check that passes with it loaded does not look at the received KV.

What it does: when vLLM's NIXL connector worker module is imported, the worker's completion
poll (``get_transfer_results`` on 0.33+, ``get_finished`` before) is wrapped.  For every request
whose receive just finished, the first block it received is corrupted in the tensors the
worker registered with NIXL (``device_kv_caches``: per-layer tensors, per-layer views of one
block-outermost buffer, or one cross-layer tensor; whatever the release and the shim made):

  shift        the block gets the bytes of the next block id (every layer, K and V), as an
               off-by-one block index in a descriptor would do
  swap-layers  layers 0 and 1 of the block trade places, as a wrong per-layer offset would do

The worker classes by release: ``...kv_connector.v1.nixl_connector.NixlConnectorWorker``
(<= 0.19), ``...v1.nixl.worker.NixlConnectorWorker`` (0.20-0.23),
``...v1.nixl.base_worker.NixlBaseConnectorWorker`` (0.24+).

Second job of the same import hook (no corruption): the registration report.  With
``XLKV_REGISTRATION_REPORT=<path>`` set (every config of pd_equivalence.sh and pd_bench.sh, stock
too: pdtools/pair.py), the worker's ``register_kv_caches`` is wrapped and, after vLLM's own returns, what
it registered is written to ``<path>`` as JSON (``.rank<N>`` appended for TP ranks > 0): the
number of regions, ``block_len_per_layer``, ``region_group_ids`` where the release has them, the
KV cache groups (spec, sliding window, layers), the KV cache layout, and per group the bytes and
regions one block id of that group touches (``registration_facts``).  It only reads attributes;
pdtools turns the bytes into blocks per transfer and descriptors per block id.
"""

import functools
import importlib.abc
import json
import os
import sys

ENV = "XLKV_NEGATIVE_CONTROL"
REPORT_ENV = "XLKV_REGISTRATION_REPORT"
#: vLLM 0.33's _SHARED_REGION_GROUP_ID: a region that the block ids of every group index
SHARED_REGION_GROUP_ID = -1
CORRUPTIONS = {
    "shift": "shift: the first KV block D received for each request gets the bytes of the next "
             "block id, in every layer (an off-by-one block index)",
    "swap-layers": "swap-layers: layers 0 and 1 of the first KV block D received for each request "
                   "trade places",
}
_BASE = "vllm.distributed.kv_transfer.kv_connector.v1."
TARGET_MODULES = (_BASE + "nixl_connector", _BASE + "nixl.worker", _BASE + "nixl.base_worker")
WORKER_CLASSES = ("NixlConnectorWorker", "NixlBaseConnectorWorker")
POLL_METHODS = ("get_transfer_results", "get_finished")
REGISTER_METHOD = "register_kv_caches"
_MARK = "_xlkv_negative_control_wrapped"


def _install(cls, name, wrapper, orig):
    """Put ``wrapper`` on ``cls`` as ``name`` with the original's name, doc and signature
    (__wrapped__): the shim checks the signature of what it wraps, and the hook must not change
    what it sees."""
    functools.update_wrapper(wrapper, orig)
    setattr(wrapper, _MARK, True)
    wrapper.__qualname__ = "%s.%s" % (cls.__name__, name)
    setattr(cls, name, wrapper)

#: what was done, for tests in the same process: [(request id, description)]
EVENTS = []


def say(msg):
    sys.stderr.write("xlkv negative control: %s (pid %d)\n" % (msg, os.getpid()))
    sys.stderr.flush()


def say_report(msg):
    """The registration report's lines (their own prefix: no 'negative control' in a stock D's log)."""
    sys.stderr.write("xlkv registration report: %s (pid %d)\n" % (msg, os.getpid()))
    sys.stderr.flush()


def mode():
    m = os.environ.get(ENV, "").strip().lower()
    if m in ("", "0", "off", "no", "false"):
        return None
    if m in ("1", "on", "yes", "true"):
        return "shift"
    if m not in CORRUPTIONS:
        raise ValueError("%s=%r: use one of %s" % (ENV, m, ", ".join(CORRUPTIONS)))
    return m


# ------------------------------------------------------------------------------ the corruption
def _first_block(meta):
    """The first (kernel) block id the request received, from its ReqMeta."""
    for attr in ("local_physical_block_ids", "local_block_ids"):
        ids = getattr(meta, attr, None)
        if ids is None:
            continue
        ids = list(ids)
        while ids and isinstance(ids[0], (list, tuple)):  # KV-cache groups: the first non-empty
            ids = next((list(g) for g in ids if len(g)), [])
        if ids:
            return int(ids[0])
    return None


def _tensors(worker):
    """The registered KV tensors, in layer order (a mamba tuple contributes nothing)."""
    caches = getattr(worker, "device_kv_caches", None) or getattr(worker, "kv_caches", None) or {}
    out = []
    for name, t in caches.items():
        # a tensor, or a list of them (K and V apart; 0.12-0.15 with the shim: [cross-layer view])
        for i, x in enumerate(t if isinstance(t, list) else [t]):
            if hasattr(x, "shape") and hasattr(x, "select"):
                out.append((name if i == 0 else "%s[%d]" % (name, i), x))
    return out


def _num_blocks(worker, tensors):
    sizes = set()
    n = getattr(worker, "num_blocks", None)
    if isinstance(n, int) and n > 0:
        sizes.add(n)
        ratio = getattr(worker, "_physical_blocks_per_logical_kv_block", None)
        if isinstance(ratio, int) and ratio > 1:
            sizes.add(n * ratio)
    return sizes


def _block_dim(t, sizes):
    """The dimension that indexes blocks: its size is the block count; if several dims have that
    size, the outermost in memory (largest stride)."""
    dims = [d for d, s in enumerate(t.shape) if s in sizes]
    if not dims:
        return None
    return max(dims, key=lambda d: t.stride(d))


def _num_layers(worker):
    for attr in ("_layer_specs", "layer_names"):
        v = getattr(worker, attr, None)
        if v:
            return len(v)
    try:
        mc = worker.vllm_config.model_config
        return mc.get_num_layers(worker.vllm_config.parallel_config)
    except Exception:
        return None


def corrupt(worker, block, how):
    """Corrupt ``block`` in the worker's registered tensors; returns a description."""
    tensors = _tensors(worker)
    if not tensors:
        raise RuntimeError("the worker has no registered KV tensors (device_kv_caches)")
    sizes = _num_blocks(worker, tensors)
    if not sizes:  # no block count known: the largest dim of the first tensor
        sizes = {max(tensors[0][1].shape)}
    if how == "shift":
        done = 0
        for name, t in tensors:
            bd = _block_dim(t, sizes)
            if bd is None:
                continue
            nb = t.shape[bd]
            src = block + 1 if block + 1 < nb else block - 1
            t.select(bd, block).copy_(t.select(bd, src).clone())
            done += 1
        if not done:
            raise RuntimeError("no registered tensor has a block dimension of size %s" % sorted(sizes))
        return "block %d <- block %d in %d tensor(s)" % (block, src, done)
    if how == "swap-layers":
        distinct = []
        for name, t in tensors:  # per-layer tensors (or per-layer views of one buffer)
            if t.data_ptr() not in {x.data_ptr() for _, x in distinct}:
                distinct.append((name, t))
        if len(distinct) >= 2:
            (n0, t0), (n1, t1) = distinct[0], distinct[1]
            b0, b1 = _block_dim(t0, sizes), _block_dim(t1, sizes)
            a = t0.select(b0, block).clone()
            t0.select(b0, block).copy_(t1.select(b1, block))
            t1.select(b1, block).copy_(a)
            return "block %d: layers %s and %s swapped" % (block, n0, n1)
        name, t = distinct[0]  # one cross-layer tensor: find its layer dimension
        nl = _num_layers(worker)
        # the registered tensor may be a flat view (the shim on 0.12-0.15 registers
        # (blocks, block, 1, rest)); the runner's tensor it views still has the layer dimension
        for cand in (t, getattr(t, "_base", None)):
            if cand is None:
                continue
            bd = _block_dim(cand, sizes)
            if bd is None:
                continue
            row = cand.select(bd, block)
            ld = next((d for d, s in enumerate(row.shape) if s == nl), None) if nl else None
            if ld is not None:
                t = cand
                break
        else:
            # a flat row (0.12-0.15 with the shim: the tensor it views is a raw buffer): vLLM's
            # uniform cross-layer allocation puts K/V outermost within a block, then the layers
            # (as the 0.16+ tensors show); the CPU harness checks this per layer
            bd = _block_dim(t, sizes)
            row = t.select(bd, block)
            if not (nl and row.is_contiguous() and row.numel() % (2 * nl) == 0):
                raise RuntimeError("cross-layer tensor %s %s: no layer dimension of size %s" % (name, tuple(t.shape), nl))
            row = row.reshape(2, nl, -1)
            ld = 1
        a = row.select(ld, 0).clone()
        row.select(ld, 0).copy_(row.select(ld, 1))
        row.select(ld, 1).copy_(a)
        return "block %d: layers 0 and 1 of the cross-layer tensor swapped (dim %d of %s)" % (
            block, ld, tuple(t.shape))
    raise ValueError(how)


# ------------------------------------------------------------------------------ the wrapper
def _finished_recving(result):
    if isinstance(result, tuple) and len(result) >= 2:
        return result[1] or ()
    return getattr(result, "finished_recving", None) or ()


def _wrap(cls, meth):
    orig = cls.__dict__[meth]
    if getattr(orig, _MARK, False):
        return False

    def poll(self, *args, **kwargs):
        pending = dict(getattr(self, "_recving_metadata", None) or {})  # popped by the original
        result = orig(self, *args, **kwargs)
        how = mode()
        if how and not getattr(self, "_xlkv_nc_busy", False):
            self._xlkv_nc_busy = True  # a subclass's poll calling this one corrupts once
            try:
                for req_id in sorted(_finished_recving(result)):
                    meta = pending.get(req_id)
                    block = _first_block(meta) if meta is not None else None
                    if block is None:
                        continue
                    try:
                        what = corrupt(self, block, how)
                    except Exception as e:
                        what = "FAILED: %s: %s" % (type(e).__name__, e)
                    EVENTS.append((req_id, what))
                    say("request %s: %s: %s" % (req_id, how, what))
            finally:
                self._xlkv_nc_busy = False
        return result

    _install(cls, meth, poll, orig)
    return True


def report_path():
    """Where the registration report goes (None: not asked for)."""
    return os.environ.get(REPORT_ENV, "").strip() or None


def registration_facts(num_regions, block_lens, region_group_ids, num_groups):
    """Per KV cache group: the regions one of its block ids touches and their bytes.

    vLLM builds a block id's descriptors as one per region of its group (0.33:
    ``_compute_desc_ids``: regions whose group id is the group's or shared, -1); a region
    registered as a whole block row (BLNHC, packed MLA) is one region whose block length is the
    row.  Releases without ``region_group_ids`` index every region with every group's ids.
    ``block_lens`` is ``block_len_per_layer`` (one entry per registered tensor or region; older
    releases split a tensor's K and V into two descriptors of half its length, which this does
    not count: the measured descriptors say it).  Returns {"bytes_per_block_id": [...],
    "regions_per_block_id": [...]} (one entry per group) or an "error"."""
    block_lens = [int(b) for b in (block_lens or [])]
    num_groups = max(1, int(num_groups or 1))
    if not block_lens:
        return {"error": "no block_len_per_layer"}
    gids = list(region_group_ids) if region_group_ids else None
    if gids is not None and len(gids) != len(block_lens):
        return {"error": "region_group_ids (%d) and block_len_per_layer (%d) differ in length"
                         % (len(gids), len(block_lens))}
    out_b, out_r = [], []
    for g in range(num_groups):
        idx = [i for i in range(len(block_lens))
               if gids is None or gids[i] == g or gids[i] == SHARED_REGION_GROUP_ID]
        out_b.append(sum(block_lens[i] for i in idx))
        out_r.append(len(idx))
    return {"bytes_per_block_id": out_b, "regions_per_block_id": out_r}


def _groups(worker):
    cfg = getattr(worker, "kv_cache_config", None)
    groups = getattr(cfg, "kv_cache_groups", None)
    if groups is None:
        return None
    out = []
    for g in groups:
        spec = getattr(g, "kv_cache_spec", None)
        out.append({"spec": type(spec).__name__ if spec is not None else None,
                    "sliding_window": getattr(spec, "sliding_window", None),
                    "page_size_bytes": getattr(spec, "page_size_bytes", None),
                    "num_layers": len(getattr(g, "layer_names", None) or [])})
    return out


def _plain(x):
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    try:
        return int(x)
    except Exception:
        return str(x)


def registration_report(worker):
    """The facts of what ``worker`` registered (after its register_kv_caches returned)."""
    block_lens = _plain(list(getattr(worker, "block_len_per_layer", None) or []))
    gids = getattr(worker, "region_group_ids", None)
    gids = _plain(list(gids)) if gids is not None else None
    groups = _groups(worker)
    # the transfer groups are the ones region_group_ids index (0.33); else the KV cache groups
    cfg = getattr(worker, "kv_cache_config", None)
    tgroups = getattr(cfg, "transfer_groups", None)
    num_groups = len(tgroups) if tgroups is not None else (len(groups) if groups is not None else 1)
    num_regions = getattr(worker, "num_regions", None)
    if not isinstance(num_regions, int) or num_regions <= 0:
        num_regions = len(block_lens)
    rep = {
        "worker_class": type(worker).__name__,
        "pid": os.getpid(),
        "tp_rank": _plain(getattr(worker, "tp_rank", None)),
        "num_regions": num_regions,
        "block_len_per_layer": block_lens,
        "region_group_ids": gids,
        "num_kv_cache_groups": num_groups,
        "kv_cache_groups": groups,
        "kv_cache_layout": _plain(getattr(worker, "kv_cache_layout", None)),
        "use_mla": _plain(getattr(worker, "use_mla", None)),
        "backend_name": _plain(getattr(worker, "backend_name", None)),
        "block_size": _plain(getattr(worker, "block_size", None)),
        "num_blocks": _plain(getattr(worker, "num_blocks", None)),
        "num_descs": _plain(getattr(worker, "num_descs", None)),
    }
    rep.update(registration_facts(num_regions, block_lens, gids, num_groups))
    try:
        import vllm

        rep["vllm_version"] = getattr(vllm, "__version__", None)
    except Exception:
        pass
    return rep


def write_report(worker, path):
    rep = registration_report(worker)
    rank = rep.get("tp_rank")
    if isinstance(rank, int) and rank > 0:
        path = "%s.rank%d" % (path, rank)
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(rep, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    say_report("%s: %d region(s), %d KV cache group(s), layout %s, bytes per block id %s"
        % (path, rep["num_regions"], rep["num_kv_cache_groups"], rep["kv_cache_layout"],
           rep.get("bytes_per_block_id", rep.get("error"))))
    return path


def _wrap_register(cls):
    orig = cls.__dict__[REGISTER_METHOD]
    if getattr(orig, _MARK, False):
        return False

    def register_kv_caches(self, *args, **kwargs):
        result = orig(self, *args, **kwargs)
        path = report_path()
        if path:
            try:
                write_report(self, path)
            except Exception as e:  # a report must never break the engine; say it loudly
                say_report("FAILED: %s: %s" % (type(e).__name__, e))
        return result

    _install(cls, REGISTER_METHOD, register_kv_caches, orig)
    return True


def patch_module(module):
    """Wrap the worker class(es) of ``module``: the completion poll when a corruption is asked for,
    register_kv_caches when a registration report is.  Returns what was wrapped."""
    wrapped, reported = [], []
    for cname in WORKER_CLASSES:
        cls = module.__dict__.get(cname)
        if not isinstance(cls, type) or cls.__module__ != module.__name__:
            continue
        if mode():
            for meth in POLL_METHODS:
                if meth in cls.__dict__:
                    if _wrap(cls, meth):
                        wrapped.append("%s.%s" % (cname, meth))
                    break  # the first one the class defines is the one the connector calls
        if report_path() and REGISTER_METHOD in cls.__dict__ and _wrap_register(cls):
            reported.append("%s.%s" % (cname, REGISTER_METHOD))
    if wrapped:
        say("wrapped %s in %s (corruption: %s)" % (", ".join(wrapped), module.__name__, mode()))
    if reported:
        say_report("wrapped %s in %s (report to %s)" % (", ".join(reported), module.__name__, report_path()))
    return wrapped + reported


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        patch_module(module)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the worker module right after it is executed (vLLM is never imported early)."""

    def __init__(self):
        self.busy = set()

    def find_spec(self, name, path, target=None):
        if name not in TARGET_MODULES or name in self.busy:
            return None
        self.busy.add(name)  # other hook finders (wrapt's, for the shim) may ask the path again
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader)
                    return spec
            return None
        finally:
            self.busy.discard(name)


def install():
    """Arm the hook in this process (idempotent); patches modules that are already imported.
    Armed when a corruption (XLKV_NEGATIVE_CONTROL) or a registration report
    (XLKV_REGISTRATION_REPORT) is asked for; otherwise it does nothing."""
    how = mode()
    if how is None and not report_path():
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in TARGET_MODULES:
        if name in sys.modules:
            patch_module(sys.modules[name])
    if how:
        say("armed (%s)" % how)
    if report_path():
        say_report("armed (%s)" % report_path())
    return True
