"""The harness model: a tiny Llama whose KV shape every module reads from here.

NUM_KV_HEADS is set once per process (``--kv-heads``, in the parent and in every rank
worker), so read it as ``model.NUM_KV_HEADS`` at call time, never import the name."""
import json
import os

NUM_LAYERS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 64
BLOCK_SIZE = 16
NUM_BLOCKS = 40  # distinct from every other dimension so the block dim can be found by size


def set_kv_heads(n):
    """--kv-heads: the model's KV heads in this process (each TP rank holds n / TP)."""
    global NUM_KV_HEADS
    NUM_KV_HEADS = n


def write_model_dir(path):
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": NUM_KV_HEADS * 2 * HEAD_DIM, "intermediate_size": 512,
        "num_hidden_layers": NUM_LAYERS, "num_attention_heads": NUM_KV_HEADS * 2,
        "num_key_value_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": 512,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    }
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
