"""Against a real vLLM release (installed by tests/harness/mkenv.sh): the patch targets of
that release resolve, the patches land in every process kind only when ENABLE_XLKV is set,
and with the flag off nothing of the shim is imported or applied."""

import json
import textwrap

from conftest import once_per_session, run_in

PROBE = textwrap.dedent("""
    import json, sys, multiprocessing as mp

    def inspect_patches(q):
        import importlib
        from xlkv_autopatch import versions
        from xlkv_autopatch.patches import all_groups
        found, checked = [], []
        v = versions.vllm_version()
        from xlkv_autopatch.flag import knob_state
        for g in all_groups():
            if not versions.in_range(v, g.vllm):
                continue
            if g.knob and knob_state(g.knob) != "on":
                continue                                # a switch that is off registers nothing
            importlib.import_module(g.trigger)          # what vLLM's connector factory does
            for spec in g.patches:
                mod = sys.modules[spec.module]
                holder = mod
                if spec.owner:
                    named = getattr(mod, spec.owner)
                    holder = named if spec.on_named_class else next(
                        k for k in named.__mro__ if spec.attr in vars(k))
                value = vars(holder).get(spec.attr)
                checked.append(spec.name)
                if type(value).__name__.startswith("Xlkv"):
                    found.append(spec.name)
        reg = sys.modules.get("xlkv_autopatch.registry")
        q.put({"checked": checked, "patched": found,
               "sources": list(reg.REGISTRY.state.sources) if reg else [],
               "xlkv_imported_before": None})

    if __name__ == "__main__":
        before = sorted(m for m in sys.modules if m.startswith("xlkv_autopatch"))
        if len(sys.argv) > 1 and sys.argv[1] == "plugin":
            import os
            os.environ["ENABLE_XLKV"] = "1"
            from vllm.plugins import load_general_plugins
            load_general_plugins()
            q = mp.Queue(); inspect_patches(q); out = q.get()
        else:
            ctx = mp.get_context("spawn")
            q = ctx.Queue(); p = ctx.Process(target=inspect_patches, args=(q,)); p.start()
            out = q.get(timeout=300); p.join(60)
        out["xlkv_modules_at_start"] = before
        print("RESULT " + json.dumps(out))
""")


def _result(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_status_resolves_every_patch_target(vllm_env):
    version, python = vllm_env
    r = run_in(python, ["-m", "xlkv_autopatch", "status", "--json"])
    info = json.loads(r.stdout)
    assert info["vllm"] == version
    applicable = [g for g in info["patch_sets"] if g["applies"]]
    assert applicable, "no patch set for vLLM %s" % version
    for g in applicable:
        assert "error" not in g, g
        assert all(p["ok"] for p in g["patches"]), g
    assert info["ok"] is True and r.returncode == 0, info["problems"]
    assert any(p.endswith("xlkv_autopatch.pth") for p in info["activation"]["pth_files"])
    assert info["activation"]["plugin_entry_points"]


def test_flag_on_patches_a_spawned_child_through_the_pth(vllm_env, tmp_path):
    version, python = vllm_env
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = _result(run_in(python, [str(script)], env={"ENABLE_XLKV": "true"}))
    assert out["checked"] and sorted(out["patched"]) == sorted(out["checked"])
    assert out["sources"] == ["pth"]


def test_flag_off_is_stock(vllm_env, tmp_path):
    version, python = vllm_env
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = _result(run_in(python, [str(script)]))
    assert out["checked"] and out["patched"] == []
    assert out["xlkv_modules_at_start"] == [] and out["sources"] == []


def test_plugin_path_activates_when_flag_set_in_script(vllm_env, tmp_path):
    version, python = vllm_env
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = _result(run_in(python, [str(script), "plugin"]))
    assert sorted(out["patched"]) == sorted(out["checked"])
    assert out["sources"] == ["vllm_plugin"]


def test_kvcached_flag_alone_is_no_problem(vllm_env):
    """ENABLE_KVCACHED without ENABLE_XLKV is kvcached's business (status OK);
    with ENABLE_XLKV too, status names the conflict and fails."""
    once_per_session(vllm_env, "status's flag check is the shim's own code, the same on every release")
    version, python = vllm_env
    r = run_in(python, ["-m", "xlkv_autopatch", "status", "--json"], env={"ENABLE_KVCACHED": "true"})
    info = json.loads(r.stdout)
    assert r.returncode == 0 and info["ok"] is True, info["problems"]
    assert info["kvcached_flags"] == ["ENABLE_KVCACHED"]
    r = run_in(python, ["-m", "xlkv_autopatch", "status", "--json"],
               env={"ENABLE_KVCACHED": "true", "ENABLE_XLKV": "true"})
    info = json.loads(r.stdout)
    assert r.returncode == 1
    assert any("ENABLE_KVCACHED and ENABLE_XLKV are both set" in p for p in info["problems"]), info["problems"]
