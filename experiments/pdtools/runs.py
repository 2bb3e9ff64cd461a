"""One equivalence run, one descriptor probe, one summary: what the jobs do with a running pair,
as functions that return objects (the files they write are kept for EQ_INCLUDE and for the
record).
"""

import importlib.util
import json
import os
import re
import sys

from .client import http_text
from .equivalence import equiv_run, render_equivalence, summarize_equivalence
from .kvmetrics import attention_backend, source_ranks, blocks_for_prompt, descriptors_per_block, kv_run, load_registration, \
    parse_prom


def parse_lengths(text):
    """"5,100 1000" -> [5, 100, 1000] (commas or blanks: EQ_LENGTHS, INPUT_LENS, --lengths)."""
    return [int(x) for x in re.split(r"[,\s]+", text.strip()) if x]


def load_json(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def run_to_file(url, model, label, lengths, max_tokens, out, seed=0, logprobs=5, prom_url=None, bytes_per_block=0,
                kv_wait=15.0, quiet=False, vocab=None):
    """The fixed greedy prompts to one endpoint; writes {"label", "url", "results"} to ``out`` and
    prints one line per prompt (unless ``quiet``).  Returns the results."""
    res = equiv_run(url, model, lengths, max_tokens, seed, logprobs=logprobs, prom_url=prom_url,
                    bytes_per_block=bytes_per_block, kv_wait_s=kv_wait, vocab=vocab)
    with open(out, "w") as f:
        json.dump({"label": label, "url": url, "results": res}, f, indent=1)
    if not quiet:
        for r in res:
            kv = r.get("kv")
            print("  %-12s len=%-5d method=%s out=%s%s" % (
                label, r["prompt_len"], r["method"], (r["token_ids"] or [])[:8],
                "" if "kv" not in r else "  KV pulled: %s" % ("unknown" if kv is None else "%s blocks in %s transfer(s)"
                                                               % (kv.get("blocks"), kv.get("transfers")))), flush=True)
    bad = [r for r in res if r["prompt_token_count"] not in (None, r["prompt_len"])]
    if bad:
        print("WARNING: tokenizer gave other prompt lengths than intended: %s"
              % [(r["prompt_len"], r["prompt_token_count"]) for r in bad], file=sys.stderr)
    return res


def prom_scrape(url):
    """D's NIXL counters from its /metrics, or None when not available (said on stderr)."""
    try:
        return parse_prom(http_text(url))
    except Exception as e:
        print("prom scrape failed: %s" % e, file=sys.stderr)
        return None


#: what the shim's INFO line says where it keeps the stock layout by design (cross-layer
#: blocks that cannot be sliced by KV heads, without XLKV_EQUAL_TP); the equivalence summary then checks
#: no descriptor promise for that config (the shim made none)
KEPT_FOR_ANY_TP = "XLKV_EQUAL_TP=true gives 1 descriptor per block"


def kept_stock_for_any_tp(log_path):
    """The shim's line saying it keeps the stock layout so that any TP pairing is served, or None."""
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                if KEPT_FOR_ANY_TP in line and "xlkv_autopatch" in line:
                    return line.strip()[-600:]
    except (OSError, TypeError):
        pass
    return None


def kv_probe(log, offset, prom_before, prom_after, bytes_per_block, backend_log=None, registration=None,
             prompt_len=0, block_size=16):
    """KV numbers of one run (kvmetrics.kv_run) with the backend named in ``backend_log`` and D's
    registration report at ``registration``; for a single-request probe of ``prompt_len`` tokens
    also its blocks and descriptors per block from the length (one KV cache group only)."""
    backend = attention_backend(backend_log) if backend_log else None
    reg = load_registration(registration) if registration else None
    if registration and reg is None:
        print("kv-run: no registration report at %s (bytes per block: %s)" % (
            registration, "the dense formula" if bytes_per_block else "unknown"), file=sys.stderr)
    kv = kv_run(log, offset, prom_before, prom_after, bytes_per_block, backend, registration=reg)
    kept = kept_stock_for_any_tp(backend_log or log)
    if kept:
        kv["kept_stock_for_any_tp"] = kept
    if prompt_len:
        # one request's blocks from its length: exact with one KV cache group only (a sliding
        # window group sends its in-window tail)
        groups = (reg or {}).get("num_kv_cache_groups") or 1
        kv["blocks_expected"] = blocks_for_prompt(prompt_len, block_size) if groups == 1 else None
        kv["descriptors_per_block_from_len"] = descriptors_per_block(
            kv.get("avg_descriptors_per_transfer"), kv["blocks_expected"])
    return kv


def summary_to_file(runs, probes, lengths, meta, out, logprob_tol=0.0, corruption=None, reference="local"):
    """The equivalence summary of ``runs`` ({label: results}) and ``probes`` ({cfg: kv_probe}),
    with ``meta`` merged in; written to ``out`` and printed.  Returns the summary."""
    probes = {cfg: {"kv": kv, "backend": (kv or {}).get("attn_backend")} for cfg, kv in probes.items()}
    s = summarize_equivalence(runs, probes, lengths, batch_invariant=meta.get("batch_invariant"),
                              logprob_tol=logprob_tol, corruption=corruption, reference=reference,
                              vllm_version=meta.get("vllm_version"),
                              source_ranks=source_ranks(meta.get("tp_p"), meta.get("tp_d"), meta.get("model_shape")))
    s.update(meta)
    with open(out, "w") as f:
        json.dump(s, f, indent=1, sort_keys=True)
    print(render_equivalence(s), flush=True)
    return s


def corruption_description(how):
    """The negative-control hook's own description of ``how`` (shift, swap-layers).  Loads only
    the hook's module from its file (it arms nothing: its sitecustomize.py does that)."""
    nc_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "negative_control")
    spec = importlib.util.spec_from_file_location("xlkv_negative_control", os.path.join(nc_dir,
                                                                                        "xlkv_negative_control.py"))
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook.CORRUPTIONS[how]
