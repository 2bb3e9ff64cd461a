"""Command line of the lab: ``python3 experiments/pdtools JOB|COMMAND ...``.

Jobs (JOBS below; experiments/*.sh are their doors): main, equivalence, bench, cell, upstream,
report.  The environment is read here, once, into the Settings every job is handed.

Helper commands (each also a function the jobs call in-process):

  prompt          print one deterministic word-level prompt (for manual checks)
  equiv-run       send the fixed greedy prompts to one endpoint, write ids, logprobs and KV pulled (JSON)
  equiv-summary   compare several runs (ids, logprobs, transfers, negative controls, descriptors), write the summary JSON
  kvstats         aggregate vLLM's "KV Transfer metrics: ..." log lines (optionally from a byte offset)
  kv-run          KV numbers of one run: Prometheus deltas, else the log lines after an offset
  prom            scrape a Prometheus /metrics endpoint into a small JSON of the NIXL counters
  get             print a URL's body (JSON endpoints such as the proxy's /timings); "null" if it fails
  bench-cell      turn `vllm bench serve` result files + KV stats into one results cell
  merge           merge results JSON files (cells of the same key gain repetitions, idempotently)
  block-bytes     bytes of one KV block (all layers, K and V) for a dense model directory (0 otherwise)
  block-bytes-registered  bytes one block id moves, from D's registration report (0 if not derivable)
  model-family    the package's family of a model directory (dense, one-kv-head, sliding-window, mla, ...)
  gpu-slug        turn `nvidia-smi` GPU names into a short file-name tag ("2xH200")
  batch-invariant does the importable (or given) vLLM know VLLM_BATCH_INVARIANT? (yes/no)
  backend         the attention backend named in a vLLM server log
  nc-describe     what a negative-control corruption (experiments/negative_control/) does
"""

import argparse
import importlib.util
import json
import os
import sys
import time

from . import job_bench, job_cell, job_equivalence, job_main, job_upstream, report
from .client import http_text
from .equivalence import REFERENCES
from .gates import GATES, gate
from .kvmetrics import (NotDense, aggregate_kv, attention_backend, kv_summary, load_registration, model_block_bytes,
                        model_family, read_kv_lines, registration_bytes_per_block)
from .prompts import DEFAULT_EQ_LENGTHS, prompt_text
from .results import bench_cell_to_file, gpu_slug, merge_results
from .runs import (corruption_description, kv_probe, load_json, parse_lengths, prom_scrape, run_to_file,
                   summary_to_file)
from .settings import Settings, run_job
from .vllminfo import vllm_has_batch_invariant


def cmd_equiv_run(a):
    run_to_file(a.url, a.model, a.label, parse_lengths(a.lengths), a.max_tokens, a.out, seed=a.seed, logprobs=a.logprobs,
                prom_url=a.prom_url, bytes_per_block=a.bytes_per_block, kv_wait=a.kv_wait)


def cmd_equiv_summary(a):
    runs = {}
    for path in a.runs:
        d = json.load(open(path))
        runs[d["label"]] = d["results"]
    probes = {}
    for spec in a.probe:
        cfg, _, path = spec.partition("=")
        probes[cfg] = load_json(path)
    s = summary_to_file(runs, probes, parse_lengths(a.lengths), json.loads(a.meta) if a.meta else {}, a.out,
                        logprob_tol=a.logprob_tol, corruption=a.corruption, reference=a.reference)
    return 0 if s["pass"] else 1


def cmd_kvstats(a):
    rows = read_kv_lines(a.log, a.offset)
    kv = aggregate_kv(rows)
    kv["source"] = "log"
    if a.bytes_per_block:
        kv = kv_summary(kv, a.bytes_per_block)
    print(json.dumps(kv))



def cmd_kv_run(a):
    print(json.dumps(kv_probe(a.log, a.offset, load_json(a.prom_before), load_json(a.prom_after), a.bytes_per_block,
                              a.backend_log, a.registration, a.prompt_len, a.block_size), sort_keys=True))


def cmd_prom(a):
    print(json.dumps(prom_scrape(a.url)))


def cmd_get(a):
    try:
        print(http_text(a.url, timeout=10.0))
    except Exception as e:  # the caller treats null as "not available"
        print("null")
        print("GET %s failed: %s" % (a.url, e), file=sys.stderr)


def cmd_bench_cell(a):
    kvs = [load_json(p) for p in a.kv]
    bench_cell_to_file(a.out, a.config, a.input_len, a.output_len, a.num_prompts, a.results, kvs, a.proxy, a.commands,
                       a.bytes_per_block, a.vllm_version, a.gpu, a.equivalence, a.run_prefix,
                       json.loads(a.meta) if a.meta else None)


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



#: the lab's jobs: name -> (module, what it is); the operators' scripts are their doors.  Each job's
#: ``main`` takes the door's Settings (and, for cell and upstream, the arguments)
JOBS = {
    "main": (job_main, "the main job: equivalence then benchmark on GPUs, the CPU checks without (main.sh)"),
    "equivalence": (job_equivalence, "P/D greedy-output equivalence with and without the shim (pd_equivalence.sh)"),
    "bench": (job_bench, "P/D TTFT benchmark (pd_bench.sh)"),
    "cell": (job_cell, "one device call: steps, then the results and the console into $OUT (run_gpu_cell.sh)"),
    "upstream": (job_upstream, "vLLM's own NIXL tests on a lent GPU, stock vs flag on (upstream/gpu.sh)"),
    "report": (report, "markdown table and plot of bench results (report.py)"),
}


def run_named_job(name, argv):
    """A job of JOBS with its arguments; its exit code."""
    module = JOBS[name][0]
    if module is report:        # files in, files out: no settings
        return report.main(argv)
    settings = Settings.read()      # the door: the environment, read once, handed on
    args = (settings, argv) if module in (job_cell, job_upstream) else (settings,)
    return run_job(module.main, *args)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in JOBS:
        return run_named_job(argv[0], argv[1:])
    p = argparse.ArgumentParser(prog="pdtools", description="the P/D lab: jobs (%s) and helper commands"
                                % ", ".join(JOBS))
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
    s.add_argument("--logprobs", type=int, default=5, help="top logprobs per position (0: none)")
    s.add_argument("--prom-url", help="D's /metrics: record the KV blocks D pulled for every request")
    s.add_argument("--bytes-per-block", type=int, default=0)
    s.add_argument("--kv-wait", type=float, default=15.0, help="seconds to wait for D's counters to move")
    s.add_argument("--out", required=True)

    s = sub.add_parser("equiv-summary")
    s.add_argument("--out", required=True)
    s.add_argument("--probe", action="append", default=[], metavar="CONFIG=KVRUN.json",
                   help="kv-run output of the single-request probe of a config")
    s.add_argument("--lengths", default=",".join(map(str, DEFAULT_EQ_LENGTHS)))
    s.add_argument("--meta", help="JSON object merged into the summary (batch_invariant is read from it)")
    s.add_argument("--logprob-tol", type=float, default=0.0,
                   help="default kernels: how much more a P/D config's logprobs may differ than stock P/D's")
    s.add_argument("--corruption", help="what the negative-control hook did (recorded)")
    s.add_argument("--reference", choices=REFERENCES, default="local",
                   help="baseline: local prefill (default) or stock P/D (families where vLLM's own P/D "
                        "differs from local prefill)")
    s.add_argument("runs", nargs="+")

    s = sub.add_parser("kvstats")
    s.add_argument("log")
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--bytes-per-block", type=int, default=0)

    s = sub.add_parser("prom")
    s.add_argument("url")

    s = sub.add_parser("get")
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
    s.add_argument("--registration", help="D's registration report (its bytes per block id win)")

    s = sub.add_parser("bench-cell")
    s.add_argument("--out", required=True)
    s.add_argument("--config", required=True)
    s.add_argument("--input-len", type=int, required=True)
    s.add_argument("--output-len", type=int, required=True)
    s.add_argument("--num-prompts", type=int, required=True)
    s.add_argument("--results", nargs="+", required=True)
    s.add_argument("--kv", nargs="*", default=[])
    s.add_argument("--proxy", nargs="*", default=[], help="the proxy's /timings per repetition (JSON files)")
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

    s = sub.add_parser("block-bytes-registered")
    s.add_argument("report")

    s = sub.add_parser("model-family")
    s.add_argument("model")

    s = sub.add_parser("gpu-slug")
    s.add_argument("names", nargs="*")

    s = sub.add_parser("batch-invariant", help="prints yes/no: does this vLLM know VLLM_BATCH_INVARIANT?")
    s.add_argument("--vllm-dir", help="the vllm package folder (default: the importable one)")

    s = sub.add_parser("nc-describe", help="prints what a negative-control corruption does")
    s.add_argument("how", choices=("shift", "swap-layers"))

    s = sub.add_parser("backend", help="prints the attention backend a vLLM server log names (or nothing)")
    s.add_argument("log")

    s = sub.add_parser("gate", help="exit 0 when vLLM VERSION has NAME (gates.py: the shim's release table), "
                                    "else print why not and exit 1")
    s.add_argument("name", choices=sorted(GATES))
    s.add_argument("version")

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
    elif a.cmd == "get":
        cmd_get(a)
    elif a.cmd == "kv-run":
        cmd_kv_run(a)
    elif a.cmd == "bench-cell":
        cmd_bench_cell(a)
    elif a.cmd == "merge":
        cmd_merge(a)
    elif a.cmd == "block-bytes":
        try:
            print(model_block_bytes(a.model, a.block_size, a.tp))
        except NotDense as e:
            print(0)
            print("block-bytes: %s" % e, file=sys.stderr)
    elif a.cmd == "block-bytes-registered":
        bpb, note = registration_bytes_per_block(load_registration(a.report))
        print(bpb or 0)
        if note:
            print("block-bytes-registered: %s" % note, file=sys.stderr)
    elif a.cmd == "model-family":
        print(model_family(a.model))
    elif a.cmd == "gpu-slug":
        names = a.names or [l for l in sys.stdin.read().splitlines()]
        print(gpu_slug(names))
    elif a.cmd == "batch-invariant":
        return cmd_batch_invariant(a)
    elif a.cmd == "nc-describe":
        print(corruption_description(a.how))
    elif a.cmd == "backend":
        print(attention_backend(a.log) or "")
    elif a.cmd == "gate":
        ok, why = gate(a.name, a.version)
        if not ok:
            print(why)
            return 1
    return 0
