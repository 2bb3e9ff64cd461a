"""``python -m xlkv_autopatch status --model DIR``: the shim's decision for one model on the installed
vLLM (a stand-in vLLM's metadata here, so the facts come from config.json; tests/real reads them
through vLLM's own ModelConfig)."""

import json

import pytest

from xlkv_autopatch import __main__ as cli
from xlkv_autopatch import facts

OURS = ("ENABLE_XLKV", "XLKV_COALESCE", "XLKV_STRICT", "XLKV_EQUAL_TP", "XLKV_VLLM_VERSION", "VLLM_PLUGINS", "VLLM_MLA_DISABLE",
        "VLLM_KV_CACHE_LAYOUT")

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
    ("0.33.0", "gpt-oss", (), "sliding-window", "BHLNC", 18, 1),
    # gpt-oss at TP 8: one KV head per rank, whole rows for a sliding-window hybrid too
    ("0.33.0", "gpt-oss", ("--tp", "8"), "sliding-window", "BHLNC", 18, 1),
    ("0.33.0", "gpt-oss", ("--tp", "8", "--pp", "2"), "sliding-window", "stock", 18, 18),
    ("0.33.0", "qwen3-next", (), "mamba-hybrid", "stock", 48, 48),
    ("0.33.0", "llama-70b", ("--tp", "8"), "one-kv-head", "BHLNC", 80, 1),
    ("0.33.0", "llama-70b", ("--tp", "8", "--pp", "2"), "one-kv-head", "stock", 80, 80),
    ("0.29.0", "llama-70b", ("--tp", "8"), "one-kv-head", "BHLNC", 80, 1),
    ("0.33.0", "llama-70b", ("--tp", "4"), "dense", "BHLNC", 80, 1),
    ("0.26.0", "deepseek-v3", (), "mla", "one cross-layer KV tensor", 61, 1),
    ("0.28.0", "deepseek-v3", ("--pp", "2"), "mla", "stock", 61, 61),
    ("0.25.0", "deepseek-v3", (), "mla", "stock", 61, 61),
    ("0.26.0", "deepseek-v32", (), "sparse-mla", "stock", 61, 61),
    # packed multi-group rows cannot be sliced by KV heads: stock unless XLKV_EQUAL_TP (test below)
    ("0.26.0", "gpt-oss", (), "sliding-window", "stock", 18, 18),
    # 0.23-0.25: no backend's cross-layer block keeps the KV heads outermost: stock unless XLKV_EQUAL_TP
    ("0.24.0", "llama-70b", ("--tp", "4"), "dense", "stock", 160, 160),
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
    assert "with ENABLE_XLKV=true: BHLNC" in text and "stock 18, xlkv 1" in text
    assert text.splitlines()[0] == "status: OK" and text.count("status: ") == 1, text


def test_a_folder_without_config_is_a_problem(status, tmp_path, capsys):
    status("0.33.0", "gpt-oss")
    rc = cli.main(["status", "--no-resolve", "--json", "--model", str(tmp_path / "nothing")])
    info = json.loads(capsys.readouterr().out)
    assert rc == 1 and any("cannot read" in p for p in info["problems"])


@pytest.mark.parametrize("vllm, name, p_tp, d_tp, served, sources, per_rank, words", [
    # 0.29+: heads-outermost rows, 1 descriptor per block per remote rank whichever side is wider
    ("0.33.0", "llama-70b", 1, 4, True, 1, {"stock": 80, "xlkv": 1}, "KV heads are outermost"),
    ("0.33.0", "llama-70b", 4, 1, True, 4, {"stock": 80, "xlkv": 1}, "KV heads are outermost"),
    ("0.33.0", "llama-70b", 2, 8, True, 1, {"stock": 80, "xlkv": 1}, "KV heads are outermost"),
    ("0.33.0", "gpt-oss", 1, 4, True, 1, {"stock": 18, "xlkv": 1}, "KV heads are outermost"),  # llm-d's guide
    ("0.33.0", "gpt-oss", 1, 8, True, 1, {"stock": 18, "xlkv": 1}, "KV heads are outermost"),
    ("0.33.0", "deepseek-v3", 1, 2, True, 1, {"stock": 61, "xlkv": 1}, "replicated"),
    ("0.33.0", "llama-70b", 8, 8, True, 1, {"stock": 80, "xlkv": 1}, "the same layout"),
    # vLLM itself refuses prefill TP > decode TP above the KV heads (stock too)
    ("0.33.0", "llama-70b", 16, 2, False, None, {"stock": None, "xlkv": None}, "with or without xlkv"),
    # one side stock (pipeline stages at one KV head per rank), the other BHLNC: refused
    # 0.12-0.28: FLASH_ATTN cross-layer blocks on 0.26 (heads outermost), refused on 0.24
    # 0.12-0.28: FLASH_ATTN cross-layer blocks on 0.26 (heads outermost); where a cross-layer block cannot be
    # sliced by KV heads (0.24's, packed groups) the engine keeps the stock layout and the pair is served as stock
    ("0.26.0", "llama-70b", 1, 2, True, 1, {"stock": 80, "xlkv": 1}, "other attention backends: the stock layout"),
    ("0.24.0", "llama-70b", 1, 2, True, 1, {"stock": 160, "xlkv": 160}, "both sides keep the stock layout"),
    ("0.26.0", "deepseek-v3", 1, 2, True, 1, {"stock": 61, "xlkv": 1}, "replicated"),  # one latent tensor
    ("0.26.0", "gpt-oss", 1, 2, True, 1, {"stock": 18, "xlkv": 18}, "XLKV_EQUAL_TP=true"),
])
def test_status_for_a_pair(status, vllm, name, p_tp, d_tp, served, sources, per_rank, words):
    rc, info = status(vllm, name, "--prefill-tp", str(p_tp), "--decode-tp", str(d_tp))
    pair = info["pair"]
    assert (pair["prefill_tp"], pair["decode_tp"], pair["served"]) == (p_tp, d_tp, served), pair
    assert pair["remote_ranks_per_decode_rank"] == sources, pair
    assert pair["descriptors_per_block_per_remote_rank"] == per_rank, pair
    assert words in pair["reason"], pair["reason"]
    assert rc == (0 if served else 1)
    assert served or any(("prefill TP %d -> decode TP %d" % (p_tp, d_tp)) in p for p in info["problems"])


def test_status_for_a_pair_with_a_stock_side(status):
    rc, info = status("0.33.0", "llama-70b", "--prefill-tp", "4", "--decode-tp", "8", "--pp", "2")
    pair = info["pair"]
    assert not pair["served"] and "prefill gets BHLNC, decode stock" in pair["reason"], pair["reason"]
    assert rc == 1


def test_status_model_predicts_an_explicit_layout(status):
    """With VLLM_KV_CACHE_LAYOUT set, status --model predicts what vLLM runs (the
    variable wins on 0.29+), and XLKV_STRICT=1 makes a stock one a problem."""
    rc, info = status("0.33.0", "llama-70b", ENABLE_XLKV="true", VLLM_KV_CACHE_LAYOUT="LBHNC")
    m = info["model"]
    assert (m["layout"], m["cross_layer"]) == ("stock (LBHNC)", False), m
    assert m["descriptors_per_block"] == {"stock": 80, "xlkv": 80} and "set explicitly and wins" in m["reason"]
    rc, info = status("0.33.0", "llama-70b", ENABLE_XLKV="true", VLLM_KV_CACHE_LAYOUT="LBHNC", XLKV_STRICT="1")
    assert rc == 1
    rc, info = status("0.33.0", "llama-70b", ENABLE_XLKV="true", VLLM_KV_CACHE_LAYOUT="BLNHC")
    assert (info["model"]["layout"], info["model"]["cross_layer"]) == ("BLNHC", True)
    rc, info = status("0.33.0", "llama-70b", "--prefill-tp", "1", "--decode-tp", "2", ENABLE_XLKV="true",
                      VLLM_KV_CACHE_LAYOUT="BLNHC")
    assert info["pair"]["served"] is False and "token-major" in info["pair"]["reason"], info["pair"]


@pytest.mark.parametrize("vllm, name, p_tp, d_tp, layout, stock, xlkv, served, words", [
    ("0.26.0", "gpt-oss", 1, 1, "packed KV cache groups", 18, 1, True, "the same layout"),
    ("0.26.0", "gpt-oss", 1, 2, "packed KV cache groups", 18, 1, False, "packed multi-group"),
    ("0.24.0", "llama-70b", 4, 4, "one cross-layer KV tensor", 160, 1, True, "the same layout"),
    ("0.24.0", "llama-70b", 1, 2, "one cross-layer KV tensor", 160, 1, False, "blocks-first"),
    ("0.26.0", "llama-70b", 1, 2, "one cross-layer KV tensor", 80, 1, True, "handshake is refused with XLKV_EQUAL"),
])
def test_equal_tp_keeps_cross_layer_blocks_that_serve_one_tp_size(status, vllm, name, p_tp, d_tp, layout, stock,
                                                                  xlkv, served, words):
    """XLKV_EQUAL_TP=true: the cross-layer blocks that cannot be sliced by KV heads are
    kept, and a pair at other TP sizes is refused, naming the knob; unset, the same pairs are served."""
    rc, info = status(vllm, name, "--prefill-tp", str(p_tp), "--decode-tp", str(d_tp), XLKV_EQUAL_TP="true")
    side = info["pair"]["sides"]["decode"]
    assert side["layout"] == layout and side["descriptors_per_block"] == {"stock": stock, "xlkv": xlkv}
    assert info["pair"]["served"] is served and words in info["pair"]["reason"], info["pair"]["reason"]
    assert served or "XLKV_EQUAL_TP=true is set" in info["pair"]["reason"]
    rc, info = status(vllm, name, "--prefill-tp", str(p_tp), "--decode-tp", str(d_tp))
    assert info["pair"]["served"] is True


def test_status_asks_the_run_times_backend_step(status, monkeypatch):
    """The "backends whose cross-layer blocks cannot be sliced by KV heads keep the stock
    layout unless XLKV_EQUAL_TP" step is one function (families.kept_stock_for_any_tp), which the
    preference patch asks at run time (tests/unit/test_families.py) and status here: a planted answer shows."""
    from xlkv_autopatch import families

    rc, info = status("0.26.0", "llama-70b", "--tp", "4")
    assert info["model"]["layout"] == "one cross-layer KV tensor"
    assert info["model"]["notes"][-1].startswith("with FLASH_ATTN; other attention backends (FLASHINFER")
    real = families.kept_stock_for_any_tp
    monkeypatch.setattr(families, "kept_stock_for_any_tp", lambda b, release, equal_tp: "PLANTED %s" % b if
                        b == "FLASH_ATTN" else real(b, release, equal_tp=equal_tp))
    rc, info = status("0.26.0", "llama-70b", "--tp", "4")
    assert (info["model"]["layout"], info["model"]["reason"]) == ("stock", "PLANTED FLASH_ATTN")
    # XLKV_EQUAL_TP=true reaches the step through status's one knob read
    monkeypatch.setattr(families, "kept_stock_for_any_tp", real)
    rc, info = status("0.24.0", "llama-70b", "--tp", "4", XLKV_EQUAL_TP="true")
    assert info["model"]["layout"] == "one cross-layer KV tensor"


@pytest.mark.parametrize("vllm, equal_tp, expected", [
    # XLKV_EQUAL_TP=true keeps every backend's cross-layer block: a blocks-first one registers K and V apart
    # on 0.12-0.25 (the release's kv_split_regions column)
    ("0.24.0", "true", {"FLASH_ATTN": 1, "FLASHINFER": 2, "TRITON_ATTN": 2}),
    # 0.26: K and V in one region of any backend's block: 1 each, so no note
    ("0.26.0", "true", {"FLASH_ATTN": 1, "FLASHINFER": 1, "TRITON_ATTN": 1}),
    # unset: only FLASH_ATTN's heads-outermost block is kept, the others stay stock (one region per layer)
    ("0.26.0", None, {"FLASH_ATTN": 1, "FLASHINFER": 80, "TRITON_ATTN": 80}),
])
def test_status_model_counts_descriptors_per_backend(status, vllm, equal_tp, expected):
    """vLLM 0.12-0.28: status --model does not know which attention backend vLLM picks, so it gives the
    count for each (the run-time registration differs: 1 region for FLASH_ATTN's block, 2 for a
    blocks-first one) and says so in a note where they differ."""
    env = {"XLKV_EQUAL_TP": equal_tp} if equal_tp else {}
    rc, info = status(vllm, "llama-70b", "--tp", "4", **env)
    m = info["model"]
    by = m["descriptors_per_block_by_backend"]
    assert {b: by[b] for b in expected if b in by} == {b: n for b, n in expected.items() if b in by}, by
    assert by["FLASH_ATTN"] == 1
    # a note where cross-layer backends differ (the stock ones have their own: "keep the stock layout")
    assert any("depend on the attention backend" in n for n in m["notes"]) == (len(set(expected.values())) > 1
                                                                            and bool(equal_tp)), m["notes"]


def test_status_model_has_no_per_backend_counts_where_the_layout_decides(status):
    rc, info = status("0.33.0", "llama-70b", "--tp", "4")
    assert info["model"]["descriptors_per_block_by_backend"] is None


@pytest.fixture
def text_status(status, capsys, tmp_path):
    """text_status(vllm, name, *args, **env) -> (exit code, the text report) of status --model."""
    def run(vllm, name, *args, **env):
        status(vllm, name, **env)  # the stand-in vLLM, the folder and the environment
        rc = cli.main(["status", "--no-resolve", "--model", str(tmp_path / name)] + list(args))
        return rc, capsys.readouterr().out

    return run


def _problems(text):
    return [line for line in text.splitlines() if line.startswith("PROBLEM: ")]


@pytest.mark.parametrize("vllm, name, args, lines", [
    # status --model at the default TP
    ("0.33.0", "llama-70b", (), [
        "model {dir} (TP 1, PP 1; facts from config.json): dense attention",
        "  with ENABLE_XLKV=true: BHLNC -- ",
        "  NIXL descriptors per block id (one KV cache group, before NIXL merges neighbours): stock 80, xlkv 1"]),
    # --tp: one KV head per rank
    ("0.33.0", "llama-70b", ("--tp", "8"), [
        "model {dir} (TP 8, PP 1; facts from config.json): ",
        "  NIXL descriptors per block id (one KV cache group, before NIXL merges neighbours): stock 80, xlkv 1"]),
    # a pair: each side's layout and heads, then the counts per remote rank (stock first, then xlkv)
    ("0.33.0", "llama-70b", ("--prefill-tp", "1", "--decode-tp", "4"), [
        "pair: prefill TP 1 -> decode TP 4: served -- the KV heads are outermost in each BHLNC block row",
        "  prefill (TP 1, 8 KV heads per rank): BHLNC",
        "  decode (TP 4, 2 KV heads per rank): BHLNC",
        "  each decode rank reads 1 prefill rank(s); NIXL descriptors per block per remote rank (before NIXL merges "
        "neighbours): stock 80, xlkv 1"]),
    ("0.26.0", "gpt-oss", ("--prefill-tp", "2", "--decode-tp", "1"), [
        "  prefill (TP 2, 4 KV heads per rank): stock",
        "  each decode rank reads 2 prefill rank(s); NIXL descriptors per block per remote rank (before NIXL merges "
        "neighbours): stock 18, xlkv 18"]),
    # MLA: what vLLM registers is one latent KV cache, the same on every rank, not a share of KV heads
    ("0.33.0", "deepseek-v3", ("--prefill-tp", "1", "--decode-tp", "2"), [
        "pair: prefill TP 1 -> decode TP 2: served -- the KV cache is replicated on every tensor-parallel rank (MLA)",
        "  prefill (TP 1, the latent KV cache replicated on every rank): BLNHC",
        "  decode (TP 2, the latent KV cache replicated on every rank): BLNHC",
        "  each decode rank reads 1 prefill rank(s); NIXL descriptors per block per remote rank (before NIXL merges "
        "neighbours): stock 61, xlkv 1"]),
])
def test_the_text_of_every_status_mode(text_status, tmp_path, vllm, name, args, lines):
    """The text an operator reads (the pair tests above read --json only): a verdict first and once, then the
    model's lines, each count in its place (a text that swapped stock and xlkv would pass every --json test)."""
    rc, text = text_status(vllm, name, *args)
    got = text.splitlines()
    assert got[0] == "status: OK" and text.count("status: ") == 1 and rc == 0, text
    at = 0
    for want in lines:  # in this order
        want = want.format(dir=tmp_path / name)
        hits = [i for i, line in enumerate(got) if i >= at and line.startswith(want)]
        assert hits, (want, got[at:])
        at = hits[0] + 1
    assert "KV heads per rank" not in text or name != "deepseek-v3", text


@pytest.mark.parametrize("value", ["bhlnc", "HND ", "LBHNC "])
def test_a_layout_value_vllm_refuses_serves_no_pair(text_status, value):
    """VLLM_KV_CACHE_LAYOUT=bhlnc: status said "served, 1 descriptor per block" and OK while vLLM 0.33.0 stops
    at start-up with "Invalid value 'bhlnc'"."""
    rc, text = text_status("0.33.0", "llama-70b", "--prefill-tp", "1", "--decode-tp", "2", ENABLE_XLKV="true",
                           VLLM_KV_CACHE_LAYOUT=value)
    (problem,) = _problems(text)
    assert rc == 1 and "Invalid value %r for VLLM_KV_CACHE_LAYOUT" % value in problem, text
    assert "  with ENABLE_XLKV=true: nothing runs: vLLM 0.33 stops at start-up: VLLM_KV_CACHE_LAYOUT=%r is not a " \
           "value it accepts" % value in text, text
    assert "pair: prefill TP 1 -> decode TP 2: REFUSED -- not served: prefill and decode do not start (the " \
           "PROBLEM line says why)" in text, text
    assert "served --" not in text and "xlkv 1" not in text, text


def test_strict_with_an_explicit_stock_layout_is_one_problem_and_no_pair(text_status):
    """XLKV_STRICT=1 and VLLM_KV_CACHE_LAYOUT=HND: status listed the cause twice with two fixes and said the pair
    was served, while each engine stops at start-up."""
    rc, text = text_status("0.33.0", "llama-70b", "--prefill-tp", "1", "--decode-tp", "2", ENABLE_XLKV="true",
                           XLKV_STRICT="1", VLLM_KV_CACHE_LAYOUT="HND")
    (problem,) = _problems(text)
    assert rc == 1 and problem.startswith("PROBLEM: XLKV_STRICT=1 and ENABLE_XLKV is set, but the stock per-layer "
                                          "KV layout would run: VLLM_KV_CACHE_LAYOUT=HND is set explicitly"), text
    # one fix (a NOTE about this test environment's own install may carry another)
    assert sum(line.count("Fix: ") for line in text.splitlines() if not line.startswith("NOTE: ")) == 1, text
    assert "pair: prefill TP 1 -> decode TP 2: REFUSED -- not served: prefill and decode do not start (the " \
           "PROBLEM line says why)" in text, text
    # without XLKV_STRICT both sides run the stock layout and stock serves the pair: a NOTE, no PROBLEM
    rc, text = text_status("0.33.0", "llama-70b", "--prefill-tp", "1", "--decode-tp", "2", ENABLE_XLKV="true",
                           VLLM_KV_CACHE_LAYOUT="HND")
    assert rc == 0 and _problems(text) == [] and "pair: prefill TP 1 -> decode TP 2: served" in text, text


@pytest.mark.parametrize("vllm, args, layout, counts, words", [
    # 0.29+: the layout patch keeps the stock layout for a smaller kernel block (a WARNING at start-up)
    ("0.33.0", ("--kernel-block-size", "8"), "stock", {"stock": 80, "xlkv": 80},
     "the attention kernel block (8 tokens) is smaller than the KV block (16 tokens)"),
    ("0.33.0", ("--block-size", "32", "--kernel-block-size", "16"), "stock", {"stock": 80, "xlkv": 80},
     "the attention kernel block (16 tokens) is smaller than the KV block (32 tokens)"),
    ("0.33.0", ("--kernel-block-size", "16"), "BHLNC", {"stock": 80, "xlkv": 1}, "one whole-row region"),
    # 0.12-0.28: the cross-layer tensor is registered per kernel block
    ("0.26.0", ("--kernel-block-size", "8"), "one cross-layer KV tensor", {"stock": 80, "xlkv": 2}, ""),
])
def test_status_model_takes_the_attention_kernel_block_into_account(status, vllm, args, layout, counts, words):
    """A kernel block of 8 under a 16-token KV block: status predicted BHLNC at 1 descriptor per block while the
    engine kept the stock layout (the harness: 4 per block, a WARNING)."""
    rc, info = status(vllm, "llama-70b", "--tp", "4", *args, ENABLE_XLKV="true")
    m = info["model"]
    assert (m["layout"], m["descriptors_per_block"]) == (layout, counts), m
    assert words in m["reason"], m["reason"]


def test_status_model_says_it_cannot_know_the_kernel_block(status):
    rc, info = status("0.33.0", "llama-70b", ENABLE_XLKV="true")
    assert any(n.startswith("assumes the attention kernel block is the KV block (16 tokens)") and
               "--kernel-block-size N says what then runs" in n for n in info["model"]["notes"]), info["model"]


@pytest.mark.parametrize("vllm, name, args, served, per_rank, words", [
    # decode blocks a multiple of prefill blocks: R descriptors per decode block per remote rank (stock: R per layer)
    ("0.33.0", "llama-70b", ("--tp", "4", "--block-size", "32", "--prefill-block-size", "16"), True,
     {"stock": 160, "xlkv": 2}, "read whole into one of 2 parts"),
    ("0.29.0", "llama-70b", ("--prefill-tp", "1", "--decode-tp", "2", "--block-size", "64", "--prefill-block-size",
                             "16"), True, {"stock": 320, "xlkv": 4}, "4 descriptors per block per remote rank"),
    ("0.33.0", "llama-70b", ("--tp", "4", "--block-size", "16", "--prefill-block-size", "32"), False,
     {"stock": None, "xlkv": None}, "refuses 16-token blocks here facing 32-token blocks there"),
    ("0.33.0", "llama-70b", ("--prefill-tp", "2", "--decode-tp", "1", "--block-size", "32", "--prefill-block-size",
                             "16"), False, {"stock": None, "xlkv": None}, "prefill TP 2 > decode TP 1"),
    ("0.33.0", "gpt-oss", ("--block-size", "32", "--prefill-block-size", "16"), False,
     {"stock": None, "xlkv": None}, "a sliding-window KV cache group"),
    ("0.33.0", "deepseek-v3", ("--block-size", "32", "--prefill-block-size", "16"), False,
     {"stock": None, "xlkv": None}, "MLA's BLNHC rows"),
    ("0.26.0", "llama-70b", ("--tp", "4", "--block-size", "32", "--prefill-block-size", "16"), False,
     {"stock": None, "xlkv": None}, "cannot be re-split"),
])
def test_status_for_different_block_sizes(status, vllm, name, args, served, per_rank, words):
    rc, info = status(vllm, name, *args)
    pair = info["pair"]
    assert pair["served"] is served and words in pair["reason"], pair["reason"]
    assert pair["descriptors_per_block_per_remote_rank"] == per_rank, pair
    assert rc == (0 if served else 1)
    assert served or any("-token -> decode" in p and words in p for p in info["problems"]), info["problems"]


def test_status_and_the_handshake_give_one_block_size_answer(status, monkeypatch):
    """The handshake's refusal names the reason status gives for the same pairing (one decision)."""
    import types

    from xlkv_autopatch.errors import XlkvMismatchError
    from xlkv_autopatch.patches import _state, handshake

    for d_bs, p_bs in ((16, 32), (48, 32)):
        _rc, info = status("0.33.0", "llama-70b", "--tp", "4", "--block-size", str(d_bs), "--prefill-block-size",
                           str(p_bs))
        monkeypatch.setenv("XLKV_VLLM_VERSION", "0.33.0")
        facts.reset()
        w = types.SimpleNamespace(block_size=d_bs, world_size=4, kv_cache_layout="BHLNC", block_len_per_layer=[1])
        _state.mark_heads_outermost(w)
        _state.mark_restages(w)
        meta = types.SimpleNamespace(block_size=p_bs, engine_id="p", kv_caches_base_addr=[1], kv_cache_layout="BHLNC")
        with pytest.raises(XlkvMismatchError) as e:
            handshake.validate_wrapper(lambda *a, **k: None, w, (meta, 0, 4), {})
        assert info["pair"]["reason"].split("refused: ", 1)[1] in str(e.value)
        facts.reset()
