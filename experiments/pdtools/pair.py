"""One prefill (P) and one decode (D) vLLM server with NixlConnector, and the P/D proxy
(pd_proxy.py): GPUs, ports, start, readiness, stop, the model they serve, and D's KV lines.

    lab = Pair(settings)         # the door's Settings; lab.version = require_vllm(lab.child_env())
    lab.detect_gpus()            # False: none here
    lab.ensure_model()
    lab.start_pair("shim", "eq-shim"); lab.use_registration(); ...; lab.stop_all()

Every server runs in its own process group (``setsid``), so stopping it ends its engine-core
and worker children too; ``stop_all`` runs on every exit of a job (jobs use ``with Pair(...)``).
Every child of the pair (servers, proxy, bench client, fragmenting load, make_model.py) gets its
environment from ``child_env``: the servers' environment (settings.server_env) with what the job
decided for them (``env_changes``: VLLM_BATCH_INVARIANT, UCX_CUDA_IPC_ENABLE_GET_ZCOPY).
"""

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

from . import configs, dynamo
from .gates import gate
from .kvmetrics import NotDense, load_registration, model_block_bytes, model_shape, registration_bytes_per_block
from .results import gpu_slug
from .settings import EXIT_SETUP, EXP_DIR, NC_DIR, die, log, server_env


#: how often a server's readiness and a stopped server's ports are polled (a localhost GET or connect each
#: time): a start that took 80-160 s on a GPU is timed to this, and a test's stand-in servers, up in 0.3 s,
#: are not waited on for seconds (with 2 s and 1 s here, tests/experiments/test_shell.py spent 164 of its
#: 224 s asleep on 2026-11-28)
READY_POLL_S = 0.2


def port_in_use(port):
    s = socket.socket()
    s.settimeout(1.0)
    try:
        return s.connect_ex(("127.0.0.1", int(port))) == 0
    finally:
        s.close()


def require_ports_free(*ports):
    for p in ports:
        if port_in_use(p):
            who = ""
            try:
                out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
                who = next((l for l in out.splitlines() if re.search(r"[:.]%s\b" % p, l)), "")
            except OSError:
                pass
            die(EXIT_SETUP, "port %s is in use%s. Stop that process or set PORT_P/PORT_D/PORT_PROXY/SIDE_P/SIDE_D."
                % (p, " (%s)" % who if who else ""))


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return 200 <= r.status < 300
    except Exception:
        return False


def gpu_names():
    """The GPUs nvidia-smi lists ([] when there is none or no nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout
    except OSError:
        return []
    return [l for l in out.splitlines() if l.strip()]


def model_dir_for(arch):
    """Where the generated model of a family lives (qwen3: the old place)."""
    return "/tmp/xlkv-model" if arch == "qwen3" else "/tmp/xlkv-model-%s" % arch


def make_model(settings, arch, env=None, stdout=None):
    """Generates the random-weight model of family ``arch`` into model_dir_for(arch), with the
    image's torch (``env``, default the door's, with PYTHONPATH cleared); make_model.py returns at
    once when the folder holds one made with the same settings.  Its exit code."""
    return subprocess.run([settings.get("PY"), os.path.join(EXP_DIR, "make_model.py"), model_dir_for(arch), "--arch",
                           arch], env=dict(settings.environ if env is None else env, PYTHONPATH=""),
                          stdout=stdout).returncode


def split_gpus(ngpu, tp_p, tp_d):
    """(P's GPUs, D's GPUs, shared): everybody their own GPUs where there are enough, else P from
    the front and D from the back; LabExit when there are fewer GPUs than the larger TP."""
    need, most = tp_p + tp_d, max(tp_p, tp_d)
    if ngpu >= need:
        return list(range(tp_p)), list(range(tp_p, need)), False
    if ngpu >= most:
        return list(range(tp_p)), list(range(ngpu - tp_d, ngpu)), True
    die(EXIT_SETUP, "TP_P=%d TP_D=%d need at least %d GPUs; this machine has %d" % (tp_p, tp_d, most, ngpu))


class Pair:
    """The servers of one job and what they serve.  ``serve_args``: more `vllm serve` flags
    (default SERVE_EXTRA_ARGS, word-split)."""

    def __init__(self, settings, version=None, serve_args=None):
        self.settings = s = settings
        self.version = version
        self.env = server_env(s)   # the environment of every child (child_env adds env_changes)
        self.env_changes = {}      # name -> value, or None: not set for the children
        self.serve_args = shlex.split(s.get("SERVE_EXTRA_ARGS")) if serve_args is None else list(serve_args)
        self.work = s.get("WORK")
        os.makedirs(self.work, exist_ok=True)
        self.commands_file = os.path.join(self.work, "commands.txt")
        self.procs = []            # [(name, Popen, log)]
        self.tp_p, self.tp_d = s.get_int("TP_P"), s.get_int("TP_D")
        self.ngpu, self.gpu_names, self.gpu_slug = 0, [], "cpu"
        self.p_gpus = self.d_gpus = ""
        self.shared_gpu, self.mem_util = False, s.get("GPU_MEM_UTIL")
        self.model = self.model_family = self.shape = None
        self.bytes_per_block = self.dense_bytes_per_block = 0
        self.bpb_source = None
        self.p_log = self.d_log = self.proxy_log = None
        self.d_reg_report = None
        self.proxy_args = []
        self.trace_dir = None      # HANDOFF_TRACE=1: the pair's handoff trace (engines' and proxy's lines)
        self.router = "proxy"      # who routes the running pair's requests: "proxy" or "dynamo" (configs.router)
        self.discovery = None      # the running Dynamo pair's discovery folder
        self.etcd_port = None      # ... and its etcd's client port (DYNAMO_ETCD), else file discovery

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()
        return False

    def child_env(self):
        """The environment of a child of this pair (a new dict each call)."""
        env = dict(self.env)
        for name, value in self.env_changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    # ------------------------------------------------------------------ GPUs
    def detect_gpus(self):
        """Counts the GPUs; False when there are none."""
        self.gpu_names = gpu_names()
        self.ngpu = len(self.gpu_names)
        self.gpu_slug = gpu_slug(self.gpu_names)
        return self.ngpu > 0

    def assign_gpus(self):
        p, d, self.shared_gpu = split_gpus(self.ngpu, self.tp_p, self.tp_d)
        self.p_gpus, self.d_gpus = ",".join(map(str, p)), ",".join(map(str, d))
        self.mem_util = self.settings.get("GPU_MEM_UTIL_SHARED" if self.shared_gpu else "GPU_MEM_UTIL")
        log("GPU split: P on [%s] (TP %d), D on [%s] (TP %d), memory utilization %s%s" % (
            self.p_gpus, self.tp_p, self.d_gpus, self.tp_d, self.mem_util, ", shared GPU" if self.shared_gpu else ""))
        self.shared_gpu_ucx()

    def shared_gpu_ucx(self):
        """On a shared GPU the children get UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y unless the caller set it.
        UCX turns cuda_ipc's get-zcopy (NIXL's READ) off when it sees no NVLink, which it never does
        with one GPU; READs then go through software emulation over tcp/lo.  Measured 2026-11-24 on
        1xH100 (experiments/probes/ucx_same_gpu.py, two processes): 1.17 GB in 2.85-3.08 s (0.40
        GB/s) with UCX's default, 0.91 ms (1292 GB/s) with the variable."""
        if self.shared_gpu and "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in self.child_env():
            self.env_changes["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] = "y"
            log("shared GPU: UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y (UCX's default turns cuda_ipc READs off without "
                "NVLink: 0.4 GB/s)")

    def bench_gpus_ok(self):
        """(True, "") when a P/D TTFT means something here: P and D on their own GPUs, a shared GPU
        with cuda_ipc READs on (shared_gpu_ucx sets them), or BENCH_ALLOW_SHARED_GPU=1."""
        need = self.tp_p + self.tp_d
        if self.ngpu >= need or self.settings.get("BENCH_ALLOW_SHARED_GPU", "0") == "1":
            return True, ""
        zcopy = self.child_env().get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY")
        if zcopy is None or zcopy in ("y", "yes", "on", "1"):
            return True, ""
        return False, ("needs %d GPUs (P: %d, D: %d) and this machine has %d: P and D would share a GPU, and with "
                       "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=%s UCX moves KV between two processes on one GPU at 0.1-0.4 "
                       "GB/s, so the TTFT would measure that path, not the connector (unset it: the bench sets y on "
                       "a shared GPU)" % (need, self.tp_p, self.tp_d, self.ngpu, zcopy))

    # ------------------------------------------------------------------ model
    def ensure_model(self):
        """MODEL when given; otherwise the random model of MODEL_ARCH, generated once
        (make_model.py returns at once when its folder holds one made with the same settings)."""
        s = self.settings
        model = s.get("MODEL")
        if model:
            if not os.path.isfile(os.path.join(model, "config.json")):
                die(EXIT_SETUP, "MODEL=%s has no config.json" % model)
        else:
            model = model_dir_for(s.get("MODEL_ARCH"))
            if make_model(s, s.get("MODEL_ARCH"), env=self.child_env(), stdout=sys.stderr) != 0:
                die(EXIT_SETUP, "make_model.py failed")
        self.model = model
        # the package's shape (the one make_model.py recorded for a model it generated) at D's TP size
        self.shape = model_shape(model, self.tp_d)
        self.model_family = self.shape.family
        try:
            self.bytes_per_block = model_block_bytes(model, s.get_int("BLOCK_SIZE"), max(self.tp_p, self.tp_d))
        except NotDense:
            self.bytes_per_block = 0
        self.dense_bytes_per_block = self.bytes_per_block
        log("model %s (%s at decode TP %d; shape from %s)" % (model, self.model_family, self.tp_d, self.shape.source))

    def use_registration(self):
        """After D is ready: the bytes one block id moves, from D's registration report.  Without a
        report a dense model keeps the dense formula (said); a non-dense one gets 0 (blocks per
        transfer and descriptors per block then stay unknown, never wrong)."""
        bpb = 0
        if self.d_reg_report and os.path.isfile(self.d_reg_report):
            bpb = registration_bytes_per_block(load_registration(self.d_reg_report))[0] or 0
        if bpb:
            self.bytes_per_block, self.bpb_source = bpb, "registration"
            log("bytes per block id: %d (D's registration report %s)" % (bpb, os.path.basename(self.d_reg_report)))
        elif self.dense_bytes_per_block:  # nonzero for a model of full attention alone (model_block_bytes)
            self.bytes_per_block, self.bpb_source = self.dense_bytes_per_block, "dense formula"
            log("NOTE: no usable registration report from D%s: bytes per block from the dense K/V formula (%d)"
                % (" (%s)" % self.d_reg_report if self.d_reg_report else "", self.bytes_per_block))
        else:
            self.bytes_per_block, self.bpb_source = 0, "none"
            log("WARNING: no usable registration report from D%s for a %s model: blocks per transfer unknown"
                % (" (%s)" % self.d_reg_report if self.d_reg_report else "", self.model_family))

    # ------------------------------------------------------------------ servers
    def _note(self, line):
        with open(self.commands_file, "a") as f:
            f.write(line + "\n")

    def start_server(self, name, cfg, port, side, gpus, tp, logf):
        base = self.child_env()
        s = configs.server_settings(cfg, self.version, self.settings, base.get("PYTHONPATH", ""))
        kvcfg = '{"kv_connector":"NixlConnector","kv_role":"kv_both"'
        if s.kv_extra:
            kvcfg += ',"kv_connector_extra_config":%s' % s.kv_extra
        kvcfg += "}"
        envs = [("CUDA_VISIBLE_DEVICES", gpus), ("VLLM_NIXL_SIDE_CHANNEL_PORT", str(side)), ("UCX_NET_DEVICES", "all")]
        if self.shared_gpu and base.get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY"):
            envs.append(("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", base["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"]))
        if not gate("layouts", self.version)[0]:      # NIXL (and the cross-layer path) need HND there
            envs.append(("VLLM_KV_CACHE_LAYOUT", self.settings.get("KV_LAYOUT", "HND")))
        envs += list(s.env.items())
        is_d = name.startswith("D")
        # the negative-control folder's import hook: D's registration report (every config, stock too) and
        # the handoff trace (P and D); nc-* configs have it on D's PYTHONPATH already
        if (self.trace_dir or (is_d and self.settings.get("REG_REPORT") == "1")) \
                and "PYTHONPATH" not in (s.d_env if is_d else {}):
            envs.append(("PYTHONPATH", "%s:%s" % (NC_DIR, base.get("PYTHONPATH", ""))))
        if self.trace_dir:
            envs.append(("XLKV_TRACE_HANDOFF", self.trace_dir))
        if self.router == "dynamo":    # the worker's system server (/health, /metrics) on the server's lab port
            envs += sorted(self.dynamo_env().items())
            envs += [("DYN_SYSTEM_PORT", str(port)), ("UCX_RCACHE_MAX_UNRELEASED", "1024")]
        if is_d:
            envs += list(s.d_env.items())
            # the registration report: the hook reads what vLLM registered
            self.d_reg_report = None
            if self.settings.get("REG_REPORT") == "1":
                self.d_reg_report = logf[:-len(".log")] + "-registration.json" if logf.endswith(".log") else \
                    logf + "-registration.json"
                if os.path.exists(self.d_reg_report):
                    os.remove(self.d_reg_report)
                envs.append(("XLKV_REGISTRATION_REPORT", self.d_reg_report))
        engine = (["--enforce-eager"] if self.settings.get("ENFORCE_EAGER") != "0" else []) + [
            "--block-size", self.settings.get("BLOCK_SIZE"),
            "--gpu-memory-utilization", self.mem_util, "--max-model-len", self.settings.get("MAX_MODEL_LEN"),
            "--kv-transfer-config", kvcfg]
        if tp > 1:
            engine += ["--tensor-parallel-size", str(tp)]
        engine += self.serve_args
        if is_d:
            engine += s.d_args
        if self.router == "dynamo":
            cmd = dynamo.worker_command(self.settings.get("PY"), self.model, "decode" if is_d else "prefill", engine)
        else:
            cmd = [self.settings.get("PY"), "-m", "vllm.entrypoints.cli.main", "serve", self.model, "--host",
                   "127.0.0.1", "--port", str(port)] + engine
        self.proxy_args = s.proxy_args
        self._note("%s: %s %s" % (name, " ".join("%s=%s" % kv for kv in envs), " ".join(cmd)))
        log("start %s (%s) on :%s, GPUs [%s], log %s" % (name, cfg, port, gpus, logf))
        env = base
        env.update(envs)
        with open(logf, "w") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.procs.append((name, proc, logf))
        return proc

    def wait_ready(self, name, url, proc, logf, timeout=None):
        timeout = self.settings.get_int("READY_TIMEOUT") if timeout is None else timeout
        t0 = time.monotonic()
        while not http_ok(url):
            why = None
            if proc.poll() is not None:
                why = "%s exited before it was ready (see %s)" % (name, logf)
            elif time.monotonic() - t0 >= timeout:
                why = "%s did not answer %s within %ds (see %s)" % (name, url, timeout, logf)
            if why:
                print("---- last 60 lines of %s ----" % logf, file=sys.stderr)
                with open(logf, errors="replace") as f:
                    sys.stderr.write("".join(f.readlines()[-60:]))
                die(EXIT_SETUP, why)
            time.sleep(READY_POLL_S)
        log("%s ready after %ds" % (name, time.monotonic() - t0))

    def url(self, which, path):
        port = self.settings.get({"P": "PORT_P", "D": "PORT_D", "proxy": "PORT_PROXY"}[which])
        return "http://127.0.0.1:%s%s" % (port, path)

    def start_pair(self, cfg, tag):
        """P, D and the proxy; logs under WORK/TAG-{p,d,proxy}.log."""
        require_ports_free(*(self.settings.get(k) for k in ("PORT_P", "PORT_D", "PORT_PROXY", "SIDE_P", "SIDE_D")))
        self.assign_gpus()
        self.p_log, self.d_log, self.proxy_log = (os.path.join(self.work, "%s-%s.log" % (tag, x))
                                                  for x in ("p", "d", "proxy"))
        self.trace_dir = None
        self.router = configs.router(cfg)
        if self.router == "dynamo":
            self.discovery = dynamo.discovery_dir()
            log("Dynamo discovery folder %s" % self.discovery)
            self.start_etcd()
            if dynamo.add_chat_template(self.model):
                log("added a plain chat_template to %s/tokenizer_config.json (Dynamo's frontend serves no model "
                    "without one; completions never use it)" % self.model)
        if self.settings.get("HANDOFF_TRACE") == "1":
            self.trace_dir = os.path.join(self.work, "%s-trace" % tag)
            shutil.rmtree(self.trace_dir, ignore_errors=True)
            os.makedirs(self.trace_dir)
        p = self.start_server("P[%s]" % cfg, cfg, self.settings.get("PORT_P"), self.settings.get("SIDE_P"),
                              self.p_gpus, self.tp_p, self.p_log)
        # on a shared GPU vLLM's memory profiling of one instance must not see the other one still
        # growing: start them one after the other
        if self.shared_gpu:
            self.wait_ready("P[%s]" % cfg, self.url("P", "/health"), p, self.p_log)
        d = self.start_server("D[%s]" % cfg, cfg, self.settings.get("PORT_D"), self.settings.get("SIDE_D"),
                              self.d_gpus, self.tp_d, self.d_log)
        self.wait_ready("P[%s]" % cfg, self.url("P", "/health"), p, self.p_log)
        self.wait_ready("D[%s]" % cfg, self.url("D", "/health"), d, self.d_log)
        self.start_proxy()
        if configs.uses_shim(cfg):
            self.check_shim_active(self.p_log, self.d_log)
        if cfg.startswith(configs.NEGATIVE_PREFIX):
            self.check_negative_control_active(self.d_log)

    def start_prefill_alone(self, cfg, tag):
        """P alone with ``cfg``'s settings (the bench's prefill_only: stock; prefill_only-detok: the shim and its
        XLKV_DETOK_TAIL switch)."""
        require_ports_free(self.settings.get("PORT_P"), self.settings.get("SIDE_P"))
        self.assign_gpus()
        self.p_log, self.d_log, self.d_reg_report = os.path.join(self.work, "%s-p.log" % tag), None, None
        self.trace_dir = None  # no handoff without D
        self.router = "proxy"  # P alone is always `vllm serve`
        p = self.start_server("P[%s]" % cfg, cfg, self.settings.get("PORT_P"), self.settings.get("SIDE_P"),
                              self.p_gpus, self.tp_p, self.p_log)
        self.wait_ready("P[%s]" % cfg, self.url("P", "/health"), p, self.p_log)
        if configs.server_settings(cfg, self.version, self.settings).env.get("ENABLE_XLKV") == "true":
            self.check_shim_active(self.p_log)

    def restart_decode(self, cfg, tag):
        """Keeps P of the running pair and replaces D and the proxy by a D with ``cfg``'s settings:
        a negative control right after its own config (P is the same; one start-up saved).  Through Dynamo the
        whole pair starts anew (a fresh discovery folder: the frontend must not route to the stopped D's keys)."""
        if self.router == "dynamo":
            self.stop_all()
            return self.start_pair(cfg, tag)
        keep = []
        for name, proc, logf in reversed(self.procs):
            if name.startswith("D[") or name == "proxy":
                self._stop(proc)
            else:
                keep.insert(0, (name, proc, logf))
        self.procs = keep
        t0 = time.monotonic()
        ports = [self.settings.get(k) for k in ("PORT_D", "PORT_PROXY", "SIDE_D")]
        while any(port_in_use(p) for p in ports) and time.monotonic() - t0 < 30:
            time.sleep(READY_POLL_S)
        require_ports_free(*ports)
        log("restarting D as %s (P kept)" % cfg)
        self.d_log, self.proxy_log = (os.path.join(self.work, "%s-%s.log" % (tag, x)) for x in ("d", "proxy"))
        d = self.start_server("D[%s]" % cfg, cfg, self.settings.get("PORT_D"), self.settings.get("SIDE_D"),
                              self.d_gpus, self.tp_d, self.d_log)
        self.wait_ready("D[%s]" % cfg, self.url("D", "/health"), d, self.d_log)
        self.start_proxy()
        if cfg.startswith(configs.NEGATIVE_PREFIX):
            self.check_negative_control_active(self.d_log)

    def start_proxy(self):
        if self.router == "dynamo":
            return self.start_frontend()
        cmd = [self.settings.get("PY"), os.path.join(EXP_DIR, "pd_proxy.py"), "--port",
               self.settings.get("PORT_PROXY"), "--prefill", self.url("P", ""), "--decode",
               self.url("D", "")] + list(self.proxy_args)
        if self.trace_dir:
            cmd += ["--trace", self.proxy_trace()]
        with open(self.proxy_log, "w") as out:
            proc = subprocess.Popen(cmd, env=self.child_env(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(("proxy", proc, self.proxy_log))
        self.wait_ready("proxy", self.url("proxy", "/health"), proc, self.proxy_log, 60)

    def dynamo_env(self):
        return dynamo.common_env(self.discovery, etcd_port=self.etcd_port)

    def start_etcd(self):
        """DYNAMO_ETCD=<etcd binary>: the pair's own etcd (Dynamo's default discovery) on DYNAMO_ETCD_PORT (23790),
        ready when it takes a TCP connection; else file discovery (self.etcd_port None)."""
        etcd = self.settings.get("DYNAMO_ETCD")
        self.etcd_port = None
        if not etcd:
            return
        port = self.settings.get_int("DYNAMO_ETCD_PORT", "23790")
        require_ports_free(port, port + 1)
        logf = os.path.join(self.work, "etcd.log")
        cmd = dynamo.etcd_command(etcd, self.discovery, port)
        self._note("etcd: " + " ".join(cmd))
        with open(logf, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.procs.append(("etcd", proc, logf))
        t0 = time.monotonic()
        while not port_in_use(port):
            if proc.poll() is not None or time.monotonic() - t0 > 30:
                log_tail(logf)
                die(EXIT_SETUP, "etcd (%s) did not listen on %d (see %s)" % (etcd, port, logf))
            time.sleep(READY_POLL_S)
        self.etcd_port = port
        log("etcd ready on :%d after %.1fs (Dynamo discovery: etcd)" % (port, time.monotonic() - t0))

    def start_frontend(self):
        """Dynamo's frontend on PORT_PROXY; ready once it lists the model and has found the prefill worker."""
        port = self.settings.get("PORT_PROXY")
        cmd = dynamo.frontend_command(self.settings.get("PY"), port)
        env = self.child_env()
        env.update(self.dynamo_env())
        self._note("frontend: %s %s" % (" ".join("%s=%s" % kv for kv in sorted(self.dynamo_env().items())),
                                        " ".join(cmd)))
        log("start Dynamo's frontend on :%s, log %s" % (port, self.proxy_log))
        with open(self.proxy_log, "w") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.procs.append(("proxy", proc, self.proxy_log))
        t0, limit = time.monotonic(), 120
        while True:
            try:
                with urllib.request.urlopen(self.url("proxy", "/v1/models"), timeout=5) as r:
                    page = r.read().decode()
            except Exception:
                page = None
            with open(self.proxy_log, errors="replace") as f:
                if dynamo.frontend_ready(page, f.read(), self.model):
                    break
            dead = [name for name, p, _ in self.procs if p.poll() is not None]
            if dead or time.monotonic() - t0 >= limit:
                log_tail(self.proxy_log, 60)
                die(EXIT_SETUP, "Dynamo's frontend %s (see %s)" % (
                    "saw %s exit" % " ".join(dead) if dead else
                    "did not list %s with a prefill worker within %ds" % (self.model, limit), self.proxy_log))
            time.sleep(READY_POLL_S)
        log("frontend ready after %ds (model listed, prefill worker found)" % (time.monotonic() - t0))

    def proxy_trace(self):
        return os.path.join(self.trace_dir, "proxy.jsonl") if self.trace_dir else None

    def check_shim_active(self, *logs):
        """A hint only (the descriptor count is the proof): the shim logs "... is active"."""
        pattern = re.compile(self.settings.get("XLKV_ACTIVE_RE"))
        for f in logs:
            with open(f, errors="replace") as fh:
                if not pattern.search(fh.read()):
                    log("WARNING: no line matching /%s/ in %s: is the shim active there?" % (pattern.pattern, f))

    def check_negative_control_active(self, logf):
        with open(logf, errors="replace") as fh:
            if "xlkv negative control: armed" not in fh.read():
                log("WARNING: the negative-control hook did not load in D (%s)" % logf)

    def _stop(self, proc):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, 15)
            except OSError:
                pass
        try:
            proc.wait(self.settings.get_int("STOP_TIMEOUT"))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
            proc.wait()

    def stop_all(self):
        """Stops every process group started here, newest first, and waits for the ports."""
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 15)
                except OSError:
                    pass
        for _, proc, _ in self.procs:
            self._stop(proc)
        t0 = time.monotonic()
        ports = [self.settings.get(k) for k in ("PORT_P", "PORT_D", "PORT_PROXY")]
        while any(port_in_use(p) for p in ports) and time.monotonic() - t0 < 30:
            time.sleep(READY_POLL_S)
        if self.procs:
            log("stopped %s" % " ".join(name for name, _, _ in self.procs))
        self.procs = []
        dynamo.remove_discovery(self.discovery)
        self.discovery = self.etcd_port = None

    # ------------------------------------------------------------------ load and D's KV lines
    def fragmenting_load(self, url, n, out_len, logf, timeout=None):
        """The churning load that fragments the free block queues: N random prompts of FRAG_LEN x
        [0.1, 1.9] tokens (seed 77), OUT_LEN output tokens each, all sent at once to URL.  False
        (and the log's tail on stderr) when it failed."""
        cmd = [self.settings.get("PY"), "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
               "--model", self.model, "--tokenizer", self.model, "--base-url", url, "--endpoint", "/v1/completions",
               "--dataset-name", "random", "--random-input-len", self.settings.get("FRAG_LEN", "2048"),
               "--random-output-len", str(out_len), "--random-range-ratio", "0.9", "--num-prompts", str(n), "--seed",
               "77", "--ignore-eos"]
        self._note("fragment: " + " ".join(cmd))
        ok = run_logged(cmd, logf, int(timeout or self.settings.get("FRAG_TIMEOUT", "900")), self.child_env())
        if ok:
            with open(logf, errors="replace") as f:
                for line in f:
                    if "Successful requests" in line or "Failed requests" in line:
                        sys.stderr.write("    " + line)
        return ok

    def wait_kv_lines(self, logf, offset, limit=None):
        """Waits until a "KV Transfer metrics" line follows ``offset`` in D's log, then two more
        logging intervals and a margin of one more up to 1 s (the final interval's lines)."""
        limit = float(self.settings.get("KV_WAIT", "60") if limit is None else limit)
        t0 = time.monotonic()
        while True:
            with open(logf, "rb") as f:
                f.seek(offset)
                if b"KV Transfer metrics:" in f.read():
                    break
            if time.monotonic() - t0 >= limit:
                log("WARNING: no KV Transfer metrics line in %s within %ds" % (logf, limit))
                return False
            time.sleep(0.2)
        i = float(self.child_env().get("VLLM_LOG_STATS_INTERVAL", "3"))
        time.sleep(2 * i + min(i, 1.0))
        return True


def log_offset(path):
    """Byte size of ``path`` now (where the next run's metrics lines start)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def run_logged(cmd, logf, timeout, env):
    """Runs ``cmd`` with environment ``env`` and its output in ``logf``; False (with the log's last
    30 lines on stderr) when it failed or ran past ``timeout`` seconds."""
    with open(logf, "w") as out:
        try:
            ok = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
    if not ok:
        log_tail(logf)
    return ok


def log_tail(path, lines=30):
    """The last ``lines`` lines of a failed run's log, on stderr (nothing if there is no log)."""
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            sys.stderr.write("".join(f.readlines()[-lines:]))


class BenchClient:
    """`vllm bench serve` runs for one job: one resident process (experiments/bench_client.py) that
    imports vLLM's benchmark once, instead of a new `python -m vllm... bench serve` per repetition
    (20-30 s of imports each on 2 x H200, the requests 0.2-3 s).  BENCH_CLIENT=cli: the per-run CLI.
    ``run`` has run_logged's contract: the run's output in ``logf``; False (the log's tail on stderr)
    when it failed or ran past ``timeout`` seconds, after which the process is replaced."""

    SCRIPT = os.path.join(EXP_DIR, "bench_client.py")

    def __init__(self, python, work, env, mode="resident"):
        """``env``: the environment of the client's process (Pair.child_env); ``mode``: BENCH_CLIENT."""
        self.python, self.work, self.env = python, work, env
        self.mode = mode or "resident"
        self.proc, self.n = None, 0

    def _start(self):
        self.log_path = os.path.join(self.work, "bench-client-%d.log" % os.getpid())
        out = open(self.log_path, "a")
        try:
            self.proc = subprocess.Popen([self.python, self.SCRIPT], stdin=subprocess.PIPE, stdout=out,
                                         stderr=subprocess.STDOUT, text=True, cwd=self.work, env=self.env)
        finally:
            out.close()

    def run(self, argv, logf, timeout):
        """``argv``: the arguments after `vllm bench serve`."""
        if self.mode == "cli":
            return run_logged([self.python, "-m", "vllm.entrypoints.cli.main", "bench", "serve"] + list(argv), logf,
                              timeout, self.env)
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.n += 1
        done = "%s.done-%d" % (logf, self.n)
        if os.path.exists(done):
            os.remove(done)
        ok, deadline = False, time.time() + timeout
        try:
            self.proc.stdin.write(json.dumps({"argv": list(argv), "log": logf, "done": done}) + "\n")
            self.proc.stdin.flush()
            while time.time() < deadline and not os.path.exists(done) and self.proc.poll() is None:
                time.sleep(0.05)
            if os.path.exists(done):
                with open(done) as f:
                    ok = json.load(f).get("rc") == 0
                os.remove(done)
            else:
                why = "ran past %d s" % timeout if self.proc.poll() is None else \
                    "the bench client exited (%s; its log: %s)" % (self.proc.returncode, self.log_path)
                log("ERROR: bench run %s" % why)
                self.close()
        except (OSError, ValueError) as e:  # a broken pipe: the client died
            log("ERROR: bench client: %s (its log: %s)" % (e, self.log_path))
            self.close()
        if not ok:
            for path in (logf, self.log_path):
                log_tail(path)
        return ok

    def close(self):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def collect_log_tails(work, dest, lines=80):
    """The tails of every log of a run (the last ``lines`` lines), into one file (a device call's $OUT)."""
    n = int(lines)
    with open(dest, "w") as out:
        for name in sorted(os.listdir(work)) if os.path.isdir(work) else []:
            path = os.path.join(work, name)
            if name.endswith(".log") and os.path.isfile(path):
                with open(path, errors="replace") as f:
                    out.write("==== %s (last %d lines) ====\n%s\n" % (path, n, "".join(f.readlines()[-n:])))
