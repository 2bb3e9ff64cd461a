"""experiments/negative_control/: how it is loaded (D's PYTHONPATH, chained sitecustomize, armed
only with XLKV_NEGATIVE_CONTROL) and what it does to KV tensors.  The real NixlConnector and
NIXL run in tests/real/test_negative_control.py; here a module at the worker's import path
stands in for vLLM, so the import hook, the wrapper and the corruption run without vLLM."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK = os.path.join(ROOT, "experiments", "negative_control")


def _py(code, env, cwd="/"):
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENABLE_XLKV", "XLKV_NEGATIVE_CONTROL")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=cwd, timeout=120)


def test_armed_only_when_asked_and_chains_to_the_checkouts_sitecustomize():
    code = ("import sys; c = sys.modules.get('xlkv_negative_control_chained_sitecustomize');"
            "print(c.__file__ if c else None, getattr(c, 'XLKV_AUTOPATCH_SITECUSTOMIZE', None))")
    r = _py(code, {"PYTHONPATH": HOOK + os.pathsep + ROOT, "XLKV_NEGATIVE_CONTROL": "shift"})
    assert r.returncode == 0, r.stderr
    assert "xlkv negative control: armed (shift)" in r.stderr
    assert r.stdout.split() == [os.path.join(ROOT, "sitecustomize.py"), "True"]  # the shim's activation still runs
    r = _py(code, {"PYTHONPATH": HOOK + os.pathsep + ROOT})
    assert r.returncode == 0 and "negative control" not in r.stderr  # on the path, but not asked for
    r = _py(code, {"PYTHONPATH": HOOK, "XLKV_NEGATIVE_CONTROL": "bogus"})
    assert "FAILED to arm" in r.stderr and "shift, swap-layers" in r.stderr


WORKER = '''
import torch

class NixlBaseConnectorWorker:
    """Stands in for vLLM's worker: what the hook reads (names as in vLLM 0.26)."""
    def __init__(self, caches, num_blocks, layer_specs=None):
        self.device_kv_caches = caches
        self.num_blocks = num_blocks
        self._layer_specs = layer_specs or {}
        self._recving_metadata = {}
        self.done = set()

    def get_finished(self):
        done = set(self.done)
        for r in done:
            self._recving_metadata.pop(r)
        self.done.clear()
        return set(), done
'''

DRIVER = '''
import types, torch
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker as W
torch.manual_seed(0)
NB = 11
layout = "%s"
if layout == "per-layer":   # (K/V, blocks, block, heads, dim) per layer, as FLASH_ATTN stock
    caches = {"l%%d" %% i: torch.randn(2, NB, 4, 2, 3) for i in range(3)}
else:                       # one cross-layer tensor (blocks, K/V, layers, block, heads*dim)
    caches = {"l0": torch.randn(NB, 2, 3, 4, 6)}
ref = {k: v.clone() for k, v in caches.items()}
w = W(caches, NB, {"l0": 0, "l1": 1, "l2": 2})
w._recving_metadata["req-1"] = types.SimpleNamespace(local_block_ids=[[5, 6]], local_physical_block_ids=[[5, 6]])
w.done.add("req-1")
print(w.get_finished())
import json
out = {}
for k, t in caches.items():
    bd = 1 if layout == "per-layer" else 0
    changed = [b for b in range(NB) if not torch.equal(t.select(bd, b), ref[k].select(bd, b))]
    out[k] = changed
    if layout == "per-layer" and changed:
        out[k + "_is_next"] = torch.equal(t.select(1, 5), ref[k].select(1, 6))
    if layout == "cross" and changed:
        out["swapped"] = torch.equal(t[5, :, 0], ref[k][5, :, 1]) and torch.equal(t[5, :, 1], ref[k][5, :, 0])
        out["layer2_same"] = torch.equal(t[5, :, 2], ref[k][5, :, 2])
print("RESULT " + json.dumps(out))
'''


@pytest.mark.parametrize("layout,how", [("per-layer", "shift"), ("per-layer", "swap-layers"), ("cross", "shift"),
                                        ("cross", "swap-layers")])
def test_hook_corrupts_the_first_received_block(tmp_path, layout, how):
    pytest.importorskip("torch")
    pkg = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "nixl"
    pkg.mkdir(parents=True)
    for d in [tmp_path / "vllm"] + list(pkg.parents)[:5] + [pkg]:
        (d / "__init__.py").touch()
    (pkg / "base_worker.py").write_text(textwrap.dedent(WORKER))
    r = _py(DRIVER % layout, {"PYTHONPATH": os.pathsep.join([HOOK, str(tmp_path)]), "XLKV_NEGATIVE_CONTROL": how})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wrapped NixlBaseConnectorWorker.get_finished" in r.stderr
    assert "(set(), {'req-1'})" in r.stdout  # the result passes through unchanged
    import json
    res = json.loads(r.stdout.split("RESULT ", 1)[1])
    if layout == "per-layer" and how == "shift":
        assert res["l0"] == res["l1"] == res["l2"] == [5] and res["l0_is_next"] and res["l2_is_next"]
        assert "block 5 <- block 6 in 3 tensor(s)" in r.stderr
    elif layout == "per-layer":
        assert res["l0"] == res["l1"] == [5] and res["l2"] == []
    elif how == "shift":
        assert res["l0"] == [5]
    else:
        assert res["l0"] == [5] and res["swapped"] and res["layer2_same"]


# ------------------------------------------------------------------ the registration report ------
sys.path.insert(0, HOOK)
import xlkv_negative_control as nc  # noqa: E402


def test_registration_facts_per_group():
    # one group, per-layer regions (stock dense or MLA): every region, summed
    assert nc.registration_facts(3, [10, 10, 10], [0, 0, 0], 1) == {"bytes_per_block_id": [30],
                                                                     "regions_per_block_id": [3]}
    # a whole block row (BLNHC, packed MLA): one region whose length is the row
    assert nc.registration_facts(1, [80], [0], 1) == {"bytes_per_block_id": [80], "regions_per_block_id": [1]}
    # hybrid, tensors shared by every group (-1): each group's block id touches both
    assert nc.registration_facts(2, [8, 8], [-1, -1], 3) == {"bytes_per_block_id": [16, 16, 16],
                                                               "regions_per_block_id": [2, 2, 2]}
    # regions of one group only: a group's block id touches its own and the shared ones
    assert nc.registration_facts(3, [4, 6, 10], [0, 1, -1], 2) == {"bytes_per_block_id": [14, 16],
                                                                     "regions_per_block_id": [2, 2]}
    # releases without region_group_ids: every region with every group's ids
    assert nc.registration_facts(2, [5, 5], None, 2)["bytes_per_block_id"] == [10, 10]
    assert "error" in nc.registration_facts(2, [5, 5], [0], 1) and "error" in nc.registration_facts(0, [], None, 1)


REG_WORKER = '''
import types

class Spec:
    def __init__(self, w=None):
        self.sliding_window = w
        self.page_size_bytes = 64

class NixlBaseConnectorWorker:
    """Stands in for vLLM 0.33's worker: register_kv_caches sets what the report reads."""
    def __init__(self, rank=0):
        self.tp_rank = rank
        self.kv_cache_layout = "BLNHC"
        self.use_mla = False
        self.calls = []
        self.block_len_per_layer = []
        self.kv_cache_config = types.SimpleNamespace(
            kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=Spec(), layer_names=["a", "b"]),
                             types.SimpleNamespace(kv_cache_spec=Spec(256), layer_names=["c", "d"])],
            transfer_groups=[0, 1])

    def register_kv_caches(self, kv_caches):
        self.calls.append(kv_caches)
        self.block_len_per_layer = [64, 64]     # set inside vLLM's method: the report reads after it
        self.region_group_ids = [-1, -1]
        self.num_regions = 2
        return "registered"

    def get_transfer_results(self):
        return set(), set()
'''

REG_DRIVER = '''
import sys
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker as W
w = W(int(sys.argv[1]))
print("RET", w.register_kv_caches({"x": 1}), w.calls)
print("POLL_WRAPPED", getattr(W.get_transfer_results, "_xlkv_negative_control_wrapped", False))
'''


def _fake_worker_pkg(tmp_path, code):
    pkg = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "nixl"
    pkg.mkdir(parents=True)
    for d in [tmp_path / "vllm"] + list(pkg.parents)[:5] + [pkg]:
        (d / "__init__.py").touch()
    (pkg / "base_worker.py").write_text(textwrap.dedent(code))
    return str(tmp_path)


def test_registration_report_is_written_after_vllms_register_kv_caches(tmp_path):
    import json
    site = _fake_worker_pkg(tmp_path, REG_WORKER)
    out = tmp_path / "reg.json"
    env = {"PYTHONPATH": os.pathsep.join([HOOK, site]), "XLKV_REGISTRATION_REPORT": str(out)}
    r = subprocess.run([sys.executable, "-c", REG_DRIVER, "0"], capture_output=True, text=True, timeout=120,
                       env=dict({k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENABLE_XLKV",
                                                                                  "XLKV_NEGATIVE_CONTROL")}, **env))
    assert r.returncode == 0, r.stderr
    assert "RET registered [{'x': 1}]" in r.stdout          # the original ran, its result passes through
    assert "POLL_WRAPPED False" in r.stdout                 # no corruption asked for: the poll is untouched
    assert "negative control" not in r.stderr and "xlkv registration report: armed" in r.stderr
    rep = json.loads(out.read_text())
    assert rep["bytes_per_block_id"] == [128, 128] and rep["regions_per_block_id"] == [2, 2]
    assert rep["num_kv_cache_groups"] == 2 and rep["kv_cache_layout"] == "BLNHC" and rep["region_group_ids"] == [-1, -1]
    assert rep["kv_cache_groups"][1] == {"spec": "Spec", "sliding_window": 256, "page_size_bytes": 64, "num_layers": 2}
    # a TP rank > 0 writes beside it
    r = subprocess.run([sys.executable, "-c", REG_DRIVER, "1"], capture_output=True, text=True, timeout=120,
                       env=dict({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "reg.json.rank1").read_text())["tp_rank"] == 1
    # not asked for: nothing wrapped, nothing written
    out.unlink()
    r = subprocess.run([sys.executable, "-c", REG_DRIVER, "0"], capture_output=True, text=True, timeout=120,
                       env=dict({k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLKV_REGISTRATION_REPORT")},
                                PYTHONPATH=env["PYTHONPATH"]))
    assert r.returncode == 0 and not out.exists() and "registration report" not in r.stderr
    # both jobs in one hook: corruption armed and report written
    r = subprocess.run([sys.executable, "-c", REG_DRIVER, "0"], capture_output=True, text=True, timeout=120,
                       env=dict({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, XLKV_NEGATIVE_CONTROL="shift",
                                **env))
    assert r.returncode == 0 and out.exists() and "POLL_WRAPPED True" in r.stdout
