"""XLKV_DETOK_TAIL (patches/incremental_detokenizer.py) through vLLM's own
FastIncrementalDetokenizer, per release: the text of every new token, step by step through vLLM's
decode_next (its invalid-prefix recovery included), is the same with the switch on as with stock vLLM
(ENABLE_XLKV unset), on a byte-level BPE and a SentencePiece-like BPE trained in the test, special
tokens skipped and kept; the tail was taken for most requests and vLLM's priming kept for the two
hazards (a prompt ending inside a character, a tail of special tokens only).  The comparison has
teeth: on the hazard prompts, a stream primed with the unguarded tail gives another text through the
same vLLM code.  Releases without whole-prompt priming (0.12-0.16) get no wrapper at all.

Fault injection: P/D's failures reach the API server as finish reasons and aborts, so
the same processes drive vLLM's own OutputProcessor through them, switch on and stock: a KV load that
failed under kv_load_failure_policy=fail (ERROR, no token), the engine aborting a request (a dead or
timed-out prefill), the client aborting mid-stream (outputs still arriving), a recompute (empty steps,
then tokens), the hazard prompts ending in an abort or an error, and a new request after them.  Every
RequestOutput is compared; a planted fault (the tail without its guards) changes the hazard paths.

The TTFT this buys is measured on two GPUs (experiments/results/2026-11-27e-*handoff-ab*), its
behaviour in a whole vLLM server on CPU by experiments/probes/detok_prime_cpu.py (not in CI)."""

import json
import os
import sys
import textwrap

import pytest

from conftest import release_of, run_in

SCRIPT = textwrap.dedent(r'''
    TESTS = "@TESTS@"   # tests/, for trained_tokenizers.py
    import json, random, sys
    from types import SimpleNamespace
    from tokenizers.decoders import DecodeStream
    from transformers import PreTrainedTokenizerFast
    from vllm.sampling_params import SamplingParams
    import logging
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")  # INFO lines to stderr
    import vllm.v1.engine.detokenizer as m

    sys.path.insert(0, TESTS)
    from trained_tokenizers import TEXT, byte_level, metaspace

    def cases(tok, seed):
        rng = random.Random(seed)
        ids, vocab = tok.encode(TEXT).ids, tok.get_vocab_size()
        out = []
        for _ in range(25):
            a = rng.randrange(0, len(ids) - 500)
            b = rng.randrange(a + 80, a + 480)
            prompt = ids[a:b] if rng.random() < 0.7 else [rng.randrange(vocab) for _ in range(rng.randrange(80, 300))]
            cont = ids[b:b + 16] if rng.random() < 0.5 else [rng.randrange(vocab) for _ in range(16)]
            out.append((prompt, cont))
        return out

    def hazards(name, tok):
        if name == "byte-level":   # the prompt ends inside an emoji
            ids = tok.encode("abc " * 40 + "\U0001F642").ids
            cut = [i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith("\ufffd")][-1]
            return [(ids[:cut], ids[cut:] + tok.encode(" done").ids)]
        special = [tok.token_to_id("<0x%02X>" % b) for b in (0x41, 0x42, 0x43, 0x44)] * 17   # 68 ids, text ""
        return [(tok.encode("The quick brown fox").ids + special, tok.encode("\u2581jumps over").ids)]

    def detok(hf, prompt, skip, rid):
        req = SimpleNamespace(request_id=rid, prompt_token_ids=prompt,
                              sampling_params=SamplingParams(max_tokens=32, skip_special_tokens=skip))
        return m.FastIncrementalDetokenizer(hf, req)

    out = {"wrapped": type(vars(m.FastIncrementalDetokenizer)["__init__"]).__name__, "texts": {}, "unguarded": {}}
    for name, make in (("byte-level", byte_level), ("metaspace", metaspace)):
        tok = make()
        hf = PreTrainedTokenizerFast(tokenizer_object=tok)
        for skip in (True, False):
            for i, (prompt, cont) in enumerate(cases(tok, 7) + hazards(name, tok)):
                d = detok(hf, prompt, skip, "r%d" % i)
                out["texts"]["%s/%s/%d" % (name, skip, i)] = [d.decode_next(t) for t in cont]
            if skip:   # the planted fault: vLLM's code, stepped from the tail without the switch's checks
                for j, (prompt, cont) in enumerate(hazards(name, tok)):
                    d = detok(hf, prompt, skip, "h%d" % j)
                    d.stream = DecodeStream(ids=prompt[-64:], skip_special_tokens=skip)
                    out["unguarded"]["%s/%d" % (name, j)] = [d.decode_next(t) for t in cont]
    mod = sys.modules.get("xlkv_autopatch.patches.incremental_detokenizer")
    out["counts"] = dict(mod.COUNTS) if mod else None

    # The failure paths of P/D as vLLM's API server sees them, through vLLM's own OutputProcessor: a
    # KV load that failed under kv_load_failure_policy=fail (the request ends with ERROR and no token),
    # the engine aborting a request (a dead or timed-out prefill seen by decode), the client aborting
    # mid-stream (outputs still arriving for it afterwards), a recompute (tokens after empty steps),
    # and after each, a new request on the same processor: decode serving on.
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.sampling_params import RequestOutputKind

    def scenarios(tok):
        ids, haz = tok.encode(TEXT).ids, hazards("byte-level", tok)[0]
        long_a, long_b, cont = ids[100:400], ids[600:900], ids[400:412]
        return [  # (name, prompt, steps); a step: ("tokens", [ids], finish or None) or ("client_abort",)
            ("normal", long_a, [("tokens", cont[:4], None), ("tokens", cont[4:8], "LENGTH")]),
            ("load_failed_policy_fail", long_b, [("tokens", [], "ERROR")]),
            ("engine_abort", long_a, [("tokens", cont[:3], None), ("tokens", [], "ABORT")]),
            ("client_abort", long_b, [("tokens", cont[:3], None), ("client_abort",), ("tokens", cont[3:5], None)]),
            ("recompute", long_a, [("tokens", [], None), ("tokens", [], None), ("tokens", cont[:5], "LENGTH")]),
            ("hazard_client_abort", haz[0], [("tokens", haz[1][:3], None), ("client_abort",)]),
            ("hazard_error_after_tokens", haz[0], [("tokens", haz[1][:2], None), ("tokens", [], "ERROR")]),
            ("served_on", long_b, [("tokens", cont[:6], "LENGTH")]),
        ]

    def new_request(rid, prompt):
        sp = SamplingParams(max_tokens=32, skip_special_tokens=True, output_kind=RequestOutputKind.DELTA)
        given = dict(request_id=rid, prompt_token_ids=prompt, sampling_params=sp, arrival_time=0.0)
        fields = EngineCoreRequest.__struct_fields__
        req = EngineCoreRequest(**{f: given.get(f) for f in fields[:len(fields) - len(EngineCoreRequest.__struct_defaults__)]})
        if "external_req_id" in EngineCoreRequest.__struct_fields__:
            req.external_req_id = rid   # 0.33 asserts it (the API server sets it)
        return req

    def run_paths(hf, tok, tag):
        proc, seen = OutputProcessor(hf, log_stats=False), {}
        for name, prompt, steps in scenarios(tok):
            rid = "%s-%s" % (tag, name)
            proc.add_request(new_request(rid, prompt), None)
            trace = seen[name] = []
            for step in steps:
                if step[0] == "client_abort":
                    trace.append(["client_abort", sorted(proc.abort_requests([rid], internal=False))])
                    continue
                finish = getattr(FinishReason, step[2]) if step[2] else None
                res = proc.process_outputs([EngineCoreOutput(request_id=rid, new_token_ids=list(step[1]),
                                                             finish_reason=finish)])
                trace.append([[ro.request_id, [(c.text, list(c.token_ids), c.finish_reason) for c in ro.outputs],
                               ro.finished] for ro in res.request_outputs])
            trace.append(["open", proc.get_num_unfinished_requests()])
        return seen

    tok = byte_level()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    out["paths"] = run_paths(hf, tok, "p")
    out["counts_paths"] = dict(mod.COUNTS) if mod else None
    # the planted fault: the shim's tail without its guards (the wrapper calls prompt_tail.tail)
    if mod is not None:
        import xlkv_autopatch.prompt_tail as pt
        tail = pt.tail
        pt.tail = lambda prompt, decode, n=pt.TAIL_IDS, joins=None: list(prompt[-n:]) if prompt and len(prompt) > n else None
        out["paths_planted"] = run_paths(hf, tok, "p")
        pt.tail = tail

    # Real vocabularies (test_real_vocabularies_...): the lab's fuzz in this process, then with its planted fault
    import os
    vocabs = os.environ.get("XLKV_TEST_VOCABS")
    if mod is not None and vocabs:
        sys.path.insert(0, "@PROBES@")
        import detok_fuzz
        out["vocab"] = {"fuzz": detok_fuzz.fuzz(vocabs, detok_fuzz.real_vocabularies.NAMES, 100, "0"),
                        "reproducers": detok_fuzz.reproducers(vocabs)}
        detok_fuzz.plant()
        out["vocab"]["planted_fuzz"] = detok_fuzz.fuzz(vocabs, detok_fuzz.real_vocabularies.SENTENCEPIECE, 100, "0")
        out["vocab"]["planted_reproducers"] = detok_fuzz.reproducers(vocabs)
    print("RESULT " + json.dumps(out))
''').replace("@TESTS@", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).replace(
    "@PROBES@", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "experiments", "probes"))


def _run(python, env):
    r = run_in(python, ["-c", SCRIPT], env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), r.stdout + r.stderr   # vLLM 0.21's log handler writes to stdout


#: python -> (stock's result, the switch's result, the switch's log): one pair of processes per release
_RUNS = {}


def _runs(python, vocab_dir):
    if python not in _RUNS:
        stock, _ = _run(python, {})
        on, log = _run(python, {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true", "XLKV_TEST_VOCABS": vocab_dir})
        _RUNS[python] = stock, on, log
    return _RUNS[python]


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    """The real vocabularies (tests/real_vocabularies.py) as files a vLLM environment reads with ``tokenizers``."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import real_vocabularies  # tests/real_vocabularies.py
    return real_vocabularies.save_all(str(tmp_path_factory.mktemp("vocabs")))


def test_the_switch_gives_vllms_text_through_vllms_detokenizer(vllm_env, vocab_dir):
    version, python = vllm_env
    stock, on, log = _runs(python, vocab_dir)
    assert stock["wrapped"] == "function" and stock["counts"] is None, stock["wrapped"]
    if release_of(vllm_env) < (0, 17):
        # nothing primed, nothing wrapped: the switch does nothing there
        assert on["wrapped"] == "function" and not any((on["counts"] or {}).values()), (on["wrapped"], on["counts"])
        assert on["texts"] == stock["texts"]
        assert on["paths"] == stock["paths"]
        return
    assert on["wrapped"] == "XlkvFunctionWrapper", on["wrapped"]
    assert on["texts"].keys() == stock["texts"].keys()
    differ = [k for k in stock["texts"] if on["texts"][k] != stock["texts"][k]]
    assert differ == [], [(k, stock["texts"][k], on["texts"][k]) for k in differ[:3]]
    counts = on["counts"]
    # 2 tokenizers x 2 skip settings x (25 random + 1 hazard), and the planted fault's 2 (tail taken there)
    assert counts["error"] == 0, (counts, log[-3000:])
    assert counts["tail"] + counts["kept"] == 2 * 2 * 26 + 2, counts
    assert counts["tail"] >= 80, counts          # the tail was taken for most requests, not only the fallback
    assert counts["kept"] >= 2, counts           # at least the two hazards (skipped special tokens) kept vLLM's
    assert log.count("decoded against the prompt's last 64 ids") == 1, log[-3000:]   # once per process
    # teeth: the unguarded tail, through the same vLLM code, changes the hazard prompts' text
    for key, texts in on["unguarded"].items():
        name, j = key.split("/")
        hazard = "%s/True/%d" % (name, 25 + int(j))   # the hazards follow the 25 random cases
        assert texts != stock["texts"][hazard], (key, texts)
    # P/D's failure paths through vLLM's OutputProcessor: every output, finish reason and abort the same as
    # stock, nothing left open, and the next request served
    assert on["paths"].keys() == stock["paths"].keys() and len(stock["paths"]) == 8
    differ = [k for k in stock["paths"] if on["paths"][k] != stock["paths"][k]]
    assert differ == [], [(k, stock["paths"][k], on["paths"][k]) for k in differ[:2]]
    for name, trace in stock["paths"].items():
        assert trace[-1] == ["open", 0], (name, trace[-1])
    assert stock["paths"]["load_failed_policy_fail"][0][0][1] == [["", [], "error"]]
    assert stock["paths"]["client_abort"][-2] == [], stock["paths"]["client_abort"]   # outputs after the abort: none
    assert stock["paths"]["served_on"][0][0][1][0][2] == "length"
    paths = {k: on["counts_paths"][k] - counts[k] for k in counts}
    assert paths == {"tail": 6, "kept": 2, "error": 0}, paths   # the tail taken; the two hazard prompts kept
    # teeth: the shim's tail without its guards (planted in the same process) changes the hazard paths' text
    planted = [k for k in stock["paths"] if on["paths_planted"][k] != stock["paths"][k]]
    assert planted == ["hazard_client_abort", "hazard_error_after_tokens"], planted


# --- Real vocabularies (tests/real_vocabularies.py), through vLLM's detokenizer: a small form of the lab's
# fuzz (experiments/probes/detok_fuzz.py; its long form's results: experiments/results/*-detok-fuzz-*.json), run
# in the switch's process of the test above.

def test_real_vocabularies_give_vllms_text_through_vllms_detokenizer(vllm_env, vocab_dir):
    """SentencePiece byte fallback (Mistral v1, v3) and byte-level BPE (DeepSeek-V4, Qwen3.6, Tekken): 100
    fuzzed cases per vocabulary and skip_special_tokens setting, each detokenized by vLLM's class with the
    switch off and on in one process, equal token by token; the three reported byte-run prompts give vLLM's
    text; the same fuzz with the tail cut at 64 ids whatever the run (planted) differs on SentencePiece."""
    if release_of(vllm_env) < (0, 17):
        pytest.skip("vLLM < 0.17 primes no prompt: nothing is wrapped (the test above checks it)")
    out = _runs(vllm_env[1], vocab_dir)[1]["vocab"]
    for name, row in out["fuzz"].items():
        assert row["cases"] == 200 and row["differ"] == 0 and row["error"] == 0, (name, row)
        assert row["tail"] >= 60 and row["kept"] >= 20, (name, row)   # both ways taken, not only one
    for what, (stock, switch) in out["reproducers"].items():
        assert stock[0].startswith("Hello world\ufffd") and switch == stock, (what, stock, switch)
    # teeth: the planted tail changes the text on both SentencePiece vocabularies and in every reproducer
    planted = {name: row["differ"] for name, row in out["planted_fuzz"].items()}
    assert planted["mistral-v1"] >= 1 and planted["mistral-v3"] >= 1, planted
    assert all(switch != stock for stock, switch in out["planted_reproducers"].values()), out["planted_reproducers"]
