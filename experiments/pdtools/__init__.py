"""The P/D lab (standard library only; numpy-free on purpose): its jobs, what they share, and the
one entry point ``python3 experiments/pdtools JOB|COMMAND`` (``__main__`` -> ``cli.main``).

The package exports nothing: its doors are ``__main__`` (the shell scripts' way in) and
experiments/report.py; the lab's scripts and the tests import from the module that defines a name
(``from pdtools.prompts import prompt_ids``).  Everything here runs without a GPU.

  settings     Settings (the environment a door reads once), exit codes, the servers' environment
  prompts      deterministic word-level prompts
  client       small HTTP client
  equivalence  greedy requests with logprobs and KV pulled, comparisons, the summary
  kvmetrics    "KV Transfer metrics" log lines, Prometheus NIXL counters, descriptor arithmetic
  results      benchmark results cells, idempotent merge, GPU tags
  report       the report job: results as markdown and a plot
  vllminfo     what a staged vLLM knows (read from its sources)
  handoff      the per-request handoff split
  gates        release gates from the shim's release table
  configs      the server configurations
  pair         P, D and the proxy
  cpuchecks    the CPU checks
  runs         one equivalence run, one probe, one summary
  job_*        the jobs
  cli          the jobs and the helper commands
"""
