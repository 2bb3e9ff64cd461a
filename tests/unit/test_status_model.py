"""``python -m xlkv_autopatch status --model DIR``: the shim's decision for one model on the installed
vLLM (a stand-in vLLM's metadata here, so the facts come from config.json; tests/real reads them
through vLLM's own ModelConfig)."""

import json

import pytest

from xlkv_autopatch import __main__ as cli
from xlkv_autopatch import facts

OURS = ("ENABLE_XLKV", "XLKV_COALESCE", "XLKV_STRICT", "XLKV_VLLM_VERSION", "VLLM_PLUGINS", "VLLM_MLA_DISABLE")

CONFIGS = {
    "deepseek-v3": dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], num_hidden_layers=61,
                        kv_lora_rank=512, qk_rope_head_dim=64, num_attention_heads=128, num_key_value_heads=128),
    "deepseek-v32": dict(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"], num_hidden_layers=61,
                         kv_lora_rank=512, qk_rope_head_dim=64, index_topk=2048, num_attention_heads=128),
    "gpt-oss": dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], num_hidden_layers=36,
                    sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 18,
                    num_attention_heads=64, num_key_value_heads=8),
    "qwen3-next": dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], num_hidden_layers=48,
                       num_attention_heads=16, num_key_value_heads=2),
    "llama-70b": dict(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8),
}


@pytest.fixture
def status(monkeypatch, capsys, tmp_path, stand_in_vllm):
    def run(vllm, name, *args, **env):
        for k in OURS:
            monkeypatch.delenv(k, raising=False)
        stand_in_vllm(vllm)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        facts.reset()
        model = tmp_path / name
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps(CONFIGS[name]))
        rc = cli.main(["status", "--no-resolve", "--json", "--model", str(model)] + list(args))
        facts.reset()
        return rc, json.loads(capsys.readouterr().out)

    return run


@pytest.mark.parametrize("vllm, name, args, family, layout, stock, xlkv", [
    ("0.33.0", "deepseek-v3", (), "mla", "BLNHC", 61, 1),
    ("0.33.0", "deepseek-v32", (), "sparse-mla", "stock", 61, 61),
    ("0.33.0", "gpt-oss", (), "sliding-window", "BLNHC", 18, 1),
    ("0.33.0", "qwen3-next", (), "mamba-hybrid", "stock", 48, 48),
    ("0.33.0", "llama-70b", ("--tp", "8"), "one-kv-head", "BLNHC", 80, 1),
    ("0.33.0", "llama-70b", ("--tp", "8", "--pp", "2"), "one-kv-head", "stock", 80, 80),
    ("0.29.0", "llama-70b", ("--tp", "8"), "one-kv-head", "BLNHC", 80, 1),
    ("0.33.0", "llama-70b", ("--tp", "4"), "dense", "BLNHC", 80, 1),
    ("0.26.0", "deepseek-v3", (), "mla", "one cross-layer KV tensor", 61, 1),
    ("0.28.0", "deepseek-v3", ("--pp", "2"), "mla", "stock", 61, 61),
    ("0.25.0", "deepseek-v3", (), "mla", "stock", 61, 61),
    ("0.26.0", "deepseek-v32", (), "sparse-mla", "stock", 61, 61),
    ("0.26.0", "gpt-oss", (), "sliding-window", "packed KV cache groups", 18, 1),
    # 0.12-0.21: a KV connector turns vLLM's hybrid KV cache manager off: one group of all 36 layers
    ("0.21.0", "gpt-oss", (), "sliding-window", "one cross-layer KV tensor", 72, 1),
    ("0.14.1", "gpt-oss", (), "sliding-window", "one cross-layer KV tensor", 72, 1),
    # 0.22-0.23: NIXL supports the hybrid manager, several groups, no packed allocation yet
    ("0.23.0", "gpt-oss", (), "sliding-window", "stock", 36, 36),
    ("0.26.0", "llama-70b", ("--tp", "8"), "one-kv-head", "one cross-layer KV tensor", 80, 1),
    ("0.21.0", "llama-70b", ("--tp", "8"), "one-kv-head", "one cross-layer KV tensor", 160, 1),
    ("0.33.0", "deepseek-v3", ("--pp", "2"), "mla", "stock", 61, 61),
])
def test_status_model_prints_the_decision(status, vllm, name, args, family, layout, stock, xlkv):
    rc, info = status(vllm, name, *args)
    m = info["model"]
    assert (m["family"], m["layout"]) == (family, layout)
    assert m["descriptors_per_block"] == {"stock": stock, "xlkv": xlkv}
    assert m["source"] == "config.json" and m["notes"]  # the stand-in vLLM cannot load it: said so
    assert rc == 0


def test_strict_makes_a_stock_family_a_problem(status):
    rc, info = status("0.33.0", "deepseek-v32", ENABLE_XLKV="true", XLKV_STRICT="1")
    assert rc == 1 and any("XLKV_STRICT=1 and this model keeps the stock layout" in p for p in info["problems"])
    rc, info = status("0.33.0", "deepseek-v3", ENABLE_XLKV="true", XLKV_STRICT="1")
    assert rc == 0 and not info["problems"]


def test_the_text_report_names_family_layout_and_counts(status, capsys, tmp_path, monkeypatch):
    status("0.33.0", "gpt-oss")  # writes the folder and the stand-in vLLM
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.33.0")
    rc = cli.main(["status", "--no-resolve", "--model", str(tmp_path / "gpt-oss")])
    text = capsys.readouterr().out
    assert "sliding-window + full attention hybrid" in text
    assert "with ENABLE_XLKV=true: BLNHC" in text and "stock 18, xlkv 1" in text
    assert text.rstrip().splitlines()[-1].startswith("status:")


def test_a_folder_without_config_is_a_problem(status, tmp_path, capsys):
    status("0.33.0", "gpt-oss")
    rc = cli.main(["status", "--no-resolve", "--json", "--model", str(tmp_path / "nothing")])
    info = json.loads(capsys.readouterr().out)
    assert rc == 1 and any("cannot read" in p for p in info["problems"])
