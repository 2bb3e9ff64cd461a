"""The lab's Dynamo configs (pdtools/dynamo.py): P and D started as Dynamo's vLLM workers with the engine flags
`vllm serve` would get, the frontend's readiness and timing histograms, and the equivalence job's ids read back
through the vocabulary where Dynamo's frontend refuses vLLM's ``return_token_ids``.  The processes are taken where
the lab hands them to ``subprocess.Popen``; none is started (the run through real Dynamo processes is
experiments/probes/dynamo_pd_cpu.py on CPU and the GPU lease's results)."""

import json
import os
import sys

import pytest

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
from pdtools import configs, dynamo, equivalence, pair, settings  # noqa: E402


def _started(monkeypatch, tmp_path, cfg):
    """{P, D: (command, environment)} of config ``cfg``'s servers, as Pair.start_server hands them to Popen."""
    started = {}

    class Popen:
        def __init__(self, cmd, env=None, **kw):
            started[name] = (list(cmd), dict(env))

    monkeypatch.setattr(pair.subprocess, "Popen", Popen)
    s = settings.Settings.read({"WORK": str(tmp_path / "work"), "PY": "/py", "PYTHONPATH": "", "REG_REPORT": "1"})
    lab = pair.Pair(s, serve_args=["--no-enable-prefix-caching"])
    lab.version, lab.model, lab.mem_util = "0.31.0", "/model", "0.3"
    lab.router = configs.router(cfg)
    lab.discovery = "/dev/shm/xlkv-dynamo-x" if lab.router == "dynamo" else None
    for name, port in (("P", 8100), ("D", 8200)):
        lab.start_server(name, cfg, port, 5600, "0", 1, str(tmp_path / ("%s.log" % name)))
    return started


def test_dynamo_rows_are_the_lab_rows_served_through_dynamo():
    for name in configs.DYNAMO_ROWS:
        row, twin = configs.CONFIGS[name], configs.CONFIGS[dynamo.PREFIX + name]
        assert (twin.env, twin.kv_extra, twin.d_env, twin.d_args) == (row.env, row.kv_extra, row.d_env, row.d_args)
        assert "dynamo" in twin.needs and "dynamo" not in row.needs
        assert configs.router(dynamo.PREFIX + name) == "dynamo" and configs.router(name) == "proxy"
    assert configs.router("nc-dynamo-shim") == "dynamo"
    assert configs.uses_shim("dynamo-shim-detok") and not configs.uses_shim("dynamo-stock")
    assert configs.alone_for("dynamo-shim-detok") == "prefill_only-detok"


@pytest.mark.parametrize("cfg", ["dynamo-stock", "dynamo-shim"])
def test_dynamo_workers_get_the_engine_flags_vllm_serve_gets(monkeypatch, tmp_path, cfg):
    through = _started(monkeypatch, tmp_path, cfg)
    lab = _started(monkeypatch, tmp_path, cfg[len(dynamo.PREFIX):])
    for name, role, port in (("P", "prefill", "8100"), ("D", "decode", "8200")):
        cmd, env = through[name]
        assert cmd[:10] == ["/py", "-m", "dynamo.vllm", "--model", "/model", "--served-model-name", "/model",
                            "--disaggregation-mode", role] + cmd[9:10]
        serve_cmd, serve_env = lab[name]
        engine = serve_cmd[serve_cmd.index("--port") + 2:]
        assert cmd[9:] == engine and "--host" not in cmd and "--port" not in cmd
        assert "--kv-transfer-config" in engine and "--no-enable-prefix-caching" in engine
        assert env["DYN_SYSTEM_PORT"] == port and env["DYN_DISCOVERY_BACKEND"] == "file"
        assert env["DYN_FILE_KV"] == "/dev/shm/xlkv-dynamo-x"
        assert env.get("ENABLE_XLKV") == serve_env.get("ENABLE_XLKV") == ("true" if cfg == "dynamo-shim" else None)
        assert "DYN_SYSTEM_PORT" not in serve_env


def test_worker_role_is_prefill_or_decode():
    with pytest.raises(ValueError):
        dynamo.worker_command("/py", "/m", "both", [])


def test_frontend_ready_needs_the_model_listed_and_a_prefill_worker():
    page = json.dumps({"data": [{"id": "/model"}]})
    assert dynamo.frontend_ready(page, "... Prefill worker detected ...", "/model")
    assert not dynamo.frontend_ready(page, "starting", "/model")
    assert not dynamo.frontend_ready(json.dumps({"data": [{"id": "/other"}]}), "Prefill worker detected", "/model")
    assert not dynamo.frontend_ready(None, "Prefill worker detected", "/model")


def test_frontend_histograms_per_repetition():
    before = dynamo.frontend_seconds(
        'dynamo_frontend_time_to_first_token_seconds_sum{model="m"} 2.0\n'
        'dynamo_frontend_time_to_first_token_seconds_count{model="m"} 4\n'
        'dynamo_frontend_stage_duration_seconds_sum{stage="route"} 0.1\n'
        'dynamo_frontend_stage_duration_seconds_count{stage="route"} 4\n'
        '# HELP ignored\nvllm:other_seconds_sum 9\n')
    after = dynamo.frontend_seconds(
        'dynamo_frontend_time_to_first_token_seconds_sum{model="m"} 3.0\n'
        'dynamo_frontend_time_to_first_token_seconds_count{model="m"} 6\n'
        'dynamo_frontend_stage_duration_seconds_sum{stage="route"} 0.12\n'
        'dynamo_frontend_stage_duration_seconds_count{stage="route"} 6\n'
        'dynamo_frontend_stage_duration_seconds_sum{stage="preprocess"} 0.5\n'
        'dynamo_frontend_stage_duration_seconds_count{stage="preprocess"} 0\n')
    assert dynamo.frontend_delta(before, after) == {
        "dynamo_frontend_stage_duration_seconds[route]": {"n": 2, "mean_ms": 10.0},
        "dynamo_frontend_time_to_first_token_seconds": {"n": 2, "mean_ms": 500.0}}
    assert dynamo.frontend_delta(None, after) == {}


def test_chat_template_added_once(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8}))
    assert dynamo.add_chat_template(str(tmp_path))
    assert not dynamo.add_chat_template(str(tmp_path))
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == dynamo.CHAT_TEMPLATE and cfg["model_max_length"] == 8


def test_ids_read_back_through_the_vocabulary(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"w5": 5, "w7": 7}},
                                                         "added_tokens": [{"id": 1, "content": "<eos>"}]}))
    vocab = equivalence.vocabulary(str(tmp_path))
    assert vocab == {"w5": 5, "w7": 7, "<eos>": 1}
    choice = {"logprobs": {"tokens": ["w7", "w5", "<eos>"]}}
    assert equivalence.ids_from_token_strings(choice, vocab) == [7, 5, 1]
    assert equivalence.ids_from_token_strings({"logprobs": {"tokens": ["w7", "w9"]}}, vocab) is None
    assert equivalence.ids_from_token_strings({"text": "w7"}, vocab) is None
    assert equivalence.vocabulary(str(tmp_path / "none")) == {}


def test_greedy_request_through_dynamo_sends_openai_fields_alone(monkeypatch):
    sent = []

    def http_json(url, body, timeout=600.0):
        sent.append(dict(body))
        return {"choices": [{"text": " w7 w5", "logprobs": {"tokens": ["w7", "w5"], "token_logprobs": [-1.0, -2.0],
                                                             "top_logprobs": [{"w7": -1.0}, {"w5": -2.0}]}}]}

    monkeypatch.setattr(equivalence, "http_json", http_json)
    r = equivalence.greedy_request("http://x/v1/completions", "/model", 8, 2, vocab={"w5": 5, "w7": 7})
    assert "return_token_ids" not in sent[0] and "return_tokens_as_token_ids" not in sent[0]
    assert sent[0]["logprobs"] == equivalence.TOP_LOGPROBS and sent[0]["ignore_eos"] is True
    assert (r["token_ids"], r["method"], r["logprobs"]) == ([7, 5], "logprobs_tokens_vocab", [-1.0, -2.0])


FAKE_ETCD = r'''#!/usr/bin/env python3
import socket, sys, time
a = sys.argv[1:]
port = int(a[a.index("--listen-client-urls") + 1].rsplit(":", 1)[1])
open(a[a.index("--data-dir") + 1] + ".args", "w").write(" ".join(a))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", port)); s.listen()
time.sleep(600)
'''


def _free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("etcd", ["fake", "/usr/bin/etcd"])
def test_dynamo_etcd_discovery_is_the_pairs_own(tmp_path, etcd):
    """DYNAMO_ETCD: the pair starts its own etcd before the workers, every Dynamo process gets the etcd backend,
    and stop_all ends it (its port free again)."""
    if etcd == "fake":
        etcd = str(tmp_path / "etcd")
        with open(etcd, "w") as f:
            f.write(FAKE_ETCD)
        os.chmod(etcd, 0o755)
    elif not os.access(etcd, os.X_OK):
        pytest.skip("no etcd binary here (Debian's etcd-server); the fake one above stands in")
    port = _free_port()
    s = settings.Settings.read({"WORK": str(tmp_path / "work"), "PY": "/py", "DYNAMO_ETCD": etcd,
                                "DYNAMO_ETCD_PORT": str(port)})
    lab = pair.Pair(s)
    lab.discovery = dynamo.discovery_dir()
    try:
        lab.start_etcd()
        assert lab.etcd_port == port and pair.port_in_use(port)
        env = lab.dynamo_env()
        assert (env["DYN_DISCOVERY_BACKEND"], env["ETCD_ENDPOINTS"]) == ("etcd", "http://127.0.0.1:%d" % port)
        assert "DYN_FILE_KV" not in env
    finally:
        lab.stop_all()
    assert not pair.port_in_use(port) and lab.discovery is None and lab.etcd_port is None
    assert dynamo.common_env("/d")["DYN_FILE_KV"] == "/d"


def test_report_compares_a_dynamo_config_with_dynamo_stock_and_shows_the_frontend():
    from pdtools import report

    def cell(cfg, ttft, frontend=None):
        return {"config": cfg, "input_len": 10240, "num_prompts": 64, "max_concurrency": 64, "state": "fresh",
                "mean_ttft_ms": ttft, "frontend": frontend}

    front = [{"dynamo_frontend_time_to_first_token_seconds": {"n": 64, "mean_ms": 990.0},
              "dynamo_frontend_stage_duration_seconds[route]": {"n": 64, "mean_ms": 0.2}}] * 3
    doc = {"cells": [cell("stock", [3000.0] * 3), cell("shim", [1500.0] * 3), cell("dynamo-stock", [2000.0] * 3),
                     cell("dynamo-shim-detok", [1000.0] * 3, front)]}
    ratio = {r["config"].split(" ")[0]: r["ratio"] for r in report.rows(doc)}
    assert ratio == {"stock": 1.0, "shim": 2.0, "dynamo-stock": 1.0, "dynamo-shim-detok": 2.0}
    text = report.markdown(doc)
    assert "dynamo-stock/dynamo-shim-detok [c64] 2.00×" in text and "stock/shim [c64] 2.00×" in text
    assert "route 0.2 ms, frontend TTFT 990.0 ms" in text


def test_pack_folds_out_into_one_file_and_keeps_the_results(tmp_path):
    import tarfile
    from pdtools import job_cell
    out, work = tmp_path / "out", tmp_path / "work"
    (work / "bench").mkdir(parents=True)
    (work / "bench" / "deep").mkdir()
    out.mkdir()
    for n in ("logtails.txt", "loggrep.txt", "eq-a-d-registration.json", "2026-11-29-x-0.31.0-2xH200.json",
              "console.txt"):
        (out / n).write_text(n)
    for n in ("eq-dynamo-shim-p.log", "commands.txt", "bench/r1.json", "bench/deep/no.json", "bench-client-1.log",
              "model.safetensors"):
        (work / n).write_text(n)
    job_cell.pack(str(out), str(work), "call21", keep={"2026-11-29-x-0.31.0-2xH200.json"})
    assert sorted(p.name for p in out.iterdir()) == ["2026-11-29-x-0.31.0-2xH200.json", "call21.tgz", "console.txt"]
    with tarfile.open(out / "call21.tgz") as t:
        names = sorted(t.getnames())
    assert names == ["out/eq-a-d-registration.json", "out/loggrep.txt", "out/logtails.txt", "work/bench/r1.json",
                     "work/commands.txt", "work/eq-dynamo-shim-p.log"]


def test_through_dynamo_the_chosen_logprob_is_read_where_it_is_exact(monkeypatch):
    """Dynamo 1.6.1 printed token_logprobs with float32's shortest digits (2026-11-29 lease: -7.9051385 for
    -7.9051384925842285, up to 4.6e-07 off at every prompt) and the same values exactly in top_logprobs."""
    def http_json(url, body, timeout=600.0):
        return {"choices": [{"text": " w7 w5", "logprobs": {
            "tokens": ["w7", "w5"], "token_logprobs": [-7.9051385, -2.0],
            "top_logprobs": [{"w7": -7.9051384925842285, "w3": -8.0}, {"w5": -2.0, "w9": -2.5}]}}]}

    monkeypatch.setattr(equivalence, "http_json", http_json)
    r = equivalence.greedy_request("http://x/v1/completions", "/m", 8, 2, vocab={"w5": 5, "w7": 7, "w3": 3, "w9": 9})
    assert r["logprobs"] == [-7.9051384925842285, -2.0] and r["logprobs_printed"] == [-7.9051385, -2.0]
    assert equivalence.chosen_from_top(["w7", "w1"], [[["w7", -1.5]], [["w5", -2.0]]]) == [-1.5, None]
    assert equivalence.is_shim("dynamo-shim-detok") and equivalence.is_shim("shim") and not equivalence.is_shim(
        "dynamo-stock")
