"""Render P/D bench results (pd_bench.sh JSON) as a markdown table and a PNG plot: the lab's
report job (``python3 experiments/pdtools report ...``; experiments/report.py is the same door).

usage: report.py RESULTS.json [MORE.json ...] [--md OUT.md] [--png OUT.png] [--no-plot] [--wire WIRE.json]

Several files are merged first (results.merge_results).  Table: one row per input length and
config with the mean TTFT over repetitions (mean of `vllm bench serve`'s per-run mean TTFT
± its sample standard deviation, and min-max), median/p99 TTFT, ITL, throughput,
descriptors per block, and the ratio stock / config (> 1: the config is faster).  Plot:
mean TTFT per config, grouped by input length, error bars = min..max over repetitions.
The PNG needs matplotlib; without it only the markdown is written (and that is said).
"""

import argparse
import json
import os
import statistics
import sys

from .archive import load_json as _load_json
from .configs import alone_for, is_alone, router
from .dynamo import PREFIX as DYNAMO
from .handoff import PARTS, SUBPARTS
from .results import merge_results

CONFIG_ORDER = ["prefill_only", "prefill_only-detok", "stock", "stock-v1", "shim", "shim-keep-order", "shim-ucx", "native",
                "native-v1", "dynamo-stock", "dynamo-native", "dynamo-shim", "dynamo-shim-detok"]


def stock_of(cfg):
    """The stock config a config's TTFT ratio is taken against: the one of its own router (dynamo-stock through
    Dynamo's frontend, stock through the proxy)."""
    return DYNAMO + "stock" if router(cfg) == "dynamo" else "stock"


def _vals(xs):
    return [x for x in (xs or []) if x is not None]


def stats(xs):
    """mean, sample std (0 for one value), min, max, n of the non-missing values."""
    xs = _vals(xs)
    if not xs:
        return None
    return {"mean": statistics.mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs), "n": len(xs)}


def _mean(xs):
    xs = _vals(xs)
    return statistics.mean(xs) if xs else None


def _order(cfg):
    return (CONFIG_ORDER.index(cfg) if cfg in CONFIG_ORDER else len(CONFIG_ORDER), cfg)


def _compared(c):
    """Cells compared with each other (a config against stock, against prefill alone): same length, state
    and client concurrency."""
    return c["input_len"], c.get("state") or "fresh", c.get("max_concurrency")


def _alone(cells, key):
    """{(prefill-alone config, key(cell)): TTFT stats} of the prefill-alone cells (prefill_only, prefill_only-detok):
    a P/D cell is compared with the one configs.alone_for names, never with another."""
    return {(c["config"], key(c)): stats(c.get("mean_ttft_ms")) for c in cells if is_alone(c.get("config") or "")}


def rows(doc):
    """Table rows: dicts with the numbers of each (input_len, config) cell."""
    out = []
    cells = sorted(doc.get("cells", []), key=lambda c: (c.get("input_len") or 0, c.get("max_concurrency") or 0,
                                                         _order(c.get("config"))))
    key = _compared
    stock = {(c["config"], key(c)): stats(c.get("mean_ttft_ms")) for c in cells
             if c.get("config") in ("stock", DYNAMO + "stock")}
    alone = _alone(cells, key)
    for c in cells:
        s = stats(c.get("mean_ttft_ms"))
        base = stock.get((stock_of(c["config"]), key(c)))
        limit = alone.get((alone_for(c["config"]), key(c)))
        state = c.get("state") or "fresh"
        tags = ([] if state == "fresh" else [state]) + (
            ["c%d" % c["max_concurrency"]] if c.get("max_concurrency") else [])
        out.append({
            "config": c["config"] + (" [%s]" % ", ".join(tags) if tags else ""),
            "state": state, "input_len": c["input_len"], "num_prompts": c.get("num_prompts"),
            "max_concurrency": c.get("max_concurrency"),
            "overhead_ms": (s["mean"] - limit["mean"]) if (s and limit and not is_alone(c["config"])) else None,
            "avg_descriptors_per_transfer": _mean(c.get("descriptors_per_transfer")),
            "avg_xfer_ms": _mean((c.get("kv_xfer") or {}).get("avg_xfer_ms")),
            "avg_mb_per_transfer": _mean((c.get("kv_xfer") or {}).get("avg_mb_per_transfer")),
            "proxy_prefill_ms": _mean(c.get("proxy_prefill_ms")),
            "proxy_decode_first_ms": _mean(c.get("proxy_decode_first_ms")),
            "ttft": s,
            "median_ttft": stats(c.get("median_ttft_ms")),
            "p99_ttft": stats(c.get("p99_ttft_ms")),
            # prefill alone asks for one token: it has no inter-token latency
            "itl": stats(c.get("mean_itl_ms")) if not is_alone(c["config"]) else None,
            "tok_s": stats(c.get("total_tok_s")),
            "desc_per_block": c.get("descriptors_per_block"),
            "desc_per_xfer": stats(c.get("descriptors_per_transfer")),
            "failed": sum(_vals(c.get("failed"))),
            "ratio": (base["mean"] / s["mean"]) if (base and s and s["mean"] and not is_alone(c["config"]))
            else None,
            "frontend": frontend_means(c.get("frontend")),
        })
    return out


#: the frontend series report.py prints (pdtools/dynamo.py keeps them all), in the order a request passes them
FRONTEND_SHOWN = (("dynamo_frontend_stage_duration_seconds[preprocess]", "preprocess"),
                  ("dynamo_frontend_stage_duration_seconds[route]", "route"),
                  ("dynamo_frontend_stage_duration_seconds[transport_roundtrip]", "transport round trip"),
                  ("dynamo_frontend_time_to_first_token_seconds", "frontend TTFT"))


def frontend_means(reps):
    """{series: mean over repetitions of its per-repetition mean ms} of a Dynamo cell's frontend histograms."""
    out = {}
    for name, _ in FRONTEND_SHOWN:
        xs = [r[name]["mean_ms"] for r in reps or [] if r and name in r]
        if xs:
            out[name] = statistics.mean(xs)
    return out


def ratio_lines(doc):
    """One line per input length: stock/shim, stock/native, ... of the mean TTFT means."""
    out = []
    by_len = {}
    for r in rows(doc):
        by_len.setdefault((r["input_len"], r.get("max_concurrency") or 0), []).append(r)
    for L, conc in sorted(by_len):
        parts = ["%s/%s %.2f×" % (stock_of(r["config"].split(" ")[0]), r["config"], r["ratio"])
                 for r in by_len[(L, conc)]
                 if r["config"].split(" ")[0] != stock_of(r["config"].split(" ")[0])
                 and not is_alone(r["config"].split(" ")[0]) and r["ratio"] is not None]
        if parts:
            out.append("- %d tokens%s: %s" % (L, ", at most %d at a time" % conc if conc else "", ", ".join(parts)))
    return out


def _f(x, fmt="%.0f"):
    return "—" if x is None else fmt % x


def _eq_source(doc):
    """ ' (file, ...)': the equivalence summaries behind equivalence_pass, where the document names them."""
    if doc.get("equivalence_pass") is None:
        return ""
    files = doc.get("equivalence_files") or ([doc["equivalence_file"]] if doc.get("equivalence_file") else [])
    return " (%s)" % ", ".join(files) if files else ""


def wire_ms_for(wire, mib):
    """The wire time of MIB MiB, scaled linearly from wire_copy.py's timed copy (None without one)."""
    if not wire or not mib or not wire.get("bytes") or wire.get("median_ms") is None:
        return None
    return wire["median_ms"] * (mib * 2 ** 20) / wire["bytes"]


def markdown(doc, wire=None):
    head = ["## P/D TTFT: vLLM %s on %s" % (doc.get("vllm_version") or "?", doc.get("gpu") or "?"), ""]
    eq = doc.get("equivalence_pass")
    head.append("Greedy-output equivalence (pd_equivalence.sh): %s" % (
        {True: "PASS", False: "**FAIL**", None: "not run / not given"}[eq]) + _eq_source(doc))
    head.append("")
    lines = ["| input len × prompts | config | reps | mean TTFT ms (mean ± std) | min–max | median TTFT ms "
             "| p99 TTFT ms | mean ITL ms | total tok/s | desc/block | stock/config TTFT |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(doc):
        t = r["ttft"]
        lines.append("| %s × %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["input_len"], r["num_prompts"], r["config"], t["n"] if t else 0,
            ("%.0f ± %.0f" % (t["mean"], t["std"])) if t else "—",
            ("%.0f–%.0f" % (t["min"], t["max"])) if t else "—",
            _f(r["median_ttft"] and r["median_ttft"]["mean"]), _f(r["p99_ttft"] and r["p99_ttft"]["mean"]),
            _f(r["itl"] and r["itl"]["mean"], "%.1f"), _f(r["tok_s"] and r["tok_s"]["mean"]),
            _f(r["desc_per_block"], "%.2f"), _f(r["ratio"], "%.2f×")
            + (" (%d failed)" % r["failed"] if r["failed"] else "")))
    ratios = ratio_lines(doc)
    if ratios:
        lines += ["", "Mean-TTFT ratios (stock / config, > 1 = faster than stock):"] + ratios
    over = ["- %d tokens, %s: %.0f ms" % (r["input_len"], r["config"], r["overhead_ms"])
            for r in rows(doc) if r["overhead_ms"] is not None]
    if over:
        lines += ["", "P/D overhead = config mean TTFT - its prefill alone's mean TTFT (P alone, max_tokens=1: "
                      "prefill_only, or prefill_only-detok for a config with XLKV_DETOK_TAIL; same input length and "
                      "state):"] + over
    split = ["- %d tokens, %s: P's answer %s ms, then D's first byte %s ms" % (
        r["input_len"], r["config"], _f(r["proxy_prefill_ms"]), _f(r["proxy_decode_first_ms"]))
        for r in rows(doc) if r["proxy_prefill_ms"] is not None]
    if split:
        lines += ["", "Where the P/D TTFT goes (pd_proxy.py's /timings, mean over requests and repetitions; "
                      "P's answer = the whole one-token prefill request, to compare with prefill_only's TTFT):"] + split
    front = ["- %d tokens, %s: %s" % (r["input_len"], r["config"], ", ".join(
        "%s %.1f ms" % (label, r["frontend"][name]) for name, label in FRONTEND_SHOWN if name in r["frontend"]))
        for r in rows(doc) if r["frontend"]]
    if front:
        lines += ["", "Dynamo's frontend, its own histograms (mean per request, mean over repetitions; the "
                      "transport round trip is dispatch to the first token back from the workers):"] + front
    kv = []
    for r in rows(doc):
        if r["avg_descriptors_per_transfer"] is None and r["avg_xfer_ms"] is None:
            continue
        w = wire_ms_for(wire, r["avg_mb_per_transfer"])
        kv.append("- %d tokens, %s: %s descriptors, %s ms%s" % (
            r["input_len"], r["config"], _f(r["avg_descriptors_per_transfer"], "%.1f"),
            _f(r["avg_xfer_ms"], "%.1f"),
            "" if w is None or not r["avg_xfer_ms"] else
            " (wire for its %.0f MiB: %.1f ms; xfer = %.1f× the wire)" % (
                r["avg_mb_per_transfer"], w, r["avg_xfer_ms"] / w)))
    if kv:
        lines += ["", "D's KV metrics per transfer (mean over repetitions of vLLM's averages: descriptors "
                      "NIXL moved, xfer time):"] + kv
    if wire:
        lines += ["", "Wire (experiments/wire_copy.py): %.2f GiB %s in %.2f ms median (%.2f–%.2f over %d copies), "
                      "%.0f GB/s; wire times above are scaled linearly from it." % (
                          wire["bytes"] / 2 ** 30, " → ".join(wire.get("gpus") or ["GPU0", "GPU1"]),
                          wire["median_ms"], wire.get("min_ms", wire["median_ms"]),
                          wire.get("max_ms", wire["median_ms"]), wire.get("reps", 0), wire.get("gb_s", 0))]
    through = " (through Dynamo: than dynamo-stock)" if any(router(c.get("config") or "") == "dynamo"
                                                           for c in doc.get("cells", [])) else ""
    notes = ["", "mean TTFT: per repetition, `vllm bench serve`'s mean over its prompts; mean ± sample std "
             "and min–max over repetitions. stock/config > 1 means the config is faster than stock%s. "
             "desc/block: NIXL descriptors per KV block on the decode side (median over repetitions)." % through]
    split = handoff_markdown(doc)
    return "\n".join(head + lines + notes) + "\n" + ("\n" + split if split else "")


#: the split's columns: the proxy's two parts are kept out when they stay under HIDE_MS (said under the table)
HIDE_MS = 0.5


def _longest_first(doc):
    """The cells in the handoff tables' order: longest prompts first, then concurrency, then config."""
    return sorted(doc.get("cells", []), key=lambda c: (-(c.get("input_len") or 0), c.get("max_concurrency") or 0,
                                                      _order(c.get("config"))))


def handoff_rows(doc):
    """One row per P/D cell with the handoff trace (HANDOFF_TRACE=1): its mean TTFT (mean ± std over
    repetitions), P/D over prefill alone (same length and concurrency), and per part of pdtools/handoff.py's
    split the mean and the p50 in ms.  Mean: the mean over repetitions of each repetition's mean over its
    requests (the parts' means add up to the proxy's mean total); p50: the median of the repetitions' p50."""
    alone = _alone(doc.get("cells", []), _compared)
    out = []
    for c in _longest_first(doc):
        reps = [h for h in (c.get("handoff_trace") or []) if h and h.get("parts_ms")]
        if not reps:
            continue
        t, base = stats(c.get("mean_ttft_ms")), alone.get((alone_for(c["config"]), _compared(c)))
        parts, subs = _pooled(reps, "parts_ms", PARTS), _pooled(reps, "subparts_ms", SUBPARTS)
        out.append({"subparts": subs, "config": c["config"], "input_len": c["input_len"],
                    "max_concurrency": c.get("max_concurrency"),
                    "reps": len(reps), "requests": sum(h.get("requests", 0) for h in reps),
                    "complete": sum(h.get("complete", 0) for h in reps),
                    "problems": sum(len(h.get("problems") or []) for h in reps),
                    "ttft": t, "over_alone_ms": (t["mean"] - base["mean"]) if (t and base) else None,
                    "alone": base, "parts": parts})
    return out


def client_hop_rows(doc):
    """One row per P/D cell whose every repetition has the proxy's total (HANDOFF_TRACE=1 with the proxy's trace): the
    client's mean TTFT beyond the proxy's mean total, per repetition and their mean (ms).  That is the client <-> proxy
    hop, which no part of the split holds: from the client's send to the proxy's ``t_in`` (the body read and parsed)
    and from the proxy's ``t_d_first`` to the client.  Prefill alone is measured without the proxy, so P/D over prefill
    alone includes it."""
    out = []
    for c in _longest_first(doc):
        trace, ttfts = c.get("handoff_trace") or [], c.get("mean_ttft_ms") or []
        totals = [((h or {}).get("total_ms") or {}).get("mean") for h in trace]
        if not trace or len(totals) != len(ttfts) or any(t is None for t in totals + list(ttfts)):
            continue
        gaps = [t - total for t, total in zip(ttfts, totals)]
        out.append({"config": c["config"], "input_len": c["input_len"], "max_concurrency": c.get("max_concurrency"),
                    "per_rep": gaps, "mean": statistics.mean(gaps)})
    return out


def _pooled(reps, field, names):
    """name -> {mean: mean of the repetitions' means, p50: median of their p50s}, for the names every
    repetition's ``field`` has."""
    out = {}
    for k in names:
        got = [(h.get(field) or {}).get(k) for h in reps]
        if all(got):
            out[k] = {"mean": statistics.mean(g["mean"] for g in got), "p50": statistics.median(g["p50"] for g in got)}
    return out


def handoff_markdown(doc):
    """The handoff split table: '' when no cell has the trace."""
    rows = handoff_rows(doc)
    if not rows:
        return ""
    shown = [k for k in PARTS if any(k in r["parts"] and r["parts"][k]["mean"] >= HIDE_MS for r in rows)]
    hidden = [k for k in PARTS if k not in shown]
    lines = ["## Where the P/D TTFT goes: the handoff split (HANDOFF_TRACE=1)", "",
             "Mean ms per part over every request (the mean of the repetitions' means; p50 of the same "
             "requests in brackets: the median of the repetitions' p50). pdtools/handoff.py says where each "
             "part begins and ends.", "",
             "| tokens × conc. | config | reps (requests) | mean TTFT ms | over prefill alone | "
             + " | ".join(shown) + " |",
             "|---|---|---|---|---|" + "---|" * len(shown)]
    for r in rows:
        t = r["ttft"]
        lines.append("| %d × c%s | %s | %d (%d%s) | %s | %s | %s |" % (
            r["input_len"], r["max_concurrency"] or "-", r["config"], r["reps"], r["requests"],
            "" if r["complete"] == r["requests"] else ", %d complete" % r["complete"],
            ("%.0f ± %.0f" % (t["mean"], t["std"])) if t else "—",
            ("%+.0f (alone %.0f)" % (r["over_alone_ms"], r["alone"]["mean"])) if r["over_alone_ms"] is not None
            else "—",
            " | ".join(("%.1f (%.1f)" % (r["parts"][k]["mean"], r["parts"][k]["p50"])) if k in r["parts"] else "—"
                       for k in shown)))
    if hidden:
        lines += ["", "Under %.1f ms in every cell, so not shown: %s." % (HIDE_MS, ", ".join(hidden))]
    finer = [k for k in SUBPARTS if any(k in r["subparts"] for r in rows)]
    if finer:
        lines += ["", "p_answer and d_first_token split by vLLM's Scheduler events (first_run, first_out), "
                      "mean (p50) ms:", "",
                  "| tokens × conc. | config | " + " | ".join(finer) + " |", "|---|---|" + "---|" * len(finer)]
        for r in rows:
            if r["subparts"]:
                lines.append("| %d × c%s | %s | %s |" % (
                    r["input_len"], r["max_concurrency"] or "-", r["config"],
                    " | ".join(("%.1f (%.1f)" % (r["subparts"][k]["mean"], r["subparts"][k]["p50"]))
                               if k in r["subparts"] else "—" for k in finer)))
    hop = client_hop_rows(doc)
    if hop:
        lines += ["", "The client <-> proxy hop, which no part above holds: the client's mean TTFT less the proxy's mean "
                      "total, per repetition (their mean), ms; prefill alone is measured without the proxy:", ""]
        lines += ["- %d × c%s, %s: %s (%s)" % (h["input_len"], h["max_concurrency"] or "-", h["config"],
                                              "%.1f" % h["mean"], ", ".join("%.1f" % g for g in h["per_rep"]))
                  for h in hop]
    bad = sum(r["problems"] for r in rows)
    lines += ["", "Requests with a part out of order (handoff.check): %d." % bad]
    return "\n".join(lines) + "\n"


def plot(doc, path):
    """Grouped bars of mean TTFT; error bars min..max over repetitions.  False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rs = [r for r in rows(doc) if r["ttft"]]
    lens = sorted({r["input_len"] for r in rs})
    cfgs = sorted({r["config"] for r in rs}, key=_order)
    width = 0.8 / max(1, len(cfgs))
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(lens) * max(1, len(cfgs)) / 2, 4.2))
    for i, cfg in enumerate(cfgs):
        xs, ys, lo, hi = [], [], [], []
        for j, L in enumerate(lens):
            r = next((r for r in rs if r["config"] == cfg and r["input_len"] == L), None)
            if r is None:
                continue
            t = r["ttft"]
            xs.append(j + (i - (len(cfgs) - 1) / 2) * width)
            ys.append(t["mean"])
            lo.append(t["mean"] - t["min"])
            hi.append(t["max"] - t["mean"])
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=cfg)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
    ax.set_xticks(range(len(lens)))
    ax.set_xticklabels(["%d tokens" % L for L in lens])
    ax.set_ylabel("mean TTFT (ms)")
    # two lines: a plot with one input length is narrow, and one long line would be cut off
    ax.set_title("P/D mean TTFT, vLLM %s, %s\n(bars: mean over reps, whiskers: min-max)"
                 % (doc.get("vllm_version") or "?", doc.get("gpu") or "?"), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description="markdown table + PNG of pd_bench.sh results")
    ap.add_argument("results", nargs="+")
    ap.add_argument("--md", help="markdown output (default: RESULTS.md next to the first file)")
    ap.add_argument("--png", help="plot output (default: RESULTS.png next to the first file)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--wire", help="wire_copy.py's JSON: the timed GPU0->GPU1 copy, printed next to the xfer times")
    a = ap.parse_args(argv)
    docs = [_load_json(p) for p in a.results]  # X.json, else X.json.xz
    doc = merge_results(docs) if len(docs) > 1 else docs[0]
    stem = os.path.splitext(a.results[0])[0]
    md = markdown(doc, _load_json(a.wire) if a.wire else None)
    md_path = a.md or stem + ".md"
    with open(md_path, "w") as f:
        f.write(md)
    print(md)
    print("markdown: %s" % md_path)
    if not a.no_plot:
        png = a.png or stem + ".png"
        if plot(doc, png):
            print("plot: %s" % png)
        else:
            print("plot skipped: matplotlib is not installed", file=sys.stderr)
    return 0
