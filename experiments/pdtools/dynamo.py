"""NVIDIA Dynamo as the lab's P/D router: the ``dynamo-<config>`` configs (configs.py) serve P and D as Dynamo's
vLLM workers (``python -m dynamo.vllm --disaggregation-mode prefill|decode``) behind Dynamo's frontend
(``python -m dynamo.frontend``) in place of `vllm serve` and pd_proxy.py.  Read from ai-dynamo 1.6.1 and run on
CPU first (experiments/probes/dynamo_pd_cpu.py, results/2026-11-29-dynamo-cpu.json):

- discovery: Dynamo's ``file`` backend (a folder of keys, each kept alive by its owner; no etcd to carry), one
  folder per pair under /dev/shm; or, with DYNAMO_ETCD=<etcd binary> (Debian's etcd-server, a static Go binary
  that can be carried), its default ``etcd`` backend on a private etcd per pair (on the loaded 2-core machine
  here a file key once expired mid-request; etcd's lease is ETCD_LEASE_TTL=60 s); request plane TCP, event
  plane zmq, every plane bound to 127.0.0.1;
- each worker's system server on the port the lab gives that server (DYN_SYSTEM_PORT = PORT_P / PORT_D): its
  ``/health`` answers 503 until the worker's endpoints serve, then 200, and its ``/metrics`` carries vLLM's own
  counters (``vllm:nixl_*`` on decode) with Dynamo's labels added, so the lab's readiness wait and its NIXL
  counters work unchanged;
- the frontend on PORT_PROXY; it serves a model only when its tokenizer_config.json has a ``chat_template``
  (``add_chat_template``), and takes only OpenAI's completions fields (``return_token_ids`` is refused with 400:
  equivalence.greedy_request with a ``vocab`` reads the ids back from the logprobs' token strings);
- Dynamo's TCP request timeout (15 s by default) is raised: a 64 x 10240 burst queues longer than that.
"""

import json
import os
import re
import shutil
import tempfile

#: config-name prefix of the configs served through Dynamo
PREFIX = "dynamo-"
#: the frontend logs this once it has found a prefill worker (its router then disaggregates)
PREFILL_FOUND = re.compile(r"Prefill worker detected", re.I)
#: added to a model's tokenizer_config.json when it has none (completions never use it)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def discovery_dir():
    """A fresh folder for Dynamo's file discovery (tmpfs where there is one: keys expire 10 s after their last
    touch, and a loaded disk once let a worker's keys expire)."""
    return tempfile.mkdtemp(prefix="xlkv-dynamo-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def remove_discovery(path):
    if path:
        shutil.rmtree(path, ignore_errors=True)


def etcd_command(etcd, discovery, port):
    """A private etcd for one pair: its data in the pair's discovery folder, client port ``port`` (peer port + 1)."""
    return [etcd, "--data-dir", os.path.join(discovery, "etcd"), "--listen-client-urls", "http://127.0.0.1:%d" % port,
            "--advertise-client-urls", "http://127.0.0.1:%d" % port, "--listen-peer-urls",
            "http://127.0.0.1:%d" % (port + 1)]


def common_env(discovery, request_timeout=600, etcd_port=None):
    """The variables every Dynamo process of one pair gets (frontend and both workers): file discovery in
    ``discovery``, or etcd on ``etcd_port``."""
    backend = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": discovery} if etcd_port is None else {
        "DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": "http://127.0.0.1:%d" % etcd_port, "ETCD_LEASE_TTL": "60"}
    return dict(backend, **{"DYN_EVENT_PLANE": "zmq",
            "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
            "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_SYSTEM_HOST": "127.0.0.1",
            "DYN_TCP_REQUEST_TIMEOUT": str(request_timeout), "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_HOST_IP": "127.0.0.1"})


def worker_command(python, model, role, engine_args):
    """A Dynamo vLLM worker of ``role`` (prefill or decode) serving ``model`` under its own path as the model name
    (what the lab's clients send), with vLLM's engine flags ``engine_args`` (the ones `vllm serve` gets, less
    --host/--port)."""
    if role not in ("prefill", "decode"):
        raise ValueError("role must be prefill or decode, not %r" % role)
    return [python, "-m", "dynamo.vllm", "--model", model, "--served-model-name", model,
            "--disaggregation-mode", role] + list(engine_args)


def frontend_command(python, port):
    return [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)]


def add_chat_template(model):
    """Gives ``model``'s tokenizer_config.json a plain chat template where it has none; True when it changed.
    Dynamo's frontend will not serve a model without one (its log: ``prompt_formatter_from_mdc: chat_template field
    is required``), even for /v1/completions, and the lab's word tokenizer has none; completions never use it."""
    path = os.path.join(model, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    if cfg.get("chat_template"):
        return False
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return True


def frontend_ready(models_page, frontend_log_text, model):
    """The frontend lists ``model`` and has found a prefill worker (so its first request is disaggregated)."""
    try:
        listed = any(m.get("id") == model for m in json.loads(models_page).get("data", []))
    except (TypeError, ValueError, AttributeError):
        return False
    return listed and bool(PREFILL_FOUND.search(frontend_log_text or ""))


#: the frontend's timing histograms (tokenize, template, the per-stage latency: preprocess, route,
#: transport_roundtrip, postprocess; time to first token, request duration), kept per bench repetition
SECONDS_SERIES = re.compile(r"^(dynamo_[a-z_]+_seconds)_(sum|count)(\{[^}]*\})?\s+([0-9.eE+-]+)$")
STAGE_LABEL = re.compile(r'stage="([^"]*)"')


def frontend_seconds(text):
    """The frontend's timing histograms from its /metrics page: {"<series>[<stage>]": [sum, count]}, summed over
    the other labels."""
    out = {}
    for line in (text or "").splitlines():
        m = SECONDS_SERIES.match(line.strip())
        if not m:
            continue
        stage = STAGE_LABEL.search(m.group(3) or "")
        key = m.group(1) + ("[%s]" % stage.group(1) if stage else "")
        pair = out.setdefault(key, [0.0, 0.0])
        pair[0 if m.group(2) == "sum" else 1] += float(m.group(4))
    return out


def frontend_delta(before, after):
    """Per series, the requests between two pages and their mean in ms: {"<series>[<stage>]": {"n", "mean_ms"}}
    ({} when either page is missing)."""
    if before is None or after is None:
        return {}
    out = {}
    for key, (total, count) in sorted(after.items()):
        b_total, b_count = before.get(key, (0.0, 0.0))
        n = count - b_count
        if n > 0:
            out[key] = {"n": int(round(n)), "mean_ms": round((total - b_total) / n * 1e3, 3)}
    return out
