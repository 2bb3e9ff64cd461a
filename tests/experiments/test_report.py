"""The report job (pdtools/report.py; experiments/report.py is its door): markdown content and the PNG
(PNG part skipped without matplotlib)."""

import json
import os
import subprocess
import sys

import pytest

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
from pdtools import results  # noqa: E402
from pdtools import configs, report  # noqa: E402

QWEN3_BLOCK = 16 * 28 * 2 * 8 * 128 * 2


def _cell(config, L, ttfts, dpb):
    runs = [{"_run_id": "%s-%d-%d" % (config, L, i), "mean_ttft_ms": t, "median_ttft_ms": t, "p99_ttft_ms": 2 * t,
             "mean_itl_ms": 20.0, "total_token_throughput": 1e5, "completed": 64, "failed": 0}
            for i, t in enumerate(ttfts)]
    kv = {"num_transfers": 64, "avg_descriptors_per_transfer": 640.0 * dpb, "avg_mb_per_transfer": 1120.0}
    return results.cell_from_runs(config, L, 16, 64 if L > 2048 else 128, runs, [kv] * len(runs), [], QWEN3_BLOCK)


@pytest.fixture
def doc():
    return {"vllm_version": "0.21.0", "gpu": "2xH200", "equivalence_pass": True, "cells": [
        _cell("shim", 10240, [2000.0, 2200.0, 2400.0], 1),
        _cell("stock", 10240, [4800.0, 5000.0, 5200.0], 56),
        _cell("stock", 1024, [830.0, 850.0, 810.0], 56),
        _cell("shim", 1024, [800.0, 820.0, 840.0], 1),
        _cell("native", 10240, [2500.0, 2500.0], 1),
    ]}


def test_rows_stats_and_ratio(doc):
    rows = report.rows(doc)
    assert [(r["input_len"], r["config"]) for r in rows] == [
        (1024, "stock"), (1024, "shim"), (10240, "stock"), (10240, "shim"), (10240, "native")]
    shim = rows[3]
    assert shim["ttft"]["mean"] == pytest.approx(2200.0)
    assert shim["ttft"]["std"] == pytest.approx(200.0)
    assert (shim["ttft"]["min"], shim["ttft"]["max"]) == (2000.0, 2400.0)
    assert shim["ratio"] == pytest.approx(5000.0 / 2200.0)
    assert rows[2]["ratio"] == pytest.approx(1.0)
    assert rows[4]["ttft"]["std"] == 0.0 and rows[4]["ratio"] == pytest.approx(2.0)


def test_markdown_table(doc):
    md = report.markdown(doc)
    assert "vLLM 0.21.0 on 2xH200" in md and "equivalence (pd_equivalence.sh): PASS" in md
    line = [l for l in md.splitlines() if l.startswith("| 10240 × 64 | shim |")][0]
    cols = [c.strip() for c in line.strip("|").split("|")]
    assert cols[2] == "3"                 # reps
    assert cols[3] == "2200 ± 200"        # mean ± std of mean TTFT
    assert cols[4] == "2000–2400"         # min-max
    assert cols[9] == "1.00"              # descriptors per block
    assert cols[10] == "2.27×"            # stock/shim
    assert "- 10240 tokens: stock/shim 2.27×, stock/native 2.00×" in md
    assert "- 1024 tokens: stock/shim 1.01×" in md  # 830 / 820
    doc["equivalence_pass"] = False
    assert "**FAIL**" in report.markdown(doc)
    doc["equivalence_files"] = ["equivalence-0.21.0.json", "eq-b.json"]
    assert "(pd_equivalence.sh): **FAIL** (equivalence-0.21.0.json, eq-b.json)" in report.markdown(doc)
    doc["equivalence_pass"] = None  # nothing to name when no summary decided it
    assert "(pd_equivalence.sh): not run / not given\n" in report.markdown(doc)


def test_cli_writes_markdown_and_png(tmp_path, doc):
    src = tmp_path / "res.json"
    src.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, os.path.join(EXP, "report.py"), str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "res.md").read_text()
    assert "| 1024 × 128 | stock |" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out.stderr
        pytest.skip("matplotlib missing: PNG part not tested (markdown part passed)")
    png = tmp_path / "res.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10000


def test_cli_merges_several_files(tmp_path, doc):
    a = dict(doc, cells=doc["cells"][:2])
    b = dict(doc, cells=doc["cells"][2:])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    subprocess.run([sys.executable, os.path.join(EXP, "report.py"), str(pa), str(pb), "--no-plot",
                    "--md", str(tmp_path / "x.md")], check=True, capture_output=True)
    md = (tmp_path / "x.md").read_text()
    assert md.count("| 10240 × 64 |") == 3 and md.count("| 1024 × 128 |") == 2
    assert not (tmp_path / "a.png").exists()


def test_prefill_only_overhead_and_fragmented_state_kept_apart(doc):
    alone = _cell("prefill_only", 10240, [1500.0, 1600.0, 1700.0], 0)
    alone["output_len"] = 1
    frag = dict(_cell("shim", 10240, [2600.0, 2800.0], 0.5), state="fragmented")
    merged = results.merge_results([doc, {"cells": [alone, frag]}])
    # a fragmented cell never merges into the fresh one of the same config
    shim = [c for c in merged["cells"] if c["config"] == "shim" and c["input_len"] == 10240]
    assert sorted(len(c["mean_ttft_ms"]) for c in shim) == [2, 3]
    rows = {(r["input_len"], r["config"]): r for r in report.rows(merged)}
    assert rows[(10240, "shim")]["overhead_ms"] == pytest.approx(2200.0 - 1600.0)
    assert rows[(10240, "stock")]["overhead_ms"] == pytest.approx(5000.0 - 1600.0)
    assert rows[(10240, "prefill_only")]["overhead_ms"] is None and rows[(10240, "prefill_only")]["ratio"] is None
    # no fragmented prefill_only or stock cell: no overhead and no ratio for the fragmented shim
    assert rows[(10240, "shim [fragmented]")]["overhead_ms"] is None
    assert rows[(10240, "shim [fragmented]")]["ratio"] is None
    assert rows[(10240, "shim [fragmented]")]["avg_descriptors_per_transfer"] == pytest.approx(320.0)
    md = report.markdown(merged)
    assert "- 10240 tokens, shim: 600 ms" in md and "stock/prefill_only" not in md


def test_wire_time_printed_next_to_the_xfer_time(doc):
    # a cell with D's xfer time; the wire copy moved 1.09 GiB (1120 MiB) in 3 ms
    doc["cells"][0]["kv_xfer"] = {"avg_xfer_ms": [15.0, 18.0, 15.0], "avg_mb_per_transfer": [1120.0] * 3}
    wire = {"bytes": 1120 * 2 ** 20, "median_ms": 3.0, "min_ms": 2.9, "max_ms": 3.1, "reps": 20, "gb_s": 391.0,
            "gpus": ["NVIDIA H200", "NVIDIA H200"]}
    assert report.wire_ms_for(wire, 560.0) == pytest.approx(1.5)
    assert report.wire_ms_for(None, 560.0) is None and report.wire_ms_for(wire, None) is None
    md = report.markdown(doc, wire)
    assert "- 10240 tokens, shim: 640.0 descriptors, 16.0 ms (wire for its 1120 MiB: 3.0 ms; xfer = 5.3× the wire)" in md
    assert "in 3.00 ms median (2.90–3.10 over 20 copies), 391 GB/s" in md
    # without the wire file: the same line, no wire figure
    assert "- 10240 tokens, shim: 640.0 descriptors, 16.0 ms\n" in report.markdown(doc)


def test_prefill_only_has_no_itl(doc):
    alone = dict(_cell("prefill_only", 10240, [1500.0], 0), output_len=1)
    rows = {r["config"]: r for r in report.rows({"cells": doc["cells"] + [alone]}) if r["input_len"] == 10240}
    assert rows["prefill_only"]["itl"] is None and rows["shim"]["itl"]["mean"] == pytest.approx(20.0)


def test_proxy_split_of_the_ttft(doc):
    runs = [{"_run_id": "s-%d" % i, "mean_ttft_ms": 1800.0, "completed": 64, "failed": 0} for i in range(2)]
    px = [{"n": 64, "prefill_ms_mean": 1600.0, "decode_first_ms_mean": 190.0},
          {"n": 64, "prefill_ms_mean": 1620.0, "decode_first_ms_mean": 210.0}]
    cell = results.cell_from_runs("shim", 10240, 16, 64, runs, [None, None], [], QWEN3_BLOCK, px)
    assert cell["proxy_prefill_ms"] == [1600.0, 1620.0] and cell["avg_proxy_decode_first_ms"] == pytest.approx(200.0)
    # a repetition without the proxy's numbers (an older proxy, a failed GET) stays None
    cell2 = results.cell_from_runs("stock", 10240, 16, 64, runs, [None, None], [], QWEN3_BLOCK, [px[0], None])
    assert cell2["proxy_decode_first_ms"] == [190.0, None] and cell2["avg_proxy_decode_first_ms"] == 190.0
    md = report.markdown({"cells": [cell, cell2]})
    assert "- 10240 tokens, shim: P's answer 1610 ms, then D's first byte 200 ms" in md
    # merging keeps the split per repetition
    more = results.cell_from_runs("shim", 10240, 16, 64, [dict(runs[0], _run_id="s-9")], [None], [], QWEN3_BLOCK,
                                  [{"prefill_ms_mean": 1700.0, "decode_first_ms_mean": 300.0}])
    merged = results.merge_results([{"cells": [cell]}, {"cells": [more]}])["cells"][0]
    assert merged["proxy_decode_first_ms"] == [190.0, 210.0, 300.0]
    assert merged["avg_proxy_decode_first_ms"] == pytest.approx(700.0 / 3)


def _traced_cell(config, conc, ttfts, part_means, subs=None):
    """A P/D cell whose repetitions carry the handoff trace's summary (pdtools/handoff.py's)."""
    runs = [{"_run_id": "%s-%d" % (config, i), "mean_ttft_ms": t, "completed": 10, "failed": 0}
            for i, t in enumerate(ttfts)]
    px = []
    for i, t in enumerate(ttfts):
        h = {"requests": 10, "complete": 10, "problems": [],
             "parts_ms": {k: ({"mean": v + i, "p50": v + 2 * i} if v >= 1 else {"mean": v, "p50": v})
                          for k, v in part_means.items()}}
        if subs:
            h["subparts_ms"] = {k: {"mean": v, "p50": v} for k, v in subs.items()}
        px.append({"handoff": h})
    cell = results.cell_from_runs(config, 10240, 16, 10, runs, [None] * len(runs), [], QWEN3_BLOCK, px)
    cell["max_concurrency"] = conc
    return cell


def test_handoff_table_means_p50s_and_the_overhead_over_prefill_alone():
    parts = dict(proxy_to_p=0.01, p_admission=24.0, p_prefill=60.0, p_answer=30.0, proxy_to_d=0.02,
                 d_admission=24.0, d_alloc=0.5, d_dispatch=0.6, transfer=4.0, d_notice=1.7, d_first_token=70.0)
    shim = _traced_cell("shim", 1, [220.0, 230.0, 240.0], parts, dict(d_to_run=2.0, d_forward=40.0, d_frontend=28.0))
    alone = _traced_cell("prefill_only", 1, [100.0, 110.0], {})
    for c in (alone,):
        c["handoff_trace"] = [None, None]
    rows = report.handoff_rows({"cells": [alone, shim]})
    assert [r["config"] for r in rows] == ["shim"]      # prefill_only has no split
    r = rows[0]
    assert r["over_alone_ms"] == pytest.approx(230.0 - 105.0) and (r["reps"], r["requests"]) == (3, 30)
    assert r["parts"]["d_first_token"] == {"mean": pytest.approx(71.0), "p50": pytest.approx(72.0)}
    md = report.handoff_markdown({"cells": [alone, shim]})
    line = [l for l in md.splitlines() if l.startswith("| 10240 × c1 | shim |")][0]
    assert "| 3 (30) | 230 ± 10 | +125 (alone 105) |" in line and "| 71.0 (72.0) |" in line
    assert "not shown: proxy_to_p, proxy_to_d" in md                 # under 0.5 ms everywhere
    assert "| 10240 × c1 | shim | 2.0 (2.0) | 40.0 (40.0) | 28.0 (28.0) |" in md
    assert "handoff split" in report.markdown({"cells": [alone, shim]})
    assert report.handoff_markdown({"cells": [alone]}) == ""
    # a fragmented cell is not compared with a fresh prefill alone (report.rows' rule)
    frag = dict(shim, state="fragmented")
    assert report.handoff_rows({"cells": [alone, frag]})[0]["over_alone_ms"] is None


def test_client_proxy_hop_is_the_clients_ttft_beyond_the_proxys_total():
    parts = dict(p_admission=24.0, p_prefill=60.0, p_answer=30.0, d_admission=24.0, transfer=4.0, d_first_token=70.0)
    shim = _traced_cell("shim", 64, [1600.0, 1500.0], parts)
    for h, total in zip(shim["handoff_trace"], (1520.0, 1450.0)):
        h["total_ms"] = {"mean": total, "p50": total}
    [row] = report.client_hop_rows({"cells": [shim]})
    assert row["per_rep"] == [pytest.approx(80.0), pytest.approx(50.0)] and row["mean"] == pytest.approx(65.0)
    assert "- 10240 × c64, shim: 65.0 (80.0, 50.0)" in report.handoff_markdown({"cells": [shim]})
    # a repetition without the proxy's total (another router): no row, rather than a mean of the others
    shim["handoff_trace"][1].pop("total_ms")
    assert report.client_hop_rows({"cells": [shim]}) == []
    assert "client <-> proxy" not in report.handoff_markdown({"cells": [shim]})


def test_a_config_with_the_detok_switch_is_compared_with_prefill_alone_with_it():
    """XLKV_DETOK_TAIL also shortens P's own answer, so shim-detok's overhead is over prefill_only-detok (P alone with
    the switch) and the shim's over prefill_only; neither falls back to the other's prefill alone."""
    parts = dict(p_answer=3.0, d_first_token=55.0)
    shim, detok = _traced_cell("shim", 1, [216.0], parts), _traced_cell("shim-detok", 1, [167.0], parts)
    alone, alone_d = _traced_cell("prefill_only", 1, [103.0], {}), _traced_cell("prefill_only-detok", 1, [81.0], {})
    for c in (alone, alone_d):
        c["handoff_trace"] = [None]
    got = {r["config"]: r["over_alone_ms"] for r in report.handoff_rows({"cells": [alone, alone_d, shim, detok]})}
    assert got == {"shim": pytest.approx(216.0 - 103.0), "shim-detok": pytest.approx(167.0 - 81.0)}
    rows = {r["config"]: r for r in report.rows({"cells": [alone, alone_d, shim, detok]})}
    assert rows["shim-detok [c1]"]["overhead_ms"] == pytest.approx(86.0)
    assert rows["prefill_only-detok [c1]"]["overhead_ms"] is None and rows["prefill_only-detok [c1]"]["itl"] is None
    # without prefill_only-detok in the run, shim-detok has no overhead (not the stock prefill alone's)
    got = {r["config"]: r["over_alone_ms"] for r in report.handoff_rows({"cells": [alone, shim, detok]})}
    assert got["shim-detok"] is None and got["shim"] == pytest.approx(113.0)
    assert configs.alone_for("shim-ids-detok") == "prefill_only-detok" and configs.alone_for("native") == "prefill_only"
    assert configs.is_alone("prefill_only-detok") and not configs.is_alone("shim-detok")


def test_the_shim_check_is_asked_once_per_job_environment(monkeypatch, tmp_path):
    """configs.shim_supported imports vLLM in a child (about 24 s on a GPU machine): a job with several shim
    configs asks once for the same interpreter, release and environment, and again for another environment."""
    calls = []

    class Done:
        returncode, stdout, stderr = 0, json.dumps({"supported": True, "patch_sets": [
            {"applies": True, "patches": [{"ok": True}]}]}), ""

    def fake_run(cmd, **kw):
        calls.append((cmd, kw["env"].get("ENABLE_XLKV"), kw["env"].get("XLKV_X")))
        return Done()

    monkeypatch.setattr(configs.subprocess, "run", fake_run)
    monkeypatch.setattr(configs, "_SHIM_ANSWERS", {})
    settings = {"PY": "py-%s" % tmp_path.name}
    for _ in range(3):
        assert configs.shim_supported("0.33.0", settings, {"XLKV_X": "1"}) == (True, "")
    assert len(calls) == 1 and calls[0][1] == "true", calls
    assert configs.shim_supported("0.33.0", settings, {"XLKV_X": "2"}) == (True, "")
    assert len(calls) == 2, calls
    # a variable status does not read (a shell's, or the device's per-call $OUT) is not another environment
    assert configs.shim_supported("0.33.0", settings, {"XLKV_X": "2", "OUT": "/tmp/out-2"}) == (True, "")
    assert len(calls) == 2, calls


def test_a_supported_answer_is_kept_in_work_for_the_next_job_with_the_same_shim(monkeypatch, tmp_path):
    """The 2026-11-27 21:35 lease asked the shim's status once per device call (19-29 s each): a "supported"
    answer is kept in WORK, so the next job (a new process, the same warm machine) does not ask again; a
    changed shim file, another release or a refusal is asked again."""
    calls = []
    answer = {"supported": True}

    class Done:
        returncode, stderr = 0, ""

        @property
        def stdout(self):
            return json.dumps({"supported": answer["supported"], "patch_sets": [
                {"applies": True, "patches": [{"ok": True}]}]})

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return Done()

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(configs.subprocess, "run", fake_run)
    monkeypatch.setattr(configs, "SHIM_TREE", [str(shim)])
    settings = {"PY": "py", "WORK": str(tmp_path / "work")}

    def new_job():
        monkeypatch.setattr(configs, "_SHIM_ANSWERS", {})

    new_job()
    assert configs.shim_supported("0.33.0", settings, {"X": "1"}) == (True, "")
    assert len(calls) == 1
    new_job()                                   # the next device call's job, with its own $OUT folder
    assert configs.shim_supported("0.33.0", settings, {"X": "1", "OUT": "/tmp/out-call-2"}) == (True, "")
    assert len(calls) == 1, "a kept answer was asked again"
    new_job()
    assert configs.shim_supported("0.29.0", settings, {"X": "1"}) == (True, "")
    assert len(calls) == 2, "another release must be asked"
    (shim / "a.py").write_text("x = 2\n")      # the shim changed between calls
    new_job()
    assert configs.shim_supported("0.33.0", settings, {"X": "1"}) == (True, "")
    assert len(calls) == 3, "a changed shim must be asked again"
    (shim / "a.py").write_text("x = 3\n")
    answer["supported"] = False                 # a refusal is not kept
    for _ in range(2):
        new_job()
        ok, why = configs.shim_supported("0.33.0", settings, {"X": "1"})
        assert not ok and "does not support" in why
    assert len(calls) == 7, calls              # each refusal: status --json, then status for the message
    new_job()
    assert configs.shim_supported("0.33.0", dict(settings, WORK=None), {"X": "1"})[0] is False
