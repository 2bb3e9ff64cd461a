"""The figures of docs/measurements.md, docs/deploy.md and README.md's prose, filled from the files they come from.

    python tools/docfigures.py --write   # fill every claim's figures into the docs from the files
    python tools/docfigures.py --check   # exit 1 naming each doc span that differs from the files, and each
                                         # number of the docs that no claim or exemption covers

(``--root DIR``: the docs and results of another tree, e.g. a copy.) tests/unit/test_measurement_figures.py runs
``--check`` (so ``bash tests/run.sh`` does), and ``--write`` on copies.

Each figure of a doc comes from a file a claim reads (experiments/results/, a log line kept there, or the source a
figure is about), or goes. A claim is a prose template with ``{}`` for each figure, and a function
of the loaded files giving the figures, rounded as the doc rounds; the filled template must be word for word in the
doc (fenced code, README's tables and measurements.md's ttft-summary table left out: tests/unit/test_docs.py checks
those; line breaks count as spaces). Then every number left in the doc must lie inside some claim's text or in a span
that is no measured figure (a date, a release, a commit, a file name, a GPU or TP size, a goal...: EXEMPT).

Why claims as data, not cog-style markers in the docs: the docs stay plain Markdown that reads as prose (no
``[[[cog ... ]]]`` blocks or generated-region comments between the words, nothing that pushes prose lines past 120),
and the claims already exist (hundreds; markers would mean rewriting every paragraph). The template is the doc's own
words, so ``--write`` finds each claim in the doc by turning its template into a pattern: its prose literal (any
whitespace, line breaks included, between words), each ``{}`` a figure of the same shape as the one the files give
(its numbers any number, PASS for FAIL...). A changed result file then rewrites only the figures, in place, keeping
the doc's line breaks. A new figure is ONE edit: write the sentence in the doc and add its claim here (template +
function); ``--write`` fills it from then on. Where a template matches more than one span of the doc with other
figures, ``--write`` names the spans instead of guessing: make the template longer (more of the sentence).
No new dependency: cogapp would need markers; this reads the docs as they are."""

import functools
import json
import math
import os
import re
import statistics
import sys

#: the checkout this file is in: its code (xlkv_autopatch, experiments/pdtools) is imported from here
SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (SOURCE, os.path.join(SOURCE, "experiments")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from xlkv_autopatch import prompt_tail, releases  # noqa: E402
from pdtools import archive, report  # noqa: E402  (the handoff table: pdtools/report.py, tested in tests/experiments)

#: the tree whose docs and files are read (and written): SOURCE unless set_root() says another
ROOT = SOURCE
RESULTS = os.path.join(ROOT, "experiments", "results")


def set_root(root):
    """Read (and write) the docs and results files of the tree at ``root`` from now on."""
    global ROOT, RESULTS
    ROOT, RESULTS = os.path.abspath(root), os.path.join(os.path.abspath(root), "experiments", "results")
    for cached in (load, read, handoff_rows, filled):
        cached.cache_clear()


# --------------------------------------------------------------------------- reading the files

@functools.lru_cache(maxsize=None)
def load(name):
    return archive.load_json(os.path.join(RESULTS, name))  # NAME, else NAME.xz


@functools.lru_cache(maxsize=None)
def read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8", errors="replace") as f:
        return f.read()


def cell(name, config, n, length, state=None):
    hit = [c for c in load(name)["cells"] if (c["config"], c["num_prompts"], c["input_len"]) == (config, n, length)
           and (state is None or c.get("state") == state)]
    assert len(hit) == 1, (name, config, n, length, state, len(hit))
    return hit[0]


def eq(name):
    return load(name)


KV_LINE = re.compile(r"KV Transfer metrics: Num successful transfers=(\d+), Avg xfer time \(ms\)=([\d.]+), "
                     r"P90 xfer time \(ms\)=[\d.]+, Avg post time \(ms\)=([\d.]+), P90 post time \(ms\)=[\d.]+, "
                     r"Avg MB per transfer=([\d.]+), Throughput \(MB/s\)=([\d.]+), Avg number of descriptors=([\d.]+)")


def kv_lines(log, server):
    """vLLM's KV Transfer metrics lines of one server's log (``server``: e.g. "bench-shim-d.log") in a grep
    file kept in experiments/results/, in order."""
    out = []
    for line in read("experiments", "results", *log.split("/")).splitlines():
        m = KV_LINE.search(line)
        if m and ("/" + server + ":") in line:
            n, xfer, post, mb, thr, descs = m.groups()
            out.append(dict(n=int(n), xfer=float(xfer), post=float(post), mb=float(mb), thr=float(thr),
                            descs=float(descs)))
    assert out, (log, server)
    return out


def log_has(log, text):
    assert text in read("experiments", "results", *log.split("/")), (log, text)
    return text


# --------------------------------------------------------------------------- formatting as the docs do

def f0(x):
    return "%.0f" % x


def f1(x):
    return "%.1f" % x


def f2(x):
    return "%.2f" % x


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs)


def pm(c):
    """A cell's mean TTFT as "mean ± sample std" over its repetitions, in ms."""
    return "%s ± %s" % (f0(c["mean_ttft_ms_mean"]), f0(c["mean_ttft_ms_std"]))


def span(xs, fmt=f0):
    xs = [x for x in xs if x is not None]
    return "%s–%s" % (fmt(min(xs)), fmt(max(xs)))


def per_rep(xs, fmt=f0, sep=" / "):
    return sep.join(fmt(x) for x in xs)


def ttft(c):
    return c["mean_ttft_ms_mean"]


def itl(c):
    """A cell's mean ITL: the mean over repetitions of `vllm bench serve`'s mean ITL."""
    return mean(c["mean_itl_ms"])


def xfer(c):
    return c["kv_xfer"]["avg_xfer_ms"]


def ratio(a, b):
    return f2(a / b) + "×"


def stock_vs_shim(name, n, length):
    """Stock's and the shim's mean TTFT in one results file's cell, each as "mean ± std" and its span over
    repetitions, then stock / shim: the five figures every "stock {} ms ({}), shim {} ms ({}): {}" claim fills."""
    stock, shim = cell(name, "stock", n, length), cell(name, "shim", n, length)
    return (pm(stock), span(stock["mean_ttft_ms"]), pm(shim), span(shim["mean_ttft_ms"]),
            ratio(ttft(stock), ttft(shim)))


def verdict(ok):
    return "PASS" if ok else "FAIL"


def passed(name):
    d = eq(name)
    return verdict(d["pass"] is True and d["equivalence_pass"] is True)


def nc(name, config="nc-shim"):
    """A negative control's max |Δlogprob|, when it was detected with different ids (else a word that fails)."""
    [r] = [r for r in eq(name)["negative_control"] if r["config"] == config]
    return r["max_logprob_diff"] if r["detected"] and r["ids_differ"] else "not detected"


def lp(name, config, key="max_logprob_diff"):
    return eq(name)["configs"][config][key]


def probe(name, config):
    """(blocks, descriptors) of a config's probe transfer."""
    c = eq(name)["configs"][config]
    return c["blocks_per_transfer"], c["descriptors_per_transfer"]


def per_block(name, config):
    n, d = probe(name, config)
    return f0(d / n)


def per_remote_rank_pass(name):
    """PASS when everything but the descriptor check passed, and the shim's descriptors per block stay within
    the lab's limit per prefill rank read (pdtools.kvmetrics: what the summary was judged by before that limit)."""
    from pdtools.kvmetrics import descriptor_limit, source_ranks
    d, c = eq(name), eq(name)["configs"]["shim"]
    ok = (d["equivalence_pass"] and d["logprob_pass"] and d["transfers_pass"] and d["negative_control_pass"]
          and d["pd_vs_pd_stock"] == {"pd:shim": []}
          and c["descriptors_per_block"] <= descriptor_limit(c["attn_backend"], vllm_version=d["vllm_version"],
                                                             source_ranks=source_ranks(d["tp_p"], d["tp_d"],
                                                                                       d.get("model_shape")))
          and c["descriptor_pass"] is False)  # what the file's own summary said (the doc says so too)
    return ok


def regions(name, config):
    got = set(eq(name)["configs"][config]["registered_regions_per_block_id"])
    assert len(got) == 1, (name, config, got)
    return got.pop()


def lengths(name):
    ls = eq(name)["prompt_lengths"]
    return "%d–%d" % (min(ls), max(ls))


def identical_ids(name, *labels):
    """Every run named is identical to the file's baseline (token ids), and no mismatch is reported."""
    runs = {r["label"]: r for r in eq(name)["runs"]}
    return all(runs[lb]["identical_to_baseline"] for lb in labels) and not eq(name)["mismatches"]


def pulled_for_every_answer(name):
    d = eq(name)
    ok = d["transfers_pass"] is True and not d["transfer_problems"]
    return "KV pulled for every P/D answer" if ok else "some P/D answer pulled no KV"


def releases_where(column, value=True):
    """The releases of xlkv_autopatch/releases.py's table whose ``column`` is ``value`` (or for which
    ``value``, a function, is true), as "first–last" (and they must be one run of consecutive rows)."""
    rows = releases.RELEASES
    test = value if callable(value) else (lambda v: v == value)
    idx = [i for i, r in enumerate(rows) if test(getattr(r, column))]
    assert idx and idx == list(range(idx[0], idx[-1] + 1)), (column, idx)
    return "%s–%s" % (rows[idx[0]].release, rows[idx[-1]].release)


# --------------------------------------------------------------------------- the files the docs cite

B21 = "2026-11-22-0.21.0-2xH200.json"
B21K = "2026-11-22-0.21.0-2xH200-1024.json"
B26 = "2026-11-22-0.26.0-2xH200.json"
B26R = "2026-11-22-0.26.0-2xH200-1024-rerun.json"
B33 = "2026-11-23-0.33.0-2xH200.json"
FRAG = "2026-11-23-0.26.0-2xH200.json"
FRAG_LOG = "logs-2026-11-23-s7/call5-loggrep.txt"
EQ_FRAG = "2026-11-23-equivalence-0.26.0-1xH200-fragmented.json"
EQ_FRAG_LOG = "logs-2026-11-23-s7/call11-loggrep.txt"
WIRE = "2026-11-23-wire-2xH200.json"
SIM = "cpu-alloc-order-sim-0.26.0.json"
ONE = "2026-11-23-0.26.0-1xH200.json"
ONE_LOG = "logs-2026-11-23-s8/call8-loggrep.txt"
ONE_CONSOLE = "logs-2026-11-23-s8/call8-console.txt"
EQ15 = "2026-11-24-equivalence-0.15.1-1xH100-logprobs-nc.json"
EQ15_LOG = "logs-2026-11-24-1xH100/call50-loggrep.txt"
EQ15_GZ = "2026-11-24-equivalence-0.15.1-1xH100-getzcopy.json"
EQ15_GZ_LOG = "logs-2026-11-24-1xH100/call55-loggrep.txt"
TRITON = "2026-11-24-equivalence-0.33.0-1xH100-triton-nc.json"
TRITON_LOG = "logs-2026-11-24-1xH100/call76-loggrep.txt"
SH33 = "2026-11-24-0.33.0-1xH100-shared.json"
SH26 = "2026-11-24-0.26.0-1xH100-shared.json"
UCX = "2026-11-24-ucx-same-gpu-1xH100.json"
DC1 = "2026-11-27-0.33.0-2xH200-decode-c1.json"
DC64 = "2026-11-27-0.33.0-2xH200-decode-c64.json"
DC_CALLS = "logs-2026-11-27-2xH200-decode/calls.md"
DC64B = "2026-11-27-0.33.0-2xH200-decode-c64-stock-shim.json"
B4 = "2026-11-22-0.26.0-4xH200.json"
EQ21 = "2026-11-22-equivalence-0.21.0-2xH200-batch-invariant.json"
EQ26 = "2026-11-22-equivalence-0.26.0-2xH200-batch-invariant.json"
EQ21_DEFAULT = "2026-11-22-equivalence-0.21.0-2xH200.json"
EQ26_DEFAULT = "2026-11-22-equivalence-0.26.0-2xH200.json"
TP22 = "2026-11-22-equivalence-0.21.0-tp2to2-4xH200.json"
TP12 = "2026-11-22-equivalence-0.21.0-tp1to2-4xH200.json"
EQ26L = "2026-11-23-equivalence-0.26.0-1xH200-logprobs-nc.json"
RUN1 = "2026-11-23-equivalence-0.26.0-1xH200-logprobs-nc-run1.json"
EQ29 = "2026-11-23-equivalence-0.29.0-1xH200-logprobs-nc.json"
EQ29R = "2026-11-23-equivalence-0.29.0-1xH200-native-ray.json"
RAY_LOG = "logs-2026-11-23-s6/0.29-call22-eq-shim-ray-d.log"
EQ33 = "2026-11-23-equivalence-0.33.0-1xH200-logprobs-nc.json"
EQ33N = "2026-11-23-equivalence-0.33.0-1xH200-native.json"
EQ33_LOG = "logs-2026-11-23-1xH200/0.33.0-equivalence.loggrep.txt"
GEMMA12 = "2026-11-26-equivalence-0.33.0-2xH200-gemma3-tp1to2-nc.json"
GPTOSS = "2026-11-29-gptoss-1xH200-equivalence.json"
DENSE12 = "2026-11-26-equivalence-0.33.0-2xH200-tp1to2-nc.json"
DENSE12_CONSOLE = "logs-2026-11-26-2xH200-hetero-tp/call20/console.txt"
DENSE21 = "2026-11-27-equivalence-0.33.0-2xH200-tp2to1-stock.json"
DENSE21NC = "2026-11-27-equivalence-0.33.0-2xH200-tp2to1-nc.json"
GEMMA21NC = "2026-11-27-equivalence-0.33.0-2xH200-gemma3-tp2to1-nc.json"
DENSE12NC = "2026-11-27-equivalence-0.33.0-2xH200-tp1to2-nc.json"
MLA33 = "2026-11-26-equivalence-0.33.0-1xH100-mla-native-nc.json"
GEMMA33 = "2026-11-26-equivalence-0.33.0-1xH100-gemma3-native-nc.json"
MQA33 = "2026-11-26-equivalence-0.33.0-1xH100-mqa-nc.json"
MLA26_TRITON = "2026-11-26-equivalence-0.26.0-1xH100-mla-triton-v1-nc.json"
MLA26_FLASHMLA = "2026-11-26-equivalence-0.26.0-1xH100-mla-flashmla-v1-nc.json"
GEMMA26 = "2026-11-26-equivalence-0.26.0-1xH100-gemma3-v1-nc.json"
MLA26_H200 = "2026-11-26-equivalence-0.26.0-1xH200-mla-flashattn-nc.json"
DESC = "cpu-desc-bench-640blocks.json"
STARTUP = "startup-cost.json"
INIT = "cpu-model-init-28layers.json"
TWO_STOCK = "2026-11-25-two-hosts-0.33.0-stock.json"
TWO_XLKV = "2026-11-25-two-hosts-0.33.0-xlkv.json"
TWO_DIES = "2026-11-25-two-hosts-0.21.0-stock-decode-dies.json"
WHEEL_VENV = "2026-11-25-wheel-venv-status.json"
HO = "2026-11-27b-0.33.0-2xH200-handoff.json"
DC64C = "2026-11-27b-0.33.0-2xH200-decode-c64-stock-shim.json"
DETOK = "2026-11-27-detok-prime-cpu-0.29.0.json"
HOAB = "2026-11-27e-0.33.0-2xH200-handoff-ab.json"
DECAB = "2026-11-27e-0.33.0-2xH200-decode-native-shim-ab.json"
DETOK2 = "2026-11-27e-detok-switch-cpu-0.29.0.json"
GRAPHS = "2026-11-27f-0.33.0-2xH200-graphs-ab.json"
GRAPHS_C8 = "2026-11-27j-0.33.0-2xH200-graphs-c8.json"
GRAPHS_26 = "2026-11-28-0.26.0-2xH200-graphs-c8.json"
EQ_GRAPHS_26 = "2026-11-28-equivalence-0.26.0-2xH200-graphs-detok-nc.json"
GRAPHS_33B = "2026-11-28b-0.33.0-2xH200-graphs-c8.json"
EQ_GRAPHS_33 = "2026-11-28b-equivalence-0.33.0-2xH200-graphs-detok-nc.json"


# --------------------------------------------------------------------------- derived figures

def pooled(config):
    """The 0.26.0 128 × 1024 cell of both runs (3 + 5 repetitions) as one sample."""
    xs = [x for name in (B26, B26R) for x in cell(name, config, 128, 1024)["mean_ttft_ms"]]
    return len(xs), statistics.mean(xs), statistics.stdev(xs)


def frag_lines():
    """D's KV metrics of the fragmented 64 × 10240 shim cell: the fragmenting load (the interval with the
    most sub-1120-MB transfers), then the benchmark's 1120 MB transfers after it."""
    lines = kv_lines(FRAG_LOG, "bench-shim-d.log")
    load = max((x for x in lines if x["mb"] < 1120), key=lambda x: x["n"])
    bench = [x for x in lines[lines.index(load) + 1:] if x["mb"] == 1120]
    return load, bench


def wire_ms_for(mb):
    """The wire's time for ``mb`` MiB (vLLM's MB), scaled linearly from the measured copy."""
    w = load(WIRE)
    return w["median_ms"] * mb * 2 ** 20 / w["bytes"]


def shared_gpu_lines():
    """1120 MB transfers between two processes on one GPU (shim-keep-order's D): those that ran with at
    most 4 at once and at ≥ 0.1 GB/s ("alone"), and the intervals of ≥ 29 transfers ("under load")."""
    lines = [x for x in kv_lines(ONE_LOG, "bench-shim-keep-order-d.log") if x["mb"] == 1120]
    alone = [x for x in lines if x["n"] <= 4 and x["thr"] >= 100]
    loaded = [x for x in lines if x["n"] >= 29]
    assert alone and loaded
    return alone, loaded


def sim_cases(prefix):
    return {k: v for k, v in load(SIM)["runs"].items() if k.startswith(prefix)}


def sim_means(case, policy, key):
    return [rep[key] for rep in load(SIM)["runs"][case]["policies"][policy]]


def sim_no_hash():
    return [x for case in sim_cases("fragmented, no prefix-cache hash") for x in
            sim_means(case, "vllm_allocation", "transfer_order_mean")]


def sim_fragmented(policy, key):
    return [x for case in sim_cases("fragmented") for x in sim_means(case, policy, key)]


def ucx_runs(zcopy):
    """The probe's cross-layer runs that completed, with or without UCX_CUDA_IPC_ENABLE_GET_ZCOPY."""
    return [r for c in load(UCX)["calls"] for r in c["runs"] if r["shape"] == "cross-layer" and r.get("median_ms")
            and ("UCX_CUDA_IPC_ENABLE_GET_ZCOPY" in r["env"]) == zcopy]


def zcopy_in_vllm():
    """The largest transfer of the 0.15.1 shim's equivalence run (D's KV metrics), without and with
    UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y: (MB, ms before, ms after)."""
    before, after = (max(kv_lines(log, "eq-shim-d.log"), key=lambda x: x["mb"]) for log in (EQ15_LOG, EQ15_GZ_LOG))
    assert before["mb"] == after["mb"], (before, after)
    return "%g" % before["mb"], "%g" % before["xfer"], "%g" % after["xfer"]


def ucx_run(variant, shape):
    """The first call's run of that variant and shape (call 1: 5 repetitions of each)."""
    return next(r for c in load(UCX)["calls"] for r in c["runs"] if (r["variant"], r["shape"]) == (variant, shape))


def first_ids(path, label, length):
    m = re.search(r"^\s*%s\s+len=%d\s+method=\S+ out=(\[[\d, ]+\])" % (re.escape(label), length),
                  read("experiments", "results", *path.split("/")), re.M)
    return json.loads(m.group(1))


def float32_step(x):
    """x is one float32 step (a power of two): the text calls it 1 ulp / one float32 step."""
    return x > 0 and x == 2.0 ** round(math.log2(x))


def distinct_ids(*names):
    return [n for name in names for n in eq(name)["distinct_ids"].values()]


def startup(key):
    return load(STARTUP)["median_ms"][key]


def two(name):
    return load(name)["result"]


def block_bytes(name, case):
    r = two(name)
    return len(r["cases"][case]["local_block_ids"]) * r["block_len"] * r["num_regions"]


# --------------------------------------------------------------------------- docs/measurements.md

MEASUREMENTS = [
    # 0.21.0, 64 × 10240
    ("P/D mean TTFT, vLLM 0.21.0, 2×H200, {} × {} tokens, {} reps | stock {} ms, shim {} ms (**{}**), vLLM's own "
     "opt-in {} ms; mean ITL {} / {} / {} ms",
     lambda: (64, 10240, cell(B21, "stock", 64, 10240)["reps"], pm(cell(B21, "stock", 64, 10240)),
              pm(cell(B21, "shim", 64, 10240)), ratio(ttft(cell(B21, "stock", 64, 10240)), ttft(cell(B21, "shim", 64, 10240))),
              pm(cell(B21, "native", 64, 10240)),
              *[f1(itl(cell(B21, c, 64, 10240))) for c in ("stock", "shim", "native")])),
    # 0.21.0, 128 × 1024
    ("P/D mean TTFT, vLLM 0.21.0, 2×H200, {} × {} tokens, {} reps | stock {} ms ({}), shim {} ms ({}): **{}**; "
     "mean ITL {} vs {} ms",
     lambda: (128, 1024, cell(B21K, "stock", 128, 1024)["reps"],
              *stock_vs_shim(B21K, 128, 1024),
              f1(itl(cell(B21K, "stock", 128, 1024))), f1(itl(cell(B21K, "shim", 128, 1024))))),
    # 0.26.0, 64 × 10240
    ("P/D mean TTFT, vLLM 0.26.0, 2×H200, {} × {} tokens, {} reps | stock {} ms ({}), shim {} ms ({}): **{}**; "
     "vLLM's best own configuration (opt-in + `VLLM_USE_V2_MODEL_RUNNER=0`) {} ms ({}); mean ITL {} / {} / {} ms; "
     "vLLM's average KV transfer time per request {} ms (stock) vs {} ms (shim)",
     lambda: (64, 10240, cell(B26, "stock", 64, 10240)["reps"],
              *stock_vs_shim(B26, 64, 10240),
              pm(cell(B26, "native-v1", 64, 10240)),
              ratio(ttft(cell(B26, "stock", 64, 10240)), ttft(cell(B26, "native-v1", 64, 10240))),
              *[f1(itl(cell(B26, c, 64, 10240))) for c in ("stock", "shim", "native-v1")],
              span(xfer(cell(B26, "stock", 64, 10240))), span(xfer(cell(B26, "shim", 64, 10240))))),
    # 0.26.0, 128 × 1024, both runs and pooled
    ("P/D mean TTFT, vLLM 0.26.0, 2×H200, {} × {} tokens | 2026-11-22 (shim at 90e7201), {} reps: stock {} ms ({}), "
     "shim {} ms ({}): {}. Rerun 2026-11-22 (shim at 11f7b7e), {} reps: stock {} ms ({}), shim {} ms ({}): {}; "
     "native-v1 {} ms ({} reps). Pooled, {} reps each: stock {} ± {}, shim {} ± {} ms: {}",
     lambda: (128, 1024, cell(B26, "stock", 128, 1024)["reps"],
              *stock_vs_shim(B26, 128, 1024),
              cell(B26R, "stock", 128, 1024)["reps"],
              *stock_vs_shim(B26R, 128, 1024),
              pm(cell(B26R, "native-v1", 128, 1024)), cell(B26R, "native-v1", 128, 1024)["reps"],
              pooled("stock")[0], f0(pooled("stock")[1]), f0(pooled("stock")[2]),
              f0(pooled("shim")[1]), f0(pooled("shim")[2]),
              # the two pooled means lie within each other's spread
              "no regression, no gain beyond noise"
              if abs(pooled("stock")[1] - pooled("shim")[1]) < min(pooled("stock")[2], pooled("shim")[2]) * 2
              else "a difference beyond noise")),
    # 0.33.0, 64 × 10240, interleaved
    ("interleaved (stock, shim, native ×{} reps, then shim, stock ×{}) | stock {} ms ({}), shim {} ms ({}): **{}**; "
     "vLLM's own `VLLM_KV_CACHE_LAYOUT=BLNHC` {} ms ({}, {} reps: the device time ran out), {}. Mean ITL {} / {} / {} ms. "
     "Descriptors per {}-block transfer (D's KV metrics): stock {}, shim {} (with the descriptor ordering), BLNHC {}; "
     "vLLM's average KV transfer time per request {} / {} / {} ms",
     lambda: (cell(B33, "native", 64, 10240)["reps"],
              cell(B33, "stock", 64, 10240)["reps"] - cell(B33, "native", 64, 10240)["reps"],
              *stock_vs_shim(B33, 64, 10240),
              pm(cell(B33, "native", 64, 10240)), span(cell(B33, "native", 64, 10240)["mean_ttft_ms"]),
              cell(B33, "native", 64, 10240)["reps"],
              ratio(ttft(cell(B33, "stock", 64, 10240)), ttft(cell(B33, "native", 64, 10240))),
              *[f1(itl(cell(B33, c, 64, 10240))) for c in ("stock", "shim", "native")],
              f0(cell(B33, "stock", 64, 10240)["kv_xfer"]["blocks_per_transfer"][0]),
              span(cell(B33, "stock", 64, 10240)["descriptors_per_transfer"]),
              "%s–%s" % (f1(min(cell(B33, "shim", 64, 10240)["descriptors_per_transfer"])),
                         f0(max(cell(B33, "shim", 64, 10240)["descriptors_per_transfer"]))),
              span(cell(B33, "native", 64, 10240)["descriptors_per_transfer"]),
              *[span(xfer(cell(B33, c, 64, 10240))) for c in ("stock", "shim", "native")])),
    ("P/D mean TTFT, vLLM 0.33.0 (torch 2.14 bundle, Model Runner V2, FLASH_ATTN), 2×H200, {} × {} tokens",
     lambda: (cell(B33, "stock", 64, 10240)["num_prompts"], cell(B33, "stock", 64, 10240)["input_len"])),
    # 0.26.0, fragmented free queue
    ("P/D mean TTFT, vLLM 0.26.0, 2×H200, {} × {} tokens, **fragmented** free queue ({} mixed-length requests first), "
     "{} reps",
     lambda: (cell(FRAG, "shim", 64, 10240, "fragmented")["num_prompts"], 10240,
              int(re.search(r"--num-prompts (\d+)", next(c for c in load(FRAG)["commands"] if "--random-input-len 2048" in c)).group(1)),
              cell(FRAG, "shim", 64, 10240, "fragmented")["reps"])),
    ("P alone (`prefill_only`, `max_tokens=1`) {} ms ({}); shim (with the descriptor ordering) {} ms ({}): "
     "P/D overhead **{} ms**. D's KV metrics per {}-block transfer: {} descriptors (mean {}; goal ≤ 16), xfer {} ms "
     "(mean {}; goal ≤ 8), post {} ms; mean ITL {} ms. The {} fragmenting transfers of {} MB (wire ≈ {} ms) took {} ms "
     "on average too",
     lambda: (pm(cell(FRAG, "prefill_only", 64, 10240, "fragmented")),
              span(cell(FRAG, "prefill_only", 64, 10240, "fragmented")["mean_ttft_ms"]),
              pm(cell(FRAG, "shim", 64, 10240, "fragmented")),
              span(cell(FRAG, "shim", 64, 10240, "fragmented")["mean_ttft_ms"]),
              f0(ttft(cell(FRAG, "shim", 64, 10240, "fragmented")) - ttft(cell(FRAG, "prefill_only", 64, 10240, "fragmented"))),
              f0(cell(FRAG, "shim", 64, 10240, "fragmented")["kv_xfer"]["blocks_per_transfer"][0]),
              span(cell(FRAG, "shim", 64, 10240, "fragmented")["descriptors_per_transfer"]),
              f0(cell(FRAG, "shim", 64, 10240, "fragmented")["avg_descriptors_per_transfer"]),
              span(xfer(cell(FRAG, "shim", 64, 10240, "fragmented")), f1),
              f1(cell(FRAG, "shim", 64, 10240, "fragmented")["avg_xfer_ms"]),
              span([x["post"] for x in frag_lines()[1]], f1),
              span(cell(FRAG, "shim", 64, 10240, "fragmented")["mean_itl_ms"], f1),
              frag_lines()[0]["n"], f0(frag_lines()[0]["mb"]), f1(wire_ms_for(frag_lines()[0]["mb"])),
              f1(frag_lines()[0]["xfer"]))),
    ("`stock` and `shim-keep-order` in this state were not run",
     lambda: () if {c["config"] for c in load(FRAG)["cells"]} == {"prefill_only", "shim"} else ("(they are in the file)",)),
    # equivalence after a fragmenting load
    ("prefix caching off, {} mixed-length requests through each pair before the checked prompts",
     lambda: (eq(EQ_FRAG)["fragment_prompts"],) if "--no-enable-prefix-caching" in eq(EQ_FRAG)["serve_args"] else ("?",)),
    ("(`EQ_FRAGMENT={}`) | **{}**: token ids identical for local:stock, pd:stock, local:shim, pd:shim at {} tokens; "
     "P/D vs local max \\|Δlogprob\\| {} in each config, local:stock vs local:shim {}; {}. The shim's first reordered "
     "transfer: {} pairs, {} runs in vLLM's order, {} after ordering; its {}-block probe moved {} descriptors ({} in a "
     "fresh state on 0.29.0), stock {}. No negative control in this run",
     lambda: (eq(EQ_FRAG)["fragment_prompts"], passed(EQ_FRAG), lengths(EQ_FRAG),
              f0(max(lp(EQ_FRAG, c, "max_logprob_diff_pd_vs_local") for c in ("stock", "shim"))),
              ("%.1e" % abs(lp(EQ_FRAG, "stock", "max_logprob_diff_local") - lp(EQ_FRAG, "shim", "max_logprob_diff_local"))
               ).replace("e-07", "e-7"),
              pulled_for_every_answer(EQ_FRAG),
              *re.search(r"first reordered NIXL transfer: (\d+) descriptor pairs, (\d+) contiguous runs in vLLM's order, "
                         r"(\d+) after ordering", read("experiments", "results", *EQ_FRAG_LOG.split("/"))).groups(),
              f0(probe(EQ_FRAG, "shim")[0]), f0(probe(EQ_FRAG, "shim")[1]), f0(probe(EQ29, "shim")[1]),
              f0(probe(EQ_FRAG, "stock")[1]))
     if not eq(EQ_FRAG)["negative_control"] and identical_ids(EQ_FRAG, "local:stock", "pd:stock", "local:shim", "pd:shim")
     else ("a negative control or a mismatch",) * 15),
    # the wire
    ("one request's KV bytes ({} GiB) GPU0 → GPU1, `torch` copy over NVLink, {} copies | median {} ms ({}), {} GB/s: "
     "vLLM's xfer time above is {}× it",
     lambda: (f2(load(WIRE)["bytes"] / 2 ** 30), load(WIRE)["reps"], f2(load(WIRE)["median_ms"]),
              span(load(WIRE)["ms"], f2), f0(load(WIRE)["gb_s"]),
              f1(cell(FRAG, "shim", 64, 10240, "fragmented")["avg_xfer_ms"] / load(WIRE)["median_ms"]))),
    # the allocation-order simulation
    ("descriptors per {}-block transfer, vLLM 0.26.0's real `BlockPool` on both sides with a model scheduler "
     "(`experiments/probes/alloc_order_sim.py`, CPU, {} reps per row) | fresh: vLLM's order {} (the GPU measured {} for "
     "the shim without ordering), ascending order {}. Fragmented: ascending order {} with prefix-cache hashes on both "
     "sides, {} when one or both sides' freed blocks carry none (the GPU measured {}: between the two); ascending "
     "*allocation* on both sides {} in all four cases; distinct block runs per request are {} on D and {} on P, so no "
     "order reaches 16",
     lambda: (load(SIM)["runs"]["fresh"]["policies"]["vllm_allocation"][0]["requests"][0]["blocks"],
              load(SIM)["runs"]["fresh"]["params"]["reps"],
              span(sim_means("fresh", "vllm_allocation", "vllm_order_mean")),
              span(cell(B26, "shim", 64, 10240)["descriptors_per_transfer"]),
              span(sim_means("fresh", "vllm_allocation", "transfer_order_mean"), f1),
              span(sim_means("fragmented", "vllm_allocation", "transfer_order_mean")),
              span(sim_no_hash()),
              span(cell(FRAG, "shim", 64, 10240, "fragmented")["descriptors_per_transfer"])
              if max(sim_means("fragmented", "vllm_allocation", "transfer_order_mean"))
              < min(cell(FRAG, "shim", 64, 10240, "fragmented")["descriptors_per_transfer"])
              <= max(cell(FRAG, "shim", 64, 10240, "fragmented")["descriptors_per_transfer"]) < min(sim_no_hash())
              else "(not between them)",
              span(sim_fragmented("sorted_allocation", "transfer_order_mean")),
              span(sim_fragmented("vllm_allocation", "runs_d_mean") + sim_fragmented("sorted_allocation", "runs_d_mean")),
              span(sim_fragmented("vllm_allocation", "runs_p_mean") + sim_fragmented("sorted_allocation", "runs_p_mean")))
     if min(sim_fragmented("vllm_allocation", "transfer_order_mean")
            + sim_fragmented("sorted_allocation", "transfer_order_mean")) > 16 else ("an order that reaches 16",) * 13),
    # one shared H200
    ("P alone, {} × {} fragmented: {} ms (2×H200: {}). P/D on the shared GPU is not a benchmark: `shim-keep-order`'s "
     "first {} × {} rep had mean TTFT {} ms (median {}), because UCX moved each {} MB transfer between the two processes "
     "in {} s alone and {} s under load ({} GB/s; 2×H200: {} ms)",
     lambda: (64, 10240, per_rep(cell(ONE, "prefill_only", 64, 10240, "fragmented")["mean_ttft_ms"]),
              per_rep(cell(FRAG, "prefill_only", 64, 10240, "fragmented")["mean_ttft_ms"]), 64, 10240,
              *[re.sub(r"(\d)(\d{3})$", r"\1 \2", f0(float(re.search(r"%s TTFT \(ms\):\s+([\d.]+)" % k,
                                                                      read("experiments", "results", *ONE_CONSOLE.split("/"))).group(1))))
                for k in ("Mean", "Median")],
              f0(shared_gpu_lines()[0][0]["mb"]),
              span([x["xfer"] / 1000 for x in shared_gpu_lines()[0]], f1),
              span([x["xfer"] / 1000 for x in shared_gpu_lines()[1]]),
              span([x["thr"] / 1000 for x in shared_gpu_lines()[0]], f1),
              span(xfer(cell(FRAG, "shim", 64, 10240, "fragmented"))))),
    # the 0.15.1 backport
    ("**{}**: token ids and top-{} logprobs identical for local:stock, pd:stock, local:shim, pd:shim at {} tokens (max "
     "\\|Δlogprob\\| {}); negative control nc-shim (one received block shifted) detected: ids differ, max \\|Δlogprob\\| "
     "{}; {}; {}-block probe: stock {} descriptors, shim {} per transfer. D's log: \"{}\"",
     lambda: (passed(EQ15) if eq(EQ15)["logprob_pass"] and identical_ids(EQ15, "local:stock", "pd:stock", "local:shim", "pd:shim")
              else "FAIL", eq(EQ15)["logprobs"], lengths(EQ15),
              f0(max(lp(EQ15, c) for c in ("stock", "shim"))), "%.3f" % nc(EQ15), pulled_for_every_answer(EQ15),
              f0(probe(EQ15, "stock")[0]), f0(probe(EQ15, "stock")[1]), f0(probe(EQ15, "shim")[1]),
              log_has(EQ15_LOG, "registering one cross-layer KV tensor (10327, 8, 28, 2, 16, 128)"))),
    # 0.33.0 TRITON_ATTN
    ("`--attention-backend TRITON_ATTN`**, 2026-11-24, shim at 47974b8, 1×H100 (P and D share it), "
     "`VLLM_BATCH_INVARIANT=1` | **{}**: ids and top-{} logprobs identical for local/pd × stock/shim (max "
     "\\|Δlogprob\\| {}), nc-shim detected (ids differ, {}); the shim requested BLNHC; a {}-block transfer: {} "
     "descriptors stock, {} with the shim",
     lambda: (passed(TRITON) if eq(TRITON)["logprob_pass"] else "FAIL", eq(TRITON)["logprobs"],
              f0(max(lp(TRITON, c) for c in ("stock", "shim"))), "%.3f" % nc(TRITON),
              f0(probe(TRITON, "stock")[0]), f0(probe(TRITON, "stock")[1]), f0(probe(TRITON, "shim")[1]))
     if log_has(TRITON_LOG, "requests KV cache layout BLNHC") else ()),
    # one shared H100, 0.33.0
    ("vLLM 0.33.0, 1×H100, {} × {} tokens, fresh, {} reps, 2026-11-24 (P's and D's compute compete: not comparable with "
     "two-GPU cells) | P alone (`prefill_only`) {} ms ({}); shim P/D {} ms ({}): P/D overhead **{} ms** (2×H200, "
     "{} × {} fragmented: {} ms). The proxy's split (reps 1–2): P's answer {} ms, D's first token after it {} ms, of "
     "which NIXL's xfer time (post → vLLM's check sees it done) {} ms for {} MB transfers of {} blocks (descriptors per "
     "transfer, averaged over a repetition's {} transfers: {} in rep 1, {} in rep 2; rep 3 recorded no transfer "
     "metrics). So about {} ms of the handoff",
     lambda: (8, 10240, cell(SH33, "shim", 8, 10240)["reps"],
              pm(cell(SH33, "prefill_only", 8, 10240)), per_rep(cell(SH33, "prefill_only", 8, 10240)["mean_ttft_ms"]),
              pm(cell(SH33, "shim", 8, 10240)), per_rep(cell(SH33, "shim", 8, 10240)["mean_ttft_ms"]),
              f0(ttft(cell(SH33, "shim", 8, 10240)) - ttft(cell(SH33, "prefill_only", 8, 10240))), 64, 10240,
              f0(ttft(cell(FRAG, "shim", 64, 10240, "fragmented")) - ttft(cell(FRAG, "prefill_only", 64, 10240, "fragmented"))),
              f0(cell(SH33, "shim", 8, 10240)["avg_proxy_prefill_ms"]),
              f0(cell(SH33, "shim", 8, 10240)["avg_proxy_decode_first_ms"]),
              f0(cell(SH33, "shim", 8, 10240)["avg_xfer_ms"]),
              f0(mean(cell(SH33, "shim", 8, 10240)["kv_xfer"]["avg_mb_per_transfer"])),
              f0(mean(cell(SH33, "shim", 8, 10240)["kv_xfer"]["blocks_per_transfer"])),
              f0(mean(cell(SH33, "shim", 8, 10240)["kv_xfer"]["num_transfers"])),
              *[("%g" % x) if x is not None else "none" for x in cell(SH33, "shim", 8, 10240)["descriptors_per_transfer"][:2]],
              # D's part outside the transfer, to the nearest 50 ms ("about")
              f0(round((cell(SH33, "shim", 8, 10240)["avg_proxy_decode_first_ms"]
                        - cell(SH33, "shim", 8, 10240)["avg_xfer_ms"]) / 50) * 50))
     if cell(SH33, "shim", 8, 10240)["descriptors_per_transfer"][2] is None else ("rep 3 has metrics",) * 22),
    # where the handoff goes
    ("vLLM 0.26.0, shim, 1×H100 shared with cuda_ipc READs, {} × {}, fresh, {} reps, 2026-11-24 | mean TTFT {} ms ({}). "
     "P's answer {} ms; D's {} ms: HTTP hop to D {}, D's ingress (tokenising, the hop to the engine core) {}, D's queue "
     "until first scheduled (admission, blocks, read posted) {}, NIXL read {} ({} MB), read noticed + last token "
     "computed {}",
     lambda: (8, 10240, cell(SH26, "shim", 8, 10240)["reps"], pm(cell(SH26, "shim", 8, 10240)),
              span(cell(SH26, "shim", 8, 10240)["mean_ttft_ms"]),
              f0(cell(SH26, "shim", 8, 10240)["handoff_split_ms"]["p_answer"]),
              f0(cell(SH26, "shim", 8, 10240)["avg_proxy_decode_first_ms"]),
              *[f0(cell(SH26, "shim", 8, 10240)["handoff_split_ms"][k])
                for k in ("d_frontend", "d_ingress", "d_queue", "kv_read")],
              f0(mean(cell(SH26, "shim", 8, 10240)["kv_xfer"]["avg_mb_per_transfer"])),
              f0(cell(SH26, "shim", 8, 10240)["handoff_split_ms"]["d_notice_first_token"]))),
    # UCX between two processes on one GPU
    ("nixl-cu12 {}, 2026-11-24, {} reps | {} × {} MiB ({} GB): median {} s ({} GB/s) with any `UCX_TLS`, because UCX "
     "disables cuda_ipc get-zcopy without NVLink (\"{}\")",
     lambda: (load(UCX)["calls"][0]["nixl"], span([len(r["ms"]) for r in ucx_runs(False) + ucx_runs(True)]),
              ucx_run("default", "cross-layer")["descriptors"], f2(ucx_run("default", "cross-layer")["block_bytes"] / 2 ** 20),
              f2(ucx_run("default", "cross-layer")["total_mb"] / 1000),
              span([r["median_ms"] / 1000 for r in ucx_runs(False)], f2),
              span([r["gb_per_s"] for r in ucx_runs(False)], f2),
              "cuda-ipc get zcopy disabled as no nvlinks detected"
              if "cuda-ipc get zcopy disabled as no nvlinks detected" in archive.read_text(os.path.join(RESULTS, UCX)) else "?")),
    ("With **`UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y`**: median {} ms (**{} GB/s**); {} × {} KiB: {} ms. Inside vLLM 0.15.1 "
     "(P and D on the one GPU, same variable): a {} MB transfer {} → {} ms, equivalence {}",
     lambda: (f2(ucx_run("get-zcopy", "cross-layer")["median_ms"]), f0(ucx_run("get-zcopy", "cross-layer")["gb_per_s"]),
              ucx_run("get-zcopy", "stock")["descriptors"], f0(ucx_run("get-zcopy", "stock")["block_bytes"] / 1024),
              f2(ucx_run("get-zcopy", "stock")["median_ms"]),
              *zcopy_in_vllm(),
              passed(EQ15_GZ))),
    # decode speed under BHLNC
    ("2×H200 (P TP 1 on GPU 0, D TP 1 on GPU 1), {}-token prompts, {} output tokens, FLASH_ATTN, {} reps",
     lambda: (10240, cell(DC1, "shim", 10, 10240)["output_len"], cell(DC1, "shim", 10, 10240)["reps"])),
    ("**one request at a time** ({} prompts per rep): mean ITL stock {} ms, shim {} (median ITL {} vs {}; p99 {} vs {}): "
     "within stock's spread. Mean TTFT stock {} ms ({}), shim {} ms ({}); descriptors per {}-block transfer {} → {}. "
     "**{} × {}**: stock mean ITL {} ms, vLLM's `BLNHC` {} (mean TTFT {} vs {} ms)",
     lambda: (cell(DC1, "shim", 10, 10240)["num_prompts"],
              per_rep(cell(DC1, "stock", 10, 10240)["mean_itl_ms"], f1), per_rep(cell(DC1, "shim", 10, 10240)["mean_itl_ms"], f1),
              per_rep(cell(DC1, "stock", 10, 10240)["median_itl_ms"], f1), per_rep(cell(DC1, "shim", 10, 10240)["median_itl_ms"], f1),
              per_rep(cell(DC1, "stock", 10, 10240)["p99_itl_ms"], f1), per_rep(cell(DC1, "shim", 10, 10240)["p99_itl_ms"], f1),
              pm(cell(DC1, "stock", 10, 10240)), span(cell(DC1, "stock", 10, 10240)["mean_ttft_ms"]),
              pm(cell(DC1, "shim", 10, 10240)), span(cell(DC1, "shim", 10, 10240)["mean_ttft_ms"]),
              f0(cell(DC1, "shim", 10, 10240)["kv_xfer"]["blocks_per_transfer"][0]),
              f0(cell(DC1, "stock", 10, 10240)["avg_descriptors_per_transfer"]),
              f0(cell(DC1, "shim", 10, 10240)["avg_descriptors_per_transfer"]),
              64, 10240,
              per_rep(cell(DC64, "stock", 64, 10240)["mean_itl_ms"], f1), per_rep(cell(DC64, "native", 64, 10240)["mean_itl_ms"], f1),
              per_rep(cell(DC64, "stock", 64, 10240)["mean_ttft_ms"]), per_rep(cell(DC64, "native", 64, 10240)["mean_ttft_ms"]))
     if min(cell(DC1, "stock", 10, 10240)["mean_itl_ms"]) <= min(cell(DC1, "shim", 10, 10240)["mean_itl_ms"])
     and max(cell(DC1, "shim", 10, 10240)["mean_itl_ms"]) <= max(cell(DC1, "stock", 10, 10240)["mean_itl_ms"])
     else ("outside stock's spread",) * 21),
    ("A later call (another 2×H200, shim 49027c2), stock and shim in the same call, **{} repetition each** (device "
     "time; no spread): mean ITL stock {} ms, shim {} (median {} vs {}; p99 {} vs {}), mean TTFT {} vs {} ms, "
     "descriptors per block {} → {}",
     lambda: (cell(DC64B, "shim", 64, 10240)["reps"] if cell(DC64B, "stock", 64, 10240)["reps"] == 1 else "?",
              f1(itl(cell(DC64B, "stock", 64, 10240))), f1(itl(cell(DC64B, "shim", 64, 10240))),
              f1(mean(cell(DC64B, "stock", 64, 10240)["median_itl_ms"])),
              f1(mean(cell(DC64B, "shim", 64, 10240)["median_itl_ms"])),
              f1(mean(cell(DC64B, "stock", 64, 10240)["p99_itl_ms"])),
              f1(mean(cell(DC64B, "shim", 64, 10240)["p99_itl_ms"])),
              f0(ttft(cell(DC64B, "stock", 64, 10240))), f0(ttft(cell(DC64B, "shim", 64, 10240))),
              f1(cell(DC64B, "stock", 64, 10240)["descriptors_per_block"]),
              "%.3f" % cell(DC64B, "shim", 64, 10240)["descriptors_per_block"])),
    ("the shim's cell was not measured (the call's {} s limit stopped it in its first repetition)",
     lambda: (re.search(r"decode c64 bench \(.*timeout (\d+) \.\.\. bench\) \| rc 124",
                        read("experiments", "results", *DC_CALLS.split("/"))).group(1),)
     if not any(c["config"] == "shim" for c in load(DC64)["cells"]) else ("(it is in the file)",)),
    # 4×H200
    ("P/D mean TTFT, vLLM 0.26.0, 4×H200 (P and D on one GPU each), {} × {} tokens, {} reps | stock {} ms, shim {} ms: {}",
     lambda: (64, 10240, cell(B4, "stock", 64, 10240)["reps"], pm(cell(B4, "stock", 64, 10240)), pm(cell(B4, "shim", 64, 10240)),
              ratio(ttft(cell(B4, "stock", 64, 10240)), ttft(cell(B4, "shim", 64, 10240))))),
    # the descriptors of the 100-block probe
    ("NIXL descriptors per transfer of a {}-block probe request (decode log) | 0.21.0: stock {} → shim {} (native {}); "
     "0.26.0: stock {} → shim {}; 0.33.0 (1×H200): stock {} → shim {} (`VLLM_KV_CACHE_LAYOUT=BLNHC` without the shim: "
     "{}); 0.29.0 (1×H200, shim with the descriptor ordering): stock {} → shim {}, shim with D on Ray {}, BLNHC without "
     "the shim {}",
     lambda: (f0(probe(EQ21, "stock")[0]),
              *[f0(probe(name, c)[1]) for name, c in ((EQ21, "stock"), (EQ21, "shim"), (EQ21, "native"), (EQ26, "stock"),
                                                      (EQ26, "shim"), (EQ33, "stock"), (EQ33, "shim"), (EQ33N, "native"),
                                                      (EQ29, "stock"), (EQ29, "shim"), (EQ29R, "shim-ray"),
                                                      (EQ29R, "native"))])),
    # CPU descriptor bench
    ("CPU: same KV bytes, real NIXL/UCX (CMA), {} blocks, median of {} | Qwen3-0.6B shape: {} descs {} ms → {} descs {} ms "
     "({}); Llama-3-8B shape: {} → {} descs, {} → {} ms ({})",
     lambda: (load(DESC)["models"]["qwen3-0.6b"]["blocks_per_transfer"], load(DESC)["runs"],
              load(DESC)["models"]["qwen3-0.6b"]["configs"]["stock"]["descriptors_per_transfer"],
              f0(load(DESC)["models"]["qwen3-0.6b"]["configs"]["stock"]["median_ms"]),
              load(DESC)["models"]["qwen3-0.6b"]["configs"]["xlkv"]["descriptors_per_transfer"],
              f0(load(DESC)["models"]["qwen3-0.6b"]["configs"]["xlkv"]["median_ms"]),
              f1(load(DESC)["models"]["qwen3-0.6b"]["stock_over_xlkv"]) + "×",
              load(DESC)["models"]["llama-3-8b"]["configs"]["stock"]["descriptors_per_transfer"],
              load(DESC)["models"]["llama-3-8b"]["configs"]["xlkv"]["descriptors_per_transfer"],
              f0(load(DESC)["models"]["llama-3-8b"]["configs"]["stock"]["median_ms"]),
              f0(load(DESC)["models"]["llama-3-8b"]["configs"]["xlkv"]["median_ms"]),
              f1(load(DESC)["models"]["llama-3-8b"]["stock_over_xlkv"]) + "×")),
    # start-up
    ("interpreter start-up (`python -c pass`, median of {}) | no shim {} ms, shim installed + flag off {} ms (round "
     "medians overlap: {} vs {} ms), flag on {} ms",
     lambda: (len(load(STARTUP)["raw_ms"]["no_shim"]), f1(startup("no_shim")), f1(startup("shim_flag_off")),
              span(load(STARTUP)["round_medians_ms"]["no_shim"], f1),
              span(load(STARTUP)["round_medians_ms"]["shim_flag_off"], f1), f1(startup("shim_flag_on")))),

    # ---- the prose below the table
    ("temperature 0, prompts of {} to {} tokens, {} output tokens each",
     lambda: (min(eq(EQ33)["prompt_lengths"]), max(eq(EQ33)["prompt_lengths"]), eq(EQ33)["max_tokens"])),
    ("the token ids of every run against local prefill on D of the first config (stock); the chosen token's logprob and "
     "the top-{} logprobs", lambda: (eq(EQ33)["logprobs"],)),
    ("on {} the shim runs Model Runner V1 and stock V2, which differ by {} ulp ({}) at one position on 0.26.0 with "
     "identical ids",
     lambda: (releases_where("runner_v1"), 1 if float32_step(lp(EQ26L, "shim", "max_logprob_diff_local")) else "not 1",
              "%.2e" % lp(EQ26L, "shim", "max_logprob_diff_local"))),
    ("The model is random-weight with the Qwen3-0.6B shape ({} MiB KV blocks)",
     lambda: (f2(eq(EQ33)["configs"]["stock"]["kv"]["bytes_per_block"] / 2 ** 20),)),
    ("{} distinct ids in {} outputs per prompt in the 1×H200 runs below; transformers' default initialisation gave {} on CPU",
     lambda: (span(distinct_ids(EQ33, EQ29, EQ26L)), eq(EQ33)["max_tokens"],
              span([p["distinct"] for p in load(INIT)["hf"]["prompts"].values()]))),
    ("`nc-stock` and `nc-shim` (off-by-one) were reported FAIL with different ids at all {} prompts (max |Δlogprob| {} and {})",
     lambda: (len(eq(EQ26L)["prompt_lengths"]) if all(
                 len(r["problems"]) == len(eq(EQ26L)["prompt_lengths"]) for r in eq(EQ26L)["runs"] if r["negative_control"])
              else "not all", f2(nc(EQ26L, "nc-stock")), f2(nc(EQ26L, "nc-shim")))),
    # 0.33.0 with logprobs
    ("token ids identical, logprobs identical (max |Δ| {}, P/D vs local and shim vs stock), KV pulled for every P/D answer "
     "({} blocks), descriptors per block {} (stock) → {} (shim), nc-shim detected: **{}**",
     lambda: (f0(max(lp(EQ33, c, k) for c in ("stock", "shim") for k in ("max_logprob_diff", "max_logprob_diff_pd_vs_local"))),
              span([v for c in ("stock", "shim") for v in eq(EQ33)["configs"][c]["kv_blocks_per_prompt"].values()]),
              per_block(EQ33, "stock"), per_block(EQ33, "shim"),
              passed(EQ33) if eq(EQ33)["negative_control_pass"] and eq(EQ33)["logprob_pass"] else "FAIL")),
    ("`NIXL registration: 1 region(s), … cross-layer layout, block lengths [{}]`",
     lambda: (re.search(r"NIXL registration: 1 region\(s\), \d+ blocks, cross-layer layout, block lengths \[(\d+)\]",
                        read("experiments", "results", *EQ33_LOG.split("/"))).group(1),)),
    ("the same {} × {} ids, {} descriptor per block, P/D vs local exact",
     lambda: (len(eq(EQ33N)["prompt_lengths"]), eq(EQ33N)["max_tokens"], per_block(EQ33N, "native"))
     if identical_ids(EQ33N, "local:native", "pd:native") and eq(EQ33N)["token_ids"]["pd:native"] == eq(EQ33)["token_ids"]["local:stock"]
     and lp(EQ33N, "native", "max_logprob_diff_pd_vs_local") == 0 else ("other ids",) * 3),
    # 0.29.0
    ("token ids and logprobs identical (max |Δ| {}), KV pulled for every P/D answer, nc-shim detected (different ids, "
     "max |Δlogprob| {}): **{}**",
     lambda: (f0(max(lp(EQ29, c, k) for c in ("stock", "shim") for k in ("max_logprob_diff", "max_logprob_diff_pd_vs_local"))),
              f2(nc(EQ29)), passed(EQ29) if eq(EQ29)["negative_control_pass"] and eq(EQ29)["logprob_pass"] else "FAIL")),
    ("same ids as local:native, P/D vs local exact: **{}**",
     lambda: (passed(EQ29R) if identical_ids(EQ29R, "pd:native", "local:shim-ray", "pd:shim-ray")
              and all(lp(EQ29R, c, "max_logprob_diff_pd_vs_local") == 0 for c in ("native", "shim-ray")) else "FAIL",)),
    ("`NIXL registration: {} region(s), {} blocks, cross-layer layout` (`logs-2026-11-23-s6/0.29-call22-eq-shim-ray-d.log`); "
     "D's probe: {} descriptors for {} blocks, as without Ray",
     lambda: (*re.search(r"\(RayWorkerProc pid=\d+\)\S* \(Worker pid=\d+\) .*NIXL registration: (\d+) region\(s\), (\d+) "
                         r"blocks, cross-layer layout", read("experiments", "results", *RAY_LOG.split("/"))).groups(),
              f0(probe(EQ29R, "shim-ray")[1]) if probe(EQ29R, "shim-ray") == probe(EQ29, "shim") else "other",
              f0(probe(EQ29R, "shim-ray")[0]))),
    ("every config's transfers ran at {} GB/s",
     lambda: (span([eq(n)["configs"][c]["kv"]["throughput_mb_s"] / 1000 for n in (EQ29, EQ29R, EQ33, EQ33N)
                    for c in eq(n)["configs"] if "kv" in eq(n)["configs"][c]], f1),)),
    # 0.26.0
    ("ids identical for local/P/D stock and shim; P/D vs local exact for both (max |Δ| {}); local shim vs local stock {} "
     "(V1 vs V2 runner, see above); descriptors {} → {}; nc-stock and nc-shim detected: **{}**",
     lambda: (f0(max(lp(EQ26L, c, "max_logprob_diff_pd_vs_local") for c in ("stock", "shim"))),
              "%.2e" % lp(EQ26L, "shim", "max_logprob_diff_local"), per_block(EQ26L, "stock"), per_block(EQ26L, "shim"),
              passed(EQ26L) if eq(EQ26L)["negative_control_pass"] else "FAIL")),
    ("a first run with the checker comparing every run's logprobs against stock's local run reported that {} ulp as FAIL",
     lambda: (1 if float32_step(lp(RUN1, "shim", "max_logprob_diff_local")) and not load(RUN1)["pass"]
              and load(RUN1)["logprob_problems"] and all("%.2e" % lp(RUN1, "shim", "max_logprob_diff_local") in p
                                                         for p in load(RUN1)["logprob_problems"]) else "?",)),
    # earlier results
    ("local prefill, P/D stock, local shim and P/D shim all identical, descriptors {} → {} per block: **{}**",
     lambda: (per_block(EQ26, "stock"), per_block(EQ26, "shim"),
              passed(EQ26) if identical_ids(EQ26, "pd:stock", "local:shim", "pd:shim") else "FAIL")),
    ("local prefill, P/D stock, local shim, P/D shim, local and P/D with vLLM's own opt-in all identical: **{}**",
     lambda: (passed(EQ21) if identical_ids(EQ21, "pd:stock", "local:shim", "pd:shim", "local:native", "pd:native")
              else "FAIL",)),
    ("vLLM 0.21.0, TP 2 → 2 (4×H200): local prefill, P/D stock and P/D shim all identical: **{}**",
     lambda: (passed(TP22) if identical_ids(TP22, "pd:stock", "local:shim", "pd:shim") else "FAIL",)),
    ("P/D shim is token-for-token identical to P/D stock; both differ from local TP-2 prefill at the {}-, {}- and "
     "{}-token prompts",
     lambda: tuple(sorted({int(re.match(r"len (\d+):", p).group(1)) for r in eq(TP12)["runs"]
                           if r["label"] in ("pd:stock", "pd:shim") for p in r["problems"]}))
     if eq(TP12)["pd_vs_pd_stock"] == {"pd:shim": []} else ("?",) * 3),
    # heterogeneous TP on 0.33.0
    ("the Gemma-3-shaped hybrid ({} KV cache groups), reference P/D stock at the same pairing: pd:shim identical to "
     "pd:stock (ids and logprobs, max difference {}), negative control detected ({}), D registered {} → {} regions per "
     "block id, {} → {} descriptors per {}-block-id transfer: **{}**",
     lambda: (eq(GEMMA12)["configs"]["shim"]["kv_cache_groups"], f0(lp(GEMMA12, "shim")), "%.3f" % nc(GEMMA12),
              regions(GEMMA12, "stock"), regions(GEMMA12, "shim"), f0(probe(GEMMA12, "stock")[1]),
              f0(probe(GEMMA12, "shim")[1]), f0(probe(GEMMA12, "shim")[0]),
              passed(GEMMA12) if eq(GEMMA12)["pd_vs_pd_stock"] == {"pd:shim": []} else "FAIL")),
    # the gpt-oss shape on one H200 (make_model.py --arch gpt_oss), 0.33.0
    ("reference stock P/D: {} KV cache groups, pd:shim and pd:native (`BLNHC`) identical to pd:stock (ids and "
     "logprobs, max difference {}, prompts of {} tokens), negative control detected ({}), D registered {} → {} "
     "regions per block id, {} → {} descriptors per {}-block-id transfer: **{}**. Local prefill differs from every "
     "P/D run, stock included (max |Δlogprob| {})",
     lambda: (eq(GPTOSS)["configs"]["shim"]["kv_cache_groups"], f0(max(lp(GPTOSS, "shim"), lp(GPTOSS, "native"))),
              lengths(GPTOSS), "%.3f" % nc(GPTOSS), regions(GPTOSS, "stock"), regions(GPTOSS, "shim"),
              f0(probe(GPTOSS, "stock")[1]), f0(probe(GPTOSS, "shim")[1]), f0(probe(GPTOSS, "shim")[0]),
              passed(GPTOSS) if eq(GPTOSS)["pd_vs_pd_stock"] == {"pd:shim": [], "pd:native": []}
              and regions(GPTOSS, "native") == 1 else "FAIL",
              "%.3f" % min(r["max_logprob_diff"] for r in eq(GPTOSS)["local_vs_pd_stock"].values()))),
    ("pd:shim's token ids equal pd:stock's ({} ids at {} and {} tokens, the first {} at {}), both {} from local prefill "
     "at the same position, negative control detected ({}), {} → {} descriptors per block",
     lambda: (eq(DENSE12)["max_tokens"], *eq(DENSE12)["prompt_lengths"], len(first_ids(DENSE12_CONSOLE, "pd:shim", 5)),
              "/".join(str(n) for n in (5, 100, 1000, 2049)
                       if first_ids(DENSE12_CONSOLE, "pd:shim", n) == first_ids(DENSE12_CONSOLE, "pd:stock", n)),
              "%.5f" % lp(DENSE12, "shim"), "%.3f" % nc(DENSE12), per_block(DENSE12, "stock"), per_block(DENSE12, "shim"))
     if all(eq(DENSE12)["token_ids"]["pd:shim"][k] == eq(DENSE12)["token_ids"]["pd:stock"][k]
            for k in eq(DENSE12)["token_ids"]["pd:shim"])
     and lp(DENSE12, "shim") == lp(DENSE12, "stock")
     and [r["max_logprob_diff_at"] for r in eq(DENSE12)["runs"] if r["label"] == "pd:shim"]
     == [r["max_logprob_diff_at"] for r in eq(DENSE12)["runs"] if r["label"] == "pd:stock"] else ("?",) * 10),
    ("could not pair the stock and shim runs ({} vs {} lengths)",
     lambda: tuple(int(x) for x in re.search(r"different number of prompts: (\d+) vs (\d+)",
                                             " ".join(eq(DENSE12)["pd_vs_pd_stock"]["pd:shim"])).groups())),
    ("the dense shape: pd:shim identical to pd:stock (ids and logprobs, max difference {}), negative control detected "
     "({}), D registered {} → {} regions per block id, {} → {} descriptors per block ({} per block from each prefill "
     "rank); the Gemma-3-shaped hybrid: identical (max difference {}), negative control detected ({}), {} → {} regions "
     "per block id in each of its {} KV cache groups, {} → {} descriptors per block id",
     lambda: (f0(lp(DENSE21NC, "shim")), "%.3f" % nc(DENSE21NC), regions(DENSE21NC, "stock"), regions(DENSE21NC, "shim"),
              per_block(DENSE21NC, "stock"), per_block(DENSE21NC, "shim"),
              f0(probe(DENSE21NC, "shim")[1] / probe(DENSE21NC, "shim")[0] / eq(DENSE21NC)["tp_p"]),
              f0(lp(GEMMA21NC, "shim")), "%.3f" % nc(GEMMA21NC), regions(GEMMA21NC, "stock"), regions(GEMMA21NC, "shim"),
              eq(GEMMA21NC)["configs"]["shim"]["kv_cache_groups"], per_block(GEMMA21NC, "stock"),
              per_block(GEMMA21NC, "shim"))
     if per_remote_rank_pass(DENSE21NC) and per_remote_rank_pass(GEMMA21NC) else ("?",) * 14),
    ("pd:shim identical to pd:stock (ids and logprobs, max difference {}), negative control detected ({}), D registered "
     "{} → {} regions per block id, {} → {} descriptors per block: **{}**",
     lambda: (f0(lp(DENSE12NC, "shim")), "%.3f" % nc(DENSE12NC), regions(DENSE12NC, "stock"), regions(DENSE12NC, "shim"),
              per_block(DENSE12NC, "stock"), per_block(DENSE12NC, "shim"), passed(DENSE12NC))
     if eq(DENSE12NC)["reference"] == "pd-stock" and (eq(DENSE12NC)["tp_p"], eq(DENSE12NC)["tp_d"]) == (1, 2)
     else ("?",) * 7),
    ("stock only, {} descriptors per {}-block transfer ({} per block: {} layers from each of the two prefill ranks), D "
     "registered {} regions per block id (LBHNC)",
     lambda: (f0(probe(DENSE21, "stock")[1]), f0(probe(DENSE21, "stock")[0]), per_block(DENSE21, "stock"),
              regions(DENSE21, "stock") if probe(DENSE21, "stock")[1] / probe(DENSE21, "stock")[0]
              == 2 * regions(DENSE21, "stock") else "?", regions(DENSE21, "stock"))),
    # model families
    ("with vLLM 0.33.0 a DeepSeek-V2-shaped MLA model ({} → {} descriptors per block, as vLLM's own `BLNHC`), a "
     "Gemma-3-shaped hybrid ({} KV cache groups, {} → {} per block id, as `BLNHC`) and a one-KV-head (MQA) Qwen3-0.6B "
     "shape ({} → {}, where vLLM's own `BLNHC` stays at {}): P/D output identical to stock P/D (and to P/D with `BLNHC`), "
     "negative control detected",
     lambda: (regions(MLA33, "stock"), regions(MLA33, "shim") if regions(MLA33, "native") == regions(MLA33, "shim") else "?",
              eq(GEMMA33)["configs"]["shim"]["kv_cache_groups"], regions(GEMMA33, "stock"),
              regions(GEMMA33, "shim") if regions(GEMMA33, "native") == regions(GEMMA33, "shim") else "?",
              regions(MQA33, "stock"), regions(MQA33, "shim"), regions(MQA33, "native"))
     if all(eq(n)["pass"] and eq(n)["negative_control_pass"] for n in (MLA33, GEMMA33, MQA33)) else ("?",) * 8),
    ("the MLA model with TRITON_MLA and FLASHMLA ({} → {} per block) and the Gemma-3-shaped hybrid ({} → {} per block id",
     lambda: (regions(MLA26_TRITON, "stock-v1"), regions(MLA26_TRITON, "shim") if regions(MLA26_FLASHMLA, "shim")
              == regions(MLA26_TRITON, "shim") and regions(MLA26_FLASHMLA, "stock-v1") == regions(MLA26_TRITON, "stock-v1")
              else "?", regions(GEMMA26, "stock-v1"), regions(GEMMA26, "shim"))
     if all(eq(n)["pass"] and eq(n)["negative_control_pass"] for n in (MLA26_TRITON, MLA26_FLASHMLA, GEMMA26))
     else ("?",) * 4),
    ("differs from both by one float32 step in the MLA logprobs, {}, ids the same: the runner's difference, also seen on "
     "an H200 with FLASH_ATTN_MLA",
     lambda: ("%.2e" % eq(MLA26_TRITON)["other_runner_vs_reference"]["pd:stock"]["max_logprob_diff"],)
     if float32_step(eq(MLA26_TRITON)["other_runner_vs_reference"]["pd:stock"]["max_logprob_diff"])
     and lp(MLA26_H200, "shim") == eq(MLA26_TRITON)["other_runner_vs_reference"]["pd:stock"]["max_logprob_diff"]
     else ("?",)),
    ("identical to local prefill except the {}-token prompt, where every P/D run, **stock included**, diverges at output "
     "token {}",
     lambda: tuple({(int(m.group(1)), int(m.group(2))) for name in (EQ21_DEFAULT, EQ26_DEFAULT)
                    for p in eq(name)["mismatches"] for m in [re.search(r"len (\d+): first difference at output position (\d+)", p)]}
                   .pop() if len({p.split(": ", 1)[1] for name in (EQ21_DEFAULT, EQ26_DEFAULT) for p in eq(name)["mismatches"]}) == 1
                   and any("pd:stock" in p for p in eq(EQ21_DEFAULT)["mismatches"]) else ("?", "?"))),
    # Model Runner V1 on 0.22–0.28
    ("## Model Runner V1 on {} On {} the shim forces Model Runner V1",
     lambda: (releases_where("runner_v1"), releases_where("runner_v1"))),
    ("At {} tokens on 0.26.0 one run showed the V1 runner's decode steps slower (ITL {} vs {} ms, TTFT {}) and a "
     "{}-repetition rerun did not (ITL {} vs {} ms, TTFT {})",
     lambda: (1024, f0(itl(cell(B26, "shim", 128, 1024))), f0(itl(cell(B26, "stock", 128, 1024))),
              ratio(ttft(cell(B26, "stock", 128, 1024)), ttft(cell(B26, "shim", 128, 1024))),
              cell(B26R, "shim", 128, 1024)["reps"], f1(itl(cell(B26R, "shim", 128, 1024))),
              f1(itl(cell(B26R, "stock", 128, 1024))),
              ratio(ttft(cell(B26R, "stock", 128, 1024)), ttft(cell(B26R, "shim", 128, 1024))))),
    # where the P/D handoff goes
    ("FLASH_ATTN, block {}, the Qwen3-0.6B shape, {} output tokens, `HANDOFF_TRACE=1`",
     lambda: (cell(HO, "shim", 10, 10240)["block_size"], cell(HO, "shim", 10, 10240)["output_len"])),
    ("(`proxy_to_p`, `proxy_to_d`) stayed under {} ms everywhere",
     lambda: (report.HIDE_MS if "not shown: proxy_to_p, proxy_to_d." in report.handoff_markdown(load(HO)) else "?",)),
    ("{}", lambda: (" ".join(l for l in report.handoff_markdown(load(HO)).splitlines() if re.match(r"\| \d", l)),)),
    ("primes the first-token detokenizer with the whole prompt and decodes it when the first token reaches the API "
     "server: {} ms for {} prompt ids and {} ms for {} (`tokenizers` {}, the lab's word tokenizer; the last 64 ids: "
     "{} ms). A real vLLM server on CPU, the whole prefix cached, streamed, {} alternated rounds: time to the first "
     "byte at {} tokens {} ms (round medians) as shipped and {} ms with the lab lever `shim-detok`",
     lambda: (f1(detok_row(10240)["whole_prompt_ms"]), 10240, f1(detok_row(32768)["whole_prompt_ms"]), 32768,
              load(DETOK)["micro_decode_stream"]["tokenizers"], f2(detok_row(10240)["last_64_ms"]),
              len(load(DETOK)["summary"]["10240-1 stock"]["round_medians_ms"]), 10240,
              span(load(DETOK)["summary"]["10240-1 stock"]["round_medians_ms"], f1),
              span(load(DETOK)["summary"]["10240-1 lever"]["round_medians_ms"], f1))
     if load(DETOK)["lever_armed"] and load(DETOK)["same_text_with_and_without"] else ("?",) * 10),
    ("**One request at a time, {} tokens**: P/D costs {} ms (stock), {} (shim) and {} (`BLNHC`) over prefill alone. Of the shim's, D's admission (HTTP and "
     "tokenising the prompt again on D) takes {} ms, the read itself (blocks, dispatch, transfer, notice) {} ms and "
     "D's first token after the read {} ms (means). D's first token takes {} ms at {} tokens",
     lambda: (10240, "%+.0f" % ho("stock", 10240, 1)["over_alone_ms"], "%+.0f" % ho("shim", 10240, 1)["over_alone_ms"],
              "%+.0f" % ho("native", 10240, 1)["over_alone_ms"], f1(ho_part("shim", 10240, 1, "d_admission")),
              f1(sum(ho_part("shim", 10240, 1, k) for k in ("d_alloc", "d_dispatch", "transfer", "d_notice"))),
              f1(ho_part("shim", 10240, 1, "d_first_token")), f1(ho_part("shim", 1024, 1, "d_first_token")), 1024)),
    ("act on `d_dispatch` and `d_notice`: {} ms together at one request at a time (shim), so no such switch can reach "
     "the goal there. At {} and {} at a time they take {} ms and {} ms (shim, both lengths)",
     lambda: (f1(ho_part("shim", 10240, 1, "d_dispatch") + ho_part("shim", 10240, 1, "d_notice")), 8, 64,
              span([ho_part("shim", L, c, "d_dispatch") for L in (10240, 1024) for c in (8, 64)], f1),
              span([ho_part("shim", L, c, "d_notice") for L in (10240, 1024) for c in (8, 64)], f1))),
    ("**{} × {}**: vLLM's own `BLNHC` was ahead of the shim's `BHLNC`: mean TTFT {} vs {} ms, D's mean ITL {} vs {} ms, "
     "D's admission {} vs {} ms and D's first token {} vs {} ms (means)",
     lambda: (64, 10240, pm(cell(HO, "native", 64, 10240)), pm(cell(HO, "shim", 64, 10240)),
              f1(itl(cell(HO, "native", 64, 10240))), f1(itl(cell(HO, "shim", 64, 10240))),
              f1(ho_part("native", 10240, 64, "d_admission")), f1(ho_part("shim", 10240, 64, "d_admission")),
              f1(ho_part("native", 10240, 64, "d_first_token")), f1(ho_part("shim", 10240, 64, "d_first_token")))
     if ttft(cell(HO, "native", 64, 10240)) < ttft(cell(HO, "shim", 64, 10240)) else ("?",) * 10),
    ("With {} repetitions each (a later lease, shim 4fe7eeb): mean TTFT stock {} ms ({}), shim {} ms ({}): {}; mean "
     "ITL stock {} ms, shim {}; descriptors per block {} → {}",
     lambda: (cell(DC64C, "shim", 64, 10240)["reps"], *stock_vs_shim(DC64C, 64, 10240),
              f1(itl(cell(DC64C, "stock", 64, 10240))), f1(itl(cell(DC64C, "shim", 64, 10240))),
              f1(cell(DC64C, "stock", 64, 10240)["descriptors_per_block"]),
              f2(cell(DC64C, "shim", 64, 10240)["descriptors_per_block"]))),
]


# --------------------------------------------------------------------------- docs/deploy.md

DEPLOY = [
    ("(2026-11-25, a {}-core CPU machine without Docker daemon, GPU or cluster)",
     lambda: (re.match(r"(\d+)-core CPU", load(TWO_STOCK)["machine"]).group(1),)),
    ("fails the build when the image's vLLM is outside {} or a patch target",
     lambda: (releases.RELEASES[0].release + "–" + releases.RELEASES[-1].release,)),
    ("one GPU each, each with a Service on port {}",
     lambda: (re.search(r"containerPort: (\d+)\}", read("deploy", "pd.yaml")).group(1),)),
    ("whose every prefill and decode pod runs one TP size, on vLLM {} with a backend or model whose cross-layer blocks "
     "cannot be sliced by KV heads",
     lambda: (releases_where("mechanism", lambda m: m != "layout"),)),
    ("`VLLM_NIXL_SIDE_CHANNEL_PORT` ({} here)",
     lambda: (re.search(r"VLLM_NIXL_SIDE_CHANNEL_PORT, value: \"(\d+)\"", read("deploy", "pd.yaml")).group(1),)),
    ("On a GPU: 0.29.0 with D on Ray, same result as without Ray",
     lambda: () if eq(EQ29R)["pass"] and probe(EQ29R, "shim-ray") == probe(EQ29, "shim") else ("(not the same)",)),
    ("a stock decode on {} is the exception below", lambda: (releases_where("failed_recv_looks_up_engine"),)),
    ("**vLLM {}, the order matters:**", lambda: (releases_where("failed_recv_looks_up_engine"),)),
    ("(each wheel {}.0–{}.0 looks the engine up for failed receives; {}.0–0.29.0 skip them)",
     lambda: (*releases_where("failed_recv_looks_up_engine").split("–"),
              releases_where("failed_recv_looks_up_engine", False).split("–")[0])),
    ("stock moves one descriptor per layer (and K/V half up to {}) per block",
     lambda: (releases_where("kv_split_regions").split("–")[1],)),
    ("(Qwen3-0.6B, {}-block request, 0.29.0: {} → {};",
     lambda: (f0(probe(EQ29, "stock")[0]), f0(probe(EQ29, "stock")[1]), f0(probe(EQ29, "shim")[1]))),
    ("(P {}, D {}, each namespace with its own `lo`)",
     lambda: (two(TWO_STOCK)["netns"]["addresses"]["p"], two(TWO_STOCK)["netns"]["addresses"]["d"])),
    ("(vLLM's own failure log names `remote_host: {}`",
     lambda: (re.search(r"'remote_host': '([\d.]+)'", json.dumps(two(TWO_DIES)) + json.dumps(two(TWO_STOCK))).group(1),)),
    ("`--link-flap {}` then throttles P's end (tc tbf, {} kbit/s since 2026-11-26; the runs below were at {} Mbit/s, "
     "which on a loaded machine once let a whole {} KiB read cross before the link went down), takes the veth down for "
     "{} s once part of a read has crossed",
     lambda: (f0(two(TWO_STOCK)["link_flap"]["down_s"]) if "--link-flap %d" % two(TWO_STOCK)["link_flap"]["down_s"]
              in load(TWO_STOCK)["command"] else "?",
              re.search(r'"--link-flap-rate", default="(\d+)kbit"', read("tests", "harness", "pdharness", "cli.py")).group(1),
              {re.match(r"(\d+)mbit", two(n)["link_flap"]["rate"]).group(1) for n in (TWO_STOCK, TWO_XLKV)}.pop(),
              block_bytes(TWO_STOCK, "reversed") // 1024, f0(two(TWO_STOCK)["link_flap"]["down_s"]))),
    ("| 0.33.0 stock, two namespaces | bytes exact; NIXL descriptors {} for {} non-contiguous blocks, {} for {} descending "
     "blocks (as on one host, compat-matrix.json); a flagged second prefill refused by vLLM's hash check "
     "(`Remote: xlkv-cross-layer-KV-layout…`), its blocks invalid, D served on; link down after {} KB of a {} KiB read: "
     "the read completed once the link was back ({} s), bytes exact, the next request exact |",
     lambda: (two(TWO_STOCK)["cases"]["noncontig"]["nixl_descs"], len(two(TWO_STOCK)["cases"]["noncontig"]["local_block_ids"]),
              two(TWO_STOCK)["cases"]["reversed"]["nixl_descs"]
              if two(TWO_STOCK)["cases"]["reversed"]["nixl_descs"] == compat("reversed")["stock"] else "?",
              len(two(TWO_STOCK)["cases"]["reversed"]["local_block_ids"]),
              f0(two(TWO_STOCK)["link_flap"]["sent_before_down"] / 1000), block_bytes(TWO_STOCK, "reversed") // 1024,
              f1(two(TWO_STOCK)["link_flap"]["recv_s"]))
     if two_ok(TWO_STOCK, "Remote: xlkv-cross-layer-KV-layout") else ("?",) * 7),
    ("| 0.33.0 `ENABLE_XLKV=true` both sides, two namespaces | cross-layer, bytes exact; NIXL descriptors {} for the {} "
     "non-contiguous blocks, {} for the {} descending blocks (one host: {}); a stock second prefill refused by the shim "
     "(`NIXL handshake refused … ENABLE_XLKV unset there`), its blocks invalid, D served on; link down after {} KB of the "
     "read: completed once the link was back ({} s), bytes exact: the same outcome as stock; the next request exact |",
     lambda: (two(TWO_XLKV)["cases"]["noncontig"]["nixl_descs"], len(two(TWO_XLKV)["cases"]["noncontig"]["local_block_ids"]),
              two(TWO_XLKV)["cases"]["reversed"]["nixl_descs"], len(two(TWO_XLKV)["cases"]["reversed"]["local_block_ids"]),
              compat("reversed")["xlkv"], f0(two(TWO_XLKV)["link_flap"]["sent_before_down"] / 1000),
              f1(two(TWO_XLKV)["link_flap"]["recv_s"]))
     if two(TWO_XLKV)["cross_layer"] and two_ok(TWO_XLKV, "ENABLE_XLKV unset there") else ("?",) * 7),
    ("refused (hash mismatch), then the decode worker died: `KeyError: '{}'` in vLLM's `get_finished`",
     lambda: (re.search(r"KeyError: '([\w-]+)'", two(TWO_DIES)["refused_peer"]["d_died"]).group(1),)
     if "get_finished" in two(TWO_DIES)["refused_peer"]["d_died"] else ("?",)),
    ("| the wheel in a fresh venv over vLLM {} and {} (`bash deploy/check_wheel_venv.sh <vllm-python>`) |",
     lambda: tuple(sorted(load(WHEEL_VENV)["status"]))),
    ("on every selected release (CI's: {}) where network namespaces can be made",
     lambda: (", ".join(re.search(r'XLKV_TEST_VLLM-"([\d. ]+)"', read("tests", "run.sh")).group(1).split()),)),
    ("`ENABLE_XLKV=true python -m xlkv_autopatch status`: exit {}, `\"ok\": {}`, the wheel's `.pth` active, every patch "
     "target resolved",
     lambda: (0 if "exit 0" in load(WHEEL_VENV)["note"] else "?",
              "true" if all(s["ok"] is True and s["activation"]["sources"] == ["pth"]
                            for s in load(WHEEL_VENV)["status"].values()) else "false")),
]


@functools.lru_cache(maxsize=None)
def handoff_rows(name):
    """report.handoff_rows of the results file ``name``, computed once (hundreds of figures read it)."""
    return report.handoff_rows(load(name))


def handoff_row(name, config, length, conc):
    """The handoff table's row (pdtools/report.handoff_rows) of one cell of the results file ``name``."""
    [r] = [r for r in handoff_rows(name)
           if (r["config"], r["input_len"], r["max_concurrency"]) == (config, length, conc)]
    return r


def ho(config, length, conc):
    """A cell's handoff row of the 0.33.0 handoff run (2026-11-27b)."""
    return handoff_row(HO, config, length, conc)


def detok_row(length):
    [r] = [r for r in load(DETOK)["micro_decode_stream"]["rows"] if r["prompt_tokens"] == length]
    return r


def ho_part(config, length, conc, part):
    return ho(config, length, conc)["parts"][part]["mean"]


def compat(case):
    [row] = [r for r in load("compat-matrix.json")["rows"] if r["vllm"] == "0.33.0"]
    return row["merged_descriptors"][case]


def two_ok(name, refused_words):
    """Every case and the link-flap read byte-exact, the refused peer's blocks invalid with its words in the
    errors, and the request after the flap exact."""
    r = two(name)
    ok = all(c["bytes_ok"] and c["ok"] for c in r["cases"].values()) and r["link_flap"]["bytes_ok"]
    ok = ok and r["refused_peer"]["invalid_block_ids"] and any(refused_words in e for e in r["refused_peer"]["errors"])
    return bool(ok and r["after_flap"]["bytes_ok"] and r["after_flap"]["ok"])

# the first-token detokenizer, XLKV_DETOK_TAIL: the alternated A/B of 2026-11-27e
DETOK_TAIL_CLAIMS = [
    ("FLASH_ATTN, block {}, the Qwen3-0.6B shape, {} output tokens, `--enforce-eager`, `HANDOFF_TRACE=1`. Two device "
     "calls, each starting every config's servers once, in opposite orders",
     lambda: (cell(HOAB, "shim", 10, 10240)["block_size"], cell(HOAB, "shim", 10, 10240)["output_len"])),
    ("**{} repetitions per cell, alternated**", lambda: (cell(HOAB, "shim", 10, 10240)["reps"],)),
    ("One request of `shim-detok`'s second {} × c1 repetition failed",
     lambda: (10240,) if cell(HOAB, "shim-detok", 10, 10240)["failed"] == [0, 1] else ("?",)),
    ("{}", lambda: (table_rows(HOAB, 0),)),
    ("{}", lambda: (table_rows(HOAB, 1),)),
    ("one request at a time, P's answer's frontend part {} → {} ms and D's {} → {} ms (shim → `shim-detok`, means); "
     "{} at a time, D's frontend {} → {} ms and D's admission {} → {} ms",
     lambda: (f1(ab_sub("shim", 10240, 1, "p_frontend")), f1(ab_sub("shim-detok", 10240, 1, "p_frontend")),
              f1(ab_sub("shim", 10240, 1, "d_frontend")), f1(ab_sub("shim-detok", 10240, 1, "d_frontend")), 64,
              f1(ab_sub("shim", 10240, 64, "d_frontend")), f1(ab_sub("shim-detok", 10240, 64, "d_frontend")),
              f1(ab_part("shim", 10240, 64, "d_admission")), f1(ab_part("shim-detok", 10240, 64, "d_admission")))),
    ("**Mean TTFT, {} tokens, one at a time**: shim {} ms ({}), `shim-detok` {} ({}), `shim-ids-detok` {} ({}), "
     "`native` {}: {}. {} × {}: shim {}, `shim-detok` {}, `shim-ids-detok` {}, `native` {}: within the spread of {} "
     "repetitions. At {} tokens the frontend parts go {} → {} ms (P) and {} → {} ms (D) and the cells are within noise",
     lambda: (10240, pm(cell(HOAB, "shim", 10, 10240)), reps(cell(HOAB, "shim", 10, 10240)),
              pm(cell(HOAB, "shim-detok", 10, 10240)), reps(cell(HOAB, "shim-detok", 10, 10240)),
              pm(cell(HOAB, "shim-ids-detok", 10, 10240)), reps(cell(HOAB, "shim-ids-detok", 10, 10240)),
              pm(cell(HOAB, "native", 10, 10240)),
              "every repetition with the switch below every one without"
              if max(cell(HOAB, c, 10, 10240)["mean_ttft_ms"][i] for c in ("shim-detok", "shim-ids-detok") for i in (0, 1))
              < min(cell(HOAB, "shim", 10, 10240)["mean_ttft_ms"]) else "?",
              64, 10240, pm(cell(HOAB, "shim", 64, 10240)), pm(cell(HOAB, "shim-detok", 64, 10240)),
              pm(cell(HOAB, "shim-ids-detok", 64, 10240)), pm(cell(HOAB, "native", 64, 10240)),
              cell(HOAB, "shim", 64, 10240)["reps"], 1024,
              f1(ab_sub("shim", 1024, 1, "p_frontend")), f1(ab_sub("shim-detok", 1024, 1, "p_frontend")),
              f1(ab_sub("shim", 1024, 1, "d_frontend")), f1(ab_sub("shim-detok", 1024, 1, "d_frontend")))),
    ("prefill alone was {} ms in the 2026-11-27b run (same machine kind, an earlier lease); `shim-ids-detok`'s {} ms is "
     "{} against it, the shim's {} ms there was {}. Prefill alone with `XLKV_DETOK_TAIL` would itself lose P's part "
     "(≈ {} ms), so against a prefill alone that has the switch too the handoff is ≈ {} ms. Left in D's first token: "
     "the one-token forward, `d_forward` {} ms with `--enforce-eager`",
     lambda: (f0(ho("shim", 10240, 1)["alone"]["mean"]), f0(ttft(cell(HOAB, "shim-ids-detok", 10, 10240))),
              "%+.0f" % (ttft(cell(HOAB, "shim-ids-detok", 10, 10240)) - ho("shim", 10240, 1)["alone"]["mean"]),
              f0(ttft(cell(HO, "shim", 10, 10240))), "%+.0f" % ho("shim", 10240, 1)["over_alone_ms"],
              f0(p_detok_part()),
              "%+.0f" % (ttft(cell(HOAB, "shim-ids-detok", 10, 10240)) - ho("shim", 10240, 1)["alone"]["mean"] + p_detok_part()),
              span([ab_sub(c, 10240, 1, "d_forward") for c in ("shim", "native", "shim-detok", "shim-ids-detok")]))),
    ("**`native` (`BLNHC`) against the shim, alternated**: {} vs {} ms one at a time and {} vs {} ms at {} × {}; D's "
     "mean ITL at {} × {} {} vs {} ms. The 2026-11-27b run (not alternated) had `native` ahead at {} × {} ({} vs {}); "
     "alternated, it is not. The decode A/B ({} × {}, {} output tokens) timed out after its first two passes: `native` "
     "{} ms, shim {} ms, ITL {} vs {} ms ({} repetition each",
     lambda: (pm(cell(HOAB, "native", 10, 10240)), pm(cell(HOAB, "shim", 10, 10240)),
              pm(cell(HOAB, "native", 64, 10240)), pm(cell(HOAB, "shim", 64, 10240)), 64, 10240, 64, 10240,
              f1(itl(cell(HOAB, "native", 64, 10240))), f1(itl(cell(HOAB, "shim", 64, 10240))), 64, 10240,
              f0(ttft(cell(HO, "native", 64, 10240))), f0(ttft(cell(HO, "shim", 64, 10240))),
              64, 10240, cell(DECAB, "shim", 64, 10240)["output_len"],
              f0(ttft(cell(DECAB, "native", 64, 10240))), f0(ttft(cell(DECAB, "shim", 64, 10240))),
              f1(itl(cell(DECAB, "native", 64, 10240))), f1(itl(cell(DECAB, "shim", 64, 10240))),
              cell(DECAB, "shim", 64, 10240)["reps"])),
    ("{}, the same text for every answer, first byte at {} tokens {} ms stock and {} ms with the switch (round medians",
     lambda: ("armed" if load(DETOK2)["lever_armed"] else "NOT armed",
              10240, span(load(DETOK2)["summary"]["10240-1 stock"]["round_medians_ms"], f1),
              span(load(DETOK2)["summary"]["10240-1 lever"]["round_medians_ms"], f1))
     if load(DETOK2)["same_text_with_and_without"] else ("?",) * 4),
    ("the switch from the package, {} alternated rounds",
     lambda: (len(load(DETOK2)["summary"]["10240-1 stock"]["round_medians_ms"]),)),
]


def table_rows(name, which):
    """The data rows, joined, of report.handoff_markdown's table ``which`` (0: the parts, 1: the sub-parts) for the
    results file ``name``: the docs quote both tables whole."""
    lines = report.handoff_markdown(load(name)).splitlines()
    cut = [i for i, l in enumerate(lines) if l.startswith("| tokens")][1]
    return " ".join(l for l in (lines[:cut], lines[cut:])[which] if re.match(r"\| \d", l))


def ab_part(config, length, conc, part):
    return handoff_row(HOAB, config, length, conc)["parts"][part]["mean"]


def ab_sub(config, length, conc, part):
    return handoff_row(HOAB, config, length, conc)["subparts"][part]["mean"]


def p_detok_part():
    """What XLKV_DETOK_TAIL took off P's answer at 10240 × c1 (P's frontend part, shim → shim-detok)."""
    return ab_sub("shim", 10240, 1, "p_frontend") - ab_sub("shim-detok", 10240, 1, "p_frontend")


def reps(c):
    """A cell's repetitions' mean TTFTs, "196, 236"."""
    return ", ".join(f0(x) for x in c["mean_ttft_ms"])


def gr(config, conc, name=GRAPHS):
    """A cell of a CUDA-graphs run (2026-11-27f, or 2026-11-27j for ``name=GRAPHS_C8``), 10240 tokens: 10, 32 and
    64 prompts at 1, 8 and 64 at a time (prefill alone too)."""
    return cell(name, config, {1: 10, 8: 32, 64: 64}[conc], 10240)


def gr_row(config, conc, name=GRAPHS):
    return handoff_row(name, config, 10240, conc)


def gr_part(config, conc, part, kind="parts", name=GRAPHS):
    return gr_row(config, conc, name)[kind][part]["mean"]


def p50(c):
    """A cell's p50 TTFT: the mean of its repetitions' medians (the results .md's median column)."""
    return mean(c["median_ttft_ms"])


def below(a, b):
    """How far below b a lies, in percent of b, "6.8%"."""
    return "%.1f%%" % (100 * (1 - a / b))


def halves(xs):
    """A cell's per-repetition means as "148, 153 → 188, 187": the first call's, then the second's."""
    return "%s → %s" % (", ".join(f0(x) for x in xs[:2]), ", ".join(f0(x) for x in xs[2:]))


def where_it_loses(part, config, conc=64):
    """"Where `native` loses at 64": the concurrency, then D's admission, D's first token, its frontend, P's answer and
    the transfer, each as ``config``'s then `shim-detok`'s mean (``part``: a run's part getter, gr_part's shape)."""
    return (conc,) + tuple(f1(part(c, conc, k, kind)) for k, kind in (
        ("d_admission", "parts"), ("d_first_token", "parts"), ("d_frontend", "subparts"), ("p_answer", "parts"),
        ("transfer", "parts")) for c in (config, "shim-detok"))


# CUDA graphs, prefill alone in the same run: the alternated run of 2026-11-27f
GRAPHS_CLAIMS = [
    ("FLASH_ATTN, block {}, the Qwen3-0.6B shape, {} output tokens, CUDA graphs",
     lambda: (gr("shim-detok", 1)["block_size"], gr("shim-detok", 1)["output_len"])),
    ("2 repetitions per start: **{} repetitions per cell, alternated** (`prefill_only-detok` at {} at a time: {}, the "
     "first call's time limit came before them)",
     lambda: (gr("shim-detok", 1)["reps"], 64, gr("prefill_only-detok", 64)["reps"])),
    ("{}", lambda: (table_rows(GRAPHS, 0),)),
    ("{}", lambda: (table_rows(GRAPHS, 1),)),
    ("`shim-detok` {} ms against its prefill alone's {} ms: {} ms mean, {} ms at p50 ({} vs {}, the repetitions' p50s "
     "averaged). Against prefill alone without the switch ({} ms) it is {}. `native` is {} ms, {} over its "
     "prefill alone",
     lambda: (pm(gr("shim-detok", 1)), pm(gr("prefill_only-detok", 1)),
              "%+.0f" % gr_row("shim-detok", 1)["over_alone_ms"],
              "%+.0f" % (p50(gr("shim-detok", 1)) - p50(gr("prefill_only-detok", 1))),
              f0(p50(gr("shim-detok", 1))), f0(p50(gr("prefill_only-detok", 1))), pm(gr("prefill_only", 1)),
              "%+.0f" % (ttft(gr("shim-detok", 1)) - ttft(gr("prefill_only", 1))), pm(gr("native", 1)),
              "%+.0f" % gr_row("native", 1)["over_alone_ms"])),
    ("D's admission {} ms (D's API server tokenises the prompt's text again; the proxy's token-id lever took it to {} ms "
     "in the eager run), the transfer {} ms, D's first token {} ms (its one-token forward {} ms), allocation, dispatch "
     "and notice {} ms together",
     lambda: (f1(gr_part("shim-detok", 1, "d_admission")), f1(ab_part("shim-ids-detok", 10240, 1, "d_admission")),
              f1(gr_part("shim-detok", 1, "transfer")), f1(gr_part("shim-detok", 1, "d_first_token")),
              f1(gr_part("shim-detok", 1, "d_forward", "subparts")),
              f1(sum(gr_part("shim-detok", 1, k) for k in ("d_alloc", "d_dispatch", "d_notice"))))),
    ("`d_forward` {} ms in every P/D cell here against {} ms with `--enforce-eager`. Seeding D's first token from P "
     "(#51919's third switch) could therefore take at most `d_to_run` + `d_forward` ≈ {} ms off one request's TTFT, "
     "about the spread of these cells (± {} ms); read dispatch and completion notice are {} + {} ms one at a time and "
     "{} + {} ms at {}",
     lambda: (span([gr_part(c, n, "d_forward", "subparts") for c in ("native", "shim-detok") for n in (1, 64)], f1),
              span([ab_sub(c, 10240, 1, "d_forward") for c in ("shim", "native", "shim-detok", "shim-ids-detok")]),
              f0(gr_part("shim-detok", 1, "d_to_run", "subparts") + gr_part("shim-detok", 1, "d_forward", "subparts")),
              f0(gr("shim-detok", 1)["mean_ttft_ms_std"]),
              f1(gr_part("shim-detok", 1, "d_dispatch")), f1(gr_part("shim-detok", 1, "d_notice")),
              f1(gr_part("shim-detok", 64, "d_dispatch")), f1(gr_part("shim-detok", 64, "d_notice")), 64)),
    ("**{} × {}**: `shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 150); `native` {} ms, {} over {}. The shim "
     "is {} below `native` (goal ≥ 10%). No handoff could reach 10% in this run: one that cost nothing would leave "
     "prefill alone, {} below `native` ({} with the switch); P's queue (`p_admission` {} ms)",
     lambda: (64, 10240, pm(gr("shim-detok", 64)), "%+.0f" % gr_row("shim-detok", 64)["over_alone_ms"],
              pm(gr("prefill_only-detok", 64)), pm(gr("native", 64)), "%+.0f" % gr_row("native", 64)["over_alone_ms"],
              pm(gr("prefill_only", 64)), below(ttft(gr("shim-detok", 64)), ttft(gr("native", 64))),
              below(ttft(gr("prefill_only", 64)), ttft(gr("native", 64))),
              below(ttft(gr("prefill_only-detok", 64)), ttft(gr("native", 64))),
              span([gr_part(c, 64, "p_admission") for c in ("native", "shim-detok")]))),
    ("**Where `native` loses at {}**: D's admission {} vs {} ms, D's first token {} vs {} ms (its frontend {} vs {}: the "
     "detokenizer's priming), P's answer {} vs {} ms, the transfer {} vs {} ms",
     lambda: where_it_loses(gr_part, "native")),
    ("**The second call ran slower one at a time** for `native` ({} ms), `shim-detok` ({}) and `prefill_only-detok` "
     "({}), not for `prefill_only` ({}); the alternation keeps that out of the comparison. `native`'s D ITL at {} at a "
     "time was {}, then {} ms",
     lambda: (halves(gr("native", 1)["mean_ttft_ms"]), halves(gr("shim-detok", 1)["mean_ttft_ms"]),
              halves(gr("prefill_only-detok", 1)["mean_ttft_ms"]), halves(gr("prefill_only", 1)["mean_ttft_ms"]), 64,
              ", ".join(f1(x) for x in gr("native", 64)["mean_itl_ms"][:2]),
              ", ".join(f1(x) for x in gr("native", 64)["mean_itl_ms"][2:]))),
]


# the 1/8/64 run with CUDA graphs (2026-11-27j)
g8 = functools.partial(gr, name=GRAPHS_C8)
g8_row = functools.partial(gr_row, name=GRAPHS_C8)
g8_part = functools.partial(gr_part, name=GRAPHS_C8)


def over(config, conc, name=GRAPHS_C8):
    """A P/D cell's TTFT over its prefill alone, "+22", in a 1/8/64 run (2026-11-27j unless ``name``)."""
    return "%+.0f" % gr_row(config, conc, name)["over_alone_ms"]


SETUP_WORDS = ("FLASH_ATTN, block {}, the Qwen3-0.6B shape, {} output tokens, CUDA graphs (`ENFORCE_EAGER=0`), "
               "`HANDOFF_TRACE=1`, {}-token prompts: {} one at a time, {} at 8 at a time, {} at 64")


def setup_figures(g):
    """The set-up of a run at 1, 8 and 64 at a time (``g``: its cell getter), as SETUP_WORDS says it."""
    c = g("shim-detok", 1)
    return (c["block_size"], c["output_len"], c["input_len"], c["num_prompts"], g("shim-detok", 8)["num_prompts"],
            g("shim-detok", 64)["num_prompts"])


def reps_per_cell(g, pd_configs):
    """The repetitions of every cell of the P/D configs and both prefills alone at 1, 8 and 64: one number only where
    every cell has as many."""
    return "/".join(sorted({str(g(c, n)["reps"]) for c in tuple(pd_configs) + ("prefill_only", "prefill_only-detok")
                            for n in (1, 8, 64)}))


# CUDA graphs at 1, 8 and 64 at a time: the run of 2026-11-27j, against the run of 2026-11-27f
GRAPHS_C8_CLAIMS = [
    ("## At {}, {} and {} at a time with CUDA graphs",
     lambda: tuple(sorted({c["max_concurrency"] for c in load(GRAPHS_C8)["cells"]}))),
    (SETUP_WORDS, lambda: setup_figures(g8)),
    ("**{} repetitions per cell**",      # one number only where every cell has as many
     lambda: reps_per_cell(g8, ("stock", "native", "shim-detok"))),
    ("{}", lambda: (table_rows(GRAPHS_C8, 0),)),
    ("{}", lambda: (table_rows(GRAPHS_C8, 1),)),
    ("**One at a time**: `shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 60) and {} at p50 ({} vs {}); against "
     "prefill alone without the switch ({}) it is {}. `native` {} ms ({}), stock {} ({})",
     lambda: (pm(g8("shim-detok", 1)), over("shim-detok", 1), pm(g8("prefill_only-detok", 1)),
              "%+.0f" % (p50(g8("shim-detok", 1)) - p50(g8("prefill_only-detok", 1))),
              f1(p50(g8("shim-detok", 1))), f1(p50(g8("prefill_only-detok", 1))), pm(g8("prefill_only", 1)),
              "%+.0f" % (ttft(g8("shim-detok", 1)) - ttft(g8("prefill_only", 1))), pm(g8("native", 1)),
              over("native", 1), pm(g8("stock", 1)), over("stock", 1))),
    ("**8 at a time**: `shim-detok` {} ms, `native` {}, stock {} ({}): the shim is {} below `native`. It is also {} ms "
     "below its prefill alone ({}), likely because",
     lambda: (pm(g8("shim-detok", 8)), pm(g8("native", 8)), pm(g8("stock", 8)),
              span(g8("stock", 8)["mean_ttft_ms"]), below(ttft(g8("shim-detok", 8)), ttft(g8("native", 8))),
              f0(-g8_row("shim-detok", 8)["over_alone_ms"]), pm(g8("prefill_only-detok", 8)))),
    ("the client keeps {} requests open, and a P/D request holds its place through D's part and its {} tokens, so P has "
     "fewer prompts queued than when it serves alone (P answered the proxy in {} ms on average; not measured further). "
     "Over prefill alone is "
     "therefore a lower bound at {}, not a handoff cost",
     lambda: (g8("shim-detok", 8)["max_concurrency"], g8("shim-detok", 8)["output_len"],
              f1(g8("shim-detok", 8)["avg_proxy_prefill_ms"]), g8("shim-detok", 8)["max_concurrency"])),
    ("**{} × {}**: `shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 150); `native` {} ({} over {}); stock {}. "
     "The shim is {} below `native` (goal ≥ 10%). In the run of 15:52–16:18 above it was {}: there `native` took {} ms, "
     "here {}, while `shim-detok` took {} and {}",
     lambda: (64, 10240, pm(g8("shim-detok", 64)), over("shim-detok", 64), pm(g8("prefill_only-detok", 64)),
              pm(g8("native", 64)), over("native", 64), pm(g8("prefill_only", 64)), pm(g8("stock", 64)),
              below(ttft(g8("shim-detok", 64)), ttft(g8("native", 64))),
              below(ttft(gr("shim-detok", 64)), ttft(gr("native", 64))), f0(ttft(gr("native", 64))),
              f0(ttft(g8("native", 64))), f0(ttft(gr("shim-detok", 64))), f0(ttft(g8("shim-detok", 64))))),
    ("its D's admission (D's API server tokenising the prompt) {} ms here against {} then, and D's first token {} against "
     "{}, of which D's frontend (priming the detokenizer with the whole prompt) {} against {}. Both are CPU work in D's "
     "API server, {} prompts of {} tokens at once; with the switch D's frontend is {} ms and its admission {} ms in this "
     "run ({} then)",
     lambda: (f1(g8_part("native", 64, "d_admission")), f1(gr_part("native", 64, "d_admission")),
              f1(g8_part("native", 64, "d_first_token")), f1(gr_part("native", 64, "d_first_token")),
              f1(g8_part("native", 64, "d_frontend", "subparts")), f1(gr_part("native", 64, "d_frontend", "subparts")),
              64, 10240, f1(g8_part("shim-detok", 64, "d_frontend", "subparts")),
              f1(g8_part("shim-detok", 64, "d_admission")), f1(gr_part("shim-detok", 64, "d_admission")))),
    ("**Stock** at {} and {}: D's transfer {} and {} ms mean (the shim's {} and {}), its D frontend {} and {} ms; stock's "
     "ITL varied {} ms at {} and {} ms at {} by repetition",
     lambda: (8, 64, f1(g8_part("stock", 8, "transfer")), f1(g8_part("stock", 64, "transfer")),
              f1(g8_part("shim-detok", 8, "transfer")), f1(g8_part("shim-detok", 64, "transfer")),
              f1(g8_part("stock", 8, "d_frontend", "subparts")), f1(g8_part("stock", 64, "d_frontend", "subparts")),
              span(g8("stock", 8)["mean_itl_ms"], f1), 8, span(g8("stock", 64)["mean_itl_ms"], f1), 64)),
]


# vLLM 0.26.0 at 1, 8 and 64 at a time with CUDA graphs: the run of 2026-11-28
g26 = functools.partial(gr, name=GRAPHS_26)
g26_row = functools.partial(gr_row, name=GRAPHS_26)
g26_part = functools.partial(gr_part, name=GRAPHS_26)
PD_26 = ("stock", "shim", "native-v1", "shim-detok")


over26 = functools.partial(over, name=GRAPHS_26)


def but_highest(c):
    """A cell's repetitions' mean TTFTs less the highest one, in ascending order."""
    return sorted(c["mean_ttft_ms"])[:-1]


def without_outlier(c):
    return mean(but_highest(c))


GRAPHS_26_CLAIMS = [
    ("## vLLM {} at {}, {} and {} at a time with CUDA graphs",
     lambda: (load(GRAPHS_26)["vllm_version"],) + tuple(sorted({c["max_concurrency"] for c in load(GRAPHS_26)["cells"]}))),
    (SETUP_WORDS, lambda: setup_figures(g26)),
    ("**{} repetitions per cell**", lambda: reps_per_cell(g26, PD_26)),
    ("{} failed requests", lambda: sum(sum(g26(c, n)["failed"]) for c in PD_26 for n in (1, 8, 64))),
    ("{}", lambda: (table_rows(GRAPHS_26, 0),)),
    ("{}", lambda: (table_rows(GRAPHS_26, 1),)),
    ("**One at a time**: `shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 60) and {} at p50 ({} vs {}). The "
     "shim without the switch {} ms ({}), `native-v1` {} ({}), stock {} ({})",
     lambda: (pm(g26("shim-detok", 1)), over26("shim-detok", 1), pm(g26("prefill_only-detok", 1)),
              "%+.0f" % (p50(g26("shim-detok", 1)) - p50(g26("prefill_only-detok", 1))),
              f1(p50(g26("shim-detok", 1))), f1(p50(g26("prefill_only-detok", 1))),
              pm(g26("shim", 1)), over26("shim", 1), pm(g26("native-v1", 1)), over26("native-v1", 1),
              pm(g26("stock", 1)), over26("stock", 1))),
    ("D's admission {} ms, the transfer {} ms, D's first token {} ms (its one-token forward {} ms), allocation, dispatch "
     "and notice {} ms together; P's own parts in P/D (admission {}, prefill {}, answer {} ms)",
     lambda: (f1(g26_part("shim-detok", 1, "d_admission")), f1(g26_part("shim-detok", 1, "transfer")),
              f1(g26_part("shim-detok", 1, "d_first_token")), f1(g26_part("shim-detok", 1, "d_forward", "subparts")),
              f1(sum(g26_part("shim-detok", 1, k) for k in ("d_alloc", "d_dispatch", "d_notice"))),
              f1(g26_part("shim-detok", 1, "p_admission")), f1(g26_part("shim-detok", 1, "p_prefill")),
              f1(g26_part("shim-detok", 1, "p_answer")))),
    ("**8 at a time**: `shim-detok` {} ms, the shim {}, `native-v1` {}, stock {} ({}): the shim with the switch is {} "
     "below `native-v1`, without it {}. `shim-detok` is {} ms below its prefill alone ({})",
     lambda: (pm(g26("shim-detok", 8)), pm(g26("shim", 8)), pm(g26("native-v1", 8)), pm(g26("stock", 8)),
              span(g26("stock", 8)["mean_ttft_ms"]), below(ttft(g26("shim-detok", 8)), ttft(g26("native-v1", 8))),
              below(ttft(g26("shim", 8)), ttft(g26("native-v1", 8))),
              f0(-g26_row("shim-detok", 8)["over_alone_ms"]), pm(g26("prefill_only-detok", 8)))),
    ("**{} × {}**: `shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 150); `native-v1` {} ({}); the shim "
     "without the switch {} ({}); stock {}. The shim with the switch is {} below `native-v1` (goal ≥ 10%), without it {}",
     lambda: (64, 10240, pm(g26("shim-detok", 64)), over26("shim-detok", 64), pm(g26("prefill_only-detok", 64)),
              pm(g26("native-v1", 64)), over26("native-v1", 64), pm(g26("shim", 64)), over26("shim", 64),
              pm(g26("stock", 64)), below(ttft(g26("shim-detok", 64)), ttft(g26("native-v1", 64))),
              below(ttft(g26("shim", 64)), ttft(g26("native-v1", 64))))),
    ("prefill alone at {} had one repetition at {} ms (the others {}), so its mean, {} ± {}, flatters the configs "
     "compared with it: against the other two repetitions' mean ({} ms) the shim is {} and `native-v1` {}",
     lambda: (64, f0(max(g26("prefill_only", 64)["mean_ttft_ms"])),
              ", ".join(f0(x) for x in but_highest(g26("prefill_only", 64))),
              f0(ttft(g26("prefill_only", 64))), f0(g26("prefill_only", 64)["mean_ttft_ms_std"]),
              f0(without_outlier(g26("prefill_only", 64))),
              "%+.0f" % (ttft(g26("shim", 64)) - without_outlier(g26("prefill_only", 64))),
              "%+.0f" % (ttft(g26("native-v1", 64)) - without_outlier(g26("prefill_only", 64))))),
    ("**Where `native-v1` loses at {}**: D's admission {} vs {} ms, D's first token {} vs {} ms (its frontend {} vs {}), "
     "P's answer {} vs {} ms, the transfer {} vs {} ms",
     lambda: where_it_loses(g26_part, "native-v1")),
    ("**Stock** at {} and {}: D's transfer {} and {} ms mean (the shim's {} and {}), its D frontend {} and {} ms",
     lambda: (8, 64, f1(g26_part("stock", 8, "transfer")), f1(g26_part("stock", 64, "transfer")),
              f1(g26_part("shim", 8, "transfer")), f1(g26_part("shim", 64, "transfer")),
              f1(g26_part("stock", 8, "d_frontend", "subparts")), f1(g26_part("stock", 64, "d_frontend", "subparts")))),
    ("**Equivalence with CUDA graphs**, the same lease, P on GPU 0 and D on GPU 1, `EQ_CONFIGS=\"stock "
     "shim-detok\"` with the negative control: **{}**. Token ids of prompts of {} tokens identical for stock P/D, "
     "`shim-detok` local and `shim-detok` P/D against local stock; `shim-detok`'s logprobs {} from stock's, local and "
     "P/D alike, and {} between its P/D and its local run; the negative control detected with other ids (max "
     "|Δlogprob| {})",
     lambda: (verdict(passed(EQ_GRAPHS_26) == "PASS"
                      and identical_ids(EQ_GRAPHS_26, "pd:stock", "local:shim-detok", "pd:shim-detok")),
              lengths(EQ_GRAPHS_26), "%.2e" % lp(EQ_GRAPHS_26, "shim-detok"),
              "%g" % lp(EQ_GRAPHS_26, "shim-detok", "max_logprob_diff_pd_vs_local"),
              "%.3f" % nc(EQ_GRAPHS_26, "nc-shim-detok"))),
]


# vLLM 0.33.0 at 1, 8 and 64 at a time with CUDA graphs, a second start: the run of
# 2026-11-28b, with the shim without the switch; against 2026-11-27f (gr) and 2026-11-27j (g8)
g33 = functools.partial(gr, name=GRAPHS_33B)
g33_part = functools.partial(gr_part, name=GRAPHS_33B)
g33_row = functools.partial(gr_row, name=GRAPHS_33B)
over33 = functools.partial(over, name=GRAPHS_33B)
PD_33B = ("shim", "native", "shim-detok")


def max_lp_all(name, configs):
    """The largest max |Δlogprob| of the configs' local and P/D runs against the reference, "%g"."""
    return "%g" % max(lp(name, c) for c in configs)


def hops(name, conc):
    """The client <-> proxy hop's cell means (pdtools/report.client_hop_rows) of a run at one concurrency."""
    return [h["mean"] for h in report.client_hop_rows(load(name)) if h["max_concurrency"] == conc]


def hop(name, config, conc):
    [h] = [h for h in report.client_hop_rows(load(name)) if (h["config"], h["max_concurrency"]) == (config, conc)]
    return h["mean"]


GRAPHS_RUNS = (GRAPHS, GRAPHS_C8, GRAPHS_33B, GRAPHS_26)


GRAPHS_33B_CLAIMS = [
    ("## vLLM {} at {}, {} and {} at a time with CUDA graphs, a second start",
     lambda: (load(GRAPHS_33B)["vllm_version"],) + tuple(sorted({c["max_concurrency"] for c in load(GRAPHS_33B)["cells"]}))),
    (SETUP_WORDS, lambda: setup_figures(g33)),
    ("**{} repetitions per cell**, {} failed requests",
     lambda: (reps_per_cell(g33, PD_33B),
              sum(sum(g33(c, n)["failed"]) for c in PD_33B + ("prefill_only", "prefill_only-detok") for n in (1, 8, 64)))),
    ("{}", lambda: (table_rows(GRAPHS_33B, 0),)),
    ("{}", lambda: (table_rows(GRAPHS_33B, 1),)),
    ("**One at a time**: `shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 60) and {} at p50 ({} vs {}). The "
     "shim without the switch {} ms ({}), `native` {} ({}). Over the three runs of 0.33.0 with CUDA graphs, `shim-detok` "
     "is {}, {} and {} over its prefill alone one at a time",
     lambda: (pm(g33("shim-detok", 1)), over33("shim-detok", 1), pm(g33("prefill_only-detok", 1)),
              "%+.0f" % (p50(g33("shim-detok", 1)) - p50(g33("prefill_only-detok", 1))),
              f1(p50(g33("shim-detok", 1))), f1(p50(g33("prefill_only-detok", 1))),
              pm(g33("shim", 1)), over33("shim", 1), pm(g33("native", 1)), over33("native", 1),
              "%+.0f" % gr_row("shim-detok", 1)["over_alone_ms"], over("shim-detok", 1), over33("shim-detok", 1))),
    ("its transfer is {} ms one at a time like `native`'s ({} descriptors per transfer each; both layouts make a block one "
     "region), and {} against {} ms at {}. Its {} ms more one at a time lie in the API servers' parts",
     lambda: (f1(g33_part("shim", 1, "transfer")) if f1(g33_part("shim", 1, "transfer")) == f1(g33_part("native", 1, "transfer"))
              else "?", f1(g33("shim", 1)["avg_descriptors_per_transfer"])
              if f1(g33("shim", 1)["avg_descriptors_per_transfer"]) == f1(g33("native", 1)["avg_descriptors_per_transfer"])
              else "?", f1(g33_part("shim", 64, "transfer")), f1(g33_part("native", 64, "transfer")), 64,
              f0(ttft(g33("shim", 1)) - ttft(g33("native", 1))))),
    ("P's admission {} vs {} ms, P's frontend {} vs {}, D's admission {} vs {}, D's frontend {} vs {}. `native` one at a "
     "time took {} ms in the run of 2026-11-27j and {} here",
     lambda: tuple(f1(g33_part(c, 1, k, kind)) for k, kind in (
         ("p_admission", "parts"), ("p_frontend", "subparts"), ("d_admission", "parts"), ("d_frontend", "subparts"))
         for c in ("shim", "native")) + (pm(g8("native", 1)), pm(g33("native", 1)))),
    ("At {} the shim is {} ms and `native` {} ({}), spreads that overlap",
     lambda: (64, pm(g33("shim", 64)), pm(g33("native", 64)), span(g33("native", 64)["mean_ttft_ms"]))),
    ("**8 at a time**: `shim-detok` {} ms, `native` {}, the shim {}: the shim with the switch is {} below `native`",
     lambda: (pm(g33("shim-detok", 8)), pm(g33("native", 8)), pm(g33("shim", 8)),
              below(ttft(g33("shim-detok", 8)), ttft(g33("native", 8))))),
    ("**{} × {}**: `shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 150); `native` {} ({} over {}). The shim "
     "with the switch is {} below `native` (goal ≥ 10%). Over the three runs that had both (2026-11-27f, 2026-11-27j, "
     "here) it was {}, {} and {}: `shim-detok` took {}, {} and {} ms, `native` {}, {} and {}. **The goal of ≥ 10% below "
     "vLLM's best own configuration at {} × {} is met in {} run of three**",
     lambda: (64, 10240, pm(g33("shim-detok", 64)), over33("shim-detok", 64), pm(g33("prefill_only-detok", 64)),
              pm(g33("native", 64)), over33("native", 64), pm(g33("prefill_only", 64)),
              below(ttft(g33("shim-detok", 64)), ttft(g33("native", 64))))
     + tuple(below(ttft(g("shim-detok", 64)), ttft(g("native", 64))) for g in (gr, g8, g33))
     + tuple(f0(ttft(g("shim-detok", 64))) for g in (gr, g8, g33))
     + tuple(f0(ttft(g("native", 64))) for g in (gr, g8, g33))
     + (64, 10240, {0: "no", 1: "one", 2: "two", 3: "every"}[
         sum(ttft(g("shim-detok", 64)) <= 0.9 * ttft(g("native", 64)) for g in (gr, g8, g33))])),
    ("**Where `native` loses at {}**: D's admission {} vs {} ms, D's first token {} vs {} ms (its frontend {} vs {}), "
     "P's answer {} vs {} ms, the transfer {} vs {} ms",
     lambda: where_it_loses(g33_part, "native")),
    ("In the {} runs with CUDA graphs ({} on 0.33.0, {} on 0.26.0) it is {} ms one at a time and {} ms at {} × {} in "
     "every P/D cell; here `shim-detok` {}, `native` {} and the shim {} ms at {}. Prefill alone is measured without the "
     "proxy, so over prefill alone includes the hop: of `shim-detok`'s {} at {} here, {} ms is the hop and {} the "
     "engines' handoff",
     lambda: ({4: "four"}[len(GRAPHS_RUNS)],
              {3: "three"}[sum(load(n)["vllm_version"] == "0.33.0" for n in GRAPHS_RUNS)],
              {1: "one"}[sum(load(n)["vllm_version"] == "0.26.0" for n in GRAPHS_RUNS)],
              span([x for n in GRAPHS_RUNS for x in hops(n, 1)], f1),
              span([x for n in GRAPHS_RUNS for x in hops(n, 64)], f1), 64, 10240)
     + tuple(f1(hop(GRAPHS_33B, c, 64)) for c in ("shim-detok", "native", "shim"))
     + (64, over33("shim-detok", 64), 64, f0(hop(GRAPHS_33B, "shim-detok", 64)),
        "%+.0f" % (g33_row("shim-detok", 64)["over_alone_ms"] - hop(GRAPHS_33B, "shim-detok", 64)))),
    ("With the hop taken off both (a router that cost nothing), `shim-detok` would be {} below `native`, and a handoff "
     "that cost nothing as well would leave its prefill alone, {} below: in this run no lever on the handoff could "
     "reach the {} goal",
     lambda: (below(ttft(g33("shim-detok", 64)) - hop(GRAPHS_33B, "shim-detok", 64),
                    ttft(g33("native", 64)) - hop(GRAPHS_33B, "native", 64)),
              below(ttft(g33("prefill_only-detok", 64)), ttft(g33("native", 64)) - hop(GRAPHS_33B, "native", 64)),
              "10%" if ttft(g33("prefill_only-detok", 64)) > 0.9 * (ttft(g33("native", 64))
                                                                     - hop(GRAPHS_33B, "native", 64)) else "?")),
    ("**Equivalence with CUDA graphs on {}**, the same lease, P on GPU 0 and D on GPU 1, "
     "`EQ_CONFIGS=\"stock shim-detok\"` with the negative control: **{}**. Token ids of prompts of {} tokens identical for "
     "stock P/D, `shim-detok` local and `shim-detok` P/D against local stock, and their logprobs too (max |Δlogprob| {}; "
     "on 0.26.0, where the shim forces Model Runner V1, {}); the negative control detected with other ids (max "
     "|Δlogprob| {})",
     lambda: (eq(EQ_GRAPHS_33)["vllm_version"],
              verdict(passed(EQ_GRAPHS_33) == "PASS" and eq(EQ_GRAPHS_33)["cuda_graphs"] is True
                      and identical_ids(EQ_GRAPHS_33, "pd:stock", "local:shim-detok", "pd:shim-detok")),
              lengths(EQ_GRAPHS_33), max_lp_all(EQ_GRAPHS_33, ("stock", "shim-detok")),
              "%.2e" % lp(EQ_GRAPHS_26, "shim-detok"), "%.3f" % nc(EQ_GRAPHS_33, "nc-shim-detok"))),
]


# --------------------------------------------------------------------------- README.md's prose

#: the files of the bold 64 × 10240 TTFT rows (eager, three repetitions each; docs/measurements.md's table of every
#: row, README's among them): README's opening gain is their range
README_GAIN = (B21, B26, B33, HO)


def overlap(a, b):
    """The repetitions' spans of two cells overlap (the words "within noise")."""
    return max(min(a), min(b)) <= min(max(a), max(b))


def stock_per_block():
    """(layers, stock descriptors per Qwen3-0.6B block where K and V are regions of their own, where they are
    one region per layer, the first release of the latter): the shim's release facts and the lab's model shape,
    each count also measured on a GPU (stock's probe transfer, read by vLLM's KV metrics, of files where NIXL
    merged nothing: a "?" where the measurement differs)."""
    from xlkv_autopatch import facts
    from model_shapes import QWEN3_0_6B
    layers = QWEN3_0_6B["num_hidden_layers"]
    rows = releases.RELEASES
    split = [facts.facts_for(r.release).kv_split_regions for r in rows]
    first = next(i for i in range(1, len(rows)) if split[i - 1] and not split[i])
    assert not any(split[first:]), "K/V regions come back after %s" % rows[first].release
    measured = {True: eq("2026-11-22-equivalence-0.21.0-tp1to2-4xH200.json"),
                False: eq("2026-11-22-equivalence-0.26.0-2xH200.json")}
    counts = []
    for kv_split, d in measured.items():
        assert facts.facts_for(d["vllm_version"]).kv_split_regions is kv_split, d["vllm_version"]
        want = layers * (2 if kv_split else 1)
        counts.append(want if d["configs"]["stock"]["descriptors_per_block"] == want else "?")
    return (layers,) + tuple(counts) + (rows[first].release,)


def python_requires():
    return re.search(r"^python_requires = >=(\d+\.\d+)$", read("setup.cfg"), re.M).group(1)


def time_limits():
    """pyproject.toml's default pytest-timeout and tests/conftest.py's limits for tests/real and slow tests."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("xlkv_tests_conftest", os.path.join(ROOT, "tests", "conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    limits = dict(conftest.TIME_LIMITS)
    return int(re.search(r"^timeout = (\d+)$", read("pyproject.toml"), re.M).group(1)), limits["real"], limits["slow"]


def ci_times():
    """README's test-time sentence: the newest CI run, the newest two runs here (ci-times.json)."""
    runs = load("ci-times.json")["runs"]
    ci, here = [r for r in runs if r["where"] == "ci"][-1], [r for r in runs if r["where"] == "here"]
    return (ci["commit"], round(ci["seconds"] / 60), ci["seconds"], here[-1]["commit"], round(here[-1]["seconds"] / 60),
            here[-1]["seconds"], here[-1]["pytest"].split(" in ")[0], here[-2]["commit"], here[-2]["seconds"],
            "still over" if here[-1]["seconds"] > 60 * 60 else "under")


README = [
    ("(a {}-layer Qwen3-0.6B block: {}, or {} from vLLM {})", stock_per_block),
    ("mean TTFT {}–{}× lower than stock at {} × {}-token prompts on two H200s (vLLM {}; table below)",
     lambda: (f2(min(ttft(cell(n, "stock", 64, 10240)) / ttft(cell(n, "shim", 64, 10240)) for n in README_GAIN)),
              f2(max(ttft(cell(n, "stock", 64, 10240)) / ttft(cell(n, "shim", 64, 10240)) for n in README_GAIN)),
              64, 10240, ", ".join(sorted({load(n)["vllm_version"] for n in README_GAIN}, reverse=True))
              if {load(n)["gpu"] for n in README_GAIN} == {"2xH200"} else "?")),
    ("at {} × {} tokens it is {} ({} on {})",
     lambda: (128, 1024, "within noise" if overlap(cell(B21K, "stock", 128, 1024)["mean_ttft_ms"],
                                                   cell(B21K, "shim", 128, 1024)["mean_ttft_ms"]) else "?",
              ratio(ttft(cell(B21K, "stock", 128, 1024)), ttft(cell(B21K, "shim", 128, 1024))),
              load(B21K)["vllm_version"])),
    ("against the prompt's last {} token ids instead of the whole prompt",
     lambda: (__import__("xlkv_autopatch.prompt_tail", fromlist=["TAIL_IDS"]).TAIL_IDS,)),
    ("on {} at {}-token prompts it took P's and D's frontend parts from {} ms to {} ms each, one request at a time",
     lambda: ({"2xH200": "two H200s"}.get(load(HOAB)["gpu"], "?"), 10240,
              span([ab_sub("shim", 10240, 1, p) for p in ("p_frontend", "d_frontend")]),
              span([ab_sub("shim-detok", 10240, 1, p) for p in ("p_frontend", "d_frontend")]))),
    ("Python ≥ {}", lambda: (python_requires(),)),
    ("Time: {} s on this 2-core machine {} a GPU",  # the machine's cores: ci-times.json does not record them
     lambda: (load("ci-times.json")["main_job"][-1]["seconds"],
              "without" if load("ci-times.json")["main_job"][-1]["gpus"] == 0 else "with")),
    ("CI's run of {} took {} minutes ({} s); a fresh clone of {} took {} minutes ({} s: {}) here with the environments "
     "cached ({}: {} s), {} the 60-minute target", ci_times),
    ("(pytest-timeout: {} s, tests/real {} s, `slow` tests {} s)", time_limits),
    ("mean TTFT of {} repetitions",
     lambda: (lambda reps: (reps.pop(),) if len(reps) == 1 else ("?",))(
         {cell(n, c, 64, 10240)["reps"] for n in README_GAIN for c in ("stock", "shim")})),
    ("interpreter start-up is {} of no shim ({} vs {} ms",
     lambda: ("within noise" if overlap(load(STARTUP)["round_medians_ms"]["shim_flag_off"],
                                        load(STARTUP)["round_medians_ms"]["no_shim"]) else "?",
              f1(startup("shim_flag_off")), f1(startup("no_shim")))),
]


def upstream_h200(release):
    """(tests, passed in each of stock / on / switches, differences) of vLLM's own NIXL tests on one H200; a
    word that fails where the modes passed different counts."""
    d = load("upstream-tests-%s-1xH200.json" % release)
    modes = d["modes"]
    passed = {modes[m]["passed"] for m in ("stock", "on", "switches")}
    counts = {len(modes[m]["outcomes"]) for m in ("stock", "on", "switches")}
    if len(passed) != 1 or len(counts) != 1:
        return ("?", "?", "?")
    return counts.pop(), passed.pop(), len(d["differ"]) + len(d["not_in_every_mode"])


DETOK_EQ = {r: "2026-11-27-equivalence-%s-1xH200-detok-nc.json" % r for r in ("0.33.0", "0.29.0")}


def detok_eq_words(release):
    """PASS when the file passed and stock P/D, the switch's local run and its P/D run equal local stock with the
    switch's P/D also equal to stock P/D; else FAIL."""
    name = DETOK_EQ[release]
    ok = (passed(name) == "PASS" and identical_ids(name, "pd:stock", "local:shim-detok", "pd:shim-detok")
          and eq(name)["pd_vs_pd_stock"] == {"pd:shim-detok": []})
    return verdict(ok)


FAILURE_CLAIMS = [
    ("vLLM 0.33.0: {} tests, {} passed in each mode, {} differences; vLLM 0.29.0: {} tests, {} passed in each mode, {} "
     "differences; vLLM 0.26.0: {} tests, {} passed in each mode, {} differences; vLLM 0.21.0: {} tests, {} passed in "
     "each mode, {} differences",
     lambda: upstream_h200("0.33.0") + upstream_h200("0.29.0") + upstream_h200("0.26.0") + upstream_h200("0.21.0")),
    ("vLLM 0.33.0 {} and vLLM 0.29.0 {}: token ids, the answers' text and top-5 logprobs of prompts of {} tokens "
     "identical to local prefill and to stock P/D (max |Δlogprob| {}, `VLLM_BATCH_INVARIANT=1`); the negative control "
     "(each request's first KV block given the next block's bytes) detected with other ids (max |Δlogprob| {} and {})",
     lambda: (detok_eq_words("0.33.0"), detok_eq_words("0.29.0"), lengths(DETOK_EQ["0.33.0"]),
              "%g" % max(lp(DETOK_EQ[r], "shim-detok") for r in DETOK_EQ),
              "%.3f" % nc(DETOK_EQ["0.33.0"], "nc-shim-detok"), "%.3f" % nc(DETOK_EQ["0.29.0"], "nc-shim-detok"))),
]

FUZZ = {r: "2026-11-29-detok-fuzz-%s.json" % r for r in ("0.21.0", "0.26.0", "0.33.0")}
FUZZ_PLANTED = "2026-11-29-detok-fuzz-0.33.0-planted.json"


def fuzz_same(key):
    """One figure that every release's fuzz file has (or "?")."""
    values = {key(load(f)) for f in FUZZ.values()}
    return values.pop() if len(values) == 1 else "?"


def thousands(n):
    return "{:,}".format(n)


def fuzz_cost(length, prompt, mode):
    """min–max over the vocabularies of one cost row's median ms on vLLM 0.33.0 (under 1 ms: two decimals)."""
    xs = [r[mode + "_ms"] for r in load(FUZZ["0.33.0"])["cost"] if (r["prompt_tokens"], r["prompt"]) == (length, prompt)]
    return span(xs, fmt=lambda x: "%.2f" % x if x < 1 else f1(x))


FUZZ_CLAIMS = [
    ("with `skip_special_tokens` on and off: {} cases per vocabulary and setting, **{} per release, {} differences** on "
     "vLLM {}, {} and {}",
     lambda: (thousands(fuzz_same(lambda d: d["cases_per_vocabulary_and_skip"])),
              thousands(fuzz_same(lambda d: d["total_cases"])), fuzz_same(lambda d: d["total_differ"]), *sorted(FUZZ))),
    ("The tail was taken in {} of each {} and vLLM's stream kept in the others",
     lambda: (thousands(fuzz_same(lambda d: sum(v["tail"] for v in d["fuzz"].values()))),
              thousands(fuzz_same(lambda d: d["total_cases"])))),
    ("a stray byte before {} skipped `<s>`; ids cut inside a character before {} emoji in byte pieces; an invalid byte "
     "before {} \"é\" in bytes) give vLLM's text",
     lambda: (63, 17, 40) if all(stock == switch for f in FUZZ.values()
                                  for stock, switch in load(f)["reproducers"].values()) else ("?",) * 3),
    ("gives another text in {} of {} cases on vLLM {}, all on the two SentencePiece vocabularies ({} Mistral v1, {} "
     "Mistral v3), and in all {} reported prompts",
     lambda: (load(FUZZ_PLANTED)["total_differ"], thousands(load(FUZZ_PLANTED)["total_cases"]), load(FUZZ_PLANTED)["vllm"],
              load(FUZZ_PLANTED)["fuzz"]["mistral-v1"]["differ"], load(FUZZ_PLANTED)["fuzz"]["mistral-v3"]["differ"],
              "three" if load(FUZZ_PLANTED)["planted"] and all(stock != switch for stock, switch in
                                                                 load(FUZZ_PLANTED)["reproducers"].values()) else "?")),
    ("prompts of text, {} ids: {} ms stock, {} ms with the switch; {} ids: {} ms stock, {} ms with the switch",
     lambda: (10240, fuzz_cost(10240, "text", "stock"), fuzz_cost(10240, "text", "switch"),
              32768, fuzz_cost(32768, "text", "stock"), fuzz_cost(32768, "text", "switch"))),
    ("after the walk back stops at {} ids: {} vs {} ms at {} ids and {} vs {} ms at {}",
     lambda: (prompt_tail.MAX_RUN, fuzz_cost(10240, "byte pieces only", "stock"), fuzz_cost(10240, "byte pieces only", "switch"), 10240,
              fuzz_cost(32768, "byte pieces only", "stock"), fuzz_cost(32768, "byte pieces only", "switch"), 32768)),
    ("(median of {} of vLLM's detokenizer set-up", lambda: (7,)),
    ("**Planted**: the tail cut at {} ids whatever the run", lambda: (prompt_tail.TAIL_IDS,)),
]

DYNAMO = "2026-11-29-0.31.0-2xH200-dynamo.json"
DYNAMO_EQ = "2026-11-29-equivalence-0.31.0-2xH200-dynamo-nc.json"
DYNAMO_ROWS = (("dynamo-stock", "Dynamo"), ("dynamo-native", "Dynamo"), ("dynamo-shim-detok", "Dynamo"),
               ("shim-detok", "the lab proxy"), ("prefill_only-detok", "none (P alone)"))


def dyn(config, conc):
    """The Dynamo lease's cell of ``config`` at 10240 tokens, 1 (10 prompts) or 64 at a time."""
    return cell(DYNAMO, config, 10 if conc == 1 else 64, 10240)


def dyn_front(config, conc, series):
    return report.frontend_means(dyn(config, conc).get("frontend"))[series]


TRANSPORT = "dynamo_frontend_stage_duration_seconds[transport_roundtrip]"
FRONT_TTFT = "dynamo_frontend_time_to_first_token_seconds"


def dyn_legs(config, conc):
    """(legs per request, ms per request in them): Dynamo's transport_roundtrip stage counts each leg to a worker
    (prefill, then decode), so a request's time in them is the stage's mean times its legs per request; means over the
    repetitions."""
    reps = dyn(config, conc)["frontend"]
    per = [r[TRANSPORT]["n"] / r[FRONT_TTFT]["n"] for r in reps]
    ms = [r[TRANSPORT]["mean_ms"] * r[TRANSPORT]["n"] / r[FRONT_TTFT]["n"] for r in reps]
    return (per[0] if len(set(per)) == 1 else "?"), mean(ms)


def dyn_table():
    """The rows of the Dynamo section's table: per config, its router, mean TTFT one and 64 at a time (mean ± std),
    dynamo-stock / config at 64, descriptors per transfer and xfer ms at 64."""
    rows = []
    for config, router in DYNAMO_ROWS:
        c1, c64 = dyn(config, 1), dyn(config, 64)
        alone = config.startswith("prefill_only")
        rows.append("| `%s` | %s | %d | %s | %s | %s | %s | %s |" % (
            config, router, c64["reps"], pm(c1), pm(c64),
            "—" if alone else ratio(ttft(dyn("dynamo-stock", 64)), ttft(c64)),
            "—" if alone else f1(c64["avg_descriptors_per_transfer"]), "—" if alone else f1(c64["avg_xfer_ms"])))
    return " ".join(rows)


def dyn_eq_words():
    """PASS when the file passed with every Dynamo run's ids equal local stock's and both Dynamo runs equal stock
    P/D; else FAIL."""
    ok = (passed(DYNAMO_EQ) == "PASS" and identical_ids(DYNAMO_EQ, "pd:stock", "pd:dynamo-stock", "pd:dynamo-shim")
          and eq(DYNAMO_EQ)["pd_vs_pd_stock"] == {"pd:dynamo-stock": [], "pd:dynamo-shim": []})
    return verdict(ok)


def dyn_printed_off():
    """How far Dynamo's printed token_logprobs lay from the exact values (the resummary's problems before)."""
    before = eq(DYNAMO_EQ)["resummarized"]["logprob_problems_before"]
    xs = {float(re.search(r"difference\| ([\d.e+-]+)", b).group(1)) for b in before}
    return "%.3g" % max(xs) if len(before) == 2 else "?"


DYNAMO_CLAIMS = [
    ("FLASH_ATTN, block {}, the Qwen3-0.6B shape, eager mode, {} output tokens; prompts of {} random tokens, {} one at "
     "a time and {} at {} at a time. The {} Dynamo configs were started twice ({} repetitions per cell), `shim-detok` "
     "and its prefill alone once ({}), {} failed requests",
     lambda: (dyn("dynamo-stock", 1)["block_size"], dyn("dynamo-stock", 1)["output_len"],
              dyn("dynamo-stock", 1)["input_len"], dyn("dynamo-stock", 1)["num_prompts"],
              dyn("dynamo-stock", 64)["num_prompts"], dyn("dynamo-stock", 64)["max_concurrency"],
              len([c for c, r in DYNAMO_ROWS if r == "Dynamo"]), dyn("dynamo-stock", 64)["reps"],
              dyn("shim-detok", 64)["reps"],
              sum(sum(dyn(c, n)["failed"]) for c, _ in DYNAMO_ROWS for n in (1, 64)))),
    ("| config | router | reps | mean TTFT ms, one at a time | mean TTFT ms, {} at a time | `dynamo-stock` / config at {} "
     "| descriptors per transfer at {} | NIXL xfer ms at {} | |---|---|---|---|---|---|---|---| {}",
     lambda: (64, 64, 64, 64, dyn_table()) if dyn("dynamo-stock", 64)["max_concurrency"] == 64 else ("?",) * 5),
    ("**Equivalence through Dynamo: {}.** Token ids and text of prompts of {} tokens identical for stock P/D (the lab "
     "proxy), `dynamo-stock` and `dynamo-shim` against local stock, and their top-5 logprobs too (max |Δlogprob| {})",
     lambda: (dyn_eq_words(), lengths(DYNAMO_EQ), "%g" % max(lp(DYNAMO_EQ, c) for c in ("dynamo-stock", "dynamo-shim")))),
    ("prints `token_logprobs` with float32's shortest digits (-7.9051385 for -7.9051384925842285), {} off",
     lambda: (dyn_printed_off(),)),
    ("the negative control through Dynamo (`nc-dynamo-shim`: each request's first KV block given the next block's bytes) "
     "detected with other ids (max |Δlogprob| {}). D registered {} regions per block with stock and {} with the shim; "
     "the {}-block probe moved {} descriptors with stock, {} with the shim",
     lambda: ("%.3f" % nc(DYNAMO_EQ, "nc-dynamo-shim"),
              *(lambda a, b: (a[0], b[0]) if len(a) == len(b) == 1 else ("?", "?"))(
                  eq(DYNAMO_EQ)["configs"]["dynamo-stock"]["registered_regions_per_block_id"],
                  eq(DYNAMO_EQ)["configs"]["dynamo-shim"]["registered_regions_per_block_id"]),
              f0(eq(DYNAMO_EQ)["configs"]["dynamo-shim"]["blocks_per_transfer"]),
              f0(eq(DYNAMO_EQ)["configs"]["dynamo-stock"]["descriptors_per_transfer"]),
              f0(eq(DYNAMO_EQ)["configs"]["dynamo-shim"]["descriptors_per_transfer"]))),
    ("**64 × 10240**: `dynamo-shim-detok` {} ms against `dynamo-stock` {}: stock Dynamo takes **{}** as long (goal ≥ "
     "1.3×, met). "
     "Against Dynamo with vLLM's own `BLNHC` ({}) it is {} {} (goal ≥ 10% below: **not met**)",
     lambda: (pm(dyn("dynamo-shim-detok", 64)), pm(dyn("dynamo-stock", 64)),
              ratio(ttft(dyn("dynamo-stock", 64)), ttft(dyn("dynamo-shim-detok", 64))), pm(dyn("dynamo-native", 64)),
              "%.1f%%" % abs(100 * (ttft(dyn("dynamo-shim-detok", 64)) / ttft(dyn("dynamo-native", 64)) - 1)),
              "above" if ttft(dyn("dynamo-shim-detok", 64)) > ttft(dyn("dynamo-native", 64)) else "below")),
    ("Descriptors per transfer at 64: {} with stock, {} with `BLNHC`, {} with the shim; NIXL's xfer time {}, {} and {} ms",
     lambda: tuple(f1(dyn(c, 64)["avg_descriptors_per_transfer"]) for c in ("dynamo-stock", "dynamo-native",
                                                                             "dynamo-shim-detok"))
     + tuple(f1(dyn(c, 64)["avg_xfer_ms"]) for c in ("dynamo-stock", "dynamo-native", "dynamo-shim-detok"))),
    ("**One at a time**: `dynamo-shim-detok` {} ms, {} over its prefill alone ({}; goal ≤ 40: **not met**); "
     "`dynamo-stock` {} and `dynamo-native` {}",
     lambda: (pm(dyn("dynamo-shim-detok", 1)),
              "%+.0f" % (ttft(dyn("dynamo-shim-detok", 1)) - ttft(dyn("prefill_only-detok", 1))),
              pm(dyn("prefill_only-detok", 1)), pm(dyn("dynamo-stock", 1)), pm(dyn("dynamo-native", 1)))),
    ("Dynamo's frontend, by its own histograms (`dynamo-shim-detok`): its time to first token is {} ms one at a time and "
     "{} at 64. Each request makes {} legs to the workers (prefill, then decode: the `transport_roundtrip` stage), "
     "{} and {} ms of it; the frontend's own part (parsing and tokenising the request, routing, handing prefill's "
     "answer to decode) is the rest, {} and {} ms, routing alone {} and {} ms",
     lambda: (f1(dyn_front("dynamo-shim-detok", 1, FRONT_TTFT)), f1(dyn_front("dynamo-shim-detok", 64, FRONT_TTFT)),
              "two" if dyn_legs("dynamo-shim-detok", 1)[0] == dyn_legs("dynamo-shim-detok", 64)[0] == 2 else "?",
              f1(dyn_legs("dynamo-shim-detok", 1)[1]), f1(dyn_legs("dynamo-shim-detok", 64)[1]),
              f1(dyn_front("dynamo-shim-detok", 1, FRONT_TTFT) - dyn_legs("dynamo-shim-detok", 1)[1]),
              f1(dyn_front("dynamo-shim-detok", 64, FRONT_TTFT) - dyn_legs("dynamo-shim-detok", 64)[1]),
              f2(dyn_front("dynamo-shim-detok", 1, "dynamo_frontend_stage_duration_seconds[route]")),
              f2(dyn_front("dynamo-shim-detok", 64, "dynamo_frontend_stage_duration_seconds[route]")))),
    ("the client's mean TTFT less the frontend's is {} ms one at a time and {} at 64",
     lambda: tuple(f0(ttft(dyn("dynamo-shim-detok", n))
                      - dyn_front("dynamo-shim-detok", n, "dynamo_frontend_time_to_first_token_seconds")) for n in (1, 64))),
    ("The same shim through the lab proxy in the same lease: {} ms one at a time, {} at 64",
     lambda: (pm(dyn("shim-detok", 1)), pm(dyn("shim-detok", 64)))),
]

CLAIMS = {"measurements.md": MEASUREMENTS + DETOK_TAIL_CLAIMS + FAILURE_CLAIMS + GRAPHS_CLAIMS + GRAPHS_C8_CLAIMS
                             + GRAPHS_26_CLAIMS + GRAPHS_33B_CLAIMS + FUZZ_CLAIMS + DYNAMO_CLAIMS,
          "deploy.md": DEPLOY, "README.md": README}

# Numbers in the docs that are no measured figure: where they stand, nothing to compare with a file.
#: code spans (`...`) that are file names, commands or settings, not results
EXEMPT_CODE = [r"20\d\d-\d\d-\d\d|\.json|\.log|results/|-64blocks|python|\.py |kubectl|docker|rate\(|<version>",
               r"^`[A-Z0-9_]+=[^`]*`$",          # a setting (VLLM_BATCH_INVARIANT=1, ...)
               r"^`max_tokens=1`$",              # prefill_only's setting
               r"^`xlkv_autopatch: NIXL registration: 1 region\(s\), N blocks"]  # the log line's shape
EXEMPT = [
    r"\]\([^)]*\)",                              # link targets
    r"\b\d{4}-\d\d-\d\d\b",                      # dates
    r"\b\d+\.\d+\.\d+\b",                        # releases and versions
    r"(?<![\d.])0\.\d\d(?:–0\.\d\d(?![\d.]| GB)|\+)",  # release ranges (0.22–0.28, 0.17+)
    r"\b(?:torch|wrapt) \d+\.\d+\b",
    r"\b(?:at|commit|shim|from commit) [0-9a-f]{7}\b",
    r"\d+×H[12]00", r"\bGPUs? \d+(?: and \d+)?",
    r"\b(?:P |D )?TP \d+(?: → (?:D TP )?\d+)?",
    r"Qwen3-0\.6B", r"Llama-3-8B", r"DeepSeek-V2", r"Gemma-3",
    r"#\d{4,5}\b",                               # vLLM PR and issue numbers
    r"goal ≤ \d+",                               # targets, not results
    r"exit 1 and a `problems` entry",            # status's exit code (its contract, tests/unit/test_status.py)
    r"not required to be 0",                     # the checker's rule
    r"\d+-GPU machine",
    r'device log "\d\d:\d\d–\d\d:\d\d"',         # where in experiments/results/device-log.md
    r"The 10240-token gain above",               # the rows above
    r"## \d+\.", r"\bsections? \d+",              # deploy.md's section numbers
]
#: per doc, more spans that are no measured figure
EXEMPT_BY_DOC = {"README.md": [
    r"`>=0\.\d\d,<0\.\d\d`",                     # the supported range as a version specifier
    r"\((?:0\.\d\d(?:–0\.\d\d)?(?:, )?)+\)",         # the releases a backend ran on: (0.26, 0.33), (0.33)
    r"`NIXL registration: 1 region\(s\), \.\.\.",     # the log line's shape
    r"`XLKV_EQUAL_TP=true` gives 1 \(",           # the support table's footnote: its cells, test_docs.py
    r"\bApache-2\.0\b",                           # the licence's name
]}


# --------------------------------------------------------------------------- the docs, as the claims read them

#: each doc's path under the root
DOCS = {"measurements.md": ("docs", "measurements.md"), "deploy.md": ("docs", "deploy.md"), "README.md": ("README.md",)}


def normalize(raw, name):
    """(text, index): the doc ``raw`` with fenced code blocks left out, whitespace collapsed (the docs wrap lines
    anywhere), and for each character of text its offset in ``raw``. README.md (at the root) without its tables: its
    prose is checked here, its tables by tests/unit/test_docs.py (the TTFT table against its files, the support table
    against the matrix). docs/measurements.md without its table of every TTFT row (between its ttft-summary markers:
    README's table and the rest of its rows), which test_docs.py checks row by row against the same files."""
    masked = raw
    if name == "README.md":
        masked = re.sub(r"(?m)^\|.*$", lambda m: " " * len(m.group()), masked)
    elif name == "measurements.md":
        masked = re.sub(r"<!-- ttft-summary -->.*?<!-- /ttft-summary -->", lambda m: " " * len(m.group()), masked,
                        flags=re.S)
    masked = re.sub(r"```.*?```", lambda m: " " * len(m.group()), masked, flags=re.S)
    words, index = [], []
    for m in re.finditer(r"\S+", masked):
        if words:
            index.append(m.start() - 1)  # the space: the whitespace before the word
        words.append(m.group())
        index.extend(range(m.start(), m.end()))
    return " ".join(words), index


def doc_raw(name):
    return read(*DOCS[name])


def doc_text(name):
    return normalize(doc_raw(name), name)[0]


def line_of(raw, offset):
    return raw.count("\n", 0, offset) + 1


# --------------------------------------------------------------------------- checking and writing

def fill(template, fn):
    """(the claim's text filled from its files, its figures as the doc writes them: one per ``{}``)."""
    vals = fn()
    vals = vals if isinstance(vals, tuple) else (vals,)
    return template.format(*vals), ["{}".format(v) for v in vals[:template.count("{}")]]


@functools.lru_cache(maxsize=None)
def filled(doc):
    """Per claim of ``doc``: (its text filled from the files, its figures, None), or (None, None, what went wrong)
    where its function fails; computed once per root (the files do not change while the tool runs)."""
    out = []
    for template, fn in CLAIMS[doc]:
        try:
            out.append(fill(template, fn) + (None,))
        except Exception as e:
            out.append((None, None, "%s: %s" % (type(e).__name__, e)))
    return tuple(out)


NUMBER = r"[-+−]?\d+(?:[.,]\d+)*(?:e-?\d+)?"
#: figures that are words: any of its set may stand where the files give another
WORDS = [("PASS", "FAIL"), ("true", "false"), ("True", "False"), ("under", "still over"), ("with", "without")]


def _shape(value):
    """A pattern for any figure of the shape of ``value``: its numbers any number; None where it has none."""
    for words in WORDS:
        if value in words:
            return "(?:%s)" % "|".join(map(re.escape, words))
    if not re.search(r"\d", value):
        return r"\S+" * bool(value) + r" \S+" * value.count(" ") if value.strip() == value else None
    out, last = [], 0
    for m in re.finditer(NUMBER, value):
        out += [re.escape(value[last:m.start()]), NUMBER]
        last = m.end()
    return "".join(out + [re.escape(value[last:])])


def _pattern(template, figs, loose=False):
    """The template as a pattern: its words literal, each ``{}`` a group (``figs``' shapes; any words if loose)."""
    pieces = template.split("{}")
    out = [re.escape(pieces[0])]
    for k, (fig, piece) in enumerate(zip(figs, pieces[1:])):
        shape = None if loose else _shape(fig)
        if shape is None:
            last = k == len(figs) - 1 and piece == ""
            shape = (r"\S+?(?=[\s,;)]|\.(?:\s|$)|$)" if last else r"\S+(?: \S+){0,5}?" if k == 0 and not pieces[0]
                     else ".+?")
        out += ["(%s)" % shape, re.escape(piece)]
    return "".join(out)


def _exact_spans(text, wants):
    """Where each of ``wants`` (claims' filled texts) stands in ``text``."""
    spans = []
    for want in set(wants):
        start = text.find(want)
        while want and start >= 0:
            spans.append((start, start + len(want)))
            start = text.find(want, start + 1)
    return spans


def locate(text, template, figs, others):
    """The matches of the claim's pattern in ``text`` that lie in no other claim's exact text (``others``: spans):
    where the doc says this claim with other figures."""
    for loose in (False, True):
        found = [m for m in re.finditer(_pattern(template, figs, loose), text)
                 if not any(a <= m.start() and m.end() <= b for a, b in others)]
        if found:
            return found
    return []


def uncovered(doc, text, wants, raw=None, index=None):
    """The numbers of ``text`` that lie in no claim's words (``wants``: their filled texts) and in no EXEMPT span."""
    spans = _exact_spans(text, wants)
    for pattern in EXEMPT + EXEMPT_BY_DOC.get(doc, []):
        spans += [(m.start(), m.end()) for m in re.finditer(pattern, text)]
    spans += [(m.start(), m.end()) for m in re.finditer(r"`[^`]*`", text)
              if any(re.search(p, m.group()) for p in EXEMPT_CODE)]
    bad = []
    for m in re.finditer(r"(?<![A-Za-z_\d.])\d+(?:\.\d+)?(?:e-?\d+)?", text):
        if not any(a <= m.start() and m.end() <= b for a, b in spans):
            if raw is False:
                bad.append(m.start())
                continue
            where = "%s:%d" % (doc_label(doc), line_of(raw, index[m.start()])) if raw is not None else doc_label(doc)
            bad.append("%s: no claim covers %r in ...%s..." % (where, m.group(),
                                                               text[max(0, m.start() - 50):m.end() + 20]))
    return bad


def doc_label(doc):
    return "/".join(DOCS[doc])


def claim_problems(doc, raw=None):
    """Per claim of ``doc`` (in CLAIMS' order): None where its filled text is in the doc, else what is wrong, naming
    where the doc says it with other figures."""
    raw = doc_raw(doc) if raw is None else raw
    text, index = normalize(raw, doc)
    exact = None
    out = []
    for i, ((template, fn), (want, figs, error)) in enumerate(zip(CLAIMS[doc], filled(doc))):
        if error:
            out.append("%s: claim %d (%s...) cannot be filled from its files: %s"
                       % (doc_label(doc), i, template[:40], error))
            continue
        if want in text:
            out.append(None)
            continue
        if exact is None:
            exact = _exact_spans(text, [w for w, _, _ in filled(doc) if w and w in text])
        found = locate(text, template, figs, exact)
        if not found:
            out.append("%s: claim %d not found: the doc should say, as its files do:\n  %s" % (doc_label(doc), i, want))
        for m in found:
            out.append("%s:%d: differs from its files: the doc says\n  %s\nthe files give\n  %s"
                       % (doc_label(doc), line_of(raw, index[m.start()]), m.group(), want))
    return out


def check(root=None):
    """Everything wrong with the docs of the tree at ``root`` (default: this checkout): each claim's span that differs
    from its files, each claim not found, each number no claim or exemption covers. [] when the docs are their
    files."""
    if root is not None:
        set_root(root)
    problems = []
    for doc in CLAIMS:
        raw = doc_raw(doc)
        text, index = normalize(raw, doc)
        problems += [p for p in claim_problems(doc, raw) if p]
        problems += uncovered(doc, text, [w for w, _, _ in filled(doc) if w and w in text], raw, index)
    return problems


def _replace(raw, index, m, figs):
    """``raw`` with the figures of the match ``m`` (of the normalized text) made ``figs``, the doc's line breaks kept
    where a figure has as many words as before."""
    for k in reversed(range(len(figs))):
        old, new = m.group(k + 1), figs[k]
        if old == new:
            continue
        a, b = index[m.start(k + 1)], index[m.end(k + 1) - 1] + 1
        seps = re.findall(r"\s+", raw[a:b])
        words = new.split(" ")
        if len(seps) == len(words) - 1:
            new = "".join(w + s for w, s in zip(words, seps + [""]))
        raw = raw[:a] + new + raw[b:]
    return raw


def rewrite(doc, raw):
    """The doc ``raw`` with every claim's figures its files' (where the claim's pattern finds one span of it)."""
    text, index = normalize(raw, doc)
    for (template, fn), (want, figs, error) in zip(CLAIMS[doc], filled(doc)):
        if error or want in text:
            continue  # check() names an error
        found = locate(text, template, figs, _exact_spans(text, [w for w, _, _ in filled(doc) if w and w in text]))
        if len(found) == 1 and found[0].lastindex == len(figs):
            raw = _replace(raw, index, found[0], figs)
            text, index = normalize(raw, doc)
    # A claim said more than once (the same words, e.g. a set-up sentence of several runs): one span stale while
    # another still says it. A span that a claim's pattern matches, with a number no claim covers in it, takes
    # that claim's figures where every claim matching it gives the same.
    bad = uncovered(doc, text, [w for w, _, _ in filled(doc) if w and w in text], raw=False)
    fixes = {}
    for (template, fn), (want, figs, error) in zip(CLAIMS[doc], filled(doc)):
        if error or not bad:
            continue
        for m in re.finditer(_pattern(template, figs), text):
            if m.group() != want and any(m.start() <= b < m.end() for b in bad) and m.lastindex == len(figs):
                fixes.setdefault((m.start(), m.end()), {})[want] = (m, figs)
    done = []
    for (a, b), wants in sorted(fixes.items(), reverse=True):
        if len(wants) == 1 and not any(a < d and c < b for c, d in done):
            [(m, figs)] = wants.values()
            raw = _replace(raw, index, m, figs)
            done.append((a, b))
    return raw


def write(root=None):
    """Fill every claim's figures into the docs of the tree at ``root`` (default: this checkout) from its files.
    Returns (the docs rewritten, what could not be written: check()'s problems after writing)."""
    if root is not None:
        set_root(root)
    changed = []
    for doc in CLAIMS:
        before = doc_raw(doc)
        raw = rewrite(doc, before)
        if raw != before:
            with open(os.path.join(ROOT, *DOCS[doc]), "w", encoding="utf-8") as f:
                f.write(raw)
            read.cache_clear()
            changed.append(doc_label(doc))
            long = [n + 1 for n, line in enumerate(raw.splitlines()) if len(line) > 120]
            if long:
                print("%s: lines over 120 characters now (re-wrap them): %s" % (doc_label(doc), long), file=sys.stderr)
    return changed, check()


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="fill every claim's figures into the docs")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each figure that is not its files'")
    ap.add_argument("--root", help="the tree whose docs and results to use (default: this checkout)")
    args = ap.parse_args(argv)
    if args.write:
        changed, problems = write(args.root)
        for c in changed:
            print("rewrote %s" % c)
    else:
        problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print("%d problem(s)" % len(problems), file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
