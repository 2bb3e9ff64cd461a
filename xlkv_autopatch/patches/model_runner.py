"""VllmConfig.use_v2_model_runner: run the V1 model runner, which honours cross-layer blocks.

Why
    From vLLM 0.22 (Qwen3) and 0.25 (all dense models) the default Model Runner V2
    registers per-layer KV tensors only (its kv_connector.py says "TODO: support
    cross_layers_kv_cache"), so the cross-layer preference is silently ignored: on 2xH200 with
    vLLM 0.26, 28 descriptors per block with V2 and 1 with the V1 runner and the same opt-in
    (docs/measurements.md, "Model Runner V1 on 0.22-0.28", has the TTFT runs).
    (0.24-0.28 also have a packed per-block allocation both runners honour; the shim uses
    it only for sliding-window hybrids with several KV cache groups, which one cross-layer
    tensor cannot serve: packed_kv_cache_config.py tags its hash and refuses heterogeneous
    TP.  Dense models keep the V1 cross-layer tensor, the path measured on GPUs; a
    sliding-window hybrid is switched to V1 as well where V2 would be chosen, so that one
    runner serves every family.)
How
    The property is wrapped: when ENABLE_XLKV is on, the engine's KV connector is a
    NixlConnector (directly or inside a MultiConnector), the model's family takes
    cross-layer blocks (families.decide: dense, one KV head, MLA on 0.26-0.28), the user
    did not set VLLM_USE_V2_MODEL_RUNNER, and the original answer is V2 because the model
    is on V2's default list, the answer becomes V1 (INFO line once).  Features that force
    V2 (speculative decoding drafts, PCP > 1) keep V2, and an explicit
    VLLM_USE_V2_MODEL_RUNNER=1 wins; both log a WARNING that the stock layout is kept
    (XLKV_STRICT=1: an error).
vLLM versions
    0.22-0.28 (0.12-0.21 default to V1; 0.29+ use KV-cache layouts both runners honour).
Removal
    When Model Runner V2 registers cross-layer KV caches, or with 0.22-0.28 support.
"""

import os

from ..logs import info_once
from ..releases import VLLM_CONFIG
from ..specs import Target
from . import _model
from ._config import uses_nixl
from ._fallback import fallback

ENV = "VLLM_USE_V2_MODEL_RUNNER"


def _forces_v2(config):
    if getattr(config, "speculative_config", None) is not None:
        return "speculative decoding"
    pcp = getattr(getattr(config, "parallel_config", None), "prefill_context_parallel_size", 1) or 1
    if pcp > 1:
        return "prefill context parallelism"
    return None


def runner_wrapper(wrapped, config, args, kwargs):
    result = wrapped(*args, **kwargs)
    if not result or not uses_nixl(getattr(config, "kv_transfer_config", None)):
        return result
    model = _model.decision(config)
    if model is None or not model.cross_layer:  # the stock layout: V2 loses nothing
        return result
    if os.environ.get(ENV, "").strip():
        fallback("runner-env", "%s=%s selects Model Runner V2, which ignores cross-layer KV blocks"
                 % (ENV, os.environ[ENV]))
        return result
    forced = _forces_v2(config)
    if forced:
        fallback("runner-" + forced, "%s requires Model Runner V2, which ignores cross-layer KV blocks" % forced)
        return result
    info_once("runner", "using the V1 model runner: Model Runner V2 ignores cross-layer KV blocks "
              "(set %s=1 to keep V2 and the stock layout)" % ENV)
    return False


#: what this file wraps: VllmConfig.use_v2_model_runner where Model Runner V2 is the default (the release
#: table's ``runner_v1``), a patch set of its own on import of vLLM's config
TARGETS = (
    Target(name="model_runner.force_v1", group="runner", module=VLLM_CONFIG, owner="VllmConfig",
           attr="use_v2_model_runner", kind="property", wrapper=runner_wrapper, when={"runner_v1": True}),
)
