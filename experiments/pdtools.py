#!/usr/bin/env python3
"""Helpers for the P/D experiment scripts (standard library only; numpy-free on purpose).

The shell scripts in this folder call this file as a command line tool; the unit tests in
``tests/experiments`` import it.  Everything here runs without a GPU.

Sub-commands (``python3 pdtools.py <cmd> --help``):

  prompt          print one deterministic word-level prompt (for manual checks)
  equiv-run       send the fixed greedy prompts to one endpoint, write the token ids (JSON)
  equiv-summary   compare the token ids of several runs, check descriptors, write the summary JSON
  kvstats         aggregate vLLM's "KV Transfer metrics: ..." log lines (optionally from a byte offset)
  prom            scrape a Prometheus /metrics endpoint into a small JSON of the NIXL counters
  bench-cell      turn `vllm bench serve` result files + KV stats into one results cell
  merge           merge results JSON files (cells of the same key gain repetitions, idempotently)
  block-bytes     bytes of one KV block (all layers, K and V) for a model directory
  gpu-slug        turn `nvidia-smi` GPU names into a short file-name tag ("2xH200")

Background on the numbers (read from vLLM 0.21.0 / 0.26.0 sources):

* ``vllm/distributed/kv_transfer/kv_connector/v1/metrics.py`` logs
  ``"KV Transfer metrics: %s"`` with ``", ".join(f"{k}={v}" ...)`` of
  ``NixlKVConnectorStats.reduce()`` (``.../nixl/stats.py``): Num successful transfers,
  Avg/P90 xfer time (ms), Avg/P90 post time (ms), Avg MB per transfer (MiB, 2**20),
  Throughput (MB/s), Avg number of descriptors.  The line is printed by the decode
  instance (the side that reads) once per ``VLLM_LOG_STATS_INTERVAL`` with the transfers
  of that interval only, so a run's numbers are the transfer-weighted mean of its lines.
* Blocks per transfer are not logged.  They follow from the bytes: one block of a dense
  model holds ``block_size * layers * 2 (K,V) * kv_heads * head_dim * dtype_bytes`` bytes
  (1.75 MiB for the Qwen3-0.6B shape at block 16), divided over tensor-parallel ranks.
  Descriptors per block = (avg descriptors per transfer) / (avg blocks per transfer).
* The same counters exist as Prometheus histograms on the decode instance:
  ``vllm:nixl_num_descriptors`` and ``vllm:nixl_bytes_transferred`` (``_sum``/``_count``).
"""

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import time
import urllib.error
import urllib.request

# ----------------------------------------------------------------------------------------
# Deterministic prompts from the word-level vocabulary (w2 .. w31999)
# ----------------------------------------------------------------------------------------
VOCAB_LO, VOCAB_HI = 2, 31999  # inclusive; ids 0/1 are <unk>/<eos>
MASK64 = (1 << 64) - 1


def _mix64(x):
    """SplitMix64 finaliser: a fixed, platform-independent integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def prompt_ids(n_tokens, seed=0):
    """Token ids of a prompt of ``n_tokens`` words; same (n, seed) -> same ids, everywhere."""
    if n_tokens < 1:
        raise ValueError("a prompt needs at least one token")
    span = VOCAB_HI - VOCAB_LO + 1
    base = _mix64(seed * 1_000_003 + n_tokens)
    return [VOCAB_LO + _mix64(base + i) % span for i in range(n_tokens)]


def prompt_text(n_tokens, seed=0):
    """The prompt as text: ``"w123 w4567 ..."``; the word-level tokenizer maps word k to id k."""
    return " ".join("w%d" % i for i in prompt_ids(n_tokens, seed))


DEFAULT_EQ_LENGTHS = (5, 17, 100, 1000, 2049, 4097)

# ----------------------------------------------------------------------------------------
# Small HTTP client (stdlib; the GPU image has requests/httpx too, but nothing is needed)
# ----------------------------------------------------------------------------------------


def http_json(url, body=None, timeout=600.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        raise RuntimeError("HTTP %s from %s: %s" % (e.code, url, detail)) from None


def http_text(url, timeout=30.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode(errors="replace")


# ----------------------------------------------------------------------------------------
# Greedy runs for the equivalence check
# ----------------------------------------------------------------------------------------


def _extract_token_ids(choice):
    """Generated token ids from a completions choice, by whatever the release returns.

    Preferred: ``token_ids`` (``return_token_ids``, vLLM >= 0.10).  Fallback: logprobs
    tokens rendered as ``token_id:<id>`` (``return_tokens_as_token_ids``).  None if neither.
    """
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]], "return_token_ids"
    lp = choice.get("logprobs") or {}
    toks = lp.get("tokens")
    if toks and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        return [int(t.split(":", 1)[1]) for t in toks], "logprobs_token_ids"
    return None, None


def greedy_request(url, model, n_tokens, max_tokens, seed=0, timeout=600.0):
    """One greedy completion; returns a dict with token ids (or text as last resort)."""
    body = {
        "model": model,
        "prompt": prompt_text(n_tokens, seed),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    t0 = time.time()
    resp = http_json(url, body, timeout=timeout)
    choice = resp["choices"][0]
    ids, method = _extract_token_ids(choice)
    if ids is None:  # older release: ask for logprobs with ids spelled out
        body.pop("return_token_ids")
        body.update(logprobs=1, return_tokens_as_token_ids=True)
        resp = http_json(url, body, timeout=timeout)
        choice = resp["choices"][0]
        ids, method = _extract_token_ids(choice)
    out = {
        "prompt_len": n_tokens,
        "seed": seed,
        "method": method or "text",
        "token_ids": ids,
        "text": choice.get("text"),
        "prompt_token_count": len(choice["prompt_token_ids"]) if choice.get("prompt_token_ids") else None,
        "usage": resp.get("usage"),
        "seconds": round(time.time() - t0, 3),
    }
    return out


def equiv_run(url, model, lengths, max_tokens, seed=0):
    return [greedy_request(url, model, n, max_tokens, seed) for n in lengths]


def outputs_key(rec):
    """What must be byte-identical: the token ids when known, the text otherwise."""
    return rec["token_ids"] if rec.get("token_ids") is not None else rec.get("text")


def compare_runs(baseline, other):
    """List of mismatch descriptions between two equiv-run result lists (empty = identical)."""
    problems = []
    if len(baseline) != len(other):
        problems.append("different number of prompts: %d vs %d" % (len(baseline), len(other)))
    for a, b in zip(baseline, other):
        if a["prompt_len"] != b["prompt_len"]:
            problems.append("prompt order differs: %s vs %s" % (a["prompt_len"], b["prompt_len"]))
            continue
        ka, kb = outputs_key(a), outputs_key(b)
        if ka is None or kb is None:
            problems.append("len %d: missing output" % a["prompt_len"])
        elif json.dumps(ka) != json.dumps(kb):
            first = next((i for i, (x, y) in enumerate(zip(ka, kb)) if x != y), min(len(ka), len(kb)))
            problems.append("len %d: first difference at output position %d" % (a["prompt_len"], first))
    return problems


# ----------------------------------------------------------------------------------------
# KV transfer metrics: log lines and Prometheus
# ----------------------------------------------------------------------------------------
KV_LINE_RE = re.compile(r"KV Transfer metrics: (.*)$")
# Keys are free text with spaces and parentheses; values are numbers. Split on ", " that
# is followed by a key and "=".
_KV_PAIR_RE = re.compile(r"\s*([^=,][^=]*?)=([-+0-9.eEinfaN]+)\s*(?:,|$)")

KEY_N = "Num successful transfers"
KEY_XFER = "Avg xfer time (ms)"
KEY_P90 = "P90 xfer time (ms)"
KEY_POST = "Avg post time (ms)"
KEY_MB = "Avg MB per transfer"
KEY_TPUT = "Throughput (MB/s)"
KEY_DESC = "Avg number of descriptors"


def parse_kv_line(line):
    """Dict of the numbers in one "KV Transfer metrics:" line, or None if it is not one."""
    m = KV_LINE_RE.search(line.rstrip("\n"))
    if not m:
        return None
    out = {}
    for k, v in _KV_PAIR_RE.findall(m.group(1)):
        try:
            num = float(v)
        except ValueError:
            continue
        out[k.strip()] = int(num) if num.is_integer() and k.strip() == KEY_N else num
    return out if KEY_N in out else None


def read_kv_lines(path, offset=0):
    """Parsed KV metrics lines of a log file, from byte ``offset`` on."""
    rows = []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            rec = parse_kv_line(raw.decode("utf-8", errors="replace"))
            if rec is not None:
                rows.append(rec)
    return rows


def aggregate_kv(rows):
    """Transfer-weighted aggregate of several interval lines (one benchmark run)."""
    rows = [r for r in rows if r.get(KEY_N, 0) > 0]
    n = sum(r[KEY_N] for r in rows)
    if n == 0:
        return {"num_transfers": 0, "lines": len(rows)}

    def wmean(key):
        vals = [(r[KEY_N], r[key]) for r in rows if key in r]
        tot = sum(w for w, _ in vals)
        return sum(w * v for w, v in vals) / tot if tot else None

    avg_mb = wmean(KEY_MB)
    avg_xfer = wmean(KEY_XFER)
    return {
        "num_transfers": n,
        "lines": len(rows),
        "avg_descriptors_per_transfer": wmean(KEY_DESC),
        "avg_mb_per_transfer": avg_mb,
        "avg_xfer_ms": avg_xfer,
        "max_p90_xfer_ms": max((r[KEY_P90] for r in rows if KEY_P90 in r), default=None),
        "avg_post_ms": wmean(KEY_POST),
        # total MiB over total transfer time, like vLLM's own Throughput field
        "throughput_mb_s": (avg_mb / (avg_xfer / 1e3)) if avg_mb and avg_xfer else None,
    }


_PROM_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaN]+)")
PROM_KEYS = {
    "vllm:nixl_num_descriptors_sum": "descriptors_sum",
    "vllm:nixl_num_descriptors_count": "transfers",
    "vllm:nixl_bytes_transferred_sum": "bytes_sum",
    "vllm:nixl_xfer_time_seconds_sum": "xfer_seconds_sum",
    "vllm:nixl_num_failed_transfers_total": "failed_transfers",
}


def parse_prom(text):
    """The NIXL counters of a Prometheus text page, summed over label sets (engines)."""
    out = {v: 0.0 for v in PROM_KEYS.values()}
    seen = False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _PROM_RE.match(line)
        if m and m.group(1) in PROM_KEYS:
            out[PROM_KEYS[m.group(1)]] += float(m.group(3))
            seen = True
    return out if seen else None


def prom_delta(before, after):
    """Counters of one run: after - before (None when the endpoint had no NIXL metrics)."""
    if not before or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n = d.get("transfers", 0)
    return {
        "num_transfers": int(round(n)),
        "avg_descriptors_per_transfer": d["descriptors_sum"] / n if n else None,
        "avg_mb_per_transfer": d["bytes_sum"] / n / 2**20 if n else None,
        "avg_xfer_ms": d["xfer_seconds_sum"] / n * 1e3 if n else None,
        "throughput_mb_s": d["bytes_sum"] / 2**20 / d["xfer_seconds_sum"] if n and d["xfer_seconds_sum"] else None,
        "failed_transfers": int(round(d.get("failed_transfers", 0))),
    }


# ----------------------------------------------------------------------------------------
# Descriptor-per-block arithmetic
# ----------------------------------------------------------------------------------------
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1, "fp8": 1}


def block_bytes(num_layers, num_kv_heads, head_dim, block_size=16, dtype_bytes=2, tp=1):
    """Bytes of one KV block over all layers (K and V) as one TP rank holds it."""
    heads = max(1, num_kv_heads // max(1, tp))
    return block_size * num_layers * 2 * heads * head_dim * dtype_bytes


def model_block_bytes(model_dir, block_size=16, tp=1, kv_dtype_bytes=None):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dt = kv_dtype_bytes or DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2)
    return block_bytes(cfg["num_hidden_layers"], cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                       head_dim, block_size, dt, tp)


def blocks_per_transfer(avg_mb_per_transfer, bytes_per_block):
    """Avg blocks per transfer from vLLM's "Avg MB per transfer" (MiB, rounded to 3 places)."""
    if not avg_mb_per_transfer or not bytes_per_block:
        return None
    return avg_mb_per_transfer * 2**20 / bytes_per_block


def descriptors_per_block(avg_descs, avg_blocks):
    if avg_descs is None or not avg_blocks:
        return None
    return avg_descs / avg_blocks


def blocks_for_prompt(n_tokens, block_size=16):
    """Blocks a single-request probe moves: every prompt block, the partial last one too."""
    return math.ceil(n_tokens / block_size)


def descriptor_limit(attn_backend):
    """What the shim promises: 1 descriptor per block on FLASH_ATTN (K and V in one block
    region), at most 2 elsewhere (K and V regions apart)."""
    return 1.0 if attn_backend and "FLASH_ATTN" in attn_backend.upper() and "MLA" not in attn_backend.upper() else 2.0


def kv_summary(kv, bytes_per_block):
    """Add blocks/descriptors-per-block to an aggregate_kv() or prom_delta() dict."""
    if not kv:
        return kv
    kv = dict(kv)
    b = blocks_per_transfer(kv.get("avg_mb_per_transfer"), bytes_per_block)
    kv["blocks_per_transfer"] = b
    kv["descriptors_per_block"] = descriptors_per_block(kv.get("avg_descriptors_per_transfer"), b)
    return kv


_BACKEND_RES = (
    re.compile(r"Using (\S+) attention backend out of potential backends"),
    re.compile(r"Using (\S+) backend\."),
)


def attention_backend(log_path):
    """Attention backend named in a vLLM server log ("FLASH_ATTN", ...), or None."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return None
    for rx in _BACKEND_RES:
        m = rx.findall(text)
        if m:
            return m[-1].split(".")[-1].strip("'\"")
    return None


# ----------------------------------------------------------------------------------------
# Results JSON: cells and merging
# ----------------------------------------------------------------------------------------
CELL_KEY = ("config", "input_len", "output_len", "num_prompts")
PER_REP = ("run_ids", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "total_tok_s",
           "completed", "failed", "descriptors_per_transfer", "descriptors_per_block_reps")


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def cell_from_runs(config, input_len, output_len, num_prompts, runs, kvs, commands, bytes_per_block):
    """One results cell from per-repetition bench results and KV stats."""
    cell = {"config": config, "input_len": input_len, "output_len": output_len, "num_prompts": num_prompts,
            "kv_xfer": {"num_transfers": [], "avg_xfer_ms": [], "avg_mb_per_transfer": [],
                        "blocks_per_transfer": [], "throughput_mb_s": [], "source": []},
            "commands": list(commands)}
    for k in PER_REP:
        cell[k] = []
    for i, (r, kv) in enumerate(zip(runs, kvs)):
        cell["run_ids"].append(r.get("_run_id") or "%s-%d" % (r.get("date", time.strftime("%Y%m%d-%H%M%S")), i))
        cell["mean_ttft_ms"].append(r.get("mean_ttft_ms"))
        cell["median_ttft_ms"].append(r.get("median_ttft_ms"))
        cell["p99_ttft_ms"].append(r.get("p99_ttft_ms"))
        cell["mean_itl_ms"].append(r.get("mean_itl_ms"))
        cell["total_tok_s"].append(r.get("total_token_throughput"))
        cell["completed"].append(r.get("completed"))
        cell["failed"].append(r.get("failed", (num_prompts - r["completed"]) if r.get("completed") is not None else None))
        kv = kv_summary(kv or {}, bytes_per_block)
        cell["descriptors_per_transfer"].append(kv.get("avg_descriptors_per_transfer"))
        cell["descriptors_per_block_reps"].append(kv.get("descriptors_per_block"))
        for k in ("num_transfers", "avg_xfer_ms", "avg_mb_per_transfer", "blocks_per_transfer", "throughput_mb_s"):
            cell["kv_xfer"][k].append(kv.get(k))
        cell["kv_xfer"]["source"].append(kv.get("source"))
    _finish_cell(cell)
    return cell


def _finish_cell(cell):
    """Derived single numbers of a cell (recomputed after merges)."""
    cell["reps"] = len(cell["mean_ttft_ms"])
    cell["descriptors_per_block"] = _median(cell.get("descriptors_per_block_reps", []))
    ttft = [x for x in cell["mean_ttft_ms"] if x is not None]
    cell["mean_ttft_ms_mean"] = statistics.mean(ttft) if ttft else None
    cell["mean_ttft_ms_std"] = statistics.stdev(ttft) if len(ttft) > 1 else 0.0 if ttft else None
    return cell


def cell_key(cell):
    return tuple(cell.get(k) for k in CELL_KEY)


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
                for k in PER_REP:
                    if k in cell:
                        tgt.setdefault(k, []).append(cell[k][i] if i < len(cell[k]) else None)
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


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def _lens(s):
    return [int(x) for x in re.split(r"[,\s]+", s.strip()) if x]


def cmd_equiv_run(a):
    res = equiv_run(a.url, a.model, _lens(a.lengths), a.max_tokens, a.seed)
    json.dump({"label": a.label, "url": a.url, "results": res}, open(a.out, "w"), indent=1)
    for r in res:
        print("  %-10s len=%-5d method=%s out=%s" % (a.label, r["prompt_len"], r["method"],
                                                    (r["token_ids"] or [])[:8]))
    bad = [r for r in res if r["prompt_token_count"] not in (None, r["prompt_len"])]
    if bad:
        print("WARNING: tokenizer gave other prompt lengths than intended: %s"
              % [(r["prompt_len"], r["prompt_token_count"]) for r in bad], file=sys.stderr)


def summarize_equivalence(runs, probes, lengths):
    """runs: {label: [results]} with 'local:<cfg>' / 'pd:<cfg>' labels; the first local run is
    the baseline.  probes: {cfg: {"kv": {...}, "backend": str}}.  Returns the summary dict."""
    labels = list(runs)
    base_label = next((l for l in labels if l.startswith("local:")), labels[0])
    base = runs[base_label]
    rows, mismatches = [], []
    for l in labels:
        probs = compare_runs(base, runs[l]) if l != base_label else []
        mismatches += ["%s vs %s: %s" % (l, base_label, p) for p in probs]
        rows.append({"label": l, "identical_to_baseline": not probs, "problems": probs,
                     "method": runs[l][0]["method"] if runs[l] else None})
    configs = {}
    desc_ok = True
    for cfg, p in probes.items():
        kv = p.get("kv") or {}
        limit = descriptor_limit(p.get("backend"))
        dpb = kv.get("descriptors_per_block")
        entry = {"attn_backend": p.get("backend"), "kv": kv, "descriptors_per_block": dpb,
                 "descriptors_per_transfer": kv.get("avg_descriptors_per_transfer"),
                 "blocks_per_transfer": kv.get("blocks_per_transfer")}
        if cfg == "shim":
            entry["limit"] = limit
            entry["descriptor_pass"] = dpb is not None and dpb <= limit + 0.05
            desc_ok = desc_ok and entry["descriptor_pass"]
        configs[cfg] = entry
    eq_ok = not mismatches and all(len(v) == len(lengths) for v in runs.values())
    # Second view: every P/D run against the stock P/D run.  When the P/D path itself differs
    # from local prefill (in stock vLLM too), this says whether a config changes anything
    # beyond what stock P/D already does.  It does not change equivalence_pass.
    pd_base = "pd:stock" if "pd:stock" in runs else None
    pd_vs_pd_stock = {}
    if pd_base:
        for l in labels:
            if l.startswith("pd:") and l != pd_base:
                pd_vs_pd_stock[l] = compare_runs(runs[pd_base], runs[l])
    token_ids = {l: {str(r["prompt_len"]): outputs_key(r) for r in runs[l]} for l in labels}
    return {"baseline": base_label, "prompt_lengths": list(lengths), "runs": rows, "mismatches": mismatches,
            "equivalence_pass": eq_ok, "descriptor_pass": desc_ok if "shim" in probes else None,
            "pd_baseline": pd_base, "pd_vs_pd_stock": pd_vs_pd_stock, "token_ids": token_ids,
            "configs": configs, "pass": bool(eq_ok and desc_ok)}


def render_equivalence(summary):
    lines = ["=" * 78, "P/D equivalence: greedy token ids, prompts of %s tokens" % summary["prompt_lengths"],
             "baseline = %s (local prefill on the decode instance)" % summary["baseline"]]
    if "batch_invariant" in summary:
        lines.append("kernels: %s" % ("VLLM_BATCH_INVARIANT=1 (deterministic)" if summary["batch_invariant"]
                                      else "vLLM defaults (VLLM_BATCH_INVARIANT unset)"))
    lines += ["-" * 78, "%-22s %-18s %s" % ("run", "vs baseline", "id method")]
    for r in summary["runs"]:
        lines.append("%-22s %-18s %s" % (r["label"], "baseline" if r["label"] == summary["baseline"]
                                         else ("IDENTICAL" if r["identical_to_baseline"] else "DIFFERENT"), r["method"]))
    lines += ["-" * 78, "%-10s %-12s %12s %12s %12s %s" % ("config", "backend", "desc/xfer", "blocks/xfer",
                                                            "desc/block", "check")]
    for cfg, c in summary["configs"].items():
        f = lambda x: "-" if x is None else "%.2f" % x
        chk = ("<= %g: %s" % (c["limit"], "PASS" if c["descriptor_pass"] else "FAIL")) if "limit" in c else "(info)"
        lines.append("%-10s %-12s %12s %12s %12s %s" % (cfg, c["attn_backend"] or "?", f(c["descriptors_per_transfer"]),
                                                        f(c["blocks_per_transfer"]), f(c["descriptors_per_block"]), chk))
    for m in summary["mismatches"][:10]:
        lines.append("MISMATCH " + m)
    for l, probs in (summary.get("pd_vs_pd_stock") or {}).items():
        lines.append("%s vs %s: %s" % (l, summary["pd_baseline"], "IDENTICAL" if not probs else "; ".join(probs[:3])))
    lines += ["-" * 78, "equivalence: %s   descriptors: %s   => %s" % (
        "PASS" if summary["equivalence_pass"] else "FAIL",
        {True: "PASS", False: "FAIL", None: "n/a (no shim run)"}[summary["descriptor_pass"]],
        "PASS" if summary["pass"] else "FAIL"), "=" * 78]
    return "\n".join(lines)


def cmd_equiv_summary(a):
    runs = {}
    for path in a.runs:
        d = json.load(open(path))
        runs[d["label"]] = d["results"]
    probes = {}
    for spec in a.probe:
        cfg, _, path = spec.partition("=")
        kv = _load_json(path)
        probes[cfg] = {"kv": kv, "backend": (kv or {}).get("attn_backend")}
    s = summarize_equivalence(runs, probes, _lens(a.lengths))
    if a.meta:
        s.update(json.loads(a.meta))
    json.dump(s, open(a.out, "w"), indent=1, sort_keys=True)
    print(render_equivalence(s))
    return 0 if s["pass"] else 1


def cmd_kvstats(a):
    rows = read_kv_lines(a.log, a.offset)
    kv = aggregate_kv(rows)
    kv["source"] = "log"
    if a.bytes_per_block:
        kv = kv_summary(kv, a.bytes_per_block)
    print(json.dumps(kv))


def kv_run(log_path, offset, prom_before, prom_after, bytes_per_block, backend=None):
    """KV numbers of one run: Prometheus deltas when D exports them (exact sums), the log
    lines after ``offset`` otherwise; both are kept for cross-checking."""
    kv_log = aggregate_kv(read_kv_lines(log_path, offset)) if log_path and os.path.exists(log_path) else None
    if kv_log is not None:
        kv_log["source"] = "log"
        kv_log = kv_summary(kv_log, bytes_per_block)
    kv_prom = prom_delta(prom_before, prom_after)
    if kv_prom is not None:
        kv_prom["source"] = "prom"
        kv_prom = kv_summary(kv_prom, bytes_per_block)
    if kv_prom and kv_prom.get("num_transfers"):
        chosen = dict(kv_prom)
    elif kv_log and kv_log.get("num_transfers"):
        chosen = dict(kv_log)
    else:
        chosen = {"num_transfers": 0, "source": None}
    chosen["bytes_per_block"] = bytes_per_block
    chosen["log"] = kv_log
    chosen["prom"] = kv_prom
    if backend:
        chosen["attn_backend"] = backend
    return chosen


def _load_json(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def cmd_kv_run(a):
    backend = attention_backend(a.backend_log) if a.backend_log else None
    kv = kv_run(a.log, a.offset, _load_json(a.prom_before), _load_json(a.prom_after), a.bytes_per_block, backend)
    if a.prompt_len:
        kv["blocks_expected"] = blocks_for_prompt(a.prompt_len, a.block_size)
        kv["descriptors_per_block_from_len"] = descriptors_per_block(
            kv.get("avg_descriptors_per_transfer"), kv["blocks_expected"])
    print(json.dumps(kv, sort_keys=True))


def cmd_prom(a):
    try:
        print(json.dumps(parse_prom(http_text(a.url))))
    except Exception as e:  # the caller treats null as "not available"
        print("null")
        print("prom scrape failed: %s" % e, file=sys.stderr)


def cmd_bench_cell(a):
    runs, kvs = [], []
    for i, path in enumerate(a.results):
        r = json.load(open(path))
        r["_run_id"] = "%s-%s" % (a.run_prefix, os.path.basename(path))
        runs.append(r)
    for path in a.kv:
        kvs.append(json.load(open(path)) if os.path.exists(path) else None)
    kvs += [None] * (len(runs) - len(kvs))
    commands = [l.rstrip("\n") for l in open(a.commands)] if a.commands else []
    cell = cell_from_runs(a.config, a.input_len, a.output_len, a.num_prompts, runs, kvs, commands, a.bytes_per_block)
    if a.meta:
        cell.update(json.loads(a.meta))
    doc = {"vllm_version": a.vllm_version, "gpu": a.gpu, "equivalence_pass": None, "cells": [cell],
           "commands": commands}
    eq = _load_json(a.equivalence)
    if eq is not None:
        if eq.get("vllm_version") in (None, a.vllm_version) and eq.get("gpu") in (None, a.gpu):
            doc["equivalence_pass"] = eq.get("equivalence_pass")
            doc["descriptor_pass"] = eq.get("descriptor_pass")
            doc["equivalence_file"] = os.path.basename(a.equivalence)
        else:
            print("equivalence file %s is for vLLM %s on %s, not this run: ignored"
                  % (a.equivalence, eq.get("vllm_version"), eq.get("gpu")), file=sys.stderr)
    if os.path.exists(a.out):  # several calls on one machine accumulate in one file
        doc = merge_results([json.load(open(a.out)), doc])
    tmp = a.out + ".tmp"
    json.dump(doc, open(tmp, "w"), indent=1, sort_keys=True)
    os.replace(tmp, a.out)
    c = [x for x in doc["cells"] if cell_key(x) == cell_key(cell)][0]
    print("cell %s L=%s: mean TTFT per rep %s ms, desc/block %s" % (
        a.config, a.input_len, ["%.0f" % x for x in c["mean_ttft_ms"] if x is not None], c["descriptors_per_block"]))


def cmd_merge(a):
    named = [(os.path.basename(p), json.load(open(p))) for p in a.inputs]
    docs = [d for _, d in named]
    if os.path.exists(a.out) and a.out not in a.inputs:
        docs.insert(0, json.load(open(a.out)))
    doc = merge_results(docs)
    # which equivalence summaries decided equivalence_pass: those named in the documents (a
    # bench call's equivalence_file) and any summary given here (a document without cells)
    names = {n for n, d in named if "cells" not in d}
    for d in docs:
        names.update(d.get("equivalence_files", []))
        if d.get("equivalence_file"):
            names.add(d["equivalence_file"])
    if names:
        doc["equivalence_files"] = sorted(names)
    json.dump(doc, open(a.out, "w"), indent=1, sort_keys=True)
    source = "; equivalence from " + ", ".join(sorted(names)) if names else ""
    print("%s: %d cells%s" % (a.out, len(doc["cells"]), source))


BATCH_INVARIANT_FILES = ("envs.py", "model_executor/layers/batch_invariant.py")


def vllm_has_batch_invariant(pkg_dir):
    """Does the vLLM package in pkg_dir read VLLM_BATCH_INVARIANT?  (0.12-0.17 read it in
    model_executor/layers/batch_invariant.py, later releases in envs.py; 0.11 and older do
    not know it and would ignore it silently.)  Reads the sources; does not import vLLM."""
    for rel in BATCH_INVARIANT_FILES:
        path = os.path.join(pkg_dir, rel)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if '"VLLM_BATCH_INVARIANT"' in f.read():
                    return True
        except OSError:
            continue
    return False


def cmd_batch_invariant(a):
    pkg = a.vllm_dir
    if not pkg:
        spec = importlib.util.find_spec("vllm")     # locates the package without running it
        if spec is None or not spec.submodule_search_locations:
            print("no"); return 1
        pkg = list(spec.submodule_search_locations)[0]
    ok = vllm_has_batch_invariant(pkg)
    print("yes" if ok else "no")
    return 0 if ok else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("prompt")
    s.add_argument("n", type=int)
    s.add_argument("--seed", type=int, default=0)

    s = sub.add_parser("equiv-run")
    s.add_argument("--url", required=True, help="…/v1/completions")
    s.add_argument("--model", required=True)
    s.add_argument("--label", required=True)
    s.add_argument("--lengths", default=",".join(map(str, DEFAULT_EQ_LENGTHS)))
    s.add_argument("--max-tokens", type=int, default=32)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True)

    s = sub.add_parser("equiv-summary")
    s.add_argument("--out", required=True)
    s.add_argument("--probe", action="append", default=[], metavar="CONFIG=KVRUN.json",
                   help="kv-run output of the single-request probe of a config")
    s.add_argument("--lengths", default=",".join(map(str, DEFAULT_EQ_LENGTHS)))
    s.add_argument("--meta", help="JSON object merged into the summary")
    s.add_argument("runs", nargs="+")

    s = sub.add_parser("kvstats")
    s.add_argument("log")
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--bytes-per-block", type=int, default=0)

    s = sub.add_parser("prom")
    s.add_argument("url")

    s = sub.add_parser("kv-run")
    s.add_argument("--log")
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--prom-before")
    s.add_argument("--prom-after")
    s.add_argument("--bytes-per-block", type=int, default=0)
    s.add_argument("--backend-log", help="server log that names the attention backend")
    s.add_argument("--prompt-len", type=int, default=0, help="single-request probe: its prompt length")
    s.add_argument("--block-size", type=int, default=16)

    s = sub.add_parser("bench-cell")
    s.add_argument("--out", required=True)
    s.add_argument("--config", required=True)
    s.add_argument("--input-len", type=int, required=True)
    s.add_argument("--output-len", type=int, required=True)
    s.add_argument("--num-prompts", type=int, required=True)
    s.add_argument("--results", nargs="+", required=True)
    s.add_argument("--kv", nargs="*", default=[])
    s.add_argument("--commands")
    s.add_argument("--bytes-per-block", type=int, default=0)
    s.add_argument("--vllm-version", default=None)
    s.add_argument("--gpu", default=None)
    s.add_argument("--equivalence")
    s.add_argument("--run-prefix", default=time.strftime("%Y%m%dT%H%M%S"))
    s.add_argument("--meta")

    s = sub.add_parser("merge")
    s.add_argument("--out", required=True)
    s.add_argument("inputs", nargs="+")

    s = sub.add_parser("block-bytes")
    s.add_argument("model")
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--tp", type=int, default=1)

    s = sub.add_parser("gpu-slug")
    s.add_argument("names", nargs="*")

    s = sub.add_parser("batch-invariant", help="prints yes/no: does this vLLM know VLLM_BATCH_INVARIANT?")
    s.add_argument("--vllm-dir", help="the vllm package folder (default: the importable one)")

    a = p.parse_args(argv)
    if a.cmd == "prompt":
        print(prompt_text(a.n, a.seed))
    elif a.cmd == "equiv-run":
        cmd_equiv_run(a)
    elif a.cmd == "equiv-summary":
        return cmd_equiv_summary(a)
    elif a.cmd == "kvstats":
        cmd_kvstats(a)
    elif a.cmd == "prom":
        cmd_prom(a)
    elif a.cmd == "kv-run":
        cmd_kv_run(a)
    elif a.cmd == "bench-cell":
        cmd_bench_cell(a)
    elif a.cmd == "merge":
        cmd_merge(a)
    elif a.cmd == "block-bytes":
        print(model_block_bytes(a.model, a.block_size, a.tp))
    elif a.cmd == "gpu-slug":
        names = a.names or [l for l in sys.stdin.read().splitlines()]
        print(gpu_slug(names))
    elif a.cmd == "batch-invariant":
        return cmd_batch_invariant(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
