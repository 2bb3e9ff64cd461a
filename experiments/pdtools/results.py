"""Results JSON of the benchmark: cells (one per config x length), idempotent merging, GPU tags."""

import json
import os
import re
import statistics
import sys
import time

from .kvmetrics import kv_summary

#: max_concurrency: the client's --max-concurrency (CONCURRENCY); None (older cells too) = unlimited
CELL_KEY = ("config", "input_len", "output_len", "num_prompts", "state", "max_concurrency")
PER_REP = ("run_ids", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
           "mean_tpot_ms", "median_tpot_ms", "total_tok_s",
           "completed", "failed", "descriptors_per_transfer", "descriptors_per_block_reps",
           "proxy_prefill_ms", "proxy_decode_first_ms", "d_ttft_ms", "d_queue_ms", "d_prefill_ms",
           "handoff_trace", "frontend")


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def cell_from_runs(config, input_len, output_len, num_prompts, runs, kvs, commands, bytes_per_block, proxies=None):
    """One results cell from per-repetition bench results, KV stats and the proxy's split of
    each repetition's time (pd_proxy.py /timings: mean ms of P's answer and of D's first byte)."""
    cell = {"config": config, "input_len": input_len, "output_len": output_len, "num_prompts": num_prompts,
            "kv_xfer": {"num_transfers": [], "avg_xfer_ms": [], "avg_mb_per_transfer": [],
                        "blocks_per_transfer": [], "throughput_mb_s": [], "source": []},
            "commands": list(commands)}
    for k in PER_REP:
        cell[k] = []
    proxies = list(proxies or []) + [None] * len(runs)
    for i, (r, kv) in enumerate(zip(runs, kvs)):
        px = proxies[i] or {}
        cell["proxy_prefill_ms"].append(px.get("prefill_ms_mean"))
        cell["proxy_decode_first_ms"].append(px.get("decode_first_ms_mean"))
        cell["handoff_trace"].append(px.get("handoff"))  # HANDOFF_TRACE=1: per-request split (pdtools/handoff.py)
        cell["frontend"].append(px.get("frontend"))      # Dynamo's frontend: its timing histograms over the rep
        cell["run_ids"].append(r.get("_run_id") or "%s-%d" % (r.get("date", time.strftime("%Y%m%d-%H%M%S")), i))
        cell["mean_ttft_ms"].append(r.get("mean_ttft_ms"))
        cell["median_ttft_ms"].append(r.get("median_ttft_ms"))
        cell["p99_ttft_ms"].append(r.get("p99_ttft_ms"))
        for k in ("mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms", "median_tpot_ms"):
            cell[k].append(r.get(k))           # decode speed
        cell["total_tok_s"].append(r.get("total_token_throughput"))
        cell["completed"].append(r.get("completed"))
        cell["failed"].append(r.get("failed", (num_prompts - r["completed"]) if r.get("completed") is not None else None))
        # the bytes per block (id) the kv-run used (D's registration report) win over the argument
        kv = kv_summary(kv or {}, (kv or {}).get("bytes_per_block") or bytes_per_block)
        if kv.get("bytes_per_block_source"):
            cell["bytes_per_block_source"] = kv["bytes_per_block_source"]
        cell["descriptors_per_transfer"].append(kv.get("avg_descriptors_per_transfer"))
        cell["descriptors_per_block_reps"].append(kv.get("descriptors_per_block"))
        for k in ("num_transfers", "avg_xfer_ms", "avg_mb_per_transfer", "blocks_per_transfer", "throughput_mb_s"):
            cell["kv_xfer"][k].append(kv.get(k))
        cell["kv_xfer"]["source"].append(kv.get("source"))
        for k in ("d_ttft_ms", "d_queue_ms", "d_prefill_ms"):
            cell[k].append(kv.get(k))
    _finish_cell(cell)
    return cell


def _finish_cell(cell):
    """Derived single numbers of a cell (recomputed after merges)."""
    cell["reps"] = len(cell["mean_ttft_ms"])
    cell["descriptors_per_block"] = _median(cell.get("descriptors_per_block_reps", []))
    ttft = [x for x in cell["mean_ttft_ms"] if x is not None]
    cell["mean_ttft_ms_mean"] = statistics.mean(ttft) if ttft else None
    cell["mean_ttft_ms_std"] = statistics.stdev(ttft) if len(ttft) > 1 else 0.0 if ttft else None
    # issue-14 view: what D's KV metrics say per transfer, averaged over the repetitions
    dpt = [x for x in cell.get("descriptors_per_transfer", []) if x is not None]
    xfer = [x for x in (cell.get("kv_xfer") or {}).get("avg_xfer_ms", []) if x is not None]
    cell["avg_descriptors_per_transfer"] = statistics.mean(dpt) if dpt else None
    cell["avg_xfer_ms"] = statistics.mean(xfer) if xfer else None
    for k in ("proxy_prefill_ms", "proxy_decode_first_ms", "d_ttft_ms", "d_queue_ms", "d_prefill_ms"):
        xs = [x for x in cell.get(k, []) if x is not None]
        cell["avg_" + k] = statistics.mean(xs) if xs else None
    cell["handoff_split_ms"] = handoff_split(cell)
    return cell


def handoff_split(cell):
    """Where a P/D request's time goes, mean ms per part (None for a cell that lacks the numbers,
    e.g. prefill_only): P's answer at the proxy, then D's part of TTFT split by D's own request
    metrics and NIXL's transfer time.  The parts after p_answer add up to the proxy's D time.
      p_answer         the proxy sends to P .. P's answer (prefill on P)
      d_frontend       the proxy sends to D .. D's API server has the request (the proxy's D time
                       minus D's own TTFT, which starts at arrival)
      d_ingress        arrival .. queued in D's engine (tokenising, the hop to the engine core:
                       D's TTFT minus its queue and prefill times)
      d_queue          queued in D's engine .. first scheduled (admission, blocks, read posted)
      kv_read          NIXL's transfer time (post .. vLLM's check sees it done)
      d_notice_first_token  first scheduled .. first token, less kv_read (the finished read
                       noticed by D's step loop, the last prompt token computed)"""
    pa, pd = cell.get("avg_proxy_prefill_ms"), cell.get("avg_proxy_decode_first_ms")
    ttft, queue, prefill = cell.get("avg_d_ttft_ms"), cell.get("avg_d_queue_ms"), cell.get("avg_d_prefill_ms")
    xfer = cell.get("avg_xfer_ms")
    if None in (pa, pd, ttft, queue, prefill):
        return None
    parts = {"p_answer": pa, "d_frontend": pd - ttft, "d_ingress": ttft - queue - prefill, "d_queue": queue}
    if xfer is not None:
        parts.update(kv_read=xfer, d_notice_first_token=prefill - xfer)
    else:
        parts["d_read_notice_first_token"] = prefill
    return {k: round(v, 3) for k, v in parts.items()}


def cell_key(cell):
    # cells written before bench states existed were all measured fresh
    return tuple((cell.get(k) or "fresh") if k == "state" else cell.get(k) for k in CELL_KEY)


def merge_results(docs):
    """Merge results documents.  Cells with the same key get the repetitions they lack
    (by run id), so merging the same file twice changes nothing."""
    if not docs:
        raise ValueError("nothing to merge")
    out = {"cells": [], "commands": []}
    index = {}
    for d in docs:
        if "cells" in d:  # a results document: keep its top-level fields (first one wins)
            for k, v in d.items():
                if k not in ("cells", "commands", "equivalence_pass", "descriptor_pass", "warnings"):
                    out.setdefault(k, v)
        for k in ("vllm_version", "gpu"):
            if out.get(k) and d.get(k) and out[k] != d[k]:
                out.setdefault("warnings", []).append("merged %s %r with %r" % (k, out[k], d[k]))
            elif d.get(k):
                out.setdefault(k, d[k])
        for k in ("equivalence_pass", "descriptor_pass"):
            # results files and equivalence summaries both carry these; one failure fails all
            if d.get(k) is not None:
                prev = out.get(k)
                out[k] = d[k] if prev is None else bool(prev and d[k])
        for c in d.get("commands", []):
            if c not in out["commands"]:
                out["commands"].append(c)
        for cell in d.get("cells", []):
            key = cell_key(cell)
            if key not in index:
                new = json.loads(json.dumps(cell))
                index[key] = new
                out["cells"].append(new)
                continue
            tgt = index[key]
            have = set(tgt.get("run_ids", []))
            for i, rid in enumerate(cell.get("run_ids", [])):
                if rid in have:
                    continue
                have.add(rid)
                for k in PER_REP:   # every list stays aligned with run_ids (older files lack keys)
                    lst = tgt.setdefault(k, [])
                    lst.extend([None] * (len(tgt["run_ids"]) - (k != "run_ids") - len(lst)))
                    lst.append(cell[k][i] if k in cell and i < len(cell[k]) else None)
                for k, v in cell.get("kv_xfer", {}).items():
                    if isinstance(v, list):
                        tgt.setdefault("kv_xfer", {}).setdefault(k, []).append(v[i] if i < len(v) else None)
            for c in cell.get("commands", []):
                if c not in tgt.setdefault("commands", []):
                    tgt["commands"].append(c)
            _finish_cell(tgt)
    out["cells"].sort(key=lambda c: (c.get("input_len") or 0, str(c.get("config"))))
    out.setdefault("equivalence_pass", None)  # always present: null = no equivalence run given
    return out


def gpu_slug(names):
    """["NVIDIA H200", "NVIDIA H200"] -> "2xH200"; mixed names joined with '+'."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        return "cpu"
    short = [re.sub(r"[^A-Za-z0-9]+", "-", n.replace("NVIDIA", "").strip()).strip("-") or "gpu" for n in names]
    groups = []
    for s in short:
        if groups and groups[-1][0] == s:
            groups[-1][1] += 1
        else:
            groups.append([s, 1])
    return "+".join("%dx%s" % (c, s) for s, c in groups)


def _load_json(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def bench_cell_to_file(out, config, input_len, output_len, num_prompts, result_files, kvs, proxy_files,
                       commands_file, bytes_per_block, vllm_version, gpu, equivalence, run_prefix, meta=None):
    """One results cell from the repetitions' `vllm bench serve` result files, their KV stats
    (dicts or None) and the proxy's /timings files, merged into ``out`` (several calls on one
    machine accumulate in one file; repeated cells gain repetitions).  ``equivalence``: the
    summary of this machine and release, for equivalence_pass.  Prints the cell's line."""
    runs = []
    for path in result_files:
        r = json.load(open(path))
        r["_run_id"] = "%s-%s" % (run_prefix, os.path.basename(path))
        runs.append(r)
    kvs = list(kvs) + [None] * (len(runs) - len(kvs))
    proxies = [_load_json(p) for p in proxy_files]  # cell_from_runs pads a short list with None
    commands = [l.rstrip("\n") for l in open(commands_file)] if commands_file else []
    cell = cell_from_runs(config, input_len, output_len, num_prompts, runs, kvs, commands, bytes_per_block, proxies)
    if meta:
        cell.update(meta)
    doc = {"vllm_version": vllm_version, "gpu": gpu, "equivalence_pass": None, "cells": [cell],
           "commands": commands}
    eq = _load_json(equivalence)
    if eq is not None:
        if eq.get("vllm_version") in (None, vllm_version) and eq.get("gpu") in (None, gpu):
            doc["equivalence_pass"] = eq.get("equivalence_pass")
            doc["descriptor_pass"] = eq.get("descriptor_pass")
            doc["equivalence_file"] = os.path.basename(equivalence)
        else:
            print("equivalence file %s is for vLLM %s on %s, not this run: ignored"
                  % (equivalence, eq.get("vllm_version"), eq.get("gpu")), file=sys.stderr)
    if os.path.exists(out):
        doc = merge_results([json.load(open(out)), doc])
    tmp = out + ".tmp"
    json.dump(doc, open(tmp, "w"), indent=1, sort_keys=True)
    os.replace(tmp, out)
    c = [x for x in doc["cells"] if cell_key(x) == cell_key(cell)][0]
    print("cell %s L=%s: mean TTFT per rep %s ms, desc/block %s" % (
        config, input_len, ["%.0f" % x for x in c["mean_ttft_ms"] if x is not None], c["descriptors_per_block"]),
        flush=True)
    if c.get("handoff_split_ms"):
        print("  handoff split (mean ms): " + ", ".join("%s %.1f" % kv for kv in c["handoff_split_ms"].items()))
    return doc
