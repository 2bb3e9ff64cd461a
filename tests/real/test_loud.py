"""Against real vLLM: with ENABLE_XLKV on, vLLM is patched or stops with a message that
names the real cause; never a silent stock run.  Each test drives the P/D harness (real
NixlConnector, real NIXL on CPU) into one misconfiguration an operator can make."""

import json
import textwrap

import pytest

from conftest import harness, once_per_session, release_of, run_in



def test_version_override_pointing_at_other_code_stops_vllm(vllm_env, tmp_path):
    """XLKV_VLLM_VERSION names a release whose patch set waits for a module this vLLM
    does not have: before, a silent stock run; now vLLM stops at NIXL connector creation."""
    once_per_session(vllm_env, "activation: the patch sets' trigger modules are checked by the same code on every release")
    other = "0.16.0" if release_of(vllm_env) >= (0, 20) else "0.21.0"
    r = harness(vllm_env[1], tmp_path, "override", "--case", "noncontig", env={"ENABLE_XLKV": "true", "XLKV_VLLM_VERSION": other})
    assert r["transfer_verified"] is False
    text = r["_text"]
    assert "XlkvNotAttachedError" in text or "xlkv's patches are not in place" in text, text[-4000:]
    assert "did not attach: its trigger module" in text and "never imported" in text, text[-4000:]
    assert "Fix: unset XLKV_VLLM_VERSION (the installed package says vLLM %s)" % vllm_env[0] in text


def test_refusal_is_repeated_after_a_second_import(vllm_env, tmp_path):
    """An unsupported release is refused at ``import vllm``; a caller that catches that and
    imports again still cannot create a NIXL connector."""
    once_per_session(vllm_env, "the refusal hook and the factory guard are the same code on every release")
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        try:
            import vllm  # refused by xlkv's hook
        except Exception as e:
            sys.stderr.write("first import refused: %s\\n" % type(e).__name__)
    """))
    r = harness(vllm_env[1], tmp_path, "again", "--case", "noncontig", env={"ENABLE_XLKV": "true", "XLKV_VLLM_VERSION": "0.11.2",
                                                      "PYTHONPATH": str(pre)})
    assert r["transfer_verified"] is False
    text = r["_text"]
    assert "first import refused: XlkvUnsupportedVersion" in text, text[-4000:]
    assert "repeated: vLLM went on to create a NIXL connector" in text, text[-4000:]


def test_missing_wrapt_stops_vllm_with_the_fix(vllm_env, tmp_path):
    """The shim installed with --no-deps into an environment without wrapt."""
    once_per_session(vllm_env, "activation, before any vLLM module is patched")
    hide = tmp_path / "hide"
    (hide / "wrapt").mkdir(parents=True)
    (hide / "wrapt" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'wrapt'\")\n")
    r = harness(vllm_env[1], tmp_path, "nowrapt", "--case", "noncontig", env={"ENABLE_XLKV": "true", "PYTHONPATH": str(hide)})
    assert r["transfer_verified"] is False
    text = r["_text"]
    assert "XlkvDependencyError" in text and "pip install 'wrapt>=1.14'" in text, text[-4000:]
    assert r.get("cross_layer") is not True


def test_unrecognised_flag_value_stops_vllm(vllm_env, tmp_path):
    """ENABLE_XLKV=enabled was silently off."""
    once_per_session(vllm_env, "activation, before any vLLM module is patched")
    r = harness(vllm_env[1], tmp_path, "enabled", "--case", "noncontig", env={"ENABLE_XLKV": "enabled"})
    assert r["transfer_verified"] is False
    assert "ENABLE_XLKV='enabled' is not a value xlkv understands" in r["_text"], r["_text"][-4000:]


def test_a_removed_lever_is_a_warning_and_the_transfer_is_the_shims(vllm_env, tmp_path):
    """XLKV_EARLY_LOAD / XLKV_NOTICE_WAIT were removed in 0.4.0.  A deployment that still sets
    them gets one WARNING per process naming the removal, not a refusal: the shim runs as without them."""
    once_per_session(vllm_env, "activation, before any vLLM module is patched")
    r = harness(vllm_env[1], tmp_path, "removed", "--case", "noncontig",
                env={"ENABLE_XLKV": "true", "XLKV_EARLY_LOAD": "1", "XLKV_NOTICE_WAIT": "2"})
    assert r["errors"] == [] and r["transfer_verified"] is True and r["cross_layer"] is True, r["errors"]
    for name in ("XLKV_EARLY_LOAD", "XLKV_NOTICE_WAIT"):
        assert "%s was removed in xlkv_autopatch 0.4.0" % name in r["_text"], r["_text"][-4000:]
    assert "XLKV_NOTICE_WAIT='2' is not a value" not in r["_text"]


# Only prefill has ENABLE_XLKV (stock decode's own hash-mismatch error prints the remote
# hash, which says what the remote engine runs): test_pd_transfer.py's
# test_flag_on_prefill_only_never_transfers checks it on the same run.


def test_explicit_layout_on_one_side_is_named(vllm_env, tmp_path):
    """0.29+: both sides flagged, VLLM_KV_CACHE_LAYOUT=LBHNC on decode only."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("KV cache layouts exist from vLLM 0.29")
    r = harness(vllm_env[1], tmp_path, "d_layout", "--case", "noncontig", "--d-env", "VLLM_KV_CACHE_LAYOUT=LBHNC",
                env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    text = r["_text"]
    assert "here: VLLM_KV_CACHE_LAYOUT=LBHNC is set explicitly and wins" in text, text[-4000:]
    assert "set ENABLE_XLKV=true on BOTH" not in text
    # decode says at start-up that the stock layout runs, and why (vLLM never asked the connector)
    said = json.dumps(r["d"]["xlkv_log"])
    assert "WARNING xlkv_autopatch: ENABLE_XLKV is set but the stock per-layer KV layout is kept: " \
           "VLLM_KV_CACHE_LAYOUT=LBHNC is set explicitly and wins: this engine runs LBHNC" in said, said[-3000:]
    assert r["d"]["worker"].get("kv_cache_layout") == "LBHNC" and r["d"]["cross_layer"] is False
    # on prefill instead: decode (xlkv's layout) names an explicit layout among the remote's causes
    r = harness(vllm_env[1], tmp_path, "p_layout", "--case", "noncontig", "--p-env", "VLLM_KV_CACHE_LAYOUT=LBHNC",
                env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    assert "an explicit VLLM_KV_CACHE_LAYOUT, which wins over xlkv" in r["_text"], r["_text"][-4000:]


def test_explicit_stock_layout_with_strict_stops_the_engine(vllm_env, tmp_path):
    """0.29+: ENABLE_XLKV=true XLKV_STRICT=1 VLLM_KV_CACHE_LAYOUT=LBHNC ran the stock layout
    silently (vLLM reads the variable before asking the connector); strict must stop the engine with the
    cause."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("KV cache layouts exist from vLLM 0.29")
    r = harness(vllm_env[1], tmp_path, "strict_layout", "--case", "noncontig", "--d-env", "XLKV_STRICT=1",
                "--d-env", "VLLM_KV_CACHE_LAYOUT=LBHNC", env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    text = json.dumps(r.get("errors")) + r["_log"]
    assert "xlkv_autopatch: ENABLE_XLKV is set but the stock per-layer KV layout is kept: VLLM_KV_CACHE_LAYOUT=LBHNC " \
           "is set explicitly and wins" in text, text[-4000:]
    assert "XLKV_STRICT=1 makes this an error" in text, text[-4000:]


def test_smaller_kernel_block_on_one_side_is_named_as_such(vllm_env, tmp_path):
    """The same --block-size (32) on both sides, a 16-token attention kernel block on
    decode only.  The refusal must not say "use the same --block-size"."""
    r = harness(vllm_env[1], tmp_path, "d_kernel", "--case", "noncontig", "--p-block-size", "32", "--d-block-size", "32",
                "--d-kernel-block-size", "16", env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    text = r["_text"]
    if release_of(vllm_env) >= (0, 29):
        # decode keeps the stock layout for that kernel block (WARNING) and says so at handshake
        assert "here: the attention kernel block (16 tokens) is smaller than the KV block (32 tokens)" in text, \
            text[-4000:]
        # and its start-up WARNING (the decode rank's shim lines) names the setting that keeps xlkv's layout
        fix = "To run xlkv's layout: set --block-size 16 (the attention kernel block) on prefill and decode"
        assert fix in json.dumps(r), json.dumps(r)[-4000:]


def _refusal(r):
    return json.dumps(r["errors"]) + json.dumps([c.get("failure_reason") for c in r["cases"].values()])


def test_vllms_own_block_outermost_layout_is_not_called_stock(vllm_env, tmp_path):
    """0.29+: a prefill with vLLM's own VLLM_KV_CACHE_LAYOUT=BLNHC (no shim) facing a flagged decode.
    vLLM hashes no layout there, so the refusal cannot tell it from the stock layout, and must say so
    (it said "the stock per-layer KV layout (ENABLE_XLKV unset there...)"; both sides were
    block-outermost)."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("KV cache layouts exist from vLLM 0.29 (0.16-0.28 hash vLLM's own opt-in separately)")
    r = harness(vllm_env[1], tmp_path, "native_p", "--case", "noncontig", "--p-env", "VLLM_KV_CACHE_LAYOUT=BLNHC",
                "--d-env", "ENABLE_XLKV=true")
    assert r["transfer_verified"] is False
    text = _refusal(r)
    assert "NIXL handshake refused" in text, text[-3000:]
    assert "or vLLM's own block-outermost layout (VLLM_KV_CACHE_LAYOUT=BLNHC or BHLNC) without ENABLE_XLKV" in text
    assert "Fix: set ENABLE_XLKV=true on the remote engine as well" in text, text[-3000:]


def test_flag_on_one_side_is_named_with_vllms_hash_check_off(vllm_env, tmp_path):
    """enforce_handshake_compat: false (what vLLM's own mismatch error suggests), ENABLE_XLKV on decode
    only: 0.21 went on to a bare "Remote P worker KV layer cache must be of shape [2, N, ...]"."""
    rel = release_of(vllm_env)
    if not ((0, 16) <= rel < (0, 22) or rel >= (0, 29)):
        pytest.skip("xlkv compares region counts with the same code up to 0.28 (run on 0.16-0.21) and layout names "
                    "from 0.29; XLKV_TEST_EVERYWHERE does not change this")
    r = harness(vllm_env[1], tmp_path, "no_hash", "--case", "noncontig", "--d-env", "ENABLE_XLKV=true",
                "--kv-extra", "enforce_handshake_compat=false")
    assert r["transfer_verified"] is False
    case = r["cases"]["noncontig"]
    assert not case.get("xfer_descs"), case  # refused before any descriptor reached NIXL
    text = _refusal(r)
    assert "NIXL handshake refused: this engine runs xlkv's cross-layer KV layout" in text, text[-3000:]
    assert "the remote engine runs the stock per-layer KV layout (ENABLE_XLKV unset there" in text, text[-3000:]
    assert "enforce_handshake_compat: false" in text and "must be of shape" not in text, text[-3000:]


def test_same_layout_name_registered_per_layer_is_named_with_the_hash_check_off(vllm_env, tmp_path):
    """0.29+: with vLLM's hash check off, a flagged decode facing a prefill on vLLM's own
    BHLNC without the flag at one KV head per rank (both publish BHLNC; the prefill registers one region per
    layer, the decode one per row) was refused by vLLM's generic "Number of KV layers must match"; xlkv
    compares what was registered and names it."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("KV cache layouts exist from vLLM 0.29")
    r = harness(vllm_env[1], tmp_path, "rows_vs_layers", "--case", "noncontig", "--p-tp", "2", "--d-tp", "2",
                "--d-env", "ENABLE_XLKV=true", "--p-env", "VLLM_KV_CACHE_LAYOUT=BHLNC",
                "--kv-extra", "enforce_handshake_compat=false", step_timeout=60)
    assert r["transfer_verified"] is False
    text = _refusal(r)
    assert "NIXL handshake refused: this engine runs xlkv's cross-layer KV layout" in text, text[-3000:]
    assert "this engine registered 1 region(s) (KV layout BHLNC), the remote engine 4 (KV layout BHLNC)" in text, \
        text[-3000:]
    assert "enforce_handshake_compat: false" in text and "Number of KV layers must match" not in text, text[-3000:]


def test_explicit_kv_layout_variable_is_named_before_0_29(vllm_env, tmp_path):
    """0.12-0.28: VLLM_KV_CACHE_LAYOUT=NHD on decode (both flagged) was reported as "vLLM's cross-layer
    guards refused (backend..., KV layout not HND, or Mamba)", and the refusal told this flagged engine
    to "set ENABLE_XLKV=true on it"."""
    if release_of(vllm_env) >= (0, 29):
        pytest.skip("0.29+ name an explicit VLLM_KV_CACHE_LAYOUT already (test_explicit_layout_on_one_side_is_named)")
    if (0, 22) <= release_of(vllm_env) < (0, 29):
        pytest.skip("the same prefer_cross_layer_blocks wrapper as 0.16-0.21, where this runs")
    r = harness(vllm_env[1], tmp_path, "nhd", "--case", "noncontig", "--d-env", "VLLM_KV_CACHE_LAYOUT=NHD",
                env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False and r["d"]["cross_layer"] is False
    said = json.dumps(r["d"]["xlkv_log"]) + r["_log"]
    assert "stock per-layer KV layout is kept: VLLM_KV_CACHE_LAYOUT=NHD is set explicitly" in said, said[-3000:]
    text = _refusal(r)
    assert "here: VLLM_KV_CACHE_LAYOUT=NHD is set explicitly" in text, text[-3000:]
    assert "set ENABLE_XLKV=true on it" not in text and "ENABLE_XLKV unset here" not in text, text[-3000:]


MLA_LAYOUT = textwrap.dedent("""
    import json, logging, os, sys, tempfile, types
    d = tempfile.mkdtemp()
    json.dump({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 256,
               "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 64, "q_lora_rank": None,
               "qk_rope_head_dim": 32, "qk_nope_head_dim": 32, "v_head_dim": 32, "vocab_size": 512,
               "max_position_embeddings": 1024, "n_routed_experts": 4, "n_shared_experts": 1,
               "num_experts_per_tok": 2, "first_k_dense_replace": 1, "torch_dtype": "bfloat16"},
              open(os.path.join(d, "config.json"), "w"))
    lines = []
    class H(logging.Handler):
        def emit(self, r):
            lines.append("%s %s" % (r.levelname, r.getMessage()))
    import vllm.logger  # noqa: F401
    logging.getLogger("vllm").addHandler(H())
    logging.getLogger("vllm").setLevel(logging.INFO)
    from vllm.config import ModelConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector
    mc = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=512)
    pp = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    cfg = types.SimpleNamespace(model_config=mc, parallel_config=types.SimpleNamespace(pipeline_parallel_size=pp,
                                                                                       tensor_parallel_size=1))
    # the engine core's call, with a real MLA ModelConfig
    try:
        out = repr(NixlConnector.get_required_kvcache_layout(cfg))
    except Exception as e:
        out = "raised %s: %s" % (type(e).__name__, e)
    print(json.dumps({"use_mla": mc.use_mla, "layout": out, "log": [x for x in lines if "xlkv" in x]}))
""")


def test_mla_is_packed_and_pipeline_parallel_mla_keeps_the_stock_layout_loudly(vllm_env, tmp_path):
    """0.29+: an MLA model requests BLNHC (vLLM registers one packed latent row per
    block), with an INFO line that names MLA; with pipeline parallel size 2 the shim keeps the stock
    layout with a WARNING naming the cause, and XLKV_STRICT=1 makes that an error."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("0.12-0.28 decide in prefer_cross_layer_blocks (MLA WARNING there since the first session)")
    script = tmp_path / "mla.py"
    script.write_text(MLA_LAYOUT)
    out = {}
    for name, pp, extra in (("packed", "1", {}), ("warn", "2", {}), ("strict", "2", {"XLKV_STRICT": "1"})):
        p = run_in(vllm_env[1], [str(script), pp], env=dict({"ENABLE_XLKV": "true"}, **extra))
        assert p.returncode == 0, p.stderr[-3000:]
        out[name] = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["packed"]["use_mla"] is True and out["packed"]["layout"] == "'BLNHC'", out
    assert any(x.startswith("INFO") and "requests KV cache layout BLNHC" in x and "MLA" in x
               for x in out["packed"]["log"]), out["packed"]["log"]
    assert out["warn"]["layout"] == "None", out
    assert any(x.startswith("WARNING") and "pipeline parallel size 2" in x and "MLA" in x
               for x in out["warn"]["log"]), out["warn"]["log"]
    assert out["strict"]["layout"].startswith("raised XlkvError") and "XLKV_STRICT=1" in out["strict"]["layout"], out