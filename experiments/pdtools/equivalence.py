"""The greedy-output equivalence check: requests, comparisons, the summary and its rendering.

One run = the fixed prompts sent to one endpoint (local prefill on D, or P/D through the
proxy).  Per prompt it keeps the generated token ids, the chosen token's logprob and the
top-5 logprobs at every output position, and, for P/D runs, the KV blocks D pulled for that
request (from D's Prometheus NIXL counters, scraped before and after the request).

What the summary decides:

* ids: every run's token ids equal the baseline's (local prefill on D, first config);
* logprobs: with ``VLLM_BATCH_INVARIANT=1`` every P/D run's logprobs equal those of local
  prefill on the same servers (same config) exactly (max |difference| = 0): that isolates
  the transferred KV.  A config's own difference from the baseline (0.22-0.28: the shim runs
  Model Runner V1, stock V2; seen as 1 ulp on 0.26.0) is recorded per config, its ids must
  still match.  With vLLM's default kernels each P/D config's max difference from the
  baseline must not exceed stock P/D's (the shim may not be worse than vLLM itself);
* transfers: every P/D answer moved KV (at least one block pulled by D for that request);
* descriptors: the shim's probe needs <= 1 (FLASH_ATTN, MLA) or 2 descriptors per block (id),
  blocks counted from the bytes per block id D registered (kvmetrics), except where D's log says
  the shim kept the stock layout so that any TP pairing is served (runs.kept_stock_for_any_tp:
  vLLM 0.12-0.28 cross-layer blocks that cannot be sliced by KV heads, without XLKV_EQUAL_TP),
  which is recorded (``descriptor_note``) and checks nothing;
* negative controls (``nc-<config>`` runs, D corrupts the KV it received): each must be
  told apart from the baseline (ids or logprobs differ beyond what the real config shows).

Reference ``pd-stock`` (pd_equivalence.sh ``EQ_REFERENCE``; automatic for MLA and sliding-window
hybrids): for families where vLLM's own P/D, stock too, differs from local prefill (measured on
0.33.0 / H100 with ``VLLM_BATCH_INVARIANT=1``), the baseline is stock P/D: every P/D run's ids
must equal it and its logprobs too (max |difference| <= ``logprob_tol``, default 0), each negative
control must be told apart from it, and local prefill's difference from stock P/D is recorded
(``local_vs_pd_stock``) as vLLM's own, not failing.  Reference ``pd-stock-v1`` is the same with
stock P/D on Model Runner V1 (config ``stock-v1``) as the baseline, the runner the shim switches to
on 0.22-0.28: a ``pd:stock`` run (vLLM's default runner) is then recorded
(``other_runner_vs_reference``), not failing.
"""

import json
import math
import os
import time

from .client import http_json, http_text
from .dynamo import PREFIX as DYNAMO
from .kvmetrics import PROM_KEYS, descriptor_limit, parse_prom
from .prompts import prompt_text

TOP_LOGPROBS = 5
NEGATIVE_PREFIX = "nc-"


def is_negative_control(config):
    return config.startswith(NEGATIVE_PREFIX)


def is_shim(config):
    """Does ``config`` run the shim (``shim``, ``shim-<variant>``, and the same through Dynamo)?  Its descriptors per
    block are checked against the layout's limit."""
    config = config[len(DYNAMO):] if config.startswith(DYNAMO) else config
    return config == "shim" or config.startswith("shim-")


def chosen_from_top(tokens, top):
    """The chosen tokens' logprobs read from the top-k lists (each [[token, logprob], ...]) where the chosen token
    (its string, as the logprobs' keys) is among them (greedy: always), else None at that position.  Dynamo's frontend prints
    ``token_logprobs`` with float32's shortest digits (-7.9051385 for -7.9051384925842285, up to 4.6e-07 off), while
    its ``top_logprobs`` carry the full value: the same number, read where it is exact."""
    out = []
    for i, t in enumerate(tokens):
        out.append(dict(top[i]).get(t) if i < len(top) else None)
    return out


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


def vocabulary(model_dir):
    """token string -> id from ``model_dir``'s tokenizer.json (its model's vocab and added tokens); {} without one."""
    try:
        with open(os.path.join(model_dir, "tokenizer.json")) as f:
            tok = json.load(f)
    except (OSError, ValueError):
        return {}
    vocab = (tok.get("model") or {}).get("vocab") or {}
    out = dict(vocab) if isinstance(vocab, dict) else {}
    for t in tok.get("added_tokens") or []:
        out[t["content"]] = t["id"]
    return out


def ids_from_token_strings(choice, vocab):
    """The generated ids read back from the logprobs' token strings through ``vocab`` (a server that returns
    neither ``token_ids`` nor ``token_id:<id>`` strings, e.g. Dynamo's frontend); None when a string is not a
    token of the vocabulary (then the ids are not known)."""
    toks = (choice.get("logprobs") or {}).get("tokens")
    if not toks or not vocab or any(t not in vocab for t in toks):
        return None
    return [vocab[t] for t in toks]


def _token_key(tok):
    """A logprobs key: "token_id:123" (return_tokens_as_token_ids) -> 123, else the string."""
    if isinstance(tok, str) and tok.startswith("token_id:"):
        try:
            return int(tok.split(":", 1)[1])
        except ValueError:
            return tok
    return tok


def _extract_logprobs(choice):
    """(chosen-token logprobs, top-k lists of [token, logprob] sorted best first) from the
    completions API's ``logprobs`` object, or (None, None) when the server sent none."""
    lp = choice.get("logprobs") or {}
    chosen = lp.get("token_logprobs")
    tops = lp.get("top_logprobs")
    if chosen is None or tops is None:
        return None, None
    top = []
    for d in tops:
        items = sorted(((_token_key(k), float(v)) for k, v in (d or {}).items()), key=lambda kv: -kv[1])
        top.append([[k, v] for k, v in items[:TOP_LOGPROBS]])
    return [None if x is None else float(x) for x in chosen], top


def _prom_snapshot(prom_url):
    """D's NIXL counters; all zero when the page has none yet (vLLM may export a histogram
    only once it has observed something), None when /metrics cannot be read."""
    if not prom_url:
        return None
    try:
        text = http_text(prom_url, timeout=10)
    except Exception:
        return None
    return parse_prom(text) or {v: 0.0 for v in PROM_KEYS.values()}


def _transfer_delta(before, after, bytes_per_block):
    if before is None or after is None:
        return None
    n = after["transfers"] - before["transfers"]
    b = after["bytes_sum"] - before["bytes_sum"]
    return {"transfers": int(round(n)), "bytes": int(round(b)),
            "descriptors": int(round(after["descriptors_sum"] - before["descriptors_sum"])),
            "failed": int(round(after.get("failed_transfers", 0) - before.get("failed_transfers", 0))),
            "blocks": round(b / bytes_per_block, 3) if bytes_per_block else None}


def kv_pulled(prom_url, before, bytes_per_block, wait_s=15.0, poll_s=0.25):
    """What D pulled for the request that just finished: D's NIXL counters after minus
    ``before``.  vLLM updates them when the engine step's stats reach the API server, which
    can trail the response a little, so this polls until the transfer count moves (or
    ``wait_s`` passes: then the delta says 0 transfers)."""
    if before is None:
        return None
    end = time.time() + wait_s
    while True:
        after = _prom_snapshot(prom_url)
        d = _transfer_delta(before, after, bytes_per_block)
        if (d and d["transfers"] > 0) or time.time() >= end:
            return d
        time.sleep(poll_s)


def greedy_request(url, model, n_tokens, max_tokens, seed=0, timeout=600.0, logprobs=TOP_LOGPROBS,
                   prom_url=None, bytes_per_block=0, kv_wait_s=15.0, vocab=None):
    """One greedy completion; returns a dict with token ids (or text as last resort), the
    logprobs, and (with ``prom_url``: D's /metrics) the KV that D pulled for it.  ``vocab`` (token string -> id;
    {} when the model has none: the ids stay unknown):
    the server takes OpenAI's completions fields alone (Dynamo's frontend refuses vLLM's ``return_token_ids``),
    so the ids are read back from the logprobs' token strings (at least 1 logprob is asked for)."""
    body = {
        "model": model,
        "prompt": prompt_text(n_tokens, seed),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    if vocab is not None:
        body["logprobs"] = max(1, logprobs or 0)
    else:
        body["return_token_ids"] = True
        if logprobs:
            body.update(logprobs=logprobs, return_tokens_as_token_ids=True)
    before = _prom_snapshot(prom_url)
    t0 = time.time()
    resp = http_json(url, body, timeout=timeout)
    choice = resp["choices"][0]
    ids, method = _extract_token_ids(choice)
    printed = None
    if ids is None and vocab is not None:
        ids = ids_from_token_strings(choice, vocab)
        method = "logprobs_tokens_vocab" if ids is not None else None
    elif ids is None:  # older release: ask for logprobs with ids spelled out
        body.pop("return_token_ids")
        body.update(logprobs=max(1, logprobs or 0), return_tokens_as_token_ids=True)
        if prom_url:
            before = _prom_snapshot(prom_url)
        resp = http_json(url, body, timeout=timeout)
        choice = resp["choices"][0]
        ids, method = _extract_token_ids(choice)
    seconds = round(time.time() - t0, 3)
    chosen, top = _extract_logprobs(choice) if logprobs else (None, None)
    if vocab is not None and chosen is not None and ids is not None:
        # OpenAI's fields alone (Dynamo): the chosen logprob from its exact top-k entry, the printed one kept
        tokens = (choice.get("logprobs") or {}).get("tokens") or []
        exact = chosen_from_top(tokens, top)
        printed, chosen = chosen, [e if e is not None else c for e, c in zip(exact, chosen)]
    out = {
        "prompt_len": n_tokens,
        "seed": seed,
        "method": method or "text",
        "token_ids": ids,
        "text": choice.get("text"),
        "prompt_token_count": len(choice["prompt_token_ids"]) if choice.get("prompt_token_ids") else None,
        "usage": resp.get("usage"),
        "seconds": seconds,
        "logprobs": chosen,
        "top_logprobs": top,
    }
    if printed is not None:
        out["logprobs_printed"] = printed
    if prom_url:
        out["kv"] = kv_pulled(prom_url, before, bytes_per_block, kv_wait_s)
    return out


def equiv_run(url, model, lengths, max_tokens, seed=0, **kw):
    return [greedy_request(url, model, n, max_tokens, seed, **kw) for n in lengths]


def outputs_key(rec):
    """What must be byte-identical: the token ids when known, the text otherwise (compare_runs also
    compares the text where both runs have the ids)."""
    return rec["token_ids"] if rec.get("token_ids") is not None else rec.get("text")


def _first_difference(ka, kb):
    return next((i for i, (x, y) in enumerate(zip(ka, kb)) if x != y), min(len(ka), len(kb)))


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
            problems.append("len %d: first difference at output position %d" % (a["prompt_len"],
                                                                                  _first_difference(ka, kb)))
        elif a.get("token_ids") is not None and None not in (a.get("text"), b.get("text")) and a["text"] != b["text"]:
            # the same ids with another text: the API server's detokenizer differs (XLKV_DETOK_TAIL's concern)
            problems.append("len %d: same token ids, text differs at character %d" % (
                a["prompt_len"], _first_difference(a["text"], b["text"])))
    return problems


def logprob_diff(baseline, other):
    """Largest |logprob difference| between two runs, over every prompt and output position
    where both saw the same context: the chosen token's logprob while the ids agree, and the
    top-5 logprob values (rank by rank) up to and including the first position whose ids
    differ.  Returns {"max": float|None, "positions": n, "at": [prompt_len, position]};
    "max" is None when either run has no logprobs."""
    worst, at, n = 0.0, None, 0
    by_len = {r["prompt_len"]: r for r in baseline}
    for b in other:
        a = by_len.get(b["prompt_len"])
        if a is None:
            continue
        la, lb = a.get("logprobs"), b.get("logprobs")
        ta, tb = a.get("top_logprobs"), b.get("top_logprobs")
        if la is None or lb is None or ta is None or tb is None:
            return {"max": None, "positions": n, "at": None}
        ka, kb = a.get("token_ids") or [], b.get("token_ids") or []
        first = _first_difference(ka, kb) if ka and kb else min(len(la), len(lb))
        last = min(first, len(la) - 1, len(lb) - 1, len(ta) - 1, len(tb) - 1)
        for i in range(last + 1):
            n += 1
            diffs = []
            if i < first and la[i] is not None and lb[i] is not None:
                diffs.append(abs(la[i] - lb[i]))
            va = [v for _, v in ta[i]]
            vb = [v for _, v in tb[i]]
            diffs += [abs(x - y) for x, y in zip(va, vb)]
            if len(va) != len(vb):
                diffs.append(math.inf)
            d = max(diffs) if diffs else 0.0
            if d > worst:
                worst, at = d, [a["prompt_len"], i]
    return {"max": worst, "positions": n, "at": at}


def distinct_ids(run):
    """prompt length (str) -> number of distinct token ids among its outputs."""
    return {str(r["prompt_len"]): len(set(r["token_ids"])) for r in run if r.get("token_ids") is not None}


def transfers_of(run):
    """prompt length (str) -> the KV that D pulled for that P/D request (None: not measured)."""
    return {str(r["prompt_len"]): r.get("kv") for r in run}


def _moved_kv(kv):
    return bool(kv) and kv.get("transfers", 0) > 0 and (kv.get("bytes") or 0) > 0


#: "pd-stock-v1": stock P/D on Model Runner V1 (``stock-v1``), the runner the shim switches to on
#: 0.22-0.28, so that a family's comparison isolates the layout from the runner's own difference
REFERENCES = ("local", "pd-stock", "pd-stock-v1")


def summarize_equivalence(runs, probes, lengths, batch_invariant=None, logprob_tol=0.0, corruption=None,
                          reference="local", vllm_version=None, source_ranks=1):
    """runs: {label: [results]} with 'local:<cfg>' / 'pd:<cfg>' labels; the first local run is
    the baseline (reference "local"), or 'pd:stock' (reference "pd-stock": the module
    docstring); configs named 'nc-<cfg>' are negative controls (D corrupts what it
    received).  probes: {cfg: {"kv": {...}, "backend": str}}; ``vllm_version``: the release the
    descriptor limit is counted for (descriptor_limit); ``source_ranks``: prefill ranks each decode
    rank reads a block from (kvmetrics.source_ranks): the limit is per block per prefill rank read.
    Returns the summary dict."""
    if reference not in REFERENCES:
        raise ValueError("reference must be one of %s (got %r)" % (", ".join(REFERENCES), reference))
    labels = list(runs)
    real = [l for l in labels if not is_negative_control(l.split(":", 1)[-1])]
    controls = [l for l in labels if l not in real]
    pd_ref = reference.startswith("pd-")
    ref_problems = []
    if pd_ref:
        base_label = "pd:" + reference[len("pd-"):]
        if base_label not in runs:
            ref_problems.append("reference %s: no %s run (put %s in EQ_CONFIGS or EQ_INCLUDE)"
                                % (reference, base_label, base_label[len("pd:"):]))
            base_label = next((l for l in real if l.startswith("pd:")), real[0] if real else labels[0])
    else:
        base_label = next((l for l in real if l.startswith("local:")), real[0] if real else labels[0])
    base = runs[base_label]
    rows, mismatches = [], list(ref_problems)
    lp = {}
    local_vs_pd_stock = {}
    # reference pd-stock-v1: stock P/D on vLLM's default runner differs from it by the runner
    # alone (the same stock layout), so it is recorded, not failing
    other_runner = {}
    recorded = lambda l: pd_ref and (l.startswith("local:") or (l == "pd:stock" and base_label != l))
    for l in labels:
        lens_l = {r["prompt_len"] for r in runs[l]}
        ref = base if l in real else [r for r in base if r["prompt_len"] in lens_l]
        probs = compare_runs(ref, runs[l]) if l != base_label else []
        if recorded(l):
            # vLLM's own difference (its P/D path vs one whole prefill, or its other model
            # runner): recorded, not failing
            (local_vs_pd_stock if l.startswith("local:") else other_runner)[l] = {
                "problems": probs, "max_logprob_diff": logprob_diff(base, runs[l])["max"]}
        elif l in real:
            mismatches += ["%s vs %s: %s" % (l, base_label, p) for p in probs]
        lp[l] = logprob_diff(base, runs[l]) if l != base_label else {"max": 0.0, "positions": None, "at": None}
        rows.append({"label": l, "identical_to_baseline": not probs, "problems": probs,
                     "method": runs[l][0]["method"] if runs[l] else None,
                     "max_logprob_diff": lp[l]["max"], "max_logprob_diff_at": lp[l]["at"],
                     "negative_control": l in controls})

    # The transfer's own check: each P/D run against local prefill on the same servers
    # (same config, so same model runner and KV layout): only the transferred KV differs.
    same = {}
    for l in real:
        cfg = l.split(":", 1)[-1]
        if l.startswith("pd:") and "local:" + cfg in runs:
            same[l] = logprob_diff(runs["local:" + cfg], runs[l])

    # logprobs: identical under deterministic kernels; otherwise no P/D config worse than stock P/D
    pd_stock = lp.get("pd:stock", {}).get("max")
    lp_problems = []
    have_lp = all(lp[l]["max"] is not None for l in real if not recorded(l))
    if not have_lp:
        lp_ok = None
        lp_problems.append("no logprobs from the server: logprob check not made")
    elif pd_ref:
        # every P/D run against stock P/D: identical (up to logprob_tol), whatever the kernels;
        # P/D vs local prefill is vLLM's own difference here (recorded in configs.*)
        for l in real:
            if l.startswith("pd:") and l != base_label and not recorded(l) and lp[l]["max"] > logprob_tol:
                lp_problems.append("%s vs %s: max |logprob difference| %.3g > %g" % (l, base_label, lp[l]["max"],
                                                                                    logprob_tol))
        lp_ok = not lp_problems
    elif batch_invariant:
        # P/D vs local prefill of the same config: bit-identical.  A config's local run
        # against the baseline (e.g. 0.22-0.28: the shim runs Model Runner V1, stock V2) must
        # give the same ids; its logprob difference is recorded (configs.*), not required 0.
        for l, d in same.items():
            if d["max"] != 0:
                lp_problems.append("%s vs local:%s: max |logprob difference| %.3g != 0 (deterministic kernels)"
                                   % (l, l.split(":", 1)[-1], d["max"]))
        for l in real:
            if l.startswith("pd:") and l not in same and lp[l]["max"] != 0:
                lp_problems.append("%s: max |logprob difference| %.3g != 0 (deterministic kernels)"
                                   % (l, lp[l]["max"]))
        lp_ok = not lp_problems
    else:
        for l in real:
            if l.startswith("pd:") and l != "pd:stock" and pd_stock is not None and \
                    lp[l]["max"] > pd_stock + logprob_tol:
                lp_problems.append("%s: max |logprob difference| %.3g > pd:stock's %.3g" % (l, lp[l]["max"], pd_stock))
        lp_ok = not lp_problems

    # every P/D answer moved KV
    transfers, xfer_problems = {}, []
    for l in labels:
        if not l.startswith("pd:"):
            continue
        transfers[l] = transfers_of(runs[l])
        for n, kv in transfers[l].items():
            if kv is None:
                xfer_problems.append("%s len %s: D's KV-transfer counters not readable" % (l, n))
            elif not _moved_kv(kv):
                xfer_problems.append("%s len %s: D pulled no KV (transfers %s, bytes %s)"
                                     % (l, n, kv.get("transfers"), kv.get("bytes")))
    xfer_ok = not xfer_problems

    configs = {}
    desc_ok = True
    for cfg, p in probes.items():
        kv = p.get("kv") or {}
        reg = kv.get("registration") or {}
        limit = descriptor_limit(p.get("backend"), mla=bool(reg.get("use_mla")), vllm_version=vllm_version,
                                 source_ranks=source_ranks)
        # per block id: blocks per transfer from the bytes one block id moves (D's registration
        # report; a sliding-window group sends fewer block ids than a full one)
        dpb = kv.get("descriptors_per_block")
        entry = {"attn_backend": p.get("backend"), "kv": kv, "descriptors_per_block": dpb,
                 "descriptors_per_transfer": kv.get("avg_descriptors_per_transfer"),
                 "blocks_per_transfer": kv.get("blocks_per_transfer"),
                 "bytes_per_block": kv.get("bytes_per_block"),
                 "bytes_per_block_source": kv.get("bytes_per_block_source"),
                 "bytes_per_block_note": kv.get("bytes_per_block_note"),
                 "kv_cache_groups": reg.get("num_kv_cache_groups"),
                 "kv_cache_layout": reg.get("kv_cache_layout"),
                 "registered_regions_per_block_id": kv.get("registered_regions_per_block_id")}
        if is_shim(cfg) and kv.get("kept_stock_for_any_tp"):
            # the shim kept the stock layout by design and said so (cross-layer blocks that
            # cannot be sliced by KV heads): no promise to check
            entry["limit"], entry["descriptor_pass"] = None, None
            entry["descriptor_note"] = "stock layout kept for any TP pairing: " + kv["kept_stock_for_any_tp"]
        elif is_shim(cfg):  # shim-ray, shim-keep-order, dynamo-shim: the shim as well
            entry["limit"] = limit
            entry["descriptor_pass"] = dpb is not None and dpb <= limit + 0.05
            desc_ok = desc_ok and entry["descriptor_pass"]
        configs[cfg] = entry
    for l in labels:
        kind, cfg = l.split(":", 1) if ":" in l else ("", l)
        entry = configs.setdefault(cfg, {})
        if kind == "pd":
            entry["max_logprob_diff"] = lp[l]["max"]
            if l in same:
                entry["max_logprob_diff_pd_vs_local"] = same[l]["max"]
                entry["max_logprob_diff_pd_vs_local_at"] = same[l]["at"]
                if pd_ref:
                    entry["pd_vs_local_is_vllms"] = True   # recorded, not failing (reference pd-stock)
            entry["kv_blocks_per_prompt"] = {n: (kv or {}).get("blocks") for n, kv in transfers[l].items()}
        elif kind == "local":
            entry["max_logprob_diff_local"] = lp[l]["max"]

    # negative controls: told apart from the baseline?
    negative = []
    for l in controls:
        cfg = l.split(":", 1)[-1]
        ref = "pd:" + cfg[len(NEGATIVE_PREFIX):]
        nc_lens = {r["prompt_len"] for r in runs[l]}
        base_sub = [r for r in base if r["prompt_len"] in nc_lens]
        comparable = len(base_sub) == len(runs[l]) > 0  # every control prompt has a baseline answer
        ids_differ = comparable and bool(compare_runs(base_sub, runs[l]))
        d = lp[l]["max"]
        # what the same config without the corruption shows against the baseline (0 under
        # deterministic kernels; reference pd-stock: the tolerance the real configs get); the
        # control is detected when it goes beyond that
        if pd_ref:
            allowed = max(logprob_tol, lp.get(ref, {}).get("max") or 0.0)
        else:
            allowed = 0.0 if batch_invariant else (lp.get(ref, {}).get("max") or 0.0) + logprob_tol
        lp_detected = comparable and d is not None and d > allowed
        negative.append({"config": cfg, "corruption": corruption, "label": l, "compared_with": base_label,
                         "ids_differ": ids_differ, "max_logprob_diff": d, "logprob_allowed": allowed,
                         "comparable": comparable,
                         "detected": bool(ids_differ or lp_detected)})
    nc_ok = all(n["detected"] for n in negative)

    eq_ok = not mismatches and all(len(runs[l]) == len(lengths) for l in real) and lp_ok is not False
    # Second view: every P/D run against the stock P/D run.  When the P/D path itself differs
    # from local prefill (in stock vLLM too), this says whether a config changes anything
    # beyond what stock P/D already does.  It does not change equivalence_pass.
    pd_base = "pd:stock" if "pd:stock" in runs else None
    pd_vs_pd_stock = {}
    if pd_base:
        for l in real:
            if l.startswith("pd:") and l != pd_base:
                pd_vs_pd_stock[l] = compare_runs(runs[pd_base], runs[l])
    token_ids = {l: {str(r["prompt_len"]): outputs_key(r) for r in runs[l]} for l in labels}
    # the answers' text, compared with the ids (compare_runs): kept so that a file shows what was compared
    texts = {l: {str(r["prompt_len"]): r.get("text") for r in runs[l]} for l in labels}
    return {"baseline": base_label, "reference": reference, "local_vs_pd_stock": local_vs_pd_stock,
            "other_runner_vs_reference": other_runner,
            "prompt_lengths": list(lengths), "runs": rows, "mismatches": mismatches,
            "equivalence_pass": eq_ok, "descriptor_pass": desc_ok if any(is_shim(c) for c in probes) else None,
            "logprob_pass": lp_ok, "logprob_problems": lp_problems, "logprob_tol": logprob_tol,
            "transfers_pass": xfer_ok, "transfer_problems": xfer_problems, "transfers": transfers,
            "distinct_ids": distinct_ids(base), "negative_control": negative,
            "negative_control_pass": nc_ok if negative else None,
            "pd_baseline": pd_base, "pd_vs_pd_stock": pd_vs_pd_stock, "token_ids": token_ids, "texts": texts,
            "configs": configs, "pass": bool(eq_ok and desc_ok and xfer_ok and nc_ok)}


def _f(x, fmt="%.2f"):
    return "-" if x is None else fmt % x


def render_equivalence(summary):
    reference = summary.get("reference") or "local"
    pd_ref = reference.startswith("pd-")
    lines = ["=" * 78, "P/D equivalence: greedy token ids + top-%d logprobs, prompts of %s tokens"
             % (TOP_LOGPROBS, summary["prompt_lengths"]),
             "baseline = %s (%s)" % (summary["baseline"], "stock P/D: EQ_REFERENCE=%s" % reference if pd_ref
                                     else "local prefill on the decode instance")]
    if "batch_invariant" in summary:
        lines.append("kernels: %s" % ("VLLM_BATCH_INVARIANT=1 (deterministic)" if summary["batch_invariant"]
                                      else "vLLM defaults (VLLM_BATCH_INVARIANT unset)"))
    if summary.get("distinct_ids"):
        lines.append("distinct ids in the baseline's outputs, per prompt length: %s" % summary["distinct_ids"])
    lines += ["-" * 78, "%-22s %-18s %-16s %s" % ("run", "vs baseline", "max |dlogprob|", "id method")]
    for r in summary["runs"]:
        verdict = "baseline" if r["label"] == summary["baseline"] else (
            "IDENTICAL" if r["identical_to_baseline"] else
            "DIFFERENT (vLLM's)" if pd_ref and (r["label"].startswith("local:") or
                                                r["label"] in summary.get("other_runner_vs_reference", {}))
            else "DIFFERENT")
        lines.append("%-22s %-18s %-16s %s%s" % (r["label"], verdict, _f(r.get("max_logprob_diff"), "%.3g"),
                                                 r["method"], "  (negative control)" if r.get("negative_control")
                                                 else ""))
    lines += ["-" * 78, "%-10s %-12s %12s %12s %12s %s" % ("config", "backend", "desc/xfer", "blocks/xfer",
                                                            "desc/block", "check")]
    for cfg, c in summary["configs"].items():
        if "attn_backend" not in c:
            continue
        chk = "(stock kept for any TP pairing)" if c.get("descriptor_note") else (
            "<= %g: %s" % (c["limit"], "PASS" if c["descriptor_pass"] else "FAIL")) if "limit" in c else "(info)"
        lines.append("%-10s %-12s %12s %12s %12s %s" % (cfg, c["attn_backend"] or "?", _f(c["descriptors_per_transfer"]),
                                                        _f(c["blocks_per_transfer"]), _f(c["descriptors_per_block"]), chk))
    for l, per in (summary.get("transfers") or {}).items():
        lines.append("KV blocks D pulled, %-14s %s" % (l + ":", ", ".join(
            "%s: %s" % (n, "-" if kv is None else _f(kv.get("blocks"), "%g")) for n, kv in per.items())))
    for m in summary["mismatches"][:10]:
        lines.append("MISMATCH " + m)
    for l, d in (summary.get("local_vs_pd_stock") or {}).items():
        lines.append("vLLM's own P/D vs local prefill (recorded, not failing): %s vs %s: %s, max |dlogprob| %s" % (
            l, summary["baseline"], "; ".join(d["problems"][:3]) or "identical", _f(d["max_logprob_diff"], "%.3g")))
    for cfg, c in summary["configs"].items():
        if "max_logprob_diff_pd_vs_local" in c:
            lines.append("logprobs pd:%s vs local:%s: max |d| %s   local:%s vs baseline: max |d| %s" % (
                cfg, cfg, _f(c["max_logprob_diff_pd_vs_local"], "%.3g"), cfg,
                _f(c.get("max_logprob_diff_local"), "%.3g")))
    for m in summary.get("logprob_problems", [])[:10]:
        lines.append("LOGPROBS " + m)
    for m in summary.get("transfer_problems", [])[:10]:
        lines.append("NO TRANSFER " + m)
    for l, probs in (summary.get("pd_vs_pd_stock") or {}).items():
        lines.append("%s vs %s: %s" % (l, summary["pd_baseline"], "IDENTICAL" if not probs else "; ".join(probs[:3])))
    for n in summary.get("negative_control") or []:
        lines.append("negative control %s (%s): %s vs %s: %s -> %s" % (
            n["config"], n["corruption"] or "?", n["label"], n["compared_with"],
            "ids differ" if n["ids_differ"] else "max |dlogprob| %s (allowed %s)" % (
                _f(n["max_logprob_diff"], "%.3g"), _f(n["logprob_allowed"], "%.3g")),
            "FAIL as planted: detected" if n["detected"] else "NOT DETECTED"))
    nc = summary.get("negative_control_pass")
    lines += ["-" * 78, "equivalence: %s   logprobs: %s   transfers: %s   descriptors: %s%s   => %s" % (
        "PASS" if summary["equivalence_pass"] else "FAIL",
        {True: "PASS", False: "FAIL", None: "n/a"}[summary.get("logprob_pass")],
        "PASS" if summary.get("transfers_pass", True) else "FAIL",
        {True: "PASS", False: "FAIL", None: "n/a (no shim run)"}[summary["descriptor_pass"]],
        "" if nc is None else "   negative controls: %s" % ("detected" if nc else "NOT DETECTED"),
        "PASS" if summary["pass"] else "FAIL"), "=" * 78]
    return "\n".join(lines)
