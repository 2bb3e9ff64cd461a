"""One command per device call (experiments/run_gpu_cell.sh): run the given steps in order, then
copy the results, the log tails and this call's console into $OUT (what comes back from the GPU
machine), also when `timeout` stops the call.

    cell [--bundle DIR] STEP [STEP ...]
      stage        copy the bundle chunk(s) carried in this call (DIR/p<N>) to /tmp/stage/DIR
      setup        verify all chunks (MANIFEST) and unpack vLLM into /tmp/site (once)
      check        is vLLM staged?  (implied by every step below)
      status       nvidia-smi, GPU topology, `python -m xlkv_autopatch status`
      model        generate the random-weight model of MODEL_ARCH (default qwen3; deepseek_v2,
                   gemma3, mqa) into /tmp/xlkv-model (qwen3) or /tmp/xlkv-model-<arch> (if missing)
      equivalence  the equivalence job (EQ_* settings; EQ_NEGATIVE_CONTROL=stock,shim adds the
                   negative controls nc-stock / nc-shim to the same call)
      bench        the bench job (CONFIGS, INPUT_LENS, REPS, NUM_PROMPTS, BENCH_STATE ...)
      wire         wire_copy.py: a timed GPU0 -> GPU1 copy of one 10240-token request's KV bytes
                   (wire-<date>.json in the results; needs two GPUs)

PACK=NAME folds what the call leaves in $OUT, less console.txt and the staged release's results, into
$OUT/NAME.tgz together with WORK's logs, commands and JSON files (the device tool returns at most 8 files: the
registration reports and log extracts of a four-config call are more).

Results on the GPU machine: RESULT_DIR (/tmp/xlkv-results; kept while the machine stays warm, so
several bench calls accumulate into one JSON there); copies go to $OUT each call.  Exit code:
that of the first failing step.
"""

import contextlib
import glob
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

from . import job_bench, job_equivalence, report
from .pair import collect_log_tails, make_model
from .settings import EXIT_SETUP, EXP_DIR, REPO_DIR, LabExit, run_job, site_version

STEPS = ("stage", "setup", "check", "status", "model", "equivalence", "bench", "wire")
LOGGREP = re.compile(r"xlkv_autopatch|xlkv negative control|xlkv registration report|KV Transfer metrics|descriptor|"
                     r"[Rr]egist|Using .*backend|attention backend|Traceback|Error|ERROR")


class Cell:
    """One device call: the door's settings and where its files go (WORK, RESULT_DIR, $OUT)."""

    def __init__(self, settings, bundle=""):
        self.settings = settings
        self.bundle = bundle
        self.work = settings.get("WORK")
        self.result_dir = settings.get("RESULT_DIR", "/tmp/xlkv-results")
        self.out = settings.get("OUT") or os.path.join(self.work, "out")

    def eq_json(self):
        """The equivalence summary of the staged release: per release, so that bench calls find the right one."""
        return self.settings.get("EQ_JSON") or os.path.join(self.result_dir,
                                                            "equivalence-%s.json" % site_version(self.settings))


def _bundle(cell, cmd, bundle=""):
    return subprocess.run(["bash", os.path.join(EXP_DIR, "bundle.sh"), cmd] + ([bundle] if bundle else []),
                          env=cell.settings.environ).returncode


def _tee_console(path):
    """This process's stdout and stderr (and its children's) go to the console file too.  tee runs
    in its own session: when `timeout` ends the call it signals only this process, and a dead tee
    would lose what collect() still prints."""
    tee = subprocess.Popen(["tee", path], stdin=subprocess.PIPE, start_new_session=True)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(tee.stdin.fileno(), 1)
    os.dup2(tee.stdin.fileno(), 2)
    return tee


def _require_staged(cell):
    bundle = cell.bundle
    if not site_version(cell.settings):
        if bundle and os.path.isdir("/tmp/stage/%s" % os.path.basename(bundle)):
            print("vLLM not unpacked yet; trying setup of %s" % bundle, flush=True)
            rc = _bundle(cell, "setup", bundle)
            if rc:
                return rc
        else:
            print("ERROR: no vLLM in %s. Stage a bundle first (experiments/README.md):" % cell.settings.get("SITE"))
            print("  one call per chunk: bash experiments/run_gpu_cell.sh --bundle .xfer21 stage   (carry .xfer21/p<N>)")
            print("  then:               bash experiments/run_gpu_cell.sh --bundle .xfer21 setup", flush=True)
            return EXIT_SETUP
    return 0


def step(name, cell):
    """Runs one step; its exit code."""
    s, bundle = cell.settings, cell.bundle
    py = s.get("PY")
    if name in ("stage", "setup"):
        if not bundle:
            print("%s needs --bundle DIR" % name)
            return EXIT_SETUP
        return _bundle(cell, name, bundle)
    if name == "check":
        return _require_staged(cell) or _bundle(cell, "check")
    if name == "status":
        subprocess.run("nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv || echo 'no nvidia-smi';"
                       " nvidia-smi topo -m 2>/dev/null || true", shell=True)
        rc = _require_staged(cell)
        if rc:
            return rc
        env = dict(s.environ, PYTHONPATH="%s:%s" % (REPO_DIR, s.get("SITE")))
        for flag in ({}, {"ENABLE_XLKV": "true"}):
            subprocess.run([py, "-m", "xlkv_autopatch", "status"], env=dict(env, **flag))
        return 0
    if name == "model":   # make_model.py skips a model it finished before with the same settings (.complete)
        if s.get("MODEL"):
            return 0
        return make_model(s, s.get("MODEL_ARCH"))
    if name == "equivalence":
        return _require_staged(cell) or run_job(job_equivalence.main, s, eq_json=cell.eq_json())
    if name == "bench":
        rc = _require_staged(cell) or run_job(job_bench.main, s, eq_json=cell.eq_json(), result_dir=cell.result_dir)
        if rc:
            return rc
        wires = sorted(glob.glob(os.path.join(cell.result_dir, "wire-*.json")))
        for f in sorted(glob.glob(os.path.join(cell.result_dir, "20*.json"))):
            try:                    # each file's markdown and plot (not on the console); a report that fails costs nothing
                with contextlib.redirect_stdout(io.StringIO()):
                    report.main([f] + (["--wire", wires[-1]] if wires else []))
            except Exception as e:
                print("report.py %s: %s" % (f, e))
        return 0
    if name == "wire":    # the image's torch is enough for a copy; no vLLM needed
        return subprocess.run([py, os.path.join(EXP_DIR, "wire_copy.py"), "--out", os.path.join(
            cell.result_dir, "wire-%s.json" % time.strftime("%Y-%m-%d"))], env=s.environ).returncode
    print("unknown step '%s' (%s)" % (name, " ".join(STEPS)))
    return EXIT_SETUP


def collect(rc, cell, console):
    """The call's files into OUT: log tails and extracts, the staged release's results, the CPU
    checks' results, D's registration reports, the console."""
    work, out, result_dir = cell.work, cell.out, cell.result_dir
    signal.signal(signal.SIGTERM, signal.SIG_IGN)    # never stop half-way through copying
    if rc:
        print("run_gpu_cell: stopped with exit %d at %s" % (rc, time.strftime("%H:%M:%SZ", time.gmtime())))
    try:
        collect_log_tails(work, os.path.join(out, "logtails.txt"), cell.settings.get("TAIL_LINES", "80"))
    except OSError:
        pass
    logs = sorted(glob.glob(os.path.join(work, "eq-*.log")) + glob.glob(os.path.join(work, "bench-*-[pd].log")))
    n = 0
    with open(os.path.join(out, "loggrep.txt"), "w") as g:
        for path in logs:
            with open(path, errors="replace") as f:
                for i, line in enumerate(f, 1):
                    if n < 3000 and LOGGREP.search(line):
                        g.write(("%s:%d:%s" % (path, i, line.rstrip("\n")))[:600] + "\n")
                        n += 1
    # only the staged release's results: the device tool returns a limited number of files, and
    # a second release's files would crowd out the logs (seen in the fourth session)
    ver, other, results = site_version(cell.settings), [], set()
    for pattern in ("*.json", "*.md", "*.png"):
        for f in sorted(glob.glob(os.path.join(result_dir, pattern))):
            n = os.path.basename(f)
            if not ver or "-%s-" % ver in n or n.endswith("-%s.json" % ver) or n.startswith("wire-"):
                shutil.copy(f, out)
                results.add(n)
            else:
                other.append(n)
    if other:
        print("run_gpu_cell: kept on the machine (not vLLM %s): %s" % (ver, " ".join(other)))
    # an EQ_JSON outside RESULT_DIR comes back too (it stayed on the machine in the lease of 2026-11-27 18:36)
    eq_json = cell.settings.get("EQ_JSON")
    extra = [eq_json] if eq_json and os.path.dirname(os.path.abspath(eq_json)) != os.path.abspath(result_dir) else []
    for f in [os.path.join(work, "cpu-stock.json"), os.path.join(work, "cpu-xlkv.json")] + extra + \
            sorted(glob.glob(os.path.join(work, "*-registration.json"))):
        if os.path.isfile(f):
            shutil.copy(f, out)
    if cell.settings.get("PACK"):
        pack(out, work, cell.settings.get("PACK"), keep=results)
    print("run_gpu_cell: exit %d; files in $OUT: %s console.txt" % (rc, " ".join(sorted(os.listdir(out)))),
          flush=True)
    sys.stderr.flush()
    time.sleep(0.3)
    try:
        shutil.copy(console, os.path.join(out, "console.txt"))
    except OSError:
        pass


#: WORK's files a PACK keeps (the model's weights and the bench client's own log stay out)
PACKED = (".log", ".txt", ".json", ".jsonl")


def pack(out, work, name, keep=()):
    """Moves every file of ``out`` but console.txt and ``keep`` into out/NAME.tgz (under out/), with WORK's logs,
    commands and JSON files two folders deep (under work/)."""
    path = os.path.join(out, "%s.tgz" % name)
    moved = [n for n in sorted(os.listdir(out)) if os.path.isfile(os.path.join(out, n))
             and n not in keep and n != "console.txt" and n != os.path.basename(path)]
    with tarfile.open(path, "w:gz") as tar:
        for n in moved:
            tar.add(os.path.join(out, n), arcname="out/" + n)
        for d, _, files in os.walk(work) if os.path.isdir(work) else []:
            rel = os.path.relpath(d, work)
            if rel.count(os.sep) >= 1:      # WORK and its folders (bench/), not deeper
                continue
            for n in sorted(files):
                if n.endswith(PACKED) and not n.startswith("bench-client"):
                    tar.add(os.path.join(d, n), arcname=os.path.normpath(os.path.join("work", rel, n)))
    for n in moved:
        os.remove(os.path.join(out, n))
    print("run_gpu_cell: packed %d files of $OUT and WORK's logs into %s (%d bytes)" % (
        len(moved), os.path.basename(path), os.path.getsize(path)))


def main(settings, argv):
    """The call with the door's ``settings`` and its arguments; its exit code."""
    bundle = ""
    if argv[:1] == ["--bundle"]:
        if len(argv) < 2:
            print("--bundle DIR")
            return EXIT_SETUP
        bundle, argv = argv[1], argv[2:]
    if not argv:
        print(__doc__.split("\n\n")[1])
        return EXIT_SETUP
    cell = Cell(settings, bundle)
    for d in (cell.work, cell.result_dir, cell.out):
        os.makedirs(d, exist_ok=True)
    console = os.path.join(cell.work, "console-%s.txt" % time.strftime("%H%M%S"))
    _tee_console(console)
    os.chdir(REPO_DIR)

    def stopped(signum, frame):
        raise LabExit(143 if signum == signal.SIGTERM else 130)
    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    rc = 0
    try:
        for name in argv:
            print("===== step: %s (%s) =====" % (name, time.strftime("%H:%M:%SZ", time.gmtime())), flush=True)
            rc = step(name, cell)
            if rc:
                break
    except LabExit as e:
        rc = e.code
    collect(rc, cell, console)
    return rc
