"""A fake NVIDIA Dynamo (``python -m dynamo.vllm`` and ``python -m dynamo.frontend``) for CPU tests of the lab's
``dynamo-<config>`` configs: just enough of what experiments/pdtools/dynamo.py relies on (file discovery in
DYN_FILE_KV, a worker's /health and /metrics on DYN_SYSTEM_PORT, the frontend's /v1/models once a prefill worker
is found and its log line saying so, OpenAI's completions fields alone, the frontend's timing histograms)."""
