"""Calls that differ between vLLM releases (rank side; vLLM is imported only inside)."""
import time

from . import model


def kw(fn, **kwargs):
    """Call fn with only the keyword arguments it accepts."""
    import inspect
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def has(mod, attr):
    import importlib
    try:
        return hasattr(importlib.import_module(mod), attr)
    except Exception:
        return False


def role(name):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    return getattr(KVConnectorRole, name)


def current_backends(cfg):
    from vllm.distributed.kv_transfer.kv_connector import utils as U
    if hasattr(U, "get_current_attn_backends"):
        return list(U.get_current_attn_backends(cfg))
    if hasattr(U, "get_current_attn_backend"):
        return [U.get_current_attn_backend(cfg)]
    from vllm.attention.selector import get_attn_backend  # very old releases
    return [get_attn_backend(model.HEAD_DIM, cfg.model_config.dtype, cfg.cache_config.cache_dtype,
                             cfg.cache_config.block_size, use_mla=False)]


def kernel_block_sizes(runner, kvcc):
    """Kernel block sizes as the release's runner computes them."""
    try:
        from vllm.v1.worker.gpu_model_runner import prepare_kernel_block_sizes
        return list(prepare_kernel_block_sizes(kvcc, runner.attn_groups))
    except Exception:
        pass
    try:
        from vllm.v1.worker.utils import prepare_kernel_block_sizes
        return list(prepare_kernel_block_sizes(kvcc, runner.attn_groups))
    except Exception:
        pass
    if hasattr(runner, "_prepare_kernel_block_sizes"):
        try:
            return list(runner._prepare_kernel_block_sizes(kvcc))
        except Exception:
            pass
    return [model.BLOCK_SIZE]


def block_ids_arg(state, ids):
    """Flat list on releases whose ReqMeta.local_block_ids is list[int], else one list
    per KV cache group. ``ids`` is a flat list (one KV cache group) or, on a model with
    several groups (--family sliding-window), one list per group."""
    if ids and isinstance(ids[0], (list, tuple)):
        if len(ids) > 1:
            return tuple(list(g) for g in ids)
        ids = ids[0]  # one group: as the release spells it (flat list on old releases)
    import importlib
    mod = importlib.import_module(type(state["conn"]).__module__)
    md_cls = None
    for cand in (mod.__name__.rsplit(".", 1)[0] + ".metadata", mod.__name__):
        try:
            m = importlib.import_module(cand)
            if hasattr(m, "ReqMeta"):
                md_cls = m.ReqMeta
                break
        except Exception:
            continue
    ann = str(getattr(md_cls, "__annotations__", {}).get("local_block_ids", ""))
    if ann in ("list[int]", "<class 'list'>", "typing.List[int]", "list"):
        return list(ids)
    return (list(ids),)


def metadata_cls(state):
    import importlib
    mod = importlib.import_module(type(state["conn"]).__module__)
    if hasattr(mod, "NixlConnectorMetadata"):
        return mod.NixlConnectorMetadata
    m = importlib.import_module(mod.__name__.rsplit(".", 1)[0] + ".metadata")
    return m.NixlConnectorMetadata


def new_md(state):
    md = metadata_cls(state)()
    if hasattr(md, "scheduler_clock"):
        md.scheduler_clock = time.perf_counter()
    return md
