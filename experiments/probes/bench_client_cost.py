"""Seconds per `vllm bench serve` repetition: the resident bench client against a new CLI process per run.

    python experiments/probes/bench_client_cost.py --vllm-python /work/envs/torch-2.14.0/bin/python \
        [--reps 3] [--out experiments/results/<date>-bench-client-cost-cpu.json]

Runs the lab's BenchClient (experiments/pdtools/pair.py) in both modes against the fake vLLM server
of tests/experiments (one machine, no GPU), with the real vLLM benchmark module of ``--vllm-python``
and the lab's word-level tokenizer (make_model.py --tokenizer-only).  The modes alternate run by
run; the JSON keeps every run's wall time, its result file's keys and the command.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools.pair import BenchClient  # noqa: E402

FAKE = os.path.join(ROOT, "tests", "experiments", "fake_vllm")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-client-cost-")
    model = os.path.join(work, "model")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([a.vllm_python, os.path.join(ROOT, "experiments", "make_model.py"), "--tokenizer-only",
                    "--config-only", model], env=env, check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--port", str(port)],
                              env=dict(env, PYTHONPATH=FAKE), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        clients = {mode: BenchClient(a.vllm_python, work, env, mode) for mode in ("resident", "cli")}
        runs = []
        for rep in range(a.reps):
            for mode, client in clients.items():
                res = "%s-%d.json" % (mode, rep)
                argv = ["--backend", "vllm", "--model", model, "--tokenizer", model, "--base-url",
                        "http://127.0.0.1:%d" % port, "--endpoint", "/v1/completions", "--dataset-name", "random",
                        "--random-input-len", "64", "--random-output-len", "4", "--num-prompts", "5",
                        "--seed", str(rep), "--ignore-eos", "--save-result", "--result-dir", work,
                        "--result-filename", res, "--max-concurrency", "2"]
                t0 = time.time()
                ok = client.run(argv, os.path.join(work, "%s-%d.log" % (mode, rep)), 600)
                wall = time.time() - t0
                keys = sorted(json.load(open(os.path.join(work, res)))) if ok else []
                runs.append({"mode": mode, "rep": rep, "ok": ok, "seconds": round(wall, 2), "result_keys": len(keys)})
                print("%-8s rep %d: %s %.1f s (%d result keys)" % (mode, rep, ok, wall, len(keys)), flush=True)
        for client in clients.values():
            client.close()
    finally:
        server.terminate()
        server.wait()
    out = {"about": __doc__.strip().splitlines()[0], "command": " ".join([sys.executable] + sys.argv),
           "vllm_python": a.vllm_python, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "cpus": os.cpu_count(), "runs": runs}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
