"""The P/D handoff levers (XLKV_EARLY_LOAD, XLKV_NOTICE_WAIT) on real vLLM code and real NIXL (UCX
on host memory): the harness drives D's connector the way the release's model runner does (bind,
start_load_kv, get_finished per step), so the wrappers run inside vLLM's own calls.  With both
levers on, every case still moves exactly the bytes P holds with the descriptors the shim alone
uses (a read posted twice would double them; one never posted would time out), and the log says
which lever acted once, on D (the early load only where vLLM posts loads after the forward: 0.29+)."""

import json

import pytest

from conftest import harness, release_of

LEVERS = {"ENABLE_XLKV": "true", "XLKV_EARLY_LOAD": "1", "XLKV_NOTICE_WAIT": "1"}


@pytest.fixture(scope="module")
def shim(vllm_env, tmp_path_factory):
    return harness(vllm_env[1], tmp_path_factory.mktemp("shim"), "shim", "--case", "noncontig",
                   env={"ENABLE_XLKV": "true"})


@pytest.fixture(scope="module")
def levers(vllm_env, tmp_path_factory):
    return harness(vllm_env[1], tmp_path_factory.mktemp("levers"), "levers", "--case", "noncontig", env=LEVERS)


def test_levers_move_the_same_bytes_with_the_same_descriptors(vllm_env, shim, levers):
    assert shim["errors"] == [] and shim["transfer_verified"] is True, shim["errors"]
    assert levers["errors"] == [] and levers["transfer_verified"] is True, levers["errors"]
    case, base = levers["cases"]["noncontig"], shim["cases"]["noncontig"]
    assert case["ok"] and case["bytes_ok"], case
    assert case["xfer_descs"] == base["xfer_descs"] > 0, (case, base)


def test_d_log_names_the_levers_that_acted(vllm_env, shim, levers):
    """D's shim lines during the receive (the harness captures them per receive)."""
    said = " ".join(levers["cases"]["noncontig"]["shim_log"])
    assert "XLKV_NOTICE_WAIT=1: the worker waits up to 5.0 ms per step" in said, said[-3000:]
    early = "XLKV_EARLY_LOAD=1: KV loads are posted when the step's connector metadata is bound" in said
    assert early is (release_of(vllm_env) >= (0, 29)), said[-3000:]
    # the flag alone patches the handoff groups (P's and D's set-up lines) but neither lever acts
    base = " ".join(shim["cases"]["noncontig"]["shim_log"])
    assert "XLKV_NOTICE_WAIT=1" not in base and "XLKV_EARLY_LOAD=1" not in base, base[-2000:]
    assert "patch set handoff-" in json.dumps([shim["p"]["xlkv_log"], shim["d"]["xlkv_log"]])

