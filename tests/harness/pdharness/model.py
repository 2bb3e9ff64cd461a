"""The harness model: one small model per FAMILY, every shape fact in experiments/model_shapes.py.

``--family`` picks the row once per process (in the parent and in every rank worker:
``set_family``), and ``--kv-heads`` may override its KV heads; so read the module's
globals as ``model.NUM_KV_HEADS`` etc. at call time, never import the names.

Families (the package's names, xlkv_autopatch/families.py; what vLLM sees: the harness builds
each layer's KV cache spec the way the model's attention layers would):
  dense           tiny Llama: 4 full-attention layers, 2 KV heads x 64 (the original shape)
  one-kv-head     the same with one KV head (TP 1 reaches the one-KV-head-per-rank registration)
  mla             DeepSeek-V2-shaped: 4 MLA layers, one latent cache per layer (kv_lora_rank 512 +
                  qk_rope_head_dim 64 = 576 per token, no K/V split), use_mla True in the model config
  sliding-window  gpt-oss-shaped hybrid: 6 layers alternating sliding-window (window 32 tokens =
                  2 blocks) and full attention, 2 KV heads x 64: vLLM's planner makes one KV cache
                  group per attention type (hybrid allocator on), the sliding-window group pulls
                  only its in-window tail
"""
import json
import os
import sys

# one row per family (the "harness" entries of experiments/model_shapes.py, the lab's one table of
# model shapes); "layers" lists each layer's attention kind in model order
_EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "experiments")
if _EXPERIMENTS not in sys.path:  # last: the lab's folder must shadow nothing of the vLLM process
    sys.path.append(_EXPERIMENTS)
import model_shapes  # noqa: E402

FAMILIES = model_shapes.HARNESS
FAMILY_NAMES = list(FAMILIES)

FAMILY = "dense"
LAYER_KINDS = list(FAMILIES[FAMILY]["layers"])
NUM_LAYERS = len(LAYER_KINDS)
NUM_KV_HEADS = FAMILIES[FAMILY]["kv_heads"]
HEAD_DIM = FAMILIES[FAMILY]["head_dim"]
SLIDING_WINDOW = None
MAX_MODEL_LEN = 512
BLOCK_SIZE = 16
NUM_BLOCKS = 40  # distinct from every other dimension so the block dim can be found by size


def set_family(name):
    """--family: the model of this process (call before set_kv_heads)."""
    global FAMILY, LAYER_KINDS, NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, SLIDING_WINDOW, MAX_MODEL_LEN
    row = FAMILIES[name]
    FAMILY = name
    LAYER_KINDS = list(row["layers"])
    NUM_LAYERS = len(LAYER_KINDS)
    NUM_KV_HEADS = row["kv_heads"]
    HEAD_DIM = row["head_dim"]
    SLIDING_WINDOW = row.get("sliding_window")
    MAX_MODEL_LEN = row.get("max_model_len", 512)


def set_kv_heads(n):
    """--kv-heads: the model's KV heads in this process (each TP rank holds n / TP)."""
    global NUM_KV_HEADS
    NUM_KV_HEADS = n


def is_mla():
    return FAMILIES[FAMILY]["arch"] == "deepseek_v2"


def layer_names():
    """The attention layers' names, in model order (as vLLM's static forward context has them)."""
    return [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]


def layer_kinds():
    """{layer name: "full" | "sliding" | "mla"}."""
    return dict(zip(layer_names(), LAYER_KINDS))


def write_model_dir(path):
    """A Hugging Face config folder of the family's architecture (random weights are never
    needed: the harness builds no model, only the KV cache)."""
    row = FAMILIES[FAMILY]
    common = {"vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "num_hidden_layers": NUM_LAYERS}
    if row["arch"] == "deepseek_v2":
        # DeepSeek-V2-Lite's attention dims (one latent cache of 512 + 64 per token and
        # layer), fewer layers and a small MLP; no MoE layer (first_k_dense_replace)
        cfg = dict(common, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                   hidden_size=256, intermediate_size=512, num_attention_heads=4,
                   num_key_value_heads=4, kv_lora_rank=row["kv_lora_rank"], q_lora_rank=None,
                   qk_rope_head_dim=row["qk_rope_head_dim"], qk_nope_head_dim=64, v_head_dim=64,
                   first_k_dense_replace=NUM_LAYERS, moe_intermediate_size=256,
                   n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                   moe_layer_freq=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                   topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
                   hidden_act="silu", attention_bias=False)
    elif row["arch"] == "gpt_oss":
        types = ["sliding_attention" if k == "sliding" else "full_attention" for k in LAYER_KINDS]
        cfg = dict(common, architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                   hidden_size=NUM_KV_HEADS * 2 * HEAD_DIM, intermediate_size=256,
                   num_attention_heads=NUM_KV_HEADS * 2, num_key_value_heads=NUM_KV_HEADS,
                   head_dim=HEAD_DIM, sliding_window=row["sliding_window"], layer_types=types,
                   num_local_experts=4, num_experts_per_tok=2, experts_per_token=2,
                   hidden_act="silu", attention_bias=True, swiglu_limit=7.0)
    else:
        cfg = dict(common, architectures=["LlamaForCausalLM"], model_type="llama",
                   hidden_size=NUM_KV_HEADS * 2 * HEAD_DIM, intermediate_size=512,
                   num_attention_heads=NUM_KV_HEADS * 2, num_key_value_heads=NUM_KV_HEADS,
                   head_dim=HEAD_DIM, hidden_act="silu")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
