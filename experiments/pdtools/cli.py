"""Command line of the lab: ``python3 experiments/pdtools JOB|COMMAND ...``.

Jobs (JOBS below; experiments/*.sh and experiments/report.py are their doors): main, equivalence,
bench, cell, upstream, report.  The environment is read here, once, into the Settings every job is
handed.

Helper commands (those experiments/README.md gives operators):

  merge           merge results JSON files (cells of the same key gain repetitions, idempotently)
  model-family    the package's family of a model directory (dense, one-kv-head, sliding-window, mla, ...)
  gate            exit 0 when vLLM VERSION has NAME (the shim's release table), else print why not and exit 1
  logs            a run's raw logs in experiments/results/logs-<run>.tar.xz: list, print a member, or --pack a folder
"""

import argparse
import json
import os
import sys

from . import archive, job_bench, job_cell, job_equivalence, job_main, job_upstream, report
from .gates import GATES, gate
from .kvmetrics import model_family
from .results import merge_results
from .settings import Settings, run_job


def cmd_merge(a):
    named = [(os.path.basename(p), json.load(open(p))) for p in a.inputs]
    docs = [d for _, d in named]
    if os.path.exists(a.out) and a.out not in a.inputs:
        docs.insert(0, json.load(open(a.out)))
    doc = merge_results(docs)
    # which equivalence summaries decided equivalence_pass: those named in the documents (a
    # bench call's equivalence_file) and any summary given here (a document without cells)
    names = {n for n, d in named if "cells" not in d}
    for d in docs:
        names.update(d.get("equivalence_files", []))
        if d.get("equivalence_file"):
            names.add(d["equivalence_file"])
    if names:
        doc["equivalence_files"] = sorted(names)
    json.dump(doc, open(a.out, "w"), indent=1, sort_keys=True)
    source = "; equivalence from " + ", ".join(sorted(names)) if names else ""
    print("%s: %d cells%s" % (a.out, len(doc["cells"]), source))


#: the lab's jobs: name -> (module, what it is); the operators' scripts are their doors.  Each job's
#: ``main`` takes the door's Settings (and, for cell and upstream, the arguments)
JOBS = {
    "main": (job_main, "the main job: equivalence then benchmark on GPUs, the CPU checks without (main.sh)"),
    "equivalence": (job_equivalence, "P/D greedy-output equivalence with and without the shim (pd_equivalence.sh)"),
    "bench": (job_bench, "P/D TTFT benchmark (pd_bench.sh)"),
    "cell": (job_cell, "one device call: steps, then the results and the console into $OUT (run_gpu_cell.sh)"),
    "upstream": (job_upstream, "vLLM's own NIXL tests on a lent GPU, stock vs flag on (upstream/gpu.sh)"),
    "report": (report, "markdown table and plot of bench results (report.py)"),
}


def run_named_job(name, argv):
    """A job of JOBS with its arguments; its exit code."""
    module = JOBS[name][0]
    if module is report:        # files in, files out: no settings
        return report.main(argv)
    settings = Settings.read()      # the door: the environment, read once, handed on
    args = (settings, argv) if module in (job_cell, job_upstream) else (settings,)
    return run_job(module.main, *args)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in JOBS:
        return run_named_job(argv[0], argv[1:])
    p = argparse.ArgumentParser(prog="pdtools", description="the P/D lab: jobs (%s) and helper commands"
                                % ", ".join(JOBS))
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("merge", help="merge results JSON files (and equivalence summaries) into --out")
    s.add_argument("--out", required=True)
    s.add_argument("inputs", nargs="+")

    s = sub.add_parser("model-family", help="prints the package's family of a model directory")
    s.add_argument("model")

    s = sub.add_parser("gate", help="exit 0 when vLLM VERSION has NAME (gates.py: the shim's release table), "
                                    "else print why not and exit 1")
    s.add_argument("name", choices=sorted(GATES))
    s.add_argument("version")

    s = sub.add_parser("logs", help="list a logs-<run>.tar.xz, print one member to stdout, or --pack a logs-<run>/ "
                                    "folder into logs-<run>.tar.xz (pdtools/archive.py)")
    s.add_argument("--pack", action="store_true", help="ARCHIVE is a folder: write FOLDER.tar.xz beside it")
    s.add_argument("archive")
    s.add_argument("member", nargs="?")

    s = sub.add_parser("resummarize", help="judge a kept equivalence summary again from the run files its job left "
                                           "in WORK (no server started; job_equivalence.resummarize)")
    s.add_argument("eq_json")
    s.add_argument("work")

    a = p.parse_args(argv)
    if a.cmd == "merge":
        cmd_merge(a)
    elif a.cmd == "model-family":
        print(model_family(a.model))
    elif a.cmd == "logs":
        if a.pack:
            print(archive.pack(a.archive))
        elif a.member:
            sys.stdout.buffer.write(archive.read(a.archive, a.member))
        else:
            print("\n".join(archive.members(a.archive)))
    elif a.cmd == "resummarize":
        return job_equivalence.resummarize(a.eq_json, a.work)
    elif a.cmd == "gate":
        ok, why = gate(a.name, a.version)
        if not ok:
            print(why)
            return 1
    return 0
