"""The lab's model shapes, one row per model family: the CPU harness's small model and the
random-weight model generated for GPU runs.  Standard library only (the harness's rank workers
import it inside a vLLM environment, make_model.py on a GPU machine).

Rows are keyed by the package's family names (xlkv_autopatch/families.py: ``dense``,
``one-kv-head``, ``mla``, ``sliding-window``; tests/experiments/test_make_model.py checks that the
package classifies every row's configs as its key), and ``attention`` is the row's attention kind
in the package's words.  make_model.py records the shape it generated in ``SHAPE_FILE`` beside
config.json, and the lab reads that (pdtools.kvmetrics.model_shape) instead of classifying
config.json again.

A row's ``harness`` entry is what ``tests/harness/pdharness/model.py`` builds KV cache specs
from (``--family NAME``): the architecture it writes into a config folder, each layer's
attention kind in model order ("full", "sliding", "mla"), KV heads, head size, sliding window and
max_model_len.  Its ``gpu`` entry is what ``experiments/make_model.py --arch ARCH`` writes: the
transformers config and model class, the config fields, and which fields ``--layers``,
``--kv-heads`` and ``--head-dim`` set (None where the family has none); ``also_gpu`` holds more GPU
models of the same family (the sliding-window row: Gemma 3 first, then gpt-oss).  Adding a family is the
package's name and classification plus one row here (a shape to a family: one row); both tools read it.
"""

# Qwen3-0.6B (config.json of Qwen/Qwen3-0.6B), with a smaller vocabulary that matches
# make_model.py's word-level tokenizer.
QWEN3_0_6B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=True,
    attention_bias=False,
)

SHAPES = {
    # dense GQA: the harness's tiny Llama (the original shape), Qwen3-0.6B on GPUs
    "dense": dict(
        attention="full",
        harness=dict(arch="llama", layers=["full"] * 4, kv_heads=2, head_dim=64),
        gpu=dict(arch="qwen3", config="Qwen3Config", model="Qwen3ForCausalLM", fields=QWEN3_0_6B,
                 layers="num_hidden_layers", kv_heads="num_key_value_heads", head_dim="head_dim")),
    # one KV head, MQA (TP 1 reaches the one-KV-head-per-rank registration)
    "one-kv-head": dict(
        attention="full",
        harness=dict(arch="llama", layers=["full"] * 4, kv_heads=1, head_dim=64),
        gpu=dict(arch="mqa", config="Qwen3Config", model="Qwen3ForCausalLM",
                 fields=dict(QWEN3_0_6B, num_key_value_heads=1),
                 layers="num_hidden_layers", kv_heads="num_key_value_heads", head_dim="head_dim")),
    # MLA, DeepSeek-V2-shaped: one latent cache per layer (kv_lora_rank 512 + qk_rope_head_dim 64 =
    # 576 per token, no K/V split).  GPU: DeepSeek-V2-Lite (config.json of deepseek-ai/DeepSeek-V2-Lite):
    # its attention and widths, 8 layers, every MLP dense (first_k_dense_replace follows --layers;
    # n_routed_experts stays set: vLLM's DeepseekV2ForCausalLM builds its expert weight mapping from
    # it); no rope scaling
    "mla": dict(
        attention="mla",
        harness=dict(arch="deepseek_v2", layers=["mla"] * 4, kv_heads=1, kv_lora_rank=512, qk_rope_head_dim=64,
                     head_dim=512 + 64),
        gpu=dict(arch="deepseek_v2", config="DeepseekV2Config", model="DeepseekV2ForCausalLM", fields=dict(
            hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=8,
            num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
            qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=64,
            n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=8, moe_layer_freq=1,
            n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
            max_position_embeddings=40960, rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu",
            tie_word_embeddings=False, attention_bias=False),
            layers="num_hidden_layers", kv_heads=None, head_dim=None, dense_replace="first_k_dense_replace")),
    # sliding-window + full attention hybrid.  Harness: gpt-oss-shaped, 6 layers alternating
    # sliding-window (window 32 tokens = 2 blocks) and full attention, 2 KV heads x 64; max_model_len
    # 256: the planner checks that one request of max_model_len fits the 40 blocks of the pool (the
    # full-attention group alone takes max_model_len / 16 of them).  GPU: Gemma 3 (text), Gemma-3-4B's
    # widths, 12 layers, 5 sliding : 1 full, window 256.  The output head is untied (Gemma ties it to
    # the embedding): with random weights a tied head makes the model repeat the last prompt token
    # whatever the context (model_check.py, 3 and 6 layers: 1 distinct id in 16, no position changes
    # with the context; untied: every one varies).  The KV cache does not depend on it.
    "sliding-window": dict(
        attention="sliding-window",
        harness=dict(arch="gpt_oss", layers=["sliding", "full"] * 3, kv_heads=2, head_dim=64, sliding_window=32,
                     max_model_len=256),
        gpu=dict(arch="gemma3", config="Gemma3TextConfig", model="Gemma3ForCausalLM", fields=dict(
            hidden_size=2560, intermediate_size=10240, num_hidden_layers=12, num_attention_heads=8,
            num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=256,
            sliding_window_pattern=6, max_position_embeddings=40960, rope_theta=1000000.0,
            rope_local_base_freq=10000.0, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=False,
            attention_bias=False),
            layers="num_hidden_layers", kv_heads="num_key_value_heads", head_dim="head_dim", layer_types=6),
        # a second GPU model of the family (MODEL_ARCH=gpt_oss; the row's "gpu" entry stays the family's first):
        # gpt-oss-shaped (GptOssForCausalLM, the config of openai/gpt-oss-20b at smaller widths): attention
        # sinks, sliding-window (128) and full layers alternating (layer_types: even layers sliding, as
        # vLLM's gpt_oss.py builds them), 8 KV heads x head_dim 64, yarn rope as gpt-oss has it, q/k/v/o
        # biases, 8 layers, a MoE MLP in every layer (32 experts, 4 per token, swiglu limit 7, unquantized
        # bf16: vLLM's loader for weights without quantization_config); output head untied as gpt-oss's.
        # One KV block of 16 tokens: 16 x 2 x 8 x 64 x 2 B = 32 KiB per layer
        also_gpu=(
            dict(arch="gpt_oss", config="GptOssConfig", model="GptOssForCausalLM", fields=dict(
                hidden_size=1024, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=16,
                num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                sliding_window=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
                rope_parameters=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                                     original_max_position_embeddings=4096, rope_theta=150000.0),
                hidden_act="silu", swiglu_limit=7.0, tie_word_embeddings=False, attention_bias=True),
                layers="num_hidden_layers", kv_heads="num_key_value_heads", head_dim="head_dim", layer_types=2),
        )),
}

#: the harness's shapes by family name (pd_harness.py --family)
HARNESS = {name: row["harness"] for name, row in SHAPES.items()}
#: the GPU models of each family, its row's "gpu" entry first, then its ``also_gpu`` entries (more models of
#: the same family: another architecture, the same attention kind)
GPU_OF_FAMILY = {name: (row["gpu"],) + tuple(row.get("also_gpu", ())) for name, row in SHAPES.items()}
#: the GPU models' shapes by architecture name (make_model.py --arch, MODEL_ARCH in the lab)
GPU = {gpu["arch"]: gpu for gpus in GPU_OF_FAMILY.values() for gpu in gpus}
#: family (the row's key) of each GPU architecture name
FAMILY_OF_ARCH = {gpu["arch"]: name for name, gpus in GPU_OF_FAMILY.items() for gpu in gpus}

#: what make_model.py writes beside config.json: the shape it generated, in the package's axes
#: (``attention``; ``kv_heads``: the KV heads its config has, as the package counts a config's) and the row
#: it came from (``family``, ``arch``)
SHAPE_FILE = "xlkv-shape.json"


def shape_record(arch, fields):
    """The SHAPE_FILE record of a model of GPU architecture ``arch`` with these config ``fields``."""
    family = FAMILY_OF_ARCH[arch]
    return {"family": family, "arch": arch, "attention": SHAPES[family]["attention"],
            "kv_heads": fields.get(GPU[arch]["kv_heads"] or "num_key_value_heads")}
