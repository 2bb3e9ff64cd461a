"""Helpers of the P/D experiment scripts (standard library only; numpy-free on purpose).

The shell scripts call the package as a command line tool (``python3 experiments/pdtools
<cmd>``, see ``cli.py``); report.py and the tests in ``tests/experiments`` import it.
Everything here runs without a GPU.

  prompts      deterministic word-level prompts
  client       small HTTP client
  equivalence  greedy requests with logprobs and KV pulled, comparisons, the summary
  kvmetrics    "KV Transfer metrics" log lines, Prometheus NIXL counters, descriptor arithmetic
  results      benchmark results cells, idempotent merge, GPU tags
  vllminfo     what a staged vLLM knows (read from its sources)
  cli          the sub-commands
"""

from .client import http_json, http_text  # noqa: F401
from .equivalence import (TOP_LOGPROBS, _extract_logprobs, _extract_token_ids, compare_runs,  # noqa: F401
                          distinct_ids, equiv_run, greedy_request, is_negative_control, kv_pulled, logprob_diff,
                          outputs_key, render_equivalence, summarize_equivalence, transfers_of)
from .kvmetrics import (DTYPE_BYTES, KEY_DESC, KEY_MB, KEY_N, KEY_P90, KEY_POST, KEY_TPUT, KEY_XFER,  # noqa: F401
                        KV_LINE_RE, PROM_KEYS, aggregate_kv, attention_backend, block_bytes, blocks_for_prompt,
                        blocks_per_transfer, descriptor_limit, descriptors_per_block, kv_run, kv_summary,
                        load_registration, model_block_bytes, model_family, NotDense, parse_kv_line, parse_prom,
                        prom_delta, read_kv_lines, registration_bytes_per_block, registration_summary)
from .prompts import DEFAULT_EQ_LENGTHS, VOCAB_HI, VOCAB_LO, _mix64, prompt_ids, prompt_text  # noqa: F401
from .results import CELL_KEY, PER_REP, cell_from_runs, cell_key, gpu_slug, merge_results  # noqa: F401
from .vllminfo import BATCH_INVARIANT_FILES, vllm_has_batch_invariant  # noqa: F401
from .cli import main  # noqa: F401
