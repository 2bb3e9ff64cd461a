"""experiments/make_model.py: the word-level tokenizer maps the experiment prompts to the
intended ids (so a prompt of n words is n tokens); the weights part needs torch+transformers."""

import json
import os
import subprocess
import sys

import pytest

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
sys.path.insert(0, os.path.join(EXP, "probes"))   # model_check.py
import pdtools  # noqa: E402


def test_tokenizer_roundtrip(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(tmp_path), "--tokenizer-only"],
                   check=True, capture_output=True)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for n, seed in ((5, 0), (4097, 0), (300, 7)):
        enc = tok.encode(pdtools.prompt_text(n, seed))
        assert enc.ids == pdtools.prompt_ids(n, seed)  # no BOS, one token per word
    assert tok.decode([5, 7, 31999]) == "w5 w7 w31999"
    assert tok.encode("w5 nonsense").ids == [5, 0]
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<eos>" and tok.token_to_id("<eos>") == 1
    assert not (tmp_path / ".complete").exists()  # tokenizer only: not a finished model


def test_model_config_shape(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    subprocess.run([sys.executable, os.path.join(EXP, "make_model.py"), str(tmp_path), "--layers", "2"],
                   check=True, capture_output=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (2, 8, 128)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == 32000
    assert pdtools.model_block_bytes(str(tmp_path)) == 16 * 2 * 2 * 8 * 128 * 2
    assert (tmp_path / ".complete").exists()


@pytest.mark.slow
def test_varied_init_gives_outputs_that_depend_on_the_prompt():
    """The real 28-layer shape on CPU: with --init varied greedy outputs vary (>= 8 distinct ids
    in 16) and change with the context; transformers' own init repeats a few ids (the reason
    for --init varied: an equivalence check over such outputs could hardly fail)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import model_check

    varied = model_check.check(layers=28, init="varied", lengths=(17,), new_tokens=16, fp32=False)["prompts"]["17"]
    assert varied["distinct"] >= 8 and varied["context"] >= 8, varied
    hf = model_check.check(layers=28, init="hf", lengths=(17,), new_tokens=16, fp32=False)["prompts"]["17"]
    assert hf["distinct"] < 8, hf
