"""experiments/probes/ucx_same_gpu.py without a GPU: what it keeps of UCX's protocol output,
and that a variant whose processes fail makes the probe fail (exit 1), not hang or pass."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "experiments" / "probes" / "ucx_same_gpu.py"
spec = importlib.util.spec_from_file_location("ucx_same_gpu", PROBE)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)

UCX_OUTPUT = """\
[1795482621.768397] [vm:9924 :0]   | target self cfg#0                                        |
[1795482621.768397] [vm:9924 :0]   | 0..4294967295 | short       | cuda_copy/cuda             |
[1795482621.771035] [vm:9925 :0]   | reader intra-node cfg#2                                  |
[1795482621.771035] [vm:9925 :0]   | remote memory read by ucp_get* from cuda/dev[1] to cuda  |
[1795482621.771035] [vm:9925 :0]   | 0..inf | software emulation | tcp/lo                      |
[1795482621.771035] [vm:9925 :0]     cuda_ipc_iface.c:320  UCX  DEBUG cuda-ipc get zcopy disabled as no nvlinks detected
[1795482621.775578] [vm:9925 :0]   | reader self cfg#1                               |
[1795482621.775578] [vm:9925 :0]   | 1..16515 | zero-copy          | tcp/lo        |
"""


def test_proto_tables_keeps_the_peer_tables_and_cuda_ipc_lines_only():
    kept = probe.proto_tables(UCX_OUTPUT)
    assert kept == [
        "| reader intra-node cfg#2                                  |",
        "| remote memory read by ucp_get* from cuda/dev[1] to cuda  |",
        "| 0..inf | software emulation | tcp/lo                      |",
        "cuda_ipc_iface.c:320  UCX  DEBUG cuda-ipc get zcopy disabled as no nvlinks detected",
    ]


def test_a_variant_whose_processes_die_fails_the_probe(tmp_path):
    """here the children cannot initialise CUDA (or import torch/nixl): each variant is
    recorded as failed with its output's tail, and the probe exits 1 within its timeout"""
    out = tmp_path / "probe.json"
    p = subprocess.run([sys.executable, str(PROBE), "--variant", "x=UCX_TLS=tcp", "--shape", "tiny=2:4096",
                        "--reps", "1", "--timeout", "60", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    run = json.loads(out.read_text())["runs"][0]
    assert run["variant"] == "x" and run["env"] == {"UCX_TLS": "tcp"} and run["descriptors"] == 2
    assert run["rc"] not in (0, "timeout") and "bytes_ok" not in run and run["tail"]
