"""experiments/make_model.py: the word-level tokenizer maps the experiment prompts to the
intended ids (so a prompt of n words is n tokens); the weights part needs torch+transformers."""

import json
import os
import subprocess
import sys

import pytest

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
sys.path.insert(0, os.path.join(EXP, "probes"))   # model_check.py
from pdtools import kvmetrics, prompts  # noqa: E402


def test_tokenizer_roundtrip(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(tmp_path), "--tokenizer-only"],
                   check=True, capture_output=True)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for n, seed in ((5, 0), (4097, 0), (300, 7)):
        enc = tok.encode(prompts.prompt_text(n, seed))
        assert enc.ids == prompts.prompt_ids(n, seed)  # no BOS, one token per word
    assert tok.decode([5, 7, 31999]) == "w5 w7 w31999"
    assert tok.encode("w5 nonsense").ids == [5, 0]
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<eos>" and tok.token_to_id("<eos>") == 1
    assert not (tmp_path / ".complete").exists()  # tokenizer only: not a finished model


def test_model_config_shape(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(tmp_path), "--layers", "2"],
                   check=True, capture_output=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (2, 8, 128)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == 32000
    assert kvmetrics.model_block_bytes(str(tmp_path)) == 16 * 2 * 2 * 8 * 128 * 2
    assert (tmp_path / ".complete").exists()


@pytest.mark.slow
def test_varied_init_gives_outputs_that_depend_on_the_prompt():
    """The real 28-layer shape on CPU: with --init varied greedy outputs vary (>= 8 distinct ids
    in 16) and change with the context; transformers' own init repeats a few ids (the reason
    for --init varied: an equivalence check over such outputs could hardly fail)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import model_check

    varied = model_check.check(layers=28, init="varied", lengths=(17,), new_tokens=16, fp32=False)["prompts"]["17"]
    assert varied["distinct"] >= 8 and varied["context"] >= 8, varied
    hf = model_check.check(layers=28, init="hf", lengths=(17,), new_tokens=16, fp32=False)["prompts"]["17"]
    assert hf["distinct"] < 8, hf


# ------------------------------------------------------------------ --arch ------------
ARCH_EXPECT = {  # what vLLM is handed for each family (config.json)
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], num_hidden_layers=28, num_key_value_heads=8, head_dim=128),
    "mqa": dict(architectures=["Qwen3ForCausalLM"], num_hidden_layers=28, num_key_value_heads=1, head_dim=128),
    "deepseek_v2": dict(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", num_hidden_layers=8,
                        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                        q_lora_rank=None, first_k_dense_replace=8),
    "gemma3": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=12,
                   sliding_window=256, num_key_value_heads=4, head_dim=256, tie_word_embeddings=False),
    "gpt_oss": dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=8,
                    sliding_window=128, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                    num_experts_per_tok=4, attention_bias=True, tie_word_embeddings=False),
}
#: the package's family of each architecture's model at TP 1 (xlkv_autopatch.families)
FAMILY = {"qwen3": "dense", "mqa": "one-kv-head", "deepseek_v2": "mla", "gemma3": "sliding-window",
          "gpt_oss": "sliding-window"}


@pytest.mark.parametrize("arch", sorted(ARCH_EXPECT))
def test_each_arch_writes_the_config_vllm_needs(tmp_path, arch):
    pytest.importorskip("transformers")
    r = subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(tmp_path), "--arch", arch,
                        "--config-only"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "config.json").read_text())
    for k, v in ARCH_EXPECT[arch].items():
        assert cfg[k] == v, (k, cfg.get(k))
    assert cfg["vocab_size"] == 32000 and cfg["dtype"] == "bfloat16" and not (tmp_path / ".complete").exists()
    assert kvmetrics.model_family(str(tmp_path)) == FAMILY[arch]
    # the shape it generated, recorded beside config.json in the package's axes: what the package's classifier
    # says of that config.json, so the lab reading the record loses nothing
    from xlkv_autopatch import families

    record = json.loads((tmp_path / "xlkv-shape.json").read_text())
    assert (record["family"], record["arch"]) == (FAMILY[arch], arch)
    for tp in (1, 4):
        recorded, classified = kvmetrics.model_shape(str(tmp_path), tp), families.classify(cfg, tp=tp)
        assert recorded.source == "xlkv-shape.json"
        assert (recorded.family, recorded.attention, recorded.mamba, recorded.kv_heads_per_rank) == \
            (classified.family, classified.attention, classified.mamba, classified.kv_heads_per_rank)
    if arch == "gemma3":   # 5 sliding : 1 full, and the window is shorter than the 1000/4097-token prompts
        assert cfg["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 2
        assert cfg["sliding_window"] < 1000
    if arch == "gpt_oss":  # alternating, even layers sliding: what vLLM's gpt_oss.py builds (layer_idx % 2 == 0)
        assert cfg["layer_types"] == ["sliding_attention", "full_attention"] * 4
        assert cfg["sliding_window"] < 1000
        rope = cfg["rope_parameters"]   # vLLM's gpt_oss.py reads these keys (yarn)
        assert rope["rope_type"] == "yarn" and {"rope_theta", "factor", "original_max_position_embeddings",
                                                "beta_fast", "beta_slow"} <= set(rope)
        assert "quantization_config" not in cfg   # vLLM's loader for unquantized (bf16) expert weights
        small = tmp_path / "small"
        subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(small), "--arch", arch,
                        "--layers", "4", "--config-only"], check=True, capture_output=True)
        assert json.loads((small / "config.json").read_text())["layer_types"] == \
            ["sliding_attention", "full_attention"] * 2
    if arch == "deepseek_v2":  # every MLP dense: first_k_dense_replace follows --layers
        small = tmp_path / "small"
        subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(small), "--arch", arch,
                        "--layers", "3", "--config-only"], check=True, capture_output=True)
        small_cfg = json.loads((small / "config.json").read_text())
        assert small_cfg["num_hidden_layers"] == small_cfg["first_k_dense_replace"] == 3
        r = subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(small), "--arch", arch,
                            "--kv-heads", "2", "--config-only"], capture_output=True, text=True)
        assert r.returncode != 0 and "--kv-heads does not apply to --arch deepseek_v2" in r.stderr


@pytest.mark.parametrize("arch", sorted(ARCH_EXPECT))
def test_the_varied_init_redraws_every_layer_matrix_of_each_arch(arch):
    """Every 2-D weight inside the layers (attention and MLP projections; MLA's kv_a_proj_with_mqa and
    kv_b_proj too) is one the varied init redraws; a name it misses would keep transformers' init,
    whose greedy outputs repeat one id.  Built on the meta device: shapes only, no memory."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import make_model
    from transformers import AutoModelForCausalLM

    args = make_model.parse_args(["unused", "--arch", arch, "--layers", "2"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(make_model.build_config(args))
    assert type(model).__name__ == make_model.ARCHS[arch]["model"]
    assert make_model.not_redrawn(model) == []
    matrices = [n for n, p in model.named_parameters() if ".layers." in n and p.dim() >= 2 and not n.endswith("bias")]
    assert len(matrices) >= 2 * 6, matrices  # the check looked at real projections
    if arch == "gpt_oss":   # the MoE: router and the experts' 3-D stacks are redrawn too, in vLLM's layout
        assert make_model.expert_layout_problems(model) == []
        assert {n.split(".layers.0.")[1] for n in matrices if ".layers.0." in n} >= {
            "mlp.router.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}


def test_the_gpt_oss_model_on_cpu_is_written_redrawn_and_loads(tmp_path):
    """A whole gpt_oss model of 2 layers on CPU: the MoE experts and the router are redrawn (not transformers'
    init), the sinks are there, and the saved experts have the layout vLLM's loader reads ([E, hidden, 2 x
    intermediate] and [E, intermediate, hidden])."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from safetensors import safe_open

    r = subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(tmp_path), "--arch", "gpt_oss",
                        "--layers", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / ".complete").exists() and json.loads((tmp_path / "xlkv-shape.json").read_text())["arch"] == \
        "gpt_oss"
    tensors = {}
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            tensors.update({k: st.get_tensor(k) for k in st.keys()})
    pre = "model.layers.1."
    gate_up, down = tensors[pre + "mlp.experts.gate_up_proj"], tensors[pre + "mlp.experts.down_proj"]
    assert tuple(gate_up.shape) == (32, 1024, 2048) and tuple(down.shape) == (32, 1024, 1024)
    assert gate_up.dtype == torch.bfloat16
    # redrawn with --proj-std 0.03 / --out-std 0.01, not transformers' 0.02
    assert abs(gate_up.float().std().item() - 0.03) < 0.002 and abs(down.float().std().item() - 0.01) < 0.001
    assert abs(tensors[pre + "mlp.router.weight"].float().std().item() - 0.03) < 0.002
    assert tuple(tensors[pre + "self_attn.sinks"].shape) == (16,)


def test_qwen3_is_the_default_and_an_old_marker_counts_as_qwen3(tmp_path):
    import make_model

    a = make_model.parse_args(["x"])
    assert (a.arch, a.layers, a.kv_heads, a.head_dim) == ("qwen3", 28, 8, 128)
    assert make_model.arch_fields("qwen3", 28, 8, 128) == make_model.QWEN3_0_6B   # the fields of every earlier run
    # a model written before --arch existed (its .complete has no "arch") is not rewritten
    (tmp_path / ".complete").write_text(json.dumps({"init": "varied", "layers": 28, "kv_heads": 8, "head_dim": 128,
                                                    "vocab": 32000, "seed": 0, "proj_std": 0.03, "out_std": 0.01}))
    r = subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(tmp_path)], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "model already there" in r.stdout


def test_one_table_of_model_shapes_serves_the_gpu_models_and_the_cpu_harness():
    """make_model.py's architectures and the CPU harness's families are the two
    entries of each row of experiments/model_shapes.py, not two tables."""
    sys.path.insert(0, EXP)
    sys.path.insert(0, os.path.join(os.path.dirname(EXP), "tests", "harness"))
    import make_model
    import model_shapes
    from pdharness import model as harness_model

    assert make_model.ARCHS is model_shapes.GPU and harness_model.FAMILIES is model_shapes.HARNESS
    assert set(model_shapes.SHAPES) == {"dense", "one-kv-head", "mla", "sliding-window"}
    # every GPU model has one family: a row's "gpu" entry, then its "also_gpu" ones (gpt-oss beside Gemma 3)
    assert sorted(model_shapes.GPU) == sorted(g["arch"] for gs in model_shapes.GPU_OF_FAMILY.values() for g in gs)
    assert [g["arch"] for g in model_shapes.GPU_OF_FAMILY["sliding-window"]] == ["gemma3", "gpt_oss"]
    for name, row in model_shapes.SHAPES.items():
        assert model_shapes.GPU_OF_FAMILY[name][0] is row["gpu"]   # the family's first GPU model stays its own
        for entry in model_shapes.GPU_OF_FAMILY[name]:
            assert model_shapes.FAMILY_OF_ARCH[entry["arch"]] == name
            # the same kind of attention on both sides: MLA rows carry a latent cache, hybrids a window
            gpu, cpu = entry["fields"], row["harness"]
            assert ("kv_lora_rank" in gpu) == ("mla" in cpu["layers"]) == (cpu["arch"] == "deepseek_v2")
            assert ("sliding_window" in gpu) == ("sliding" in cpu["layers"])
            one_head = cpu["kv_heads"] == 1 and name != "mla"
            assert (gpu.get("num_key_value_heads") == 1) == (name == "one-kv-head") == one_head


def test_the_table_is_keyed_by_the_packages_names_and_the_package_classifies_each_row_as_its_key(tmp_path):
    """One vocabulary for model shape, owned by the package.  Each row's key is a family
    name of xlkv_autopatch.families, its ``attention`` an attention kind of the package, and the package's
    one classifier, given the config each tool writes for the row (make_model.py's GPU config, the
    harness's config folder), says that family and kind at TP 1."""
    sys.path.insert(0, EXP)
    sys.path.insert(0, os.path.join(os.path.dirname(EXP), "tests", "harness"))
    import make_model
    import model_shapes
    from pdharness import model as harness_model
    from xlkv_autopatch import families

    assert set(model_shapes.SHAPES) <= set(families.FAMILIES)
    try:
        for name, row in model_shapes.SHAPES.items():
            assert row["attention"] in families.ATTENTION_KINDS, name
            gpus = [families.classify(make_model.arch_fields(g["arch"])) for g in model_shapes.GPU_OF_FAMILY[name]]
            harness_model.set_family(name)
            harness_model.write_model_dir(str(tmp_path / name))
            cpu = families.classify(json.loads((tmp_path / name / "config.json").read_text()))
            for shape in gpus + [cpu]:
                assert (shape.family, shape.attention) == (name, row["attention"]), (name, shape)
    finally:
        harness_model.set_family("dense")


def test_the_lab_reads_the_recorded_shape_instead_of_classifying_the_config(tmp_path):
    """make_model.py's record wins over config.json (a model the lab generated is never re-guessed); a
    folder without one (MODEL=... of a real model) gets the package's classifier, not a rule of the lab's."""
    import model_shapes

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_key_value_heads": 8}))
    assert kvmetrics.model_family(str(tmp_path)) == "dense"
    assert kvmetrics.model_shape(str(tmp_path)).source == "config.json"
    (tmp_path / model_shapes.SHAPE_FILE).write_text(json.dumps({"attention": "sliding-window", "kv_heads": 8}))
    assert kvmetrics.model_family(str(tmp_path)) == "sliding-window"
    assert kvmetrics.model_shape(str(tmp_path), tp=8).kv_heads_per_rank == 1  # both facts kept
    with pytest.raises(kvmetrics.NotDense, match="sliding-window model"):
        kvmetrics.model_block_bytes(str(tmp_path))
