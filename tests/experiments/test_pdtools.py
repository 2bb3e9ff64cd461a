"""Unit tests of experiments/pdtools/ (the package): prompts, KV-metrics parsing, descriptor arithmetic,
results cells and merging, equivalence summaries.  No GPU, no vLLM."""

import json
import os
import subprocess
import sys

import pytest

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
from pdtools import equivalence, kvmetrics, prompts, results, vllminfo  # noqa: E402

# The format string of vLLM 0.21.0 / 0.26.0: metrics.py logs "KV Transfer metrics: %s" with
# ", ".join(f"{k}={v}" for k, v in NixlKVConnectorStats.reduce().items()).  The prefix is
# vLLM's logger format.  Numbers: 0.21.0 stock, 2xH200, 64 requests of 10240 tokens
# (640 blocks of 1.75 MiB, 56 descriptors per block).
STOCK_LINE = ("(APIServer pid=48211) INFO 11-22 14:03:17 [metrics.py:103] KV Transfer metrics: "
              "Num successful transfers=12, Avg xfer time (ms)=41.532, P90 xfer time (ms)=77.018, "
              "Avg post time (ms)=1.204, P90 post time (ms)=2.113, Avg MB per transfer=1120.0, "
              "Throughput (MB/s)=26967.158, Avg number of descriptors=35840.0")
SHIM_LINE = ("(APIServer pid=48377) INFO 11-22 14:09:02 [metrics.py:103] KV Transfer metrics: "
             "Num successful transfers=4, Avg xfer time (ms)=9.1, P90 xfer time (ms)=12.5, "
             "Avg post time (ms)=0.2, P90 post time (ms)=0.3, Avg MB per transfer=1120.0, "
             "Throughput (MB/s)=123076.923, Avg number of descriptors=640.0")
ZERO_LINE = ("INFO 11-22 14:09:05 [metrics.py:103] KV Transfer metrics: Num successful transfers=0, "
             "Avg xfer time (ms)=0, P90 xfer time (ms)=0, Avg post time (ms)=0, P90 post time (ms)=0, "
             "Avg MB per transfer=0, Throughput (MB/s)=0, Avg number of descriptors=0")
QWEN3_BLOCK = 16 * 28 * 2 * 8 * 128 * 2  # 1.75 MiB


# ------------------------------------------------------------------ prompts -----------------
def test_prompt_ids_are_pinned():
    # Pinned values: a change here changes every equivalence prompt (old results no longer comparable).
    assert prompts.prompt_ids(5) == [7265, 8976, 24069, 19236, 27722]
    assert prompts.prompt_ids(3, seed=7) == [8444, 14929, 21243]
    assert prompts.prompt_text(3, seed=7) == "w8444 w14929 w21243"


def test_prompt_ids_range_length_and_seed():
    ids = prompts.prompt_ids(4097)
    assert len(ids) == 4097
    assert min(ids) >= 2 and max(ids) <= 31999
    assert len(set(ids)) > 3500  # not degenerate
    assert prompts.prompt_ids(100, seed=1) != prompts.prompt_ids(100, seed=0)
    assert prompts.prompt_ids(100)[:10] != prompts.prompt_ids(101)[:10]  # length is part of the seed
    with pytest.raises(ValueError):
        prompts.prompt_ids(0)


def test_prompt_is_deterministic_in_a_fresh_interpreter():
    code = ("import sys; sys.path.insert(0, %r); from pdtools.prompts import prompt_text; "
            "print(prompt_text(7, seed=3))" % EXP)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == prompts.prompt_text(7, seed=3) == " ".join("w%d" % i for i in prompts.prompt_ids(7, seed=3))


# ------------------------------------------------------------------ KV metrics lines --------
def test_parse_kv_line_realistic():
    rec = kvmetrics.parse_kv_line(STOCK_LINE)
    assert rec[kvmetrics.KEY_N] == 12 and isinstance(rec[kvmetrics.KEY_N], int)
    assert rec[kvmetrics.KEY_DESC] == 35840.0
    assert rec[kvmetrics.KEY_MB] == 1120.0
    assert rec[kvmetrics.KEY_XFER] == 41.532
    assert rec[kvmetrics.KEY_P90] == 77.018
    assert rec[kvmetrics.KEY_TPUT] == 26967.158
    assert kvmetrics.parse_kv_line("INFO Avg prompt throughput: 10.0 tokens/s") is None


def test_parse_kv_line_roundtrips_vllm_reduce_format():
    """Build the line exactly as vLLM does (numpy values, f-string join) and parse it back."""
    np = pytest.importorskip("numpy")
    descs = np.asarray([56 * 640, 56 * 3], dtype=np.uint32)
    xfer = np.asarray([0.04, 0.001])
    mb = np.asarray([1120.0, 5.25])
    stats = {
        "Num successful transfers": len(descs),
        "Avg xfer time (ms)": round(xfer.mean() * 1e3, 3),
        "P90 xfer time (ms)": round(np.percentile(xfer, 90).item() * 1e3, 3),
        "Avg post time (ms)": round(0.0012 * 1e3, 3),
        "P90 post time (ms)": round(0.002 * 1e3, 3),
        "Avg MB per transfer": round(mb.sum() / 2, 3),
        "Throughput (MB/s)": round(mb.sum() / xfer.sum(), 3),
        "Avg number of descriptors": round(descs.mean(), 1),
    }
    line = "INFO [metrics.py:103] KV Transfer metrics: %s" % ", ".join(f"{k}={v}" for k, v in stats.items())
    rec = kvmetrics.parse_kv_line(line)
    assert set(rec) == set(stats)
    for k, v in stats.items():
        assert rec[k] == pytest.approx(float(v)), k


def test_read_and_aggregate_weighted_by_transfers(tmp_path):
    log = tmp_path / "d.log"
    log.write_text("noise\n" + STOCK_LINE + "\n" + ZERO_LINE + "\n")
    off = log.stat().st_size
    with open(log, "a") as f:
        f.write("INFO KV Transfer metrics: Num successful transfers=2, Avg xfer time (ms)=10.0, "
                "Avg MB per transfer=7.0, Avg number of descriptors=10.0\n")
        f.write("INFO KV Transfer metrics: Num successful transfers=6, Avg xfer time (ms)=2.0, "
                "Avg MB per transfer=3.5, Avg number of descriptors=2.0\n")
    assert len(kvmetrics.read_kv_lines(str(log))) == 4
    agg = kvmetrics.aggregate_kv(kvmetrics.read_kv_lines(str(log), off))
    assert agg["num_transfers"] == 8 and agg["lines"] == 2
    assert agg["avg_descriptors_per_transfer"] == pytest.approx((2 * 10 + 6 * 2) / 8)
    assert agg["avg_mb_per_transfer"] == pytest.approx((2 * 7 + 6 * 3.5) / 8)
    assert agg["avg_xfer_ms"] == pytest.approx((2 * 10 + 6 * 2) / 8)
    assert kvmetrics.aggregate_kv(kvmetrics.read_kv_lines(str(log), log.stat().st_size))["num_transfers"] == 0
    # zero-transfer lines are ignored
    assert kvmetrics.aggregate_kv([kvmetrics.parse_kv_line(ZERO_LINE)])["num_transfers"] == 0


# ------------------------------------------------------------------ descriptors per block ---
def test_block_bytes_qwen3_shape(tmp_path):
    assert kvmetrics.block_bytes(28, 8, 128, 16, 2) == QWEN3_BLOCK == int(1.75 * 2**20)
    assert kvmetrics.block_bytes(28, 8, 128, 16, 2, tp=2) == QWEN3_BLOCK // 2
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_size": 1024, "torch_dtype": "bfloat16"}))
    assert kvmetrics.model_block_bytes(str(tmp_path)) == QWEN3_BLOCK
    assert kvmetrics.model_block_bytes(str(tmp_path), block_size=32) == 2 * QWEN3_BLOCK


def test_descriptors_per_block_from_log_lines():
    stock = kvmetrics.kv_summary(kvmetrics.aggregate_kv([kvmetrics.parse_kv_line(STOCK_LINE)]), QWEN3_BLOCK)
    assert stock["blocks_per_transfer"] == pytest.approx(640)
    assert stock["descriptors_per_block"] == pytest.approx(56)
    shim = kvmetrics.kv_summary(kvmetrics.aggregate_kv([kvmetrics.parse_kv_line(SHIM_LINE)]), QWEN3_BLOCK)
    assert shim["descriptors_per_block"] == pytest.approx(1.0)
    # rounding of "Avg MB per transfer" to 3 places costs little even for one block
    assert kvmetrics.descriptors_per_block(2.0, kvmetrics.blocks_per_transfer(1.75, QWEN3_BLOCK)) == pytest.approx(2.0)
    assert kvmetrics.descriptors_per_block(None, 3) is None
    assert kvmetrics.blocks_per_transfer(0, QWEN3_BLOCK) is None


def test_blocks_for_prompt_and_limits():
    assert kvmetrics.blocks_for_prompt(1600) == 100
    assert kvmetrics.blocks_for_prompt(1601) == 101
    assert kvmetrics.blocks_for_prompt(5) == 1
    assert kvmetrics.descriptor_limit("FLASH_ATTN") == 1.0
    assert kvmetrics.descriptor_limit("TRITON_ATTN") == 2.0
    assert kvmetrics.descriptor_limit(None) == 2.0
    # the release's own rule (xlkv_autopatch.layout.cross_layer_regions): whole rows on 0.29+ for any
    # backend; FLASH_ATTN's cross-layer block is one region on every release (0.23-0.25 too)
    assert kvmetrics.descriptor_limit("TRITON_ATTN", vllm_version="0.33.0") == 1.0
    assert kvmetrics.descriptor_limit("FLASH_ATTN", vllm_version="0.26.0") == 1.0
    # a blocks-first block (TRITON_ATTN, FLASHINFER) is 2 regions where the release registers K and V apart
    # (0.12-0.25: the CPU harness, TRITON_ATTN with XLKV_EQUAL_TP=true, 0.21.0: 2), else 1 (0.26.0: 1)
    assert kvmetrics.descriptor_limit("FLASHINFER", vllm_version="0.26.0") == 1.0
    assert kvmetrics.descriptor_limit("TRITON_ATTN", vllm_version="0.21.0") == 2.0
    assert kvmetrics.descriptor_limit("FLASH_ATTN", vllm_version="0.24.0") == 1.0
    assert kvmetrics.descriptor_limit("TRITON_MLA", vllm_version="0.24.0") == 1.0


PROM_TEXT = """# HELP vllm:nixl_num_descriptors Histogram of number of descriptors per NIXL  KV Cache transfers.
# TYPE vllm:nixl_num_descriptors histogram
vllm:nixl_num_descriptors_bucket{engine="0",le="10.0",model_name="/tmp/m"} 0.0
vllm:nixl_num_descriptors_sum{engine="0",model_name="/tmp/m"} 5600.0
vllm:nixl_num_descriptors_count{engine="0",model_name="/tmp/m"} 1.0
vllm:nixl_num_descriptors_sum{engine="1",model_name="/tmp/m"} 5600.0
vllm:nixl_num_descriptors_count{engine="1",model_name="/tmp/m"} 1.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="/tmp/m"} 1.835008e+08
vllm:nixl_bytes_transferred_sum{engine="1",model_name="/tmp/m"} 1.835008e+08
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="/tmp/m"} 0.004
vllm:nixl_num_failed_transfers_total{engine="0",model_name="/tmp/m"} 0.0
vllm:num_requests_running{engine="0",model_name="/tmp/m"} 0.0
"""


def test_prom_parse_and_delta():
    after = kvmetrics.parse_prom(PROM_TEXT)
    assert after["transfers"] == 2 and after["descriptors_sum"] == 11200
    assert kvmetrics.parse_prom("# nothing\nvllm:num_requests_running 0\n") is None
    before = {k: 0.0 for k in after}
    d = kvmetrics.kv_summary(kvmetrics.prom_delta(before, after), QWEN3_BLOCK)
    assert d["num_transfers"] == 2
    assert d["avg_descriptors_per_transfer"] == 5600
    assert d["blocks_per_transfer"] == pytest.approx(100)
    assert d["descriptors_per_block"] == pytest.approx(56)
    assert kvmetrics.prom_delta(None, after) is None


def test_kv_run_prefers_prometheus_and_falls_back_to_log(tmp_path):
    log = tmp_path / "d.log"
    log.write_text("Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN'].\n" + SHIM_LINE + "\n")
    after = kvmetrics.parse_prom(PROM_TEXT)
    before = {k: 0.0 for k in after}
    kv = kvmetrics.kv_run(str(log), 0, before, after, QWEN3_BLOCK, "FLASH_ATTN")
    assert kv["source"] == "prom" and kv["descriptors_per_block"] == pytest.approx(56)
    assert kv["log"]["descriptors_per_block"] == pytest.approx(1.0)
    kv = kvmetrics.kv_run(str(log), 0, None, None, QWEN3_BLOCK)
    assert kv["source"] == "log" and kv["descriptors_per_block"] == pytest.approx(1.0)
    assert kvmetrics.attention_backend(str(log)) == "FLASH_ATTN"
    log2 = tmp_path / "e.log"
    log2.write_text("INFO [cuda.py:312] Using AttentionBackendEnum.TRITON_ATTN backend.\n")
    assert kvmetrics.attention_backend(str(log2)) == "TRITON_ATTN"


# ------------------------------------------------------------------ cells and merge ---------
def _bench(ttft, rid):
    return {"_run_id": rid, "mean_ttft_ms": ttft, "median_ttft_ms": ttft - 1, "p99_ttft_ms": ttft * 2,
            "mean_itl_ms": 5.0, "total_token_throughput": 1000.0, "completed": 64, "failed": 0}


def _kv(desc_per_block):
    return {"num_transfers": 64, "avg_descriptors_per_transfer": 640.0 * desc_per_block,
            "avg_mb_per_transfer": 1120.0, "avg_xfer_ms": 9.0, "source": "prom"}


def _doc(config, ttfts, prefix, L=10240, eq=True, dpb=1):
    runs = [_bench(t, "%s-%d" % (prefix, i)) for i, t in enumerate(ttfts)]
    cell = results.cell_from_runs(config, L, 16, 64, runs, [_kv(dpb)] * len(runs), ["cmd " + prefix], QWEN3_BLOCK)
    return {"vllm_version": "0.21.0", "gpu": "2xH200", "equivalence_pass": eq, "cells": [cell],
            "commands": ["cmd " + prefix]}


def test_cell_from_runs():
    c = _doc("shim", [2000.0, 2200.0, 2400.0], "a")["cells"][0]
    assert c["mean_ttft_ms"] == [2000.0, 2200.0, 2400.0]
    assert c["reps"] == 3 and c["mean_ttft_ms_mean"] == pytest.approx(2200.0)
    assert c["mean_ttft_ms_std"] == pytest.approx(200.0)
    assert c["descriptors_per_block"] == pytest.approx(1.0)
    assert c["kv_xfer"]["blocks_per_transfer"] == [pytest.approx(640)] * 3
    assert c["total_tok_s"] == [1000.0] * 3


def test_merge_adds_repetitions_idempotently_and_keeps_other_cells():
    a = _doc("stock", [5000.0, 5100.0], "a", dpb=56)
    b = _doc("stock", [4900.0], "b", dpb=56)
    c = _doc("shim", [2000.0], "c")
    m = results.merge_results([a, b, c])
    assert len(m["cells"]) == 2
    stock = [x for x in m["cells"] if x["config"] == "stock"][0]
    assert stock["mean_ttft_ms"] == [5000.0, 5100.0, 4900.0]
    assert stock["reps"] == 3 and stock["kv_xfer"]["num_transfers"] == [64, 64, 64]
    assert stock["descriptors_per_block"] == pytest.approx(56)
    again = results.merge_results([m, a, b, c])  # nothing new
    assert [x["mean_ttft_ms"] for x in again["cells"]] == [x["mean_ttft_ms"] for x in m["cells"]]
    assert set(m["commands"]) == {"cmd a", "cmd b", "cmd c"}
    # inputs are not modified
    assert a["cells"][0]["mean_ttft_ms"] == [5000.0, 5100.0]


def test_merge_equivalence_flags_and_mismatched_machines():
    ok = _doc("stock", [1.0], "a", eq=True)
    bad = _doc("shim", [1.0], "b", eq=False)
    assert results.merge_results([ok, bad])["equivalence_pass"] is False
    eq_summary = {"equivalence_pass": True, "descriptor_pass": False, "vllm_version": "0.21.0", "gpu": "2xH200"}
    m = results.merge_results([ok, eq_summary])
    assert m["equivalence_pass"] is True and m["descriptor_pass"] is False
    assert results.merge_results([_doc("stock", [1.0], "n", eq=None)])["equivalence_pass"] is None  # key always there
    other = _doc("stock", [1.0], "z")
    other["vllm_version"] = "0.26.0"
    assert any("0.26.0" in w for w in results.merge_results([ok, other])["warnings"])


def test_merge_cli_and_bench_cells_into_one_file(tmp_path):
    """bench_cell_to_file (the bench job's) accumulates repetitions in one file; `pdtools merge` (an
    operator's command) merges files and equivalence summaries."""
    from pdtools.results import bench_cell_to_file
    res = []
    for i, t in enumerate((3000.0, 3300.0)):
        p = tmp_path / ("stock-10240-64-r%d.json" % i)
        p.write_text(json.dumps(_bench(t, "x")))
        res.append(str(p))
    eq = tmp_path / "eq.json"
    eq.write_text(json.dumps({"equivalence_pass": True, "descriptor_pass": True, "vllm_version": "0.21.0",
                              "gpu": "2xH200"}))
    out = tmp_path / "r.json"

    def cell(prefix):
        bench_cell_to_file(str(out), "stock", 10240, 16, 64, res, [_kv(56), _kv(56)], [], None, QWEN3_BLOCK,
                           "0.21.0", "2xH200", str(eq), prefix)
    cell("one")
    cell("one")  # same run ids: no change
    d = json.loads(out.read_text())
    assert d["equivalence_pass"] is True and d["cells"][0]["mean_ttft_ms"] == [3000.0, 3300.0]
    cell("two")  # new reps accumulate
    d = json.loads(out.read_text())
    assert d["cells"][0]["reps"] == 4
    assert d["cells"][0]["descriptors_per_block"] == pytest.approx(56)
    # merge sub-command
    other = tmp_path / "o.json"
    other.write_text(json.dumps(_doc("shim", [1500.0], "s")))
    merged = tmp_path / "m.json"
    subprocess.run([sys.executable, os.path.join(EXP, "pdtools"), "merge", "--out", str(merged), str(out),
                    str(other)], check=True, capture_output=True)
    assert sorted(c["config"] for c in json.loads(merged.read_text())["cells"]) == ["shim", "stock"]
    assert json.loads(merged.read_text())["equivalence_files"] == ["eq.json"]  # from the bench call
    # a failed equivalence summary given to merge fails the document, and is named in it
    eq_bad = tmp_path / "equivalence-bad.json"
    eq_bad.write_text(json.dumps({"equivalence_pass": False, "vllm_version": "0.21.0", "gpu": "2xH200"}))
    r = subprocess.run([sys.executable, os.path.join(EXP, "pdtools"), "merge", "--out", str(merged),
                        str(eq_bad)], check=True, capture_output=True, text=True)
    m = json.loads(merged.read_text())
    assert m["equivalence_pass"] is False and m["equivalence_files"] == ["eq.json", "equivalence-bad.json"]
    assert "equivalence-bad.json" in r.stdout


def test_bench_cell_ignores_equivalence_of_another_release(tmp_path, capsys):
    from pdtools.results import bench_cell_to_file
    p = tmp_path / "r0.json"
    p.write_text(json.dumps(_bench(1.0, "x")))
    eq = tmp_path / "eq.json"
    eq.write_text(json.dumps({"equivalence_pass": True, "vllm_version": "0.26.0", "gpu": "2xH200"}))
    out = tmp_path / "r.json"
    bench_cell_to_file(str(out), "stock", 1024, 16, 128, [str(p)], [], [], None, 0, "0.21.0", "2xH200", str(eq), "p")
    assert json.loads(out.read_text())["equivalence_pass"] is None
    assert "is for vLLM 0.26.0 on 2xH200, not this run: ignored" in capsys.readouterr().err


def test_gpu_slug():
    assert results.gpu_slug(["NVIDIA H200", "NVIDIA H200"]) == "2xH200"
    assert results.gpu_slug(["NVIDIA H100 80GB HBM3"]) == "1xH100-80GB-HBM3"
    assert results.gpu_slug([]) == "cpu"


# ------------------------------------------------------------------ equivalence summary -----
def _run(label_lens, shift=0, lp_shift=0.0, kv=True, logprobs=True):
    """One run's results as equiv-run writes them: ids, logprobs (top 2 here), KV pulled."""
    out = []
    for n in label_lens:
        ids = [n + shift, 2, 3]
        r = {"prompt_len": n, "method": "return_token_ids", "token_ids": ids, "text": None}
        if logprobs:
            r["logprobs"] = [-0.25 + lp_shift] * 3
            r["top_logprobs"] = [[[t, -0.25 + lp_shift], [t + 1, -1.5 + lp_shift]] for t in ids]
        if kv:
            r["kv"] = {"transfers": 1, "bytes": QWEN3_BLOCK, "blocks": 1.0, "descriptors": 28, "failed": 0}
        out.append(r)
    return out


def test_source_ranks_and_the_per_remote_rank_limit():
    from pdtools.kvmetrics import descriptor_limit, source_ranks
    assert [source_ranks(p, d) for p, d in ((1, 1), (2, 1), (4, 1), (4, 2), (1, 2), (1, 4))] == [1, 2, 4, 2, 1, 1]
    assert source_ranks(2, 1, {"attention": "mla", "kv_heads": None}) == 1  # replicated latent cache: one rank
    assert source_ranks(4, 1, {"attention": "full", "kv_heads": 2}) == 1  # vLLM refuses P TP > KV heads: nothing read
    assert descriptor_limit("FLASH_ATTN", source_ranks=2) == 2.0 and descriptor_limit("TRITON_ATTN", source_ranks=2) == 4.0
    assert descriptor_limit("FLASH_ATTN", mla=True, source_ranks=2) == 1.0  # MLA: read from one prefill rank


def test_equivalence_summary_pass_and_failures():
    lens = [5, 4097]
    runs = {"local:stock": _run(lens), "pd:stock": _run(lens), "local:shim": _run(lens), "pd:shim": _run(lens)}
    probes = {"stock": {"kv": {"descriptors_per_block": 56.0}, "backend": "FLASH_ATTN"},
              "shim": {"kv": {"descriptors_per_block": 1.0}, "backend": "FLASH_ATTN"}}
    s = equivalence.summarize_equivalence(runs, probes, lens)
    assert s["pass"] and s["equivalence_pass"] and s["descriptor_pass"]
    assert s["baseline"] == "local:stock"
    text = equivalence.render_equivalence(s)
    assert "IDENTICAL" in text and "PASS" in text and "pd:shim" in text

    runs["pd:shim"] = _run(lens, shift=1)
    s = equivalence.summarize_equivalence(runs, probes, lens)
    assert not s["equivalence_pass"] and not s["pass"]
    assert any("pd:shim" in m and "len 5" in m for m in s["mismatches"])
    assert "DIFFERENT" in equivalence.render_equivalence(s)

    runs["pd:shim"] = _run(lens)
    probes["shim"]["kv"]["descriptors_per_block"] = 2.0  # allowed on TRITON_ATTN, not on FLASH_ATTN
    s = equivalence.summarize_equivalence(runs, probes, lens)
    assert s["equivalence_pass"] and s["descriptor_pass"] is False and not s["pass"]
    # per block per remote rank: a decode rank reading from two prefill ranks (P TP 2 -> D TP 1) may move 2
    s = equivalence.summarize_equivalence(runs, probes, lens, source_ranks=2)
    assert s["descriptor_pass"] and s["configs"]["shim"]["limit"] == 2.0
    probes["shim"]["kv"]["descriptors_per_block"] = 2.5
    assert equivalence.summarize_equivalence(runs, probes, lens, source_ranks=2)["descriptor_pass"] is False
    probes["shim"]["kv"]["descriptors_per_block"] = 2.0
    probes["shim"]["backend"] = "TRITON_ATTN"
    assert equivalence.summarize_equivalence(runs, probes, lens)["pass"]
    probes["shim"]["kv"] = {}  # no transfer seen at all: fail, not pass
    assert equivalence.summarize_equivalence(runs, probes, lens)["descriptor_pass"] is False


def test_compare_runs_reports_position():
    a = _run([10])
    b = [dict(a[0], token_ids=[10, 2, 4])]
    assert equivalence.compare_runs(a, b) == ["len 10: first difference at output position 2"]
    assert equivalence.compare_runs(a, a) == []
    # the same ids with another text (a detokenizer that decoded the first token differently) is a mismatch
    texted = [dict(a[0], text=" w5 w7")]
    assert equivalence.compare_runs(texted, [dict(a[0], text="w5 w7")]) == [
        "len 10: same token ids, text differs at character 0"]
    assert equivalence.compare_runs(texted, texted) == []
    assert equivalence.compare_runs(texted, [dict(a[0], text=None)]) == []   # a run without text: ids decide
    lens = [10]
    runs = {"local:stock": texted, "pd:stock": texted, "pd:shim": [dict(a[0], text="w5 w7")]}
    summary = equivalence.summarize_equivalence(runs, {}, lens)
    assert summary["texts"]["pd:shim"] == {"10": "w5 w7"}
    assert any("same token ids, text differs" in m for m in summary["mismatches"]), summary["mismatches"]


def test_extract_token_ids_fallbacks():
    assert equivalence._extract_token_ids({"token_ids": [5, 6]}) == ([5, 6], "return_token_ids")
    lp = {"logprobs": {"tokens": ["token_id:7", "token_id:8"]}}
    assert equivalence._extract_token_ids(lp) == ([7, 8], "logprobs_token_ids")
    assert equivalence._extract_token_ids({"text": "x"}) == (None, None)


def test_equivalence_summary_pd_vs_pd_stock():
    # P/D differs from local prefill in stock too: equivalence fails, but the second view
    # shows that the shim's P/D output is the same as stock P/D
    lens = [5, 2049]
    pd = [{"prompt_len": 5, "method": "return_token_ids", "token_ids": [5, 2, 3], "text": None},
          {"prompt_len": 2049, "method": "return_token_ids", "token_ids": [2049, 9, 9], "text": None}]
    runs = {"local:stock": _run(lens), "pd:stock": pd, "local:shim": _run(lens), "pd:shim": list(pd),
            "pd:native": _run(lens)}
    s = equivalence.summarize_equivalence(runs, {}, lens)
    assert not s["equivalence_pass"]
    assert s["pd_baseline"] == "pd:stock"
    assert s["pd_vs_pd_stock"]["pd:shim"] == []
    assert s["pd_vs_pd_stock"]["pd:native"] == ["len 2049: first difference at output position 1"]
    assert s["token_ids"]["pd:shim"]["2049"] == [2049, 9, 9]
    text = equivalence.render_equivalence(s)
    assert "pd:shim vs pd:stock: IDENTICAL" in text


def test_vllm_has_batch_invariant_reads_the_sources(tmp_path):
    pkg = tmp_path / "vllm"
    (pkg / "model_executor" / "layers").mkdir(parents=True)
    assert not vllminfo.vllm_has_batch_invariant(str(pkg))           # 0.11-like: neither file knows it
    (pkg / "envs.py").write_text('environment_variables = {"VLLM_HOST_IP": None}\n')
    assert not vllminfo.vllm_has_batch_invariant(str(pkg))
    (pkg / "model_executor" / "layers" / "batch_invariant.py").write_text(
        'val = os.getenv("VLLM_BATCH_INVARIANT", "0")\n')              # 0.12-0.17 read it there
    assert vllminfo.vllm_has_batch_invariant(str(pkg))
    os.remove(pkg / "model_executor" / "layers" / "batch_invariant.py")
    (pkg / "envs.py").write_text('environment_variables = {"VLLM_BATCH_INVARIANT": None}\n')  # later releases
    assert vllminfo.vllm_has_batch_invariant(str(pkg))
    assert not vllminfo.vllm_has_batch_invariant(str(tmp_path / "nowhere"))


# ------------------------------------------------------------------ logprobs, transfers, controls
def test_extract_logprobs_from_the_completions_format():
    choice = {"logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.5, -0.25],
                           "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -0.75, "token_id:4": -2.0},
                                            {"token_id:9": -0.25}]}}
    chosen, top = equivalence._extract_logprobs(choice)
    assert chosen == [-0.5, -0.25]
    assert top == [[[7, -0.5], [3, -0.75], [4, -2.0]], [[9, -0.25]]]  # best first, ids as ints
    assert equivalence._extract_logprobs({"text": "x"}) == (None, None)


def test_logprob_diff_compares_only_the_same_context():
    a = _run([5, 17])
    assert equivalence.logprob_diff(a, a) == {"max": 0.0, "positions": 6, "at": None}
    b = _run([5, 17], lp_shift=0.125)
    d = equivalence.logprob_diff(a, b)
    assert d["max"] == pytest.approx(0.125) and d["positions"] == 6
    # ids diverge at position 1 of the 17-token prompt: position 1's top values are compared
    # (same context), the chosen logprob there and everything after are not
    c = _run([5, 17])
    c[1]["token_ids"] = [17, 99, 98]
    c[1]["logprobs"] = [-0.25, -7.0, -9.0]
    c[1]["top_logprobs"][2] = [[98, -9.0], [1, -9.5]]
    c[1]["top_logprobs"][1] = [[99, -0.25 + 0.5], [100, -1.5]]
    d = equivalence.logprob_diff(a, c)
    assert d["max"] == pytest.approx(0.5) and d["at"] == [17, 1] and d["positions"] == 5
    assert equivalence.logprob_diff(a, _run([5, 17], logprobs=False))["max"] is None
    # matched by prompt length: a run over a subset of the prompts compares those only
    assert equivalence.logprob_diff(a, _run([17], lp_shift=0.25))["max"] == pytest.approx(0.25)


def _probes():
    return {"stock": {"kv": {"descriptors_per_block": 28.0}, "backend": "FLASH_ATTN"},
            "shim": {"kv": {"descriptors_per_block": 1.0}, "backend": "FLASH_ATTN"}}


def test_logprobs_must_be_identical_under_deterministic_kernels():
    lens = [5, 100]
    runs = {"local:stock": _run(lens), "pd:stock": _run(lens), "local:shim": _run(lens), "pd:shim": _run(lens)}
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True)
    assert s["pass"] and s["logprob_pass"] is True
    assert s["configs"]["shim"]["max_logprob_diff"] == 0.0 and s["configs"]["stock"]["max_logprob_diff"] == 0.0
    runs["pd:shim"] = _run(lens, lp_shift=2 ** -10)  # same ids, one ulp-ish of difference
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True)
    assert not s["pass"] and s["logprob_pass"] is False and not s["equivalence_pass"]
    assert s["configs"]["shim"]["max_logprob_diff"] == pytest.approx(2 ** -10)
    assert any(p.startswith("pd:shim vs local:shim") for p in s["logprob_problems"])
    assert "LOGPROBS pd:shim" in equivalence.render_equivalence(s)


def test_a_configs_own_logprob_difference_is_recorded_not_blamed_on_the_transfer():
    """0.26.0 on an H200: the shim's servers run Model Runner V1 (stock: V2), so local:shim and
    pd:shim both differ from local:stock by 1 ulp (9.54e-07) with identical ids.  The transfer
    check is pd:shim vs local:shim, which is exact; the config's own difference is recorded."""
    lens = [5, 100]
    ulp = 2 ** -20
    runs = {"local:stock": _run(lens), "pd:stock": _run(lens),
            "local:shim": _run(lens, lp_shift=ulp), "pd:shim": _run(lens, lp_shift=ulp)}
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True)
    assert s["pass"] and s["logprob_pass"] is True, s["logprob_problems"]
    shim = s["configs"]["shim"]
    assert shim["max_logprob_diff_pd_vs_local"] == 0.0
    assert shim["max_logprob_diff_local"] == pytest.approx(ulp) and shim["max_logprob_diff"] == pytest.approx(ulp)
    assert "logprobs pd:shim vs local:shim: max |d| 0" in equivalence.render_equivalence(s)
    runs["pd:shim"] = _run(lens, lp_shift=2 * ulp)  # the transfer adds a difference of its own
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True)
    assert s["logprob_pass"] is False and s["configs"]["shim"]["max_logprob_diff_pd_vs_local"] == pytest.approx(ulp)


def test_default_kernels_shim_may_not_be_worse_than_stock():
    lens = [5, 100]
    runs = {"local:stock": _run(lens), "pd:stock": _run(lens, lp_shift=0.0625),
            "local:shim": _run(lens), "pd:shim": _run(lens, lp_shift=0.0625)}
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=False)
    assert s["pass"] and s["logprob_pass"] is True
    assert s["configs"]["stock"]["max_logprob_diff"] == s["configs"]["shim"]["max_logprob_diff"] == 0.0625
    runs["pd:shim"] = _run(lens, lp_shift=0.125)
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=False)
    assert not s["pass"] and s["logprob_pass"] is False
    assert "pd:shim: max |logprob difference| 0.125 > pd:stock's 0.0625" in s["logprob_problems"][0]
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=False, logprob_tol=0.1)
    assert s["pass"]


def test_every_pd_answer_must_have_moved_kv():
    lens = [5, 100]
    runs = {"local:stock": _run(lens), "pd:stock": _run(lens)}
    s = equivalence.summarize_equivalence(runs, {}, lens, batch_invariant=True)
    assert s["pass"] and s["transfers_pass"]
    assert s["configs"]["stock"]["kv_blocks_per_prompt"] == {"5": 1.0, "100": 1.0}
    assert s["transfers"]["pd:stock"]["100"]["transfers"] == 1
    runs["pd:stock"][1]["kv"] = {"transfers": 0, "bytes": 0, "blocks": 0.0, "descriptors": 0, "failed": 0}
    s = equivalence.summarize_equivalence(runs, {}, lens, batch_invariant=True)
    assert not s["pass"] and not s["transfers_pass"]
    assert s["transfer_problems"] == ["pd:stock len 100: D pulled no KV (transfers 0, bytes 0)"]
    assert "NO TRANSFER pd:stock len 100" in equivalence.render_equivalence(s)
    runs["pd:stock"][1]["kv"] = None  # counters not readable: not a pass either
    s = equivalence.summarize_equivalence(runs, {}, lens, batch_invariant=True)
    assert not s["pass"] and "not readable" in s["transfer_problems"][0]


def test_negative_controls_must_be_detected_and_do_not_count_as_mismatches():
    lens = [5, 100]
    base = {"local:stock": _run(lens), "pd:stock": _run(lens), "local:shim": _run(lens), "pd:shim": _run(lens)}
    runs = dict(base, **{"pd:nc-stock": _run(lens, shift=3), "pd:nc-shim": _run([100], lp_shift=2 ** -8)})
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True, corruption="shift: ...")
    assert s["pass"] and s["equivalence_pass"] and s["negative_control_pass"] is True
    assert s["mismatches"] == []  # the controls' differences are expected, not failures
    nc = {n["config"]: n for n in s["negative_control"]}
    assert nc["nc-stock"]["detected"] and nc["nc-stock"]["ids_differ"]
    assert nc["nc-shim"]["detected"] and not nc["nc-shim"]["ids_differ"]  # logprobs alone caught it
    assert nc["nc-shim"]["max_logprob_diff"] == pytest.approx(2 ** -8)
    assert nc["nc-stock"]["corruption"] == "shift: ..."
    assert "FAIL as planted: detected" in equivalence.render_equivalence(s)
    # a control the check cannot tell apart makes the whole run fail
    runs["pd:nc-shim"] = _run([100])
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True)
    assert not s["pass"] and s["negative_control_pass"] is False
    assert "NOT DETECTED" in equivalence.render_equivalence(s)
    # a control over prompts the baseline lacks proves nothing (not "detected" by a count mismatch)
    runs["pd:nc-shim"] = _run([77], shift=3)
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True)
    nc = {n["config"]: n for n in s["negative_control"]}
    assert nc["nc-shim"]["comparable"] is False and nc["nc-shim"]["detected"] is False and not s["pass"]
    # default kernels: detected only beyond what the same config shows without the corruption
    runs = dict(base, **{"pd:stock": _run(lens, lp_shift=0.25), "pd:nc-stock": _run(lens, lp_shift=0.125)})
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=False)
    assert s["negative_control"][0]["detected"] is False and not s["pass"]


def test_distinct_ids_of_the_baseline():
    lens = [5, 100]
    runs = {"local:stock": _run(lens), "pd:stock": _run(lens)}
    runs["local:stock"][0]["token_ids"] = [7, 7, 7]
    s = equivalence.summarize_equivalence(runs, {}, lens)
    assert s["distinct_ids"] == {"5": 1, "100": 3}


def test_the_corruption_description_is_the_hooks_own():
    from pdtools.runs import corruption_description
    text = corruption_description("shift")
    assert text.startswith("shift: ") and "next block id" in text
    assert corruption_description("swap-layers").startswith("swap-layers: ")


def test_kv_pulled_reads_d_metrics_before_and_after(tmp_path):
    """kv_pulled against a real HTTP /metrics page: counters absent at first (vLLM may export a
    histogram only after its first observation) count as zero; the delta gives the blocks."""
    import http.server
    import threading

    pages = {"text": "# no NIXL metrics yet\nvllm:num_requests_running 0\n"}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages["text"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/metrics" % srv.server_port
    try:
        before = equivalence._prom_snapshot(url)
        assert before["transfers"] == 0.0
        pages["text"] = PROM_TEXT
        d = equivalence.kv_pulled(url, before, QWEN3_BLOCK, wait_s=2)
        assert d["transfers"] == 2 and d["blocks"] == pytest.approx(200) and d["descriptors"] == 11200
        # nothing moved: the delta says so after the wait (no exception, no guess)
        d = equivalence.kv_pulled(url, equivalence._prom_snapshot(url), QWEN3_BLOCK, wait_s=0.5, poll_s=0.1)
        assert d["transfers"] == 0 and d["bytes"] == 0
    finally:
        srv.shutdown()
    assert equivalence.kv_pulled("http://127.0.0.1:9/metrics", None, QWEN3_BLOCK, wait_s=0.1) is None


REQUEST_PROM = PROM_TEXT + """vllm:time_to_first_token_seconds_sum{engine="0",model_name="/tmp/m"} 2.4
vllm:time_to_first_token_seconds_count{engine="0",model_name="/tmp/m"} 8.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="/tmp/m"} 0.4
vllm:request_queue_time_seconds_count{engine="0",model_name="/tmp/m"} 8.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="/tmp/m"} 1.6
vllm:request_prefill_time_seconds_count{engine="0",model_name="/tmp/m"} 8.0
"""


def test_handoff_split_from_the_proxy_d_request_metrics_and_nixl():
    """each P/D cell splits D's part of TTFT with D's own request histograms (deltas per rep)
    and NIXL's transfer time; the parts after P's answer add up to the proxy's D time"""
    after = kvmetrics.parse_prom(REQUEST_PROM)
    before = dict.fromkeys(after, 0.0)
    kv = kvmetrics.kv_run(None, 0, before, after, QWEN3_BLOCK)
    assert (kv["d_ttft_ms"], kv["d_queue_ms"], kv["d_prefill_ms"]) == pytest.approx((300, 50, 200))
    assert kv["avg_xfer_ms"] == pytest.approx(2.0)          # 0.004 s over 2 transfers
    # the request histograms alone are no KV source (no NIXL counters on the page)
    assert kvmetrics.parse_prom("vllm:request_queue_time_seconds_sum 1.0\n") is None
    proxy = {"prefill_ms_mean": 400.0, "decode_first_ms_mean": 320.0}
    cell = results.cell_from_runs("shim", 10240, 16, 8, [_bench(700.0, "r1")], [kv], [], QWEN3_BLOCK, [proxy])
    split = cell["handoff_split_ms"]
    assert split == pytest.approx({"p_answer": 400, "d_frontend": 20, "d_ingress": 50, "d_queue": 50,
                                   "kv_read": 2, "d_notice_first_token": 198})
    assert sum(v for k, v in split.items() if k != "p_answer") == pytest.approx(320)
    # P alone (no proxy, no D): no split
    assert results.cell_from_runs("prefill_only", 10240, 1, 8, [_bench(380.0, "r2")], [None], [],
                                  QWEN3_BLOCK)["handoff_split_ms"] is None


def test_handoff_split_without_nixl_time_keeps_the_read_inside_one_named_part():
    """a cell whose D page had no NIXL transfer time (no kv_read): the read, the notice and the first
    token stay one part, named so, and the parts after P's answer still add up to the proxy's D time"""
    cell = {"avg_proxy_prefill_ms": 400.0, "avg_proxy_decode_first_ms": 320.0, "avg_d_ttft_ms": 300.0,
            "avg_d_queue_ms": 50.0, "avg_d_prefill_ms": 200.0, "avg_xfer_ms": None}
    split = results.handoff_split(cell)
    assert split == {"p_answer": 400, "d_frontend": 20, "d_ingress": 50, "d_queue": 50,
                     "d_read_notice_first_token": 200}
    assert sum(v for k, v in split.items() if k != "p_answer") == pytest.approx(320)
    # the same cell through cell_from_runs: D's request metrics on the page, no NIXL counters
    kv = {"d_ttft_ms": 300.0, "d_queue_ms": 50.0, "d_prefill_ms": 200.0}
    proxy = {"prefill_ms_mean": 400.0, "decode_first_ms_mean": 320.0}
    c = results.cell_from_runs("shim", 10240, 16, 8, [_bench(700.0, "r1")], [kv], [], QWEN3_BLOCK, [proxy])
    assert c["avg_xfer_ms"] is None and c["handoff_split_ms"] == split
    # any one of D's request metrics missing: no split at all (never a part guessed from the others)
    for k in ("avg_proxy_prefill_ms", "avg_proxy_decode_first_ms", "avg_d_ttft_ms", "avg_d_queue_ms",
              "avg_d_prefill_ms"):
        assert results.handoff_split(dict(cell, **{k: None})) is None, k


def test_merge_keeps_per_rep_lists_aligned_when_an_older_file_lacks_a_key():
    old = results.cell_from_runs("shim", 10240, 16, 8, [_bench(700.0, "r1")], [None], [], QWEN3_BLOCK)
    for k in ("d_ttft_ms", "d_queue_ms", "d_prefill_ms"):
        del old[k]                          # a cell written before D's request metrics were kept
    new = results.cell_from_runs("shim", 10240, 16, 8, [_bench(650.0, "r2")], [{"d_queue_ms": 40.0}], [],
                                 QWEN3_BLOCK)
    doc = results.merge_results([{"cells": [old]}, {"cells": [new]}])
    c = doc["cells"][0]
    assert c["run_ids"] == ["r1", "r2"] and c["d_queue_ms"] == [None, 40.0] and c["avg_d_queue_ms"] == 40.0


# ------------------------------------------------------------------ model families ----
# D's registration reports as experiments/negative_control/ writes them (the fields pdtools reads).
# MLA, DeepSeek-V2-shaped, 8 layers, block 16: one latent page (512 + 64) * 2 B * 16 per layer.
MLA_PAGE = 16 * (512 + 64) * 2
MLA_STOCK_REG = {"num_regions": 8, "block_len_per_layer": [MLA_PAGE] * 8, "region_group_ids": [0] * 8,
                 "num_kv_cache_groups": 1, "kv_cache_layout": "NHD", "use_mla": True,
                 "bytes_per_block_id": [8 * MLA_PAGE], "regions_per_block_id": [8]}
# Gemma-3-shaped hybrid: 6 KV cache groups (1 full, 5 sliding), 2 shared tensors (region group -1)
GEMMA_PAGE = 16 * 2 * 4 * 256 * 2
GEMMA_STOCK_REG = {"num_regions": 2, "block_len_per_layer": [GEMMA_PAGE] * 2, "region_group_ids": [-1, -1],
                   "num_kv_cache_groups": 6, "kv_cache_layout": "NHD", "use_mla": False,
                   "bytes_per_block_id": [2 * GEMMA_PAGE] * 6, "regions_per_block_id": [2] * 6}


def _mla_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v2", "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
        "hidden_size": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "dtype": "bfloat16"}))
    return str(tmp_path)


def test_model_family_and_the_dense_formula_only_for_dense_models(tmp_path):
    # the package's classifier and names (xlkv_autopatch.families), not a rule of the lab's own
    assert kvmetrics.model_family({"model_type": "qwen3", "layer_types": ["full_attention"] * 2,
                                 "sliding_window": None, "num_key_value_heads": 8}) == "dense"
    assert kvmetrics.model_family({"model_type": "qwen3", "num_key_value_heads": 8}, tp=8) == "one-kv-head"
    assert kvmetrics.model_family({"model_type": "deepseek_v2", "kv_lora_rank": 512}) == "mla"
    assert kvmetrics.model_family({"model_type": "gemma3_text", "sliding_window": 256,
                                 "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}) == "sliding-window"
    assert kvmetrics.model_family({"model_type": "gemma3", "text_config": {"sliding_window": 512}}) == "sliding-window"
    # every layer sliding is one KV cache group, not a hybrid; Mamba layers are no dense model
    assert kvmetrics.model_family({"model_type": "mistral", "sliding_window": 4096,
                                 "layer_types": ["sliding_attention"] * 4, "num_key_value_heads": 8}) == "dense"
    assert kvmetrics.model_family({"model_type": "qwen3_next", "num_key_value_heads": 2}) == "mamba-hybrid"
    # the dense K/V formula would count an MLA block as 16 * 8 * 2 * 16 * 128 * 2 = 1 MiB (7x too much):
    # it refuses (the lab then says 0, unknown, instead of a wrong number)
    with pytest.raises(kvmetrics.NotDense, match="mla model"):
        kvmetrics.model_block_bytes(_mla_config(tmp_path))
    r = subprocess.run([sys.executable, os.path.join(EXP, "pdtools"), "model-family", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "mla"


def test_bytes_per_block_id_from_the_registration_report(tmp_path):
    assert kvmetrics.registration_bytes_per_block(MLA_STOCK_REG) == (8 * MLA_PAGE, None)
    assert kvmetrics.registration_bytes_per_block(GEMMA_STOCK_REG) == (2 * GEMMA_PAGE, None)
    bpb, note = kvmetrics.registration_bytes_per_block(dict(GEMMA_STOCK_REG, bytes_per_block_id=[100, 200]))
    assert bpb is None and "different bytes per block id" in note
    assert kvmetrics.registration_bytes_per_block(None)[0] is None
    assert kvmetrics.registration_bytes_per_block({"error": "no block_len_per_layer"})[1].endswith("no block_len_per_layer")
    p = tmp_path / "reg.json"
    p.write_text(json.dumps(MLA_STOCK_REG))
    assert kvmetrics.registration_bytes_per_block(kvmetrics.load_registration(str(p)))[0] == 8 * MLA_PAGE
    assert kvmetrics.descriptor_limit("FLASH_ATTN_MLA") == 1.0 and kvmetrics.descriptor_limit("TRITON_MLA") == 1.0
    assert kvmetrics.descriptor_limit(None, mla=True) == 1.0 and kvmetrics.descriptor_limit("TRITON_ATTN") == 2.0


def _prom(descs, nbytes, n=1):
    keys = set(kvmetrics.PROM_KEYS.values())
    before = {k: 0.0 for k in keys}
    after = dict(before, descriptors_sum=float(descs), transfers=float(n), bytes_sum=float(nbytes),
                 xfer_seconds_sum=0.001)
    return before, after


def test_kv_run_mla_blocks_and_descriptors_from_what_d_registered():
    """100 MLA blocks, stock (8 regions): 800 descriptors.  With D's report: 100 blocks, 8 per block.
    The dense formula for the same model would have said 100 * 147456 / 1 MiB = 14 blocks, 57 per block."""
    before, after = _prom(800, 100 * 8 * MLA_PAGE)
    kv = kvmetrics.kv_run(None, 0, before, after, 0, "FLASH_ATTN_MLA", registration=MLA_STOCK_REG)
    assert kv["blocks_per_transfer"] == pytest.approx(100) and kv["descriptors_per_block"] == pytest.approx(8)
    assert kv["bytes_per_block_source"] == "registration" and kv["registered_regions_per_block_id"] == [8]
    assert kv["registration"]["use_mla"] is True
    dense = 16 * 8 * 2 * 16 * 128 * 2
    kv = kvmetrics.kv_run(None, 0, before, after, dense, "FLASH_ATTN_MLA")   # no report: the formula, said
    assert kv["bytes_per_block_source"] == "dense formula" and "no registration report" in kv["bytes_per_block_note"]
    assert kv["blocks_per_transfer"] == pytest.approx(14.06, abs=0.01)     # wrong: why the report exists
    # a report whose groups differ in bytes per block id: blocks unknown, never a guess
    kv = kvmetrics.kv_run(None, 0, before, after, dense, "X",
                        registration=dict(MLA_STOCK_REG, bytes_per_block_id=[1, 2], num_kv_cache_groups=2))
    assert kv["blocks_per_transfer"] is None and kv["descriptors_per_block"] is None
    assert "different bytes per block id" in kv["bytes_per_block_note"]


def test_kv_run_sliding_window_hybrid_is_per_block_id(tmp_path, capsys):
    """A 1600-token probe on the 6-group hybrid: the full group sends 100 block ids, each of the 5
    sliding groups its 17-block window tail: 185 block ids, 2 descriptors each (stock)."""
    ids = 100 + 5 * 17
    before, after = _prom(2 * ids, ids * 2 * GEMMA_PAGE)
    kv = kvmetrics.kv_run(None, 0, before, after, 0, "FLASH_ATTN", registration=GEMMA_STOCK_REG)
    assert kv["blocks_per_transfer"] == pytest.approx(185) and kv["descriptors_per_block"] == pytest.approx(2)
    # the probe (runs.kv_probe): with several groups a prompt's length does not give its blocks (sliding tails)
    from pdtools.runs import kv_probe
    reg = tmp_path / "reg.json"
    reg.write_text(json.dumps(GEMMA_STOCK_REG))
    kv = kv_probe(None, 0, before, after, 123, registration=str(reg), prompt_len=1600, block_size=16)
    assert kv["blocks_per_transfer"] == pytest.approx(185) and kv["bytes_per_block"] == 2 * GEMMA_PAGE
    assert kv["blocks_expected"] is None and kv["descriptors_per_block_from_len"] is None
    kv = kv_probe(None, 0, before, after, 0, registration=str(tmp_path / "none"), prompt_len=1600, block_size=16)
    assert "no registration report at" in capsys.readouterr().err and kv["blocks_per_transfer"] is None


def test_the_shims_mla_descriptor_check_is_one_per_block():
    lens = [5, 100]
    runs = {"pd:stock": _run(lens), "pd:shim": _run(lens)}
    probes = {"stock": {"kv": {"descriptors_per_block": 8.0, "registration": MLA_STOCK_REG}, "backend": "FLASH_ATTN_MLA"},
              "shim": {"kv": {"descriptors_per_block": 1.0, "registration": dict(MLA_STOCK_REG, num_regions=1)},
                       "backend": "TRITON_MLA"}}
    s = equivalence.summarize_equivalence(runs, probes, lens, reference="pd-stock")
    assert s["descriptor_pass"] is True and s["configs"]["shim"]["limit"] == 1.0
    probes["shim"]["kv"]["descriptors_per_block"] = 2.0   # TRITON_MLA: 2 would pass a dense check, not MLA's
    s = equivalence.summarize_equivalence(runs, probes, lens, reference="pd-stock")
    assert s["descriptor_pass"] is False and not s["pass"]


def test_reference_pd_stock_records_vllms_local_difference_and_keeps_teeth():
    """MLA / Gemma 3 on 0.33.0: vLLM's own P/D (stock too) differs from local prefill.  With
    reference pd-stock that difference is recorded, not failing; the shim must equal stock P/D."""
    lens = [5, 100]
    runs = {"local:stock": _run(lens), "pd:stock": _run(lens, shift=1, lp_shift=0.03),
            "local:shim": _run(lens), "pd:shim": _run(lens, shift=1, lp_shift=0.03)}
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True)   # reference local
    assert not s["pass"] and not s["equivalence_pass"]                                # what it was before
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True, reference="pd-stock")
    assert s["pass"] and s["equivalence_pass"] and s["logprob_pass"] is True, (s["mismatches"], s["logprob_problems"])
    assert s["baseline"] == "pd:stock" and s["reference"] == "pd-stock" and s["mismatches"] == []
    assert set(s["local_vs_pd_stock"]) == {"local:stock", "local:shim"}
    assert s["local_vs_pd_stock"]["local:stock"]["problems"][0].startswith("len 5: first difference")
    assert s["configs"]["shim"]["pd_vs_local_is_vllms"] is True
    text = equivalence.render_equivalence(s)
    assert "stock P/D: EQ_REFERENCE=pd-stock" in text and "DIFFERENT (vLLM's)" in text and "recorded, not failing" in text
    # teeth 1: the shim's ids differ from stock P/D
    bad = dict(runs, **{"pd:shim": _run(lens, shift=2, lp_shift=0.03)})
    s = equivalence.summarize_equivalence(bad, _probes(), lens, batch_invariant=True, reference="pd-stock")
    assert not s["pass"] and s["mismatches"][0].startswith("pd:shim vs pd:stock: len 5")
    # teeth 2: same ids, other logprobs (default kernels too: identical is asked for, up to the tolerance)
    for bi in (True, False):
        bad = dict(runs, **{"pd:shim": _run(lens, shift=1, lp_shift=0.03 + 2 ** -10)})
        s = equivalence.summarize_equivalence(bad, _probes(), lens, batch_invariant=bi, reference="pd-stock")
        assert not s["pass"] and s["logprob_pass"] is False and "pd:shim vs pd:stock" in s["logprob_problems"][0]
    s = equivalence.summarize_equivalence(bad, _probes(), lens, batch_invariant=False, reference="pd-stock", logprob_tol=0.01)
    assert s["pass"]
    # teeth 3: the negative control is judged against stock P/D
    nc = dict(runs, **{"pd:nc-shim": _run([100], shift=1, lp_shift=0.03 + 1e-3)})
    s = equivalence.summarize_equivalence(nc, _probes(), lens, batch_invariant=True, reference="pd-stock")
    assert s["pass"] and s["negative_control"][0]["detected"] and s["negative_control"][0]["compared_with"] == "pd:stock"
    nc["pd:nc-shim"] = _run([100], shift=1, lp_shift=0.03)    # a control identical to stock P/D: not detected
    s = equivalence.summarize_equivalence(nc, _probes(), lens, batch_invariant=True, reference="pd-stock")
    assert not s["pass"] and s["negative_control_pass"] is False
    # no stock P/D run: no reference, no pass
    s = equivalence.summarize_equivalence({"local:shim": _run(lens), "pd:shim": _run(lens)}, _probes(), lens,
                                      batch_invariant=True, reference="pd-stock")
    assert not s["pass"] and "no pd:stock run" in s["mismatches"][0]
    with pytest.raises(ValueError):
        equivalence.summarize_equivalence(runs, _probes(), lens, reference="bogus")


def test_reference_pd_stock_v1_separates_the_model_runner_from_the_layout():
    """0.22-0.28: the shim runs Model Runner V1, stock vLLM V2.  With reference pd-stock-v1 the
    shim is held to stock P/D on V1 (identical), and stock P/D on V2 is recorded, not failing."""
    lens = [5, 100]
    runs = {"pd:stock": _run(lens, lp_shift=2 ** -21), "pd:stock-v1": _run(lens), "pd:shim": _run(lens),
            "local:shim": _run(lens)}
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True, reference="pd-stock")
    assert not s["pass"] and any(p.startswith("pd:shim vs pd:stock:") for p in s["logprob_problems"])  # the H200 run
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True, reference="pd-stock-v1")
    assert s["pass"] and s["baseline"] == "pd:stock-v1", (s["mismatches"], s["logprob_problems"])
    assert s["other_runner_vs_reference"]["pd:stock"]["max_logprob_diff"] == 2 ** -21
    assert "EQ_REFERENCE=pd-stock-v1" in equivalence.render_equivalence(s)
    bad = dict(runs, **{"pd:shim": _run(lens, lp_shift=2 ** -21)})                  # teeth: one ulp off V1
    s = equivalence.summarize_equivalence(bad, _probes(), lens, batch_invariant=True, reference="pd-stock-v1")
    assert not s["pass"] and "pd:shim vs pd:stock-v1" in s["logprob_problems"][0]
    del runs["pd:stock-v1"]
    s = equivalence.summarize_equivalence(runs, _probes(), lens, batch_invariant=True, reference="pd-stock-v1")
    assert not s["pass"] and "no pd:stock-v1 run" in s["mismatches"][0]


def test_an_empty_setting_reads_as_unset(monkeypatch):
    """The scripts read ${X:-default}, so an empty value takes the default (a plant that read
    os.environ.get(name, default) let an empty TP_D through as "")."""
    from pdtools import settings
    monkeypatch.setenv("TP_D", "")
    monkeypatch.setenv("WORK", "")
    s = settings.Settings.read()
    assert s.get("TP_D") == settings.DEFAULTS["TP_D"] == "1"
    assert s.get_int("TP_D") == 1
    assert s.get("WORK") == settings.DEFAULTS["WORK"]
    monkeypatch.setenv("TP_D", "2")
    assert s.get_int("TP_D") == 1                      # read once, at the door: a later change is not seen
    assert settings.Settings.read().get_int("TP_D") == 2
    assert settings.Settings.read({"XLKV_NO_SUCH_SETTING": ""}).get("XLKV_NO_SUCH_SETTING", "fallback") == "fallback"


def test_a_shim_that_kept_the_stock_layout_for_any_tp_is_not_held_to_the_descriptor_promise(tmp_path):
    """Where D's log has the shim's INFO line (stock layout kept so that any TP pairing is
    served), the summary records it and checks no descriptor limit; without the line, 28 per block fails."""
    from pdtools import equivalence, runs as R

    log = tmp_path / "d.log"
    log.write_text("INFO 11-27 [x.py:1] xlkv_autopatch: ENABLE_XLKV is set but the stock per-layer KV layout is "
                   "kept: ... XLKV_EQUAL_TP=true gives 1 descriptor per block (a peer ...)\n")
    assert R.kept_stock_for_any_tp(str(log)).endswith("(a peer ...)")
    assert R.kept_stock_for_any_tp(str(tmp_path / "none.log")) is None
    runs = {"local:stock": _run([5]), "pd:stock": _run([5]), "local:shim": _run([5]), "pd:shim": _run([5])}
    kv = {"descriptors_per_block": 28.0, "avg_descriptors_per_transfer": 2800.0, "blocks_per_transfer": 100}
    for kept, want in ((R.kept_stock_for_any_tp(str(log)), None), (None, False)):
        probes = {"stock": {"kv": dict(kv), "backend": "TRITON_ATTN"},
                  "shim": {"kv": dict(kv, **({"kept_stock_for_any_tp": kept} if kept else {})),
                           "backend": "TRITON_ATTN"}}
        s = equivalence.summarize_equivalence(runs, probes, [5])
        assert s["equivalence_pass"], s["mismatches"]
        assert s["configs"]["shim"]["descriptor_pass"] is want, s["configs"]["shim"]
        assert s["descriptor_pass"] is (want is None), s["descriptor_pass"]
        assert ("descriptor_note" in s["configs"]["shim"]) is (kept is not None)
