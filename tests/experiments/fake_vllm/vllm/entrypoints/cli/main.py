"""A fake ``vllm`` CLI (``serve`` and ``bench serve``) for CPU tests of the experiment scripts.

It speaks just enough of vLLM's HTTP API and log format for pd_equivalence.sh and
pd_bench.sh to run end to end without a GPU:

* ``serve``: /health, /v1/models, /v1/completions (greedy "generation" = a fixed function
  of the prompt ids; P/D via kv_transfer_params like NixlConnector; streaming), /metrics
  with the NIXL histograms' _sum/_count, and the periodic "KV Transfer metrics: ..." log
  line in vLLM's own format (``", ".join(f"{k}={v}")`` of NixlKVConnectorStats.reduce()).
  Descriptors per KV block: 56 (stock; FAKE_STOCK_DESC overrides), 1 with ENABLE_XLKV=true (FAKE_SHIM_DESC overrides)
  or with kv_connector_extra_config.enable_cross_layers_blocks.
  FAKE_PD_CORRUPT=1 makes the decode side of P/D requests generate other tokens.
  Logprobs (``logprobs: k``, ``return_tokens_as_token_ids``) in the completions API's format: a
  fixed function of the token; FAKE_PD_LOGPROB_NOISE adds to every logprob of a P/D answer
  (vLLM's default kernels), FAKE_SHIM_LOGPROB_NOISE more with ENABLE_XLKV.  A decode server
  started with experiments/negative_control/ on its PYTHONPATH and XLKV_NEGATIVE_CONTROL set
  (the hook's sitecustomize loaded) shifts the logprobs of P/D answers by 1e-3, ids unchanged.
  FAKE_NO_TRANSFER=1: the decode side serves P/D requests without pulling KV (as from a
  prefix cache): the NIXL counters do not move.
  Model shapes: FAKE_BLOCK_BYTES (bytes one block id moves; default the Qwen3-0.6B dense block),
  FAKE_KV_GROUPS=G (G > 1: a sliding-window hybrid: one full group, G-1 sliding groups that send
  only their last FAKE_WINDOW_BLOCKS=17 blocks), FAKE_MLA=1 (an MLA backend, FAKE_BACKEND names
  it).  At start-up the server "registers" its KV caches through the fake worker
  (vllm/distributed/.../v1/nixl_connector.py), so the registration report hook sees them.
* ``bench serve``: concurrent streamed requests through --base-url, writes a result JSON
  with the keys `vllm bench serve` writes (mean_ttft_ms, ...).
"""

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

BLOCK_BYTES = 16 * 28 * 2 * 8 * 128 * 2


def _ids(prompt):
    if isinstance(prompt, list):
        return [int(x) for x in prompt]
    return [int(w[1:]) if w.startswith("w") and w[1:].isdigit() else 0 for w in prompt.split()]


def _gen(ids, n, corrupt=False):
    s = sum(ids) * 31 + len(ids) + (17 if corrupt else 0)
    return [2 + (s + 7919 * k) % 31998 for k in range(n)]


def _logprobs(toks, k, as_ids, shift):
    """The completions API's ``logprobs`` object for ``toks``: the chosen token is the best."""
    def key(t):
        return "token_id:%d" % t if as_ids else "w%d" % t
    chosen = [-((t % 97) / 100.0) - 0.01 + shift for t in toks]
    top = []
    for t, lp in zip(toks, chosen):
        d = {key(t): lp}
        for j in range(1, k):
            d[key(2 + (t + 101 * j) % 31998)] = lp - 0.5 * j
        top.append(d)
    return {"tokens": [key(t) for t in toks], "token_logprobs": chosen, "top_logprobs": top,
            "text_offset": list(range(len(toks)))}


def _negative_control_loaded():
    sc = sys.modules.get("sitecustomize")
    return bool(os.environ.get("XLKV_NEGATIVE_CONTROL")) and bool(getattr(sc, "XLKV_NEGATIVE_CONTROL_HOOK", False))


def serve(argv):
    from aiohttp import web

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-transfer-config", default="{}")
    a, _ = ap.parse_known_args(argv)
    kvcfg = json.loads(a.kv_transfer_config)
    native = str(kvcfg.get("kv_connector_extra_config", {}).get("enable_cross_layers_blocks", "")).lower() == "true"
    shim = os.environ.get("ENABLE_XLKV", "").lower() == "true"
    per_block = int(os.environ.get("FAKE_STOCK_DESC", "56"))
    if native and os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0") != "1":
        per_block = 1
    if shim:
        per_block = int(os.environ.get("FAKE_SHIM_DESC", "1"))
    block_bytes = int(os.environ.get("FAKE_BLOCK_BYTES", BLOCK_BYTES))
    groups = int(os.environ.get("FAKE_KV_GROUPS", "1"))
    window_blocks = int(os.environ.get("FAKE_WINDOW_BLOCKS", "17"))
    mla = os.environ.get("FAKE_MLA") == "1"
    backend = os.environ.get("FAKE_BACKEND", "FLASH_ATTN_MLA" if mla else "FLASH_ATTN")
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector import NixlConnectorWorker

    NixlConnectorWorker(per_block, block_bytes, groups, window_blocks * a.block_size, mla,
                        "BLNHC" if per_block == 1 else "NHD", backend).register_kv_caches({})
    interval = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10"))
    print("INFO fake vllm serve: VLLM_BATCH_INVARIANT=%s" % os.environ.get("VLLM_BATCH_INVARIANT", "<unset>"), flush=True)
    print("INFO [cuda.py:373] Using %s attention backend out of potential backends: ['%s']." % (backend, backend),
          flush=True)
    if _negative_control_loaded():
        print("INFO fake vllm serve: negative-control hook loaded", flush=True)
    if shim:
        print("INFO [registry.py:329] xlkv_autopatch: fake-nixl is active in this process (first call, pid=%d)"
              % os.getpid(), flush=True)
    pending = {"transfer_duration": [], "bytes_transferred": [], "num_descriptors": []}
    prom = {"desc_sum": 0.0, "count": 0, "bytes_sum": 0.0, "time_sum": 0.0}

    async def logger_task(app):
        async def loop():
            while True:
                await asyncio.sleep(interval)
                if not pending["num_descriptors"]:
                    continue
                n = len(pending["num_descriptors"])
                xt = pending["transfer_duration"]
                mb = [b / 2**20 for b in pending["bytes_transferred"]]
                stats = {
                    "Num successful transfers": n,
                    "Avg xfer time (ms)": round(statistics.mean(xt) * 1e3, 3),
                    "P90 xfer time (ms)": round(sorted(xt)[int(0.9 * (n - 1))] * 1e3, 3),
                    "Avg post time (ms)": 0.05,
                    "P90 post time (ms)": 0.07,
                    "Avg MB per transfer": round(sum(mb) / n, 3),
                    "Throughput (MB/s)": round(sum(mb) / sum(xt), 3),
                    "Avg number of descriptors": round(statistics.mean(pending["num_descriptors"]), 1),
                }
                for v in pending.values():
                    v.clear()
                print("(APIServer pid=%d) INFO %s [metrics.py:103] KV Transfer metrics: %s" % (
                    os.getpid(), time.strftime("%m-%d %H:%M:%S"), ", ".join(f"{k}={v}" for k, v in stats.items())),
                    flush=True)
        app["logger"] = asyncio.ensure_future(loop())

    async def health(request):
        return web.Response(text="")

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": a.model, "object": "model"}]})

    async def metrics(request):
        lab = '{engine="0",model_name="%s"}' % a.model
        text = "\n".join([
            "# HELP vllm:nixl_num_descriptors Histogram of number of descriptors",
            "# TYPE vllm:nixl_num_descriptors histogram",
            "vllm:nixl_num_descriptors_sum%s %s" % (lab, prom["desc_sum"]),
            "vllm:nixl_num_descriptors_count%s %s" % (lab, float(prom["count"])),
            "vllm:nixl_bytes_transferred_sum%s %s" % (lab, prom["bytes_sum"]),
            "vllm:nixl_bytes_transferred_count%s %s" % (lab, float(prom["count"])),
            "vllm:nixl_xfer_time_seconds_sum%s %s" % (lab, prom["time_sum"]),
            "vllm:nixl_num_failed_transfers_total%s 0.0" % lab, ""])
        return web.Response(text=text)

    async def completions(request):
        body = await request.json()
        ids = _ids(body["prompt"])
        n = int(body.get("max_tokens", 16))
        kvp = body.get("kv_transfer_params") or {}
        out_kv = None
        corrupt = False
        if kvp.get("do_remote_decode"):
            nb = -(-len(ids) // a.block_size)
            out_kv = {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_block_ids": list(range(nb)), "remote_engine_id": "fake-%d" % a.port,
                      "remote_host": "localhost", "remote_port": int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", 0)),
                      "remote_request_id": "req-%d" % time.time_ns(), "tp_size": 1}
        elif kvp.get("do_remote_prefill") and os.environ.get("FAKE_NO_TRANSFER") == "1":
            corrupt = False  # served as if from a prefix cache: nothing pulled
        elif kvp.get("do_remote_prefill"):
            nb = len(kvp["remote_block_ids"])
            # block ids pulled: every block of the full group, the window's tail of each sliding one
            nb = nb + (groups - 1) * min(nb, window_blocks)
            pending["transfer_duration"].append(0.002)
            pending["bytes_transferred"].append(nb * block_bytes)
            pending["num_descriptors"].append(nb * per_block)
            prom["desc_sum"] += nb * per_block
            prom["count"] += 1
            prom["bytes_sum"] += nb * block_bytes
            prom["time_sum"] += 0.002
            corrupt = os.environ.get("FAKE_PD_CORRUPT") == "1"
        toks = _gen(ids, n, corrupt)
        shift = 0.0
        if kvp.get("do_remote_prefill"):
            shift += float(os.environ.get("FAKE_PD_LOGPROB_NOISE", "0"))
            if shim:
                shift += float(os.environ.get("FAKE_SHIM_LOGPROB_NOISE", "0"))
            if _negative_control_loaded():
                shift += 1e-3
        await asyncio.sleep(0.001 * len(ids) / 100)
        if not body.get("stream"):
            choice = {"index": 0, "text": " ".join("w%d" % t for t in toks), "finish_reason": "length"}
            if body.get("return_token_ids"):
                choice.update(token_ids=toks, prompt_token_ids=ids)
            if body.get("logprobs"):
                choice["logprobs"] = _logprobs(toks, int(body["logprobs"]), body.get("return_tokens_as_token_ids"),
                                               shift)
            return web.json_response({"id": "cmpl", "object": "text_completion", "choices": [choice],
                                      "usage": {"prompt_tokens": len(ids), "completion_tokens": n},
                                      "kv_transfer_params": out_kv})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for t in toks:
            await asyncio.sleep(0.001)
            chunk = {"choices": [{"index": 0, "text": " w%d" % t}]}
            await resp.write(("data: %s\n\n" % json.dumps(chunk)).encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.on_startup.append(logger_task)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    time.sleep(float(os.environ.get("FAKE_START_DELAY", "0.3")))
    print("INFO Starting vLLM API server on http://%s:%d" % (a.host, a.port), flush=True)
    web.run_app(app, host=a.host, port=a.port, print=None)


def add_bench_args(ap):
    """The `bench serve` options the lab passes (vllm.benchmarks.serve.add_cli_args in the real vLLM)."""
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--base-url")
    ap.add_argument("--endpoint", default="/v1/completions")
    ap.add_argument("--model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--dataset-name", default="random")
    ap.add_argument("--random-input-len", type=int)
    ap.add_argument("--random-output-len", type=int)
    ap.add_argument("--num-prompts", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--percentile-metrics")
    ap.add_argument("--metric-percentiles")
    ap.add_argument("--max-concurrency", type=int)
    ap.add_argument("--save-result", action="store_true")
    ap.add_argument("--result-dir", default=".")
    ap.add_argument("--result-filename")


def bench_serve(argv):
    ap = argparse.ArgumentParser()
    add_bench_args(ap)
    a, _ = ap.parse_known_args(argv)
    return bench_main(a)


def bench_main(a):
    import aiohttp

    rng = random.Random(a.seed)
    slots = asyncio.Semaphore(a.max_concurrency or a.num_prompts)

    async def one(session, i):
        prompt = " ".join("w%d" % rng.randrange(2, 32000) for _ in range(a.random_input_len))
        body = {"model": a.model, "prompt": prompt, "max_tokens": a.random_output_len, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        async with slots:
            t0 = time.perf_counter()
            ttft, last, itl = None, None, []
            async with session.post(a.base_url + a.endpoint, json=body) as r:
                if r.status != 200:
                    return None
                async for line in r.content:
                    if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                        continue
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        itl.append(now - last)
                    last = now
        return ttft, itl

    async def run():
        async with aiohttp.ClientSession() as s:
            t0 = time.perf_counter()
            res = await asyncio.gather(*[one(s, i) for i in range(a.num_prompts)])
            return res, time.perf_counter() - t0

    res, dur = asyncio.run(run())
    ok = [r for r in res if r is not None]
    ttfts = sorted(r[0] * 1e3 for r in ok)
    itls = [x * 1e3 for r in ok for x in r[1]]
    out = {"date": time.strftime("%Y%m%d-%H%M%S"), "completed": len(ok), "failed": len(res) - len(ok),
           "mean_ttft_ms": statistics.mean(ttfts), "median_ttft_ms": statistics.median(ttfts),
           "p99_ttft_ms": ttfts[int(0.99 * (len(ttfts) - 1))], "mean_itl_ms": statistics.mean(itls) if itls else 0,
           "total_token_throughput": len(ok) * (a.random_input_len + a.random_output_len) / dur,
           "client_pid": os.getpid()}
    print("Successful requests: %d" % len(ok))
    print("Mean TTFT (ms): %.2f" % out["mean_ttft_ms"])
    print("Mean ITL (ms): %.2f" % out["mean_itl_ms"])
    if a.save_result:
        os.makedirs(a.result_dir, exist_ok=True)
        with open(os.path.join(a.result_dir, a.result_filename), "w") as f:
            json.dump(out, f)
    return 0 if ok else 1


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    if argv[:2] == ["bench", "serve"]:
        return bench_serve(argv[2:])
    print("fake vllm: unsupported command %s" % argv, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
