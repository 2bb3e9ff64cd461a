"""Issue 11, against real vLLM: with ENABLE_XLKV on, vLLM is patched or stops with a message that
names the real cause; never a silent stock run.  Each test drives the P/D harness (real
NixlConnector, real NIXL on CPU) into one misconfiguration an operator can make."""

import textwrap

import pytest

from conftest import harness, once_per_session, release_of



def test_version_override_pointing_at_other_code_stops_vllm(vllm_env, tmp_path):
    """Item 1: XLKV_VLLM_VERSION names a release whose patch set waits for a module this vLLM
    does not have: before, a silent stock run; now vLLM stops at NIXL connector creation."""
    other = "0.16.0" if release_of(vllm_env) >= (0, 20) else "0.21.0"
    r = harness(vllm_env[1], tmp_path, "override", "--case", "noncontig", env={"ENABLE_XLKV": "true", "XLKV_VLLM_VERSION": other})
    assert r["transfer_verified"] is False
    text = r["_text"]
    assert "XlkvNotAttachedError" in text or "xlkv's patches are not in place" in text, text[-4000:]
    assert "did not attach: its trigger module" in text and "never imported" in text, text[-4000:]
    assert "Fix: unset XLKV_VLLM_VERSION (the installed package says vLLM %s)" % vllm_env[0] in text


def test_refusal_is_repeated_after_a_second_import(vllm_env, tmp_path):
    """Item 9: an unsupported release is refused at ``import vllm``; a caller that catches that and
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
    """Item 2: the shim installed with --no-deps into an environment without wrapt."""
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
    """Item 8: ENABLE_XLKV=enabled was silently off."""
    once_per_session(vllm_env, "activation, before any vLLM module is patched")
    r = harness(vllm_env[1], tmp_path, "enabled", "--case", "noncontig", env={"ENABLE_XLKV": "enabled"})
    assert r["transfer_verified"] is False
    assert "ENABLE_XLKV='enabled' is not a value xlkv understands" in r["_text"], r["_text"][-4000:]


def test_prefill_only_flag_is_named_by_the_stock_decode_side(vllm_env, tmp_path):
    """Item 4: only prefill has ENABLE_XLKV; decode runs stock vLLM, whose own hash-mismatch error
    prints the remote hash, which now says what the remote engine runs."""
    r = harness(vllm_env[1], tmp_path, "p_only", "--case", "noncontig", "--p-env", "ENABLE_XLKV=1")
    assert r["transfer_verified"] is False
    text = r["_text"]
    assert "Remote: xlkv-cross-layer-KV-layout.sent-by-an-engine-with-ENABLE_XLKV=true." in text, text[-4000:]


def test_explicit_layout_on_one_side_is_named(vllm_env, tmp_path):
    """Item 5 (0.29+): both sides flagged, VLLM_KV_CACHE_LAYOUT=LBHNC on decode only."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("KV cache layouts exist from vLLM 0.29")
    r = harness(vllm_env[1], tmp_path, "d_layout", "--case", "noncontig", "--d-env", "VLLM_KV_CACHE_LAYOUT=LBHNC",
                env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    text = r["_text"]
    assert "here: VLLM_KV_CACHE_LAYOUT=LBHNC is set explicitly and wins" in text, text[-4000:]
    assert "set ENABLE_XLKV=true on BOTH" not in text
    # on prefill instead: decode (xlkv's layout) names an explicit layout among the remote's causes
    r = harness(vllm_env[1], tmp_path, "p_layout", "--case", "noncontig", "--p-env", "VLLM_KV_CACHE_LAYOUT=LBHNC",
                env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    assert "an explicit VLLM_KV_CACHE_LAYOUT, which wins over xlkv" in r["_text"], r["_text"][-4000:]


def test_smaller_kernel_block_on_one_side_is_named_as_such(vllm_env, tmp_path):
    """Item 6: the same --block-size (32) on both sides, a 16-token attention kernel block on
    decode only.  The refusal must not say "use the same --block-size"."""
    r = harness(vllm_env[1], tmp_path, "d_kernel", "--case", "noncontig", "--p-block-size", "32", "--d-block-size", "32",
                "--d-kernel-block-size", "16", env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    text = r["_text"]
    if release_of(vllm_env) >= (0, 29):
        # decode keeps the stock layout for that kernel block (WARNING) and says so at handshake
        assert "here: the attention kernel block (16 tokens) is smaller than the KV block (32 tokens)" in text, \
            text[-4000:]
    else:
        assert "split by the attention kernel into 16-token blocks" in text, text[-4000:]
        assert "the attention kernel block differs" in text
