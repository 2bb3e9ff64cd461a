"""The engine's model shape, gathered from vLLM objects for :func:`xlkv_autopatch.families.decide`.

Every patch that treats model families differently (kv_cache_layout.py on 0.29+,
cross_layer_preference.py and model_runner.py on 0.12-0.28, packed_kv_cache_config.py on 0.24-0.28)
calls :func:`decision`, so the
rule lives in one place (families.py) and ``status --model`` predicts the same answer.
"""

from .. import facts, families
from ._fallback import equal_tp


def _backend_names(vllm_config):
    try:
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends

        return [b.get_name() for b in get_current_attn_backends(vllm_config)]
    except Exception:  # older releases have no such helper; the config decides alone then
        return []


def _kv_heads_per_rank(model, parallel):
    """KV heads each tensor-parallel rank holds (vLLM's own ModelConfig.get_num_kv_heads)."""
    try:
        heads = model.get_num_kv_heads(parallel)
    except Exception:
        return None
    return heads if isinstance(heads, int) else None


def model_shape(vllm_config, *, backends=None, kv_cache_groups=None):
    """families.classify of the engine's model with vLLM's own answers, or None without a model config.
    ``kv_cache_groups``: how many KV cache groups vLLM planned, where the caller knows it (connector,
    planner, worker)."""
    model = getattr(vllm_config, "model_config", None)
    if model is None:
        return None
    parallel = getattr(vllm_config, "parallel_config", None)
    hf = getattr(model, "hf_text_config", None) or getattr(model, "hf_config", None)
    use_mla = bool(getattr(model, "use_mla", False))
    return families.classify(
        hf,
        use_mla=use_mla,
        mamba=bool(getattr(model, "is_hybrid", False)),
        kv_heads_per_rank=_kv_heads_per_rank(model, parallel),
        tp=getattr(parallel, "tensor_parallel_size", 1) or 1,  # per rank where vLLM's own answer is missing
        pp=getattr(parallel, "pipeline_parallel_size", 1) or 1,
        backends=(backends if backends is not None else (_backend_names(vllm_config) if use_mla else ())),
        kv_cache_groups=kv_cache_groups,
    )


def kv_cache_group_count(kv_cache_config):
    """len(kv_cache_config.kv_cache_groups), or None where there is no such config."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    return len(groups) if isinstance(groups, (list, tuple)) else None


def decision(vllm_config, *, kv_cache_groups=None):
    """families.decide for this engine on the installed release, or None without a model config.
    ``kv_cache_groups``: the number of KV cache groups vLLM planned, where the caller knows it."""
    release = facts.current()
    # the attention backends only tell sparse MLA apart, which matters where MLA can be packed
    found = model_shape(vllm_config, backends=None if release.mechanism == "layout" or release.mla_cross_layer_backends
                        else (), kv_cache_groups=kv_cache_groups)
    if found is None:
        return None
    return families.decide(found, release, equal_tp=equal_tp())
