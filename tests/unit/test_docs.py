"""The README says what the code and the results say."""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md")).read()


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```\n(.*?)\n```", README.split("## Set-up commands", 1)[1].split("## ", 1)[0], re.S)
    assert blocks == ["bash experiments/main.sh", "bash tests/run.sh"]
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "bash tests/run.sh" in ci


def test_support_table_matches_the_matrix():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "compat", "render_table.py"), "--check"],
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


def test_gpu_column_names_result_files_that_exist():
    gpu = json.load(open(os.path.join(ROOT, "experiments", "results", "gpu-proven.json")))
    for release, entry in gpu.items():
        if release.startswith("_"):
            continue
        assert entry["files"], release
        for f in entry["files"]:
            assert os.path.exists(os.path.join(ROOT, "experiments", "results", f)), (release, f)
