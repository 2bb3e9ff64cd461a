"""The README says what the code and the results say."""

import json
import os
import re
import subprocess
import sys

from xlkv_autopatch.families import canonical

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools import archive  # noqa: E402  (X.json, else X.json.xz: the results files' one reader)
README = open(os.path.join(ROOT, "README.md")).read()


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```\n(.*?)\n```", README.split("## Set-up commands", 1)[1].split("## ", 1)[0], re.S)
    assert blocks == ["bash experiments/main.sh", "bash tests/run.sh"]
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "bash tests/run.sh" in ci


def test_support_table_matches_the_matrix():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "render_table.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_matrix_rows_are_well_formed():
    path = os.path.join(ROOT, "experiments", "results", "compat-matrix.json")
    rows = json.load(open(path))["rows"]
    keys = {"vllm", "mechanism", "status", "descriptors_per_block_stock", "descriptors_per_block_xlkv",
            "transfer_verified", "notes"}
    for row in rows:
        assert keys <= set(row), row
        assert row["status"] in ("pass", "fail", "unsupported")
        if row["status"] == "pass":  # a pass must carry its evidence
            assert row["transfer_verified"] is True
            assert row["descriptors_per_block_xlkv"] <= 2 < row["descriptors_per_block_stock"]
            per = row["descriptors_per_block_xlkv"]
            for case, m in (row.get("merged_descriptors") or {}).items():
                assert m["xlkv"] == m["expected_xlkv"], (row["vllm"], case, m)
                if "xlkv_keep_order" in m:  # the ordering off: vLLM's order, one per block and region
                    assert m["xlkv_keep_order"] == m["blocks"] * per, (row["vllm"], case, m)
            push = row.get("push")
            if push and push.get("available"):
                assert push["as_expected"] is True and not push["problems"], (row["vllm"], push["problems"])
                assert push["xlkv"]["connector_class"].endswith(".NixlPushConnector"), row["vllm"]
                for c, x in push["xlkv"]["cases"].items():
                    assert x["transfer"] == "push", (row["vllm"], c)
                    if c in push.get("vllm_failures", {}):  # stock vLLM's push fails there: the same result
                        assert x["num_mismatches"] == push["stock"]["cases"][c]["num_mismatches"], (row["vllm"], c)
                    else:
                        assert x["bytes_ok"] is True, (row["vllm"], c, x)


def test_matrix_flags_counts_that_contradict_the_ordering():
    """run_matrix's own checks, on hand-made harness results: a keep-order run that merged, and
    an xlkv run that did not, are problems; bytes not compared exact are problems."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import run_matrix
    ids = {"reversed": 8, "interleaved": 6, "shared": 4}

    def run(counts, cross=True, ok=True):
        return {"cross_layer": cross, "descs_per_block": 1 if cross else 4,
                "cases": {c: {"nixl_descs": n, "bytes_ok": ok, "local_block_ids": list(range(ids[c]))}
                          for c, n in counts.items()}}
    stock = run({"reversed": 32, "interleaved": 24, "shared": 16}, cross=False)
    good = run_matrix.merged_descriptors(stock, run({"reversed": 1, "interleaved": 2, "shared": 1}),
                                         run({"reversed": 8, "interleaved": 6, "shared": 4}))
    assert "problems" not in good and good["reversed"]["xlkv_keep_order"] == 8
    bad = run_matrix.merged_descriptors(stock, run({"reversed": 8, "interleaved": 2, "shared": 1}),
                                        run({"reversed": 1, "interleaved": 6, "shared": 4}, ok=False))
    assert any("reversed blocks: NIXL moved 8 descriptors with xlkv, 1 expected" in p for p in bad["problems"])
    assert any("reversed blocks: NIXL moved 1 descriptors with XLKV_COALESCE=false, 8 expected" in p
               for p in bad["problems"])
    assert any("XLKV_COALESCE=false: bytes not exact" in p for p in bad["problems"])


def test_matrix_push_check_tells_vllms_failures_from_the_shims():
    """A push case stock vLLM gets wrong is vLLM's (recorded, not a problem) as long as the shim
    gets exactly the same result; a different result, or a failure where stock is exact, is."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import run_matrix
    blocks = {"noncontig": 4, "reversed": 8, "interleaved": 6, "shared": 4}

    def run(nixl, bad=None, cross=True):
        bad = bad or {}
        return {"cross_layer": cross, "descs_per_block": 1 if cross else 4,
                "p": {"connector_class": "vllm.x.NixlPushConnector"},
                "cases": {c: {"ok": c not in bad, "bytes_ok": c not in bad, "num_mismatches": bad.get(c, 0),
                              "transfer": "push", "nixl_descs": nixl[c], "local_block_ids": list(range(n))}
                          for c, n in blocks.items()}}
    stock_n = {"noncontig": 16, "reversed": 32, "interleaved": 24, "shared": 16}
    xlkv_n = {"noncontig": 4, "reversed": 1, "interleaved": 2, "shared": 1}
    same = run_matrix.push_results(run(stock_n, {"shared": 16}, cross=False), run(xlkv_n, {"shared": 16}))
    assert same["as_expected"] is True and same["vllm_failures"] == {"shared": "stock push: 16 mismatches"}
    other = run_matrix.push_results(run(stock_n, {"shared": 16}, cross=False), run(xlkv_n, {"shared": 12}))
    assert other["problems"] == ["push shared: xlkv 12 mismatches, stock 16"], other["problems"]
    own = run_matrix.push_results(run(stock_n, cross=False), run(xlkv_n, {"reversed": 3}))
    assert own["as_expected"] is False and any("push, xlkv, reversed: not exact" in p for p in own["problems"])


GPU_PROVEN = os.path.join(ROOT, "experiments", "results", "gpu-proven.json")
#: the GPU column's descriptor counts: checked against the file's configs.{stock,shim}
#: blocks_per_transfer and descriptors_per_transfer
DESCRIPTORS = r"(\d+)-block transfer: (\d+) descriptors stock, (\d+) with the shim"


def _claim_problems(release, gpu_text, claims):
    """Why the GPU column's words for one release are not what its result files say ([] if they are)."""
    bad = []
    if not claims:
        return ["no claims"]
    for c in claims:
        says, where = c["says"], "%s %r (%s)" % (release, c["says"], c["file"])
        if says not in gpu_text:
            bad.append("%s: not in the column's text" % where)
        path = os.path.join(ROOT, "experiments", "results", c["file"])
        if not os.path.exists(path):
            bad.append("%s: no such file" % where)
            continue
        doc = json.load(open(path))
        fields = c.get("fields", {})
        if doc.get("vllm_version") != release:
            bad.append("%s: the file is of vLLM %s" % (where, doc.get("vllm_version")))
        for k, v in fields.items():
            if doc.get(k) != v:
                bad.append("%s: %s is %r in the file, the claim needs %r" % (where, k, doc.get(k), v))
        for cfg in c.get("configs", []):
            if cfg not in (doc.get("configs") or {}):
                bad.append("%s: no config %s in the file" % (where, cfg))
        cells = doc.get("cells") or []
        for want in c.get("cells", []):
            hit = [x for x in cells if all(x.get(k) == v for k, v in want.items())]
            if not hit or not all(set(x.get("completed") or [0]) == {want["num_prompts"]} for x in hit):
                bad.append("%s: no complete cell %s in the file" % (where, want))
        if "ratio" in c:
            r = c["ratio"]
            ttft = {x["config"]: x.get("mean_ttft_ms_mean") for x in cells
                    if x.get("num_prompts") == r["num_prompts"] and x.get("input_len") == r["input_len"]}
            got = round(ttft["stock"] / ttft["shim"], 2) if ttft.get("stock") and ttft.get("shim") else None
            if got != r["stock/shim"]:
                bad.append("%s: stock/shim TTFT is %s in the file" % (where, got))
        # what the words claim, the claim must check
        need = {}
        if "PASS" in says:
            need.update(pass_=True, equivalence_pass=True)
        if "logprobs" in says:
            need["logprob_pass"] = True
        if "negative control" in says:
            need["negative_control_pass"] = True
        for a, b in re.findall(r"TP (\d+)→(\d+)", says):
            need.update(tp_p=int(a), tp_d=int(b))
        for n in re.findall(r"(\d+)×H200", says):
            need["gpu"] = "%sxH200" % n
        for n in re.findall(r"(\d+)×H100", says):   # the slug names the model: 1xH100-80GB-HBM3
            if not str(fields.get("gpu", "")).startswith("%sxH100" % n):
                bad.append("%s: the words need gpu=%sxH100* among the claim's fields" % (where, n))
        for backend in re.findall(r"\b(TRITON_ATTN|FLASHINFER|FLASH_ATTN)\b", says):
            if backend not in str(fields.get("serve_args", "")).split():
                bad.append("%s: the words need --attention-backend %s in the claim's serve_args" % (where, backend))
        for n in re.findall(r"(\d+)-request fragmenting load", says):
            need["fragment_prompts"] = int(n)
        for n, stock, shim in re.findall(DESCRIPTORS, says):  # "a 100-block transfer: 2800 descriptors stock, ..."
            need["descriptor_pass"] = True
            for config, count in (("stock", stock), ("shim", shim)):
                got = (doc.get("configs") or {}).get(config) or {}
                if (got.get("blocks_per_transfer"), got.get("descriptors_per_transfer")) != (float(n), float(count)):
                    bad.append("%s: the file's %s config moved %s blocks in %s descriptors per transfer, the words "
                               "say %s in %s" % (where, config, got.get("blocks_per_transfer"),
                                                 got.get("descriptors_per_transfer"), n, count))
        for k, v in need.items():
            if fields.get(k.rstrip("_")) != v:
                bad.append("%s: the words need %s=%r among the claim's fields" % (where, k.rstrip("_"), v))
        same = [x for x in claims if x["says"] == says]
        for n, m in re.findall(r"(\d+)×(\d+)", says):
            if not any(w.get("num_prompts") == int(n) and w.get("input_len") == int(m)
                       for x in same for w in x.get("cells", [])):
                bad.append("%s: no claim of that text checks a %s×%s cell" % (where, n, m))
        m = re.search(r"stock/shim (\d+\.\d+)×", says)
        if m and float(m.group(1)) != c.get("ratio", {}).get("stock/shim"):
            bad.append("%s: the ratio %s is not checked" % (where, m.group(1)))
    # every result word of the column lies inside a claim's words
    spans = [(i, i + len(c["says"])) for c in claims for i in [gpu_text.find(c["says"])] if i >= 0]
    for word in re.finditer(r"PASS|\d+×H[12]00|\d+×\d+|TTFT|fragment\w*|TRITON_ATTN|FLASHINFER|\d+-block|"
                            r"\d+ descriptors|\d+ with the shim", gpu_text):
        if not any(a <= word.start() and word.end() <= b for a, b in spans):
            bad.append("%s: %r at %d is backed by no claim" % (release, word.group(), word.start()))
    return bad


def test_gpu_column_says_what_its_result_files_say():
    gpu = json.load(open(GPU_PROVEN))
    problems = []
    for release, entry in gpu.items():
        if not release.startswith("_"):
            problems += _claim_problems(release, entry["gpu"], entry.get("claims"))
    assert problems == [], "\n".join(problems)


def test_the_gpu_column_check_catches_a_claim_its_file_contradicts():
    # the 0.21.0 column as it stood: "equivalence PASS (TP 1→1, 2→2)" with the default-kernel
    # equivalence file (equivalence_pass false) and no TP 2→2 file
    claims = [{"says": "2×H200: equivalence PASS (TP 1→1, 2→2)",
               "file": "2026-11-22-equivalence-0.21.0-2xH200.json",
               "fields": {"pass": True, "equivalence_pass": True, "gpu": "2xH200", "tp_p": 1, "tp_d": 1}}]
    bad = _claim_problems("0.21.0", "2×H200: equivalence PASS (TP 1→1, 2→2), 64×10240 TTFT", claims)
    assert any("equivalence_pass is False in the file" in b for b in bad), bad
    assert any("'64×10240' at" in b for b in bad), bad  # a result word no claim backs


def test_the_gpu_column_check_catches_descriptor_counts_its_file_contradicts():
    # once: "2800 descriptors stock, 28 with the shim" changed to 2900 / 19 passed every docs test
    text = "1×H100: equivalence PASS (a 100-block transfer: 2900 descriptors stock, 19 with the shim)"
    claims = [{"says": "1×H100: equivalence PASS", "file": "2026-11-24-equivalence-0.33.0-1xH100-triton-nc.json",
               "fields": {"pass": True, "equivalence_pass": True, "gpu": "1xH100-80GB-HBM3"}},
              {"says": "a 100-block transfer: 2900 descriptors stock, 19 with the shim",
               "file": "2026-11-24-equivalence-0.33.0-1xH100-triton-nc.json", "fields": {"descriptor_pass": True}}]
    bad = _claim_problems("0.33.0", text, claims)
    assert any("stock config moved 100.0 blocks in 2800.0 descriptors per transfer, the words say 100 in 2900" in b
               for b in bad), bad
    assert any("shim config moved 100.0 blocks in 28.0 descriptors per transfer, the words say 100 in 19" in b
               for b in bad), bad
    # the counts left out of every claim's words: unchecked words are a problem too
    bad = _claim_problems("0.33.0", text, claims[:1])
    assert any("'2900 descriptors' at" in b for b in bad) and any("'19 with the shim' at" in b for b in bad), bad


def test_upstream_tests_table_matches_the_result_files():
    """docs/support-matrix.md's table of vLLM's own NIXL tests is the rendering of experiments/results/upstream-tests-*.json."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "upstream_tests", os.path.join(ROOT, "experiments", "upstream", "upstream_tests.py"))
    upstream = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(upstream)
    readme = open(os.path.join(ROOT, "docs", "support-matrix.md")).read()
    start, end = readme.index(upstream.TABLE_START), readme.index(upstream.TABLE_END)
    assert readme[start + len(upstream.TABLE_START):end].strip() == upstream.table(), (
        "docs/support-matrix.md's vLLM-own-tests table is stale: python3 experiments/upstream/upstream_tests.py table")


def test_upstream_cpu_rows_count_the_ids_ci_runs():
    """A 'CPU (pinned ids)' row of that table counts what CI runs (tests/real/test_upstream_nixl.py):
    for every release pinned in experiments/upstream/cpu-passing.json, its result file holds exactly
    the pinned ids in each mode (once the table said 101 for 0.33.0 where CI runs 102)."""
    pins = json.load(open(os.path.join(ROOT, "experiments", "upstream", "cpu-passing.json")))
    problems = []
    for release, pin in sorted(pins.items()):
        name = "upstream-tests-%s-cpu.json" % release
        path = os.path.join(ROOT, "experiments", "results", name)
        if not os.path.exists(path):
            problems.append("vLLM %s is pinned for CI but has no %s" % (release, name))
            continue
        modes = json.load(open(path))["modes"]
        want = set(pin["passing_stock"])
        for mode in ("stock", "on"):
            ids = set(modes.get(mode, {}).get("outcomes", {}))
            if ids != want:
                problems.append("%s, %s: %d ids, CI runs %d pinned ids (not in the file: %s; not pinned: %s)" % (
                    name, mode, len(ids), len(want), sorted(want - ids)[:3], sorted(ids - want)[:3]))
    assert problems == [], "\n".join(problems)


def test_readme_states_the_test_time_limits():
    """README's test section names the per-test limits that pyproject.toml and tests/conftest.py set."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("xlkv_tests_conftest", os.path.join(ROOT, "tests", "conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    text = " ".join(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split())
    ini = open(os.path.join(ROOT, "pyproject.toml")).read()
    default = int(re.search(r"^timeout = (\d+)$", ini, re.M).group(1))
    assert re.search(r"^timeout_func_only = true$", ini, re.M)
    limits = dict(conftest.TIME_LIMITS)
    want = "pytest-timeout: %d s, tests/real %d s, `slow` tests %d s" % (default, limits["real"], limits["slow"])
    assert want in text, "README should say %r" % want


def test_readme_states_the_supported_range_of_the_release_table():
    """The README's opening names the range the shim enforces: both come from one table
    (xlkv_autopatch/releases.py), so adding a row makes this test name the README line to edit."""
    from xlkv_autopatch import releases
    first, last = releases.RELEASES[0].release, releases.RELEASES[-1].release
    head = "\n".join(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()[:6])
    want_words, want_range = "stock vLLM %s–%s" % (first, last), "`%s`" % releases.supported_range()
    assert want_words in head and want_range in head, (
        "README's opening should say %r and %r (xlkv_autopatch/releases.py)" % (want_words, want_range))


def test_the_model_family_table_is_what_its_results_files_say(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("render_families",
                                                  os.path.join(ROOT, "tools", "render_families.py"))
    rf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rf)
    assert rf.main(["--check"]) == 0, "run python3 tools/render_families.py"
    # every cell comes from its file: a planted change in the GPU MLA row's results is seen
    index = json.load(open(rf.INDEX))
    row = next(r for r in index["rows"] if r["where"].startswith("1×H100") and r["family"] == "mla")
    assert rf.cells(row)[0]["xlkv"] == "1" and rf.cells(row)[1] == "yes"
    data = json.load(open(os.path.join(ROOT, row["file"])))
    data["configs"]["shim"]["registered_regions_per_block_id"] = [2]
    data["negative_control_pass"] = False
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps(data))
    values, verdict = rf.cells(dict(row, file=str(planted)))
    assert values["xlkv"] == "2" and verdict == "NO"


def test_the_heterogeneous_tp_table_is_what_its_results_files_say(tmp_path, monkeypatch):
    """docs/support-matrix.md's heterogeneous-TP table is rendered from the harness's results
    files; a planted change in one of them (a decode rank's descriptors per remote rank) is seen."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("render_hetero_tp",
                                                  os.path.join(ROOT, "tools", "render_hetero_tp.py"))
    rh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rh)
    assert rh.main(["--check"]) == 0, "run python3 tools/render_hetero_tp.py"
    table = rh.render()
    assert "| 0.33.0 | dense, 4 KV heads | 1 → 2 | 1 | exact, 4 region(s), 4 | exact, 1 region(s), 1 |" in table, table
    # a planted fault in a copy of one file: the rendered row follows it
    src = os.path.join(ROOT, "experiments", "results", "2026-11-26-hetero-tp-cpu-0.33.0.json")
    data = archive.load_json(src)  # kept as .json.xz
    data["runs"]["xlkv_dense4_1to2"]["cases"]["noncontig"]["descriptors_per_block_per_remote_rank"] = [1.0, 4.0]
    (tmp_path / "2026-11-26-hetero-tp-cpu-0.33.0.json").write_text(json.dumps(data))
    monkeypatch.setattr(rh, "FILES", str(tmp_path / "*-hetero-tp-cpu-*.json"))
    assert "| 1 → 2 | 1 | exact, 4 region(s), 4 | exact, 1 region(s), 1-4 |" in rh.render()


def test_the_readme_ci_time_is_the_newest_measured_run():
    """README's CI time comes from experiments/results/ci-times.json (the newest CI run),
    not from prose of its own."""
    data = json.load(open(os.path.join(ROOT, "experiments", "results", "ci-times.json")))
    ci = [r for r in data["runs"] if r["where"] == "ci"]
    newest = ci[-1]
    readme = open(os.path.join(ROOT, "README.md")).read()
    want = "CI's run of %s took %d minutes (%d s)" % (newest["commit"], round(newest["seconds"] / 60), newest["seconds"])
    assert want in readme, want
    here = [r for r in data["runs"] if r["where"] == "here"][-1]
    want = "%s took %d minutes (%d s: %s)" % (here["commit"], round(here["seconds"] / 60), here["seconds"],
                                              here["pytest"].split(" in ")[0])
    assert want in " ".join(readme.split()), want
    assert all(isinstance(r["seconds"], int) and r["source"] for r in data["runs"])


def test_the_readme_float_step_is_the_files():
    """The one-float32-step difference README quotes is the results file's."""
    path = os.path.join(ROOT, "experiments", "results", "2026-11-26-equivalence-0.26.0-1xH100-mla-triton-v1-nc.json")
    step = json.load(open(path))["other_runner_vs_reference"]["pd:stock"]["max_logprob_diff"]
    assert "%.2e" % step == "4.77e-07" and ("MLA logprobs, %.2e" % step) in " ".join(open(
        os.path.join(ROOT, "docs", "measurements.md")).read().split())


SUMMARY_START, SUMMARY_END = "<!-- ttft-summary -->", "<!-- /ttft-summary -->"


def readme_ttft_rows(readme=None):
    """The data rows of README's measurements table (the first table after its "## Measurements")."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read() if readme is None else readme
    section = readme.split("## Measurements", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    return [line for line in table if line.startswith("| 0.")]


def summary_ttft_rows(text=None):
    """The data rows of docs/measurements.md's table of every TTFT row (between its ttft-summary markers), with
    their links written as from the repository root, as README writes them."""
    if text is None:
        text = open(os.path.join(ROOT, "docs", "measurements.md"), encoding="utf-8").read()
    block = text.split(SUMMARY_START, 1)[1].split(SUMMARY_END, 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| 0.")]
    return [re.sub(r"\]\(#", "](docs/measurements.md#", r.replace("](../experiments/", "](experiments/")) for r in rows]


def ttft_row_problems(row):
    """Why one TTFT row says what its linked results files do not ([] if every figure is a file's): every
    millisecond figure and ratio is a mean TTFT of a cell of the row's linked results files (the .json beside
    each .md), or the repetition-weighted mean of the same cell across them (a pooled row)."""
    files = [os.path.join(ROOT, m[:-3] + ".json") for m in re.findall(r"\]\((experiments/results/[^)]+\.md)\)", row)]
    if not files or not all(archive.exists(f) for f in files):
        return ["%r: no results file, or a missing one (%s)" % (row[:60], files)]
    cells = [c for f in files for c in archive.load_json(f)["cells"]]
    means = {round(c["mean_ttft_ms_mean"]) for c in cells}
    pooled = {}
    for c in cells:
        key = (c["config"], c["num_prompts"], c["input_len"])
        total, n = pooled.get(key, (0.0, 0))
        pooled[key] = (total + c["mean_ttft_ms_mean"] * c["reps"], n + c["reps"])
    means |= {round(total / n) for total, n in pooled.values()}
    text = re.sub(r"\[[^\]]*\]\([^)]*\)", "", row)  # link texts and targets carry dates, not figures
    figures = [int(x) for x in re.findall(r"(?<!× )\b(\d{3,5})(?= ms|, )", text)]
    bad = [] if figures else ["%r: no figure" % row[:60]]
    bad += ["%d ms (row %r) is no cell's mean in %s" % (x, row[:60], files) for x in figures if x not in means]
    for ratio in re.findall(r"(\d\.\d\d)×", text):
        m = re.match(r"\| (0\.\d+)\.\d+, (?:(\d+) × (\d+))", row)
        want = {c["config"]: c["mean_ttft_ms_mean"] for c in cells
                if (c["num_prompts"], c["input_len"]) == (int(m.group(2)), int(m.group(3)))}
        if "%.2f" % (want["stock"] / want["shim"]) != ratio:
            bad.append("%r: %s× is not stock/shim of its cell" % (row[:60], ratio))
    return bad


def test_the_ttft_tables_are_what_their_files_say():
    """README's measurements table shows a few rows (at most four); docs/measurements.md keeps every row,
    README's among them, word for word. Every row of both is checked against its files."""
    readme, every = readme_ttft_rows(), summary_ttft_rows()
    assert 1 <= len(readme) <= 4, readme
    assert len(every) >= 14, "docs/measurements.md lost TTFT rows: %d" % len(every)
    assert [r for r in readme if r not in every] == [], "README rows that docs/measurements.md does not keep"
    problems = [p for row in every + readme for p in ttft_row_problems(row)]
    assert problems == [], "\n".join(problems)


def test_the_ttft_row_check_sees_a_changed_figure():
    """Planted in copies: a millisecond figure and a ratio of one row changed, and a row dropped from the doc."""
    [row] = [r for r in summary_ttft_rows() if r.startswith("| 0.21.0, 64 × 10240")]
    assert ttft_row_problems(row) == []
    assert any("4322 ms" in p for p in ttft_row_problems(row.replace("4321 ms", "4322 ms")))
    assert any("1.71×" in p for p in ttft_row_problems(row.replace("1.70×", "1.71×")))
    doc = open(os.path.join(ROOT, "docs", "measurements.md"), encoding="utf-8").read()
    assert row not in summary_ttft_rows(doc.replace(row.replace("](experiments/", "](../experiments/") + "\n", ""))


def test_every_results_file_the_docs_name_exists_and_a_pass_line_names_no_failed_file():
    """The docs cite results files by name; each must exist, and a line that says
    PASS must not cite a summary whose own verdict ("pass") is false."""
    cited = 0
    for doc in ["README.md"] + ["docs/" + f for f in sorted(os.listdir(os.path.join(ROOT, "docs"))) if f.endswith(".md")]:
        for n, line in enumerate(open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines(), 1):
            for name in re.findall(r"(?:experiments/results/)?(20\d\d-\d\d-\d\d-[\w.,-]+\.json)(?:\.xz)?", line):
                path = os.path.join(ROOT, "experiments", "results", name)
                assert archive.exists(path), "%s:%d names %s, which is not in experiments/results" % (doc, n, name)
                cited += 1
                if "PASS" in line:
                    verdict = archive.load_json(path)
                    assert not (isinstance(verdict, dict) and verdict.get("pass") is False), (
                        "%s:%d says PASS and names %s, whose pass is false" % (doc, n, name))
    assert cited > 20, cited


def test_the_one_group_hybrid_figure_is_the_files():
    """The figure "12 → 1" (a sliding-window hybrid planned as one KV cache group on 0.14.1 and
    0.21.0) in docs/support-matrix.md's prose is the descriptors per block of those families files."""
    seen = set()
    for release in ("0.14.1", "0.21.0"):
        runs = json.load(open(os.path.join(ROOT, "experiments", "results",
                                           "2026-11-26-families-cpu-%s.json" % release)))["runs"]
        runs = {canonical(k): v for k, v in runs.items()}["sliding-window"]  # these files spell it "swa"
        assert runs["stock"]["transfer_verified"] and runs["xlkv"]["transfer_verified"], release
        seen.add("%d → %d" % (runs["stock"]["descs_per_block"], runs["xlkv"]["descs_per_block"]))
    assert seen == {"12 → 1"}, seen
    text = " ".join(open(os.path.join(ROOT, "docs", "support-matrix.md"), encoding="utf-8").read().split())
    assert "measured on 0.14.1 and 0.21.0: 12 → 1" in text


def test_the_readme_is_short_and_its_opening_gain_is_the_tables():
    """README ≤ 120 lines, prose lines ≤ 120 characters and table rows ≤ 210, the gain in its first paragraph's
    first twenty words, and that gain is the range of the bold (64 × 10240) ratios of every TTFT row (docs/measurements.md's
    table, which holds README's rows too), which the test above ties to the files."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = readme.splitlines()
    assert len(lines) <= 120, len(lines)
    long = [(n, len(l)) for n, l in enumerate(lines, 1) if len(l) > (210 if l.startswith("|") else 120)]
    assert long == [], "README lines too long (line, characters): %s" % long
    opening = " ".join(readme.split("\n\n", 2)[1].split())
    before = opening.split("**The gain:**", 1)[0].split()
    assert "**The gain:**" in opening and len(before) <= 20, "the gain after %d words of the opening" % len(before)
    bold = sorted(float(x) for row in summary_ttft_rows() for x in re.findall(r"\*\*(\d\.\d\d)×\*\*", row))
    assert "mean TTFT %.2f–%.2f× lower than stock at 64 × 10240-token prompts" % (bold[0], bold[-1]) in opening, \
        (bold, opening)
    for heading in ("## Quick start", "## What each model gets", "## Requirements", "## When it refuses",
                    "## Set-up commands", "## Measurements"):
        assert heading in readme, heading
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "status --model" in quick and "any P/D router works" in " ".join(quick.split())


def test_the_readme_main_job_time_is_the_newest_measured_run():
    """The main job's time in README comes from ci-times.json."""
    data = json.load(open(os.path.join(ROOT, "experiments", "results", "ci-times.json")))
    newest = data["main_job"][-1]
    assert isinstance(newest["seconds"], int) and newest["source"] and newest["gpus"] == 0
    text = " ".join(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split())
    assert "Time: %d s on this 2-core machine without a GPU" % newest["seconds"] in text
