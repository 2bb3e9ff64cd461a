"""P and D as two hosts on one machine: the harness's ``--netns`` runs P's rank workers in one
network namespace and D's in another, joined by a veth pair (P 10.231.0.1, D 10.231.0.2).  vLLM's
NIXL side channel binds each side's own address and NIXL moves the blocks with UCX's TCP
transport over the veth (UCX_TLS=tcp, UCX_NET_DEVICES=the veth end): nothing of P is reachable
from D's namespace but across the pair.  Checked there as on one host: bytes exact, descriptors
as the compatibility matrix counted them on one host, a one-sided flag refused with its cause and
D serving on, and the link taken down in the middle of a read and brought back (stock and
flagged must come out the same).  Two harness runs (stock, flag on) on the oldest and the newest
selected release (CI: 0.14.1 and 0.33.0, 76 and 99 s on 2026-11-27; XLKV_TEST_EVERYWHERE=1: every
release): the one release-dependent branch here (whether a stock decode survives a flagged peer)
splits at 0.22, and the per-release connector and handshake are tests/real/test_pd_transfer.py's.

Needs root (``ip netns add``); elsewhere every test here is skipped with the reason."""

import json
import os
import sys

import pytest

from conftest import ROOT, at_the_ends, harness, release_of

sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
from pdharness import netns  # noqa: E402  (standard library only)

CASES = ("noncontig", "reversed")
FLAP_S = "3"


@pytest.fixture(scope="module")
def two_hosts(vllm_env):
    at_the_ends(vllm_env, "the veth around the connector; its per-release branch splits at 0.22")
    why = netns.unavailable()
    if why:
        pytest.skip("network namespaces cannot be made here: " + why)
    return vllm_env


def _run(vllm_env, tmp_path_factory, name, flagged):
    # three engines start side by side (a loaded 2-core machine took 200 s): a roomier set-up limit
    args = ["--netns", "--link-flap", FLAP_S, "--setup-timeout", "480"]
    for c in CASES:
        args += ["--case", c]
    env = {"ENABLE_XLKV": "true"} if flagged else {}
    # a second prefill whose flag differs from D's, asked first: D must refuse it and serve on
    # (a stock decode facing a flagged prefill dies there on 0.12-0.21: vLLM's own KeyError)
    if flagged or release_of(vllm_env) >= (0, 22):
        args += ["--refused-peer-env", "ENABLE_XLKV=" + ("false" if flagged else "true")]
    return harness(vllm_env[1], tmp_path_factory.mktemp(name), name, *args, env=env)


@pytest.fixture(scope="module")
def stock(two_hosts, tmp_path_factory):
    return _run(two_hosts, tmp_path_factory, "stock", flagged=False)


@pytest.fixture(scope="module")
def xlkv(two_hosts, tmp_path_factory):
    return _run(two_hosts, tmp_path_factory, "xlkv", flagged=True)


def _matrix_row(version):
    rows = json.load(open(os.path.join(ROOT, "experiments", "results", "compat-matrix.json")))["rows"]
    return next((r for r in rows if r["vllm"] == version), None)


def test_each_side_has_its_own_host_and_nothing_is_left_behind(stock, xlkv):
    for r in (stock, xlkv):
        n = r["netns"]
        assert n["addresses"] == {"p": "10.231.0.1", "d": "10.231.0.2"}, n
        assert r["env_p"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.231.0.1"
        assert r["env_d"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.231.0.2"
        assert r["env_p"]["UCX_TLS"] == r["env_d"]["UCX_TLS"] == "tcp"
        assert r["env_p"]["UCX_NET_DEVICES"] == n["veth"]["p"] and r["env_d"]["UCX_NET_DEVICES"] == n["veth"]["d"]
        assert n["left_behind"] == [], n  # both namespaces (and the veth with them) removed
        assert not any(ns in netns._ip("netns", "list", check=False).stdout for ns in n["namespaces"].values())


@pytest.mark.parametrize("mode", ["stock", "xlkv"])
def test_bytes_exact_across_the_veth_with_the_one_host_descriptor_counts(vllm_env, stock, xlkv, mode):
    r = {"stock": stock, "xlkv": xlkv}[mode]
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    assert r["cross_layer"] is (mode == "xlkv")
    row = _matrix_row(vllm_env[0])
    for name in CASES:
        case = r["cases"][name]
        assert case["ok"] and case["bytes_ok"], (name, case)
        # the blocks came over the pair: D's veth end received at least the bytes moved
        moved = len(case["local_block_ids"]) * r["block_len"] * r["num_regions"]
        assert case["veth"]["d"]["rx_bytes"] >= moved, (name, case["veth"], moved)
        # and nothing else carried them: P's end sent what D's end received.  The two ends' counters
        # are read one after the other, so a control packet (a 66-byte TCP ACK was seen in CI) can
        # land between the reads: a few packets' slack, and always less than one descriptor's bytes
        # (4096 where vLLM 0.12-0.25 split K and V: a missing descriptor could not hide in it)
        gap = abs(case["veth"]["p"]["tx_bytes"] - case["veth"]["d"]["rx_bytes"])
        assert gap <= min(4 * 1514, r["block_len"] - 1), (case["veth"], r["block_len"])
    if row is not None:  # the same counts as the compatibility matrix took with P and D on one host
        assert r["descs_per_block"] == row["descriptors_per_block_" + mode], (r["descs_per_block"], row)
        merged = (row.get("merged_descriptors") or {}).get("reversed")
        if merged:
            assert r["cases"]["reversed"]["nixl_descs"] == merged[mode], (r["cases"]["reversed"], merged)


def test_one_sided_flag_is_refused_with_the_cause_and_decode_serves_on(vllm_env, stock, xlkv):
    # flagged decode, stock prefill: the shim on D refuses and names the flag
    refused = xlkv["refused_peer"]
    assert "d_died" not in refused, refused
    text = json.dumps(refused["errors"])
    assert "NIXL handshake refused" in text and "ENABLE_XLKV unset there" in text, text[-3000:]
    assert refused["recv_done"] is True and refused["invalid_block_ids"] == [23, 24, 25], refused
    assert not refused["xfer_calls"], refused
    # stock decode, flagged prefill: vLLM's own check refuses it (0.22+: D serves on)
    if release_of(vllm_env) >= (0, 22):
        refused = stock["refused_peer"]
        assert "d_died" not in refused, refused
        assert refused["recv_done"] is True and refused["invalid_block_ids"] == [23, 24, 25], refused
        assert not refused["xfer_calls"], refused
        assert "compatibility hash mismatch" in (refused.get("failure_reason") or ""), refused
    # ... and both decodes then served the compatible prefill byte for byte
    for r in (stock, xlkv):
        assert r["transfer_verified"] is True and r["cases"]["noncontig"]["bytes_ok"], r["errors"]


def _outcome(c):
    return {"recv_done": c.get("recv_done"), "blocks_invalid": bool(c.get("invalid_block_ids")),
            "bytes_ok": c.get("bytes_ok"), "error": c.get("error")}


def test_link_down_mid_read_comes_out_as_stock_does(stock, xlkv):
    for r in (stock, xlkv):
        flap = r["link_flap"]
        # the link really went down in the middle of the read: part of it had crossed, not all
        total = len(flap["local_block_ids"]) * r["block_len"] * r["num_regions"]
        assert netns.UNDER_WAY_BYTES <= flap["sent_before_down"] < total, (flap["sent_before_down"], total)
        assert [e for _, e in flap["link_events"]][-2:] == ["down", "up"], flap["link_events"]
        # whatever the read's fate, nothing wrong is ever reported as received
        assert flap["bytes_ok"] or not flap["recv_done"] or flap["invalid_block_ids"], flap
        # and the next request over the restored link arrives byte for byte
        after = r["after_flap"]
        assert after["ok"] and after["bytes_ok"], after
    assert _outcome(xlkv["link_flap"]) == _outcome(stock["link_flap"]), (stock["link_flap"], xlkv["link_flap"])
