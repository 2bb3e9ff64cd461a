"""The fake Dynamo vLLM worker: registers itself in the discovery folder, then serves as the fake `vllm serve` on
its system port (DYN_SYSTEM_PORT): /health, /metrics, and the /v1/completions the fake frontend forwards to."""
import argparse
import json
import os
import sys

from vllm.entrypoints.cli.main import serve

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--served-model-name")
ap.add_argument("--disaggregation-mode", choices=("prefill", "decode"), required=True)
a, engine = ap.parse_known_args()
if "--host" in engine or "--port" in engine:
    sys.exit("fake dynamo.vllm: a Dynamo worker takes no --host/--port (got %s)" % engine)
port = os.environ["DYN_SYSTEM_PORT"]
with open(os.path.join(os.environ["DYN_FILE_KV"], "%s-%s.json" % (a.disaggregation_mode, port)), "w") as f:
    json.dump({"role": a.disaggregation_mode, "url": "http://127.0.0.1:%s" % port,
               "model": a.served_model_name or a.model}, f)
print("INFO fake dynamo.vllm: %s worker on system port %s" % (a.disaggregation_mode, port), flush=True)
sys.exit(serve([a.served_model_name or a.model, "--host", "127.0.0.1", "--port", port] + engine))
