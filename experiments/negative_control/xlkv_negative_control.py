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
"""

import functools
import importlib.abc
import os
import sys

ENV = "XLKV_NEGATIVE_CONTROL"
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
_MARK = "_xlkv_negative_control_wrapped"

#: what was done, for tests in the same process: [(request id, description)]
EVENTS = []


def say(msg):
    sys.stderr.write("xlkv negative control: %s (pid %d)\n" % (msg, os.getpid()))
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

    # the original's name, doc and signature (__wrapped__): the shim checks the signature of
    # what it wraps, and the hook must not change what it sees
    functools.update_wrapper(poll, orig)
    setattr(poll, _MARK, True)
    poll.__qualname__ = "%s.%s" % (cls.__name__, meth)
    setattr(cls, meth, poll)
    return True


def patch_module(module):
    wrapped = []
    for cname in WORKER_CLASSES:
        cls = module.__dict__.get(cname)
        if not isinstance(cls, type) or cls.__module__ != module.__name__:
            continue
        for meth in POLL_METHODS:
            if meth in cls.__dict__:
                if _wrap(cls, meth):
                    wrapped.append("%s.%s" % (cname, meth))
                break  # the first one the class defines is the one the connector calls
    if wrapped:
        say("wrapped %s in %s (corruption: %s)" % (", ".join(wrapped), module.__name__, mode()))
    return wrapped


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
    """Arm the hook in this process (idempotent); patches modules that are already imported."""
    how = mode()
    if how is None:
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in TARGET_MODULES:
        if name in sys.modules:
            patch_module(sys.modules[name])
    say("armed (%s)" % how)
    return True
