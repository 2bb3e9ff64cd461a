"""The TTFT benchmark job (experiments/pd_bench.sh): 1P1D with `vllm bench serve` through the
proxy, stock vs the shim vs vLLM's own opt-in, cells CONFIGS x INPUT_LENS with REPS repetitions.

Settings, the cells it writes and exit codes: experiments/README.md, "pd_bench.sh".  Per
repetition: its own --seed (no prefix-cache hits; the same seeds for every config), D's NIXL
counters before and after (descriptors per transfer and per block), the proxy's /timings (where
P/D time goes) and, with HANDOFF_TRACE=1, the per-request handoff split (pdtools/handoff.py).  ``prefill_only`` is P alone with max_tokens=1: the physical limit of P/D TTFT.
"""

import json
import os
import shlex
import socket
import sys
import time

from . import configs, dynamo, handoff, report
from .client import http_text
from .cpuchecks import require_gpus_or_cpu_checks
from .gates import gate
from .kvmetrics import attention_backend
from .pair import BenchClient, Pair, log_offset
from .results import bench_cell_to_file
from .runs import kv_probe, parse_lengths, prom_scrape
from .settings import EXIT_FAIL, EXIT_SETUP, EXIT_UNSUPPORTED, EXP_DIR, die, log, require_vllm


def num_prompts_for(settings, length, concurrency=None):
    """NUM_PROMPTS, else 128 prompts up to 2048 tokens and 64 above; at most ``concurrency`` requests at a
    time, 4 per slot and at least 10 (10 at 1, 32 at 8, 64 at 64 for 10240 tokens)."""
    if settings.get("NUM_PROMPTS"):
        return settings.get_int("NUM_PROMPTS")
    n = 128 if length <= 2048 else 64
    return min(n, max(10, 4 * concurrency)) if concurrency else n


def concurrencies(settings):
    """CONCURRENCY: client concurrency levels, each its own cell on the same servers ("1 8 64"; empty:
    one pass without a limit, or whatever BENCH_EXTRA_ARGS says)."""
    out = []
    for word in settings.get("CONCURRENCY", "").split():
        if not word.isdigit() or int(word) < 1:
            die(EXIT_SETUP, "CONCURRENCY must be positive integers (got '%s')" % settings.get("CONCURRENCY"))
        out.append(int(word))
    if out and "--max-concurrency" in settings.get("BENCH_EXTRA_ARGS", ""):
        die(EXIT_SETUP, "set the client concurrency in CONCURRENCY or in BENCH_EXTRA_ARGS, not both")
    return out or [None]


def default_configs(version):
    names = ["stock", "shim", "native"]
    if gate("runner-v1", version)[0]:
        names.append("native-v1")
    return names


def _proxy_timings(pair, keep=None):
    """The proxy's split of the time since the last reset (and reset it); None if unreadable."""
    try:
        text = http_text(pair.url("proxy", "/timings?reset=1"), timeout=10.0)
    except Exception as e:
        print("GET timings failed: %s" % e, file=sys.stderr)
        return None
    if keep:
        with open(keep, "w") as f:
            f.write(text)
    return text


def _frontend_page(pair):
    """Dynamo's frontend timing histograms now (pdtools/dynamo.py), or None when its /metrics cannot be read."""
    try:
        return dynamo.frontend_seconds(http_text(pair.url("proxy", "/metrics"), timeout=10.0))
    except Exception as e:
        print("GET frontend metrics failed: %s" % e, file=sys.stderr)
        return None


def _handoff(pair, proxy_file, window):
    """HANDOFF_TRACE=1: the rep's per-request handoff split (pdtools/handoff.py) added to its proxy file."""
    if not pair.trace_dir or not os.path.exists(proxy_file):
        return
    events, records = handoff.load(pair.trace_dir, pair.proxy_trace())
    rows = handoff.split(events, records, window=window)
    summ = handoff.summary(rows)
    summ["problems"] = handoff.check(rows)
    with open(proxy_file) as f:
        data = json.load(f)
    data["handoff"] = summ
    with open(proxy_file, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    with open(proxy_file[:-len(".proxy.json")] + ".handoff.json", "w") as f:
        json.dump({"summary": summ, "rows": rows}, f, indent=1, sort_keys=True)
    log("handoff split: %d requests, %d complete; p50 ms: %s%s" % (
        summ["requests"], summ["complete"],
        ", ".join("%s %.1f" % (k, v["p50"]) for k, v in summ["parts_ms"].items()),
        "; PROBLEMS: %s" % "; ".join(summ["problems"][:3]) if summ["problems"] else ""))


def main(settings, eq_json=None, result_dir=None):
    """The job with the door's ``settings``; ``eq_json``: the equivalence summary of this machine
    and release (default EQ_JSON, else WORK/equivalence.json), ``result_dir``: where the results
    file goes (default RESULT_DIR, else experiments/results; RESULT_JSON names the file).  Its
    exit code."""
    s = settings
    state = s.get("BENCH_STATE", "fresh")
    if state not in ("fresh", "fragmented"):
        die(EXIT_SETUP, "BENCH_STATE must be fresh or fragmented")
    input_lens = parse_lengths(s.get("INPUT_LENS", "1024 10240"))
    output_len, reps = s.get_int("OUTPUT_LEN", "16"), s.get_int("REPS", "3")
    warmup = s.get_int("WARMUP_PROMPTS", "4")
    timeout = s.get_int("BENCH_TIMEOUT", "900")
    extra = shlex.split(s.get("BENCH_EXTRA_ARGS", ""))
    work = s.get("WORK")
    eq_json = eq_json or s.get("EQ_JSON") or os.path.join(work, "equivalence.json")
    frag_prompts = s.get_int("FRAG_PROMPTS", "400")
    levels = concurrencies(s)

    pair = Pair(s)
    failed, skipped = 0, []
    with pair:
        require_gpus_or_cpu_checks(pair)
        pair.version = version = require_vllm(pair.child_env())
        pair.ensure_model()
        bench = BenchClient(s.get("PY"), work, pair.child_env(), s.get("BENCH_CLIENT", "resident"))
        if bench.mode not in ("resident", "cli"):
            die(EXIT_SETUP, "BENCH_CLIENT must be resident or cli (got '%s')" % bench.mode)
        names = s.get("CONFIGS", "").split() or default_configs(version)
        ok, why = pair.bench_gpus_ok()
        if not ok:
            for cfg in names:
                if not configs.is_alone(cfg):
                    die(EXIT_SETUP, "config %s %s. Run on a machine with %d GPUs (e.g. nvidia-h200-x2), use "
                        "CONFIGS=prefill_only, or set BENCH_ALLOW_SHARED_GPU=1 to time it anyway."
                        % (cfg, why, pair.tp_p + pair.tp_d))
        result_json = s.get("RESULT_JSON") or os.path.join(
            result_dir or s.get("RESULT_DIR") or os.path.join(EXP_DIR, "results"),
            "%s-%s-%s.json" % (time.strftime("%Y-%m-%d"), version, pair.gpu_slug))
        os.makedirs(os.path.dirname(os.path.abspath(result_json)), exist_ok=True)
        os.makedirs(os.path.join(work, "bench"), exist_ok=True)
        if os.path.exists(pair.commands_file):
            os.remove(pair.commands_file)
        log("configs: %s; input lengths: %s; reps: %d; results: %s" % (
            " ".join(names), " ".join(map(str, input_lens)), reps, result_json))
        for cfg in names:
            ok, why = configs.supported(cfg, version, s, pair.child_env())
            if not ok:
                print(why, file=sys.stderr)
                if cfg == "shim":
                    die(EXIT_UNSUPPORTED, "vLLM %s is not supported by the shim (see above)" % version)
                skipped.append(cfg)
                log("skipping %s" % cfg)
                continue
            log("=== %s (%s) ===" % (cfg, state))
            open(pair.commands_file, "w").close()
            alone = configs.is_alone(cfg)
            if alone:
                pair.start_prefill_alone(cfg, "bench-" + cfg)
                url, out_len = pair.url("P", ""), 1
            else:
                pair.start_pair(cfg, "bench-" + cfg)
                pair.use_registration()
                url, out_len = pair.url("proxy", ""), output_len

            def bench_run(length, n, seed, res, logf, conc=None):
                cmd = ["--backend", "vllm", "--model", pair.model, "--tokenizer", pair.model, "--base-url", url,
                       "--endpoint",
                       "/v1/completions", "--dataset-name", "random", "--random-input-len", str(length),
                       "--random-output-len", str(out_len), "--num-prompts", str(n), "--seed", str(seed),
                       "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
                       "50,90,99"]
                if res:
                    cmd += ["--save-result", "--result-dir", os.path.dirname(res), "--result-filename",
                            os.path.basename(res)]
                cmd += extra
                if conc:
                    cmd += ["--max-concurrency", str(conc)]
                pair._note("bench: vllm bench serve " + " ".join(cmd))
                return bench.run(cmd, logf, timeout)

            for length in input_lens:
                if warmup > 0:
                    log("%s L=%d: warm-up (%d prompts)" % (cfg, length, warmup))
                    if not bench_run(length, warmup, 99, "", os.path.join(work, "bench-%s-%d-warmup.log"
                                                                          % (cfg, length))):
                        die(EXIT_FAIL, "warm-up failed (%s, L=%d)" % (cfg, length))
                    if pair.d_log:
                        pair.wait_kv_lines(pair.d_log, 0, limit=20)
                if state == "fragmented":
                    log("%s L=%d: fragmenting the free block queue: %d prompts of mixed lengths around %s"
                        % (cfg, length, frag_prompts, s.get("FRAG_LEN", "2048")))
                    if not pair.fragmenting_load(url, frag_prompts, 1 if alone else s.get("FRAG_OUTPUT_LEN", "16"),
                                                 os.path.join(work, "bench-%s-%d-fragment.log" % (cfg, length)),
                                                 timeout=timeout):
                        die(EXIT_FAIL, "fragmenting load failed (%s, L=%d)" % (cfg, length))
                for li, conc in enumerate(levels):
                    n = num_prompts_for(s, length, conc)
                    results, kvs, proxies = [], [], []
                    for rep in range(1, reps + 1):
                        # vLLM's random dataset makes a shorter prompt of a seed the prefix of a longer one: a seed
                        # per length, level and rep, so no measured prompt hits a prefix cached before it
                        seed = 1000 + 10000 * input_lens.index(length) + 100 * li + rep
                        tag = "%s-%d-%d%s-r%d-%s" % (cfg, length, n, "-c%d" % conc if conc else "", rep,
                                                 time.strftime("%H%M%S"))
                        res = os.path.join(work, "bench", tag + ".json")
                        logf = os.path.join(work, "bench-%s.log" % tag)
                        log("%s L=%d%s rep %d/%d: %d prompts, seed %d"
                            % (cfg, length, " c=%d" % conc if conc else "", rep, reps, n, seed))
                        if alone:           # prefill_only: no transfers to count
                            if not bench_run(length, n, seed, res, logf, conc):
                                log("ERROR: bench run %s failed" % tag)
                                failed = 1
                                continue
                            results.append(res)
                            kvs.append(None)
                            proxies.append(None)
                            continue
                        off = log_offset(pair.d_log)
                        before = prom_scrape(pair.url("D", "/metrics"))
                        through_dynamo = pair.router == "dynamo"
                        front0 = _frontend_page(pair) if through_dynamo else _proxy_timings(pair)  # this rep only
                        window = [time.time(), None]
                        if not bench_run(length, n, seed, res, logf, conc):
                            log("ERROR: bench run %s failed" % tag)
                            failed = 1
                            continue
                        with open(logf, errors="replace") as f:
                            for line in f:
                                if any(k in line for k in ("Mean TTFT", "Median TTFT", "P99 TTFT", "Mean ITL",
                                                           "Total token throughput", "Failed requests")):
                                    sys.stderr.write("    " + line)
                        proxy_file = os.path.join(work, "bench", tag + ".proxy.json")
                        if through_dynamo:      # no proxy: the frontend's own histograms over this rep instead
                            with open(proxy_file, "w") as f:
                                json.dump({"frontend": dynamo.frontend_delta(front0, _frontend_page(pair))}, f,
                                          indent=1, sort_keys=True)
                        else:
                            _proxy_timings(pair, keep=proxy_file)
                            window[1] = time.time()
                            _handoff(pair, proxy_file, window)
                        pair.wait_kv_lines(pair.d_log, off)
                        after = prom_scrape(pair.url("D", "/metrics"))
                        kv = kv_probe(pair.d_log, off, before, after, pair.bytes_per_block, pair.d_log,
                                      pair.d_reg_report)
                        results.append(res)
                        kvs.append(kv)
                        proxies.append(proxy_file)
                    if not results:
                        continue
                    meta = {"block_size": s.get_int("BLOCK_SIZE"), "tp_p": pair.tp_p, "tp_d": pair.tp_d,
                            "model": pair.model, "attn_backend": attention_backend(pair.d_log or pair.p_log) or "",
                            "state": state, "shared_gpu": pair.shared_gpu,
                            "ucx_cuda_ipc_get_zcopy": pair.child_env().get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", ""),
                            "max_concurrency": conc}
                    bench_cell_to_file(result_json, cfg, length, out_len, n, results, kvs, proxies, pair.commands_file,
                                       pair.bytes_per_block, version, pair.gpu_slug, eq_json,
                                       "%s-%d" % (socket.gethostname(), int(time.time())), meta)
            pair.stop_all()
        bench.close()
    if skipped:
        log("skipped (not in this release): %s" % " ".join(skipped))
    log("results: %s" % result_json)
    try:
        report.main([result_json, "--no-plot"])
    except Exception as e:          # the report is a convenience; the results file is the record
        log("report.py: %s" % e)
    return failed
