"""The tiny model directory: loads in transformers, caches by config hash, is written atomically."""

import json
import math
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from system.config.data import ArithmeticTaskConfig
from system.config.model import TinyModelConfig
from system.data.arithmetic import ArithmeticPrompts
from system.models.tiny import build_key, build_tiny_model
from system.models.tokenizer import train_char_tokenizer
from system.models.warm_start import IGNORE, answer_batch
from system.types import Prompt

MODEL = TinyModelConfig(warm_start_steps=60, warm_start_label_smoothing=0.0)
TASK = ArithmeticTaskConfig(num_prompts=1000)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    return cache, build_tiny_model(MODEL, TASK, seed=0, cache_dir=cache)


def build_info(model_dir) -> dict:
    return json.loads((Path(model_dir) / "aisrl_build.json").read_text())


def test_directory_loads_in_transformers_with_untied_head(built):
    _, model_dir = built
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings is False
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    assert head.data_ptr() != embed.data_ptr() and not torch.equal(head, embed)
    # 3 specials + the 12 characters of the task ("0".."9", "+", "=")
    assert model.config.vocab_size == len(tok) == 15
    assert tok.eos_token == "<eos>" and model.config.eos_token_id == tok.eos_token_id == 1
    ids = tok.encode("37+45=82")
    assert len(ids) == 8 and tok.decode(ids) == "37+45=82"
    n = sum(p.numel() for p in model.parameters())
    assert build_info(model_dir)["num_parameters"] == n


def test_warm_start_learns_the_answers(built):
    _, model_dir = built
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    fresh = [ArithmeticPrompts(TASK, seed=99)[i] for i in range(64)]  # prompts of another seed
    input_ids, labels = answer_batch(tok, fresh)
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                            ignore_index=IGNORE)
    # a uniform guess over 15 tokens costs ln 15 = 2.71 nats; 60 steps must beat it clearly
    assert nll.item() < math.log(15) - 0.5
    losses = build_info(model_dir)["warm_start_losses"]
    assert len(losses) == 60 and losses[-1] < losses[0]


def test_second_call_is_a_cache_hit(built, caplog):
    cache, model_dir = built
    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level("WARNING", logger="system.models.tiny"):
        again = build_tiny_model(MODEL, TASK, seed=0, cache_dir=cache)
    assert caplog.records == []  # only a build is said (test_a_build_says_so_once)
    assert again == model_dir  # the file's unchanged mtime (below) shows nothing was rebuilt
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert model_dir.name == f"tiny-{build_key(MODEL, TASK, 0)}"


def test_a_build_says_so_once(tmp_path, caplog):
    """A first run was silent while the model built (a probe: 179 s for a 1200-step warm start)."""
    small = MODEL.model_copy(update={"warm_start_steps": 2})
    with caplog.at_level("WARNING", logger="system.models.tiny"):
        build_tiny_model(small, TASK, seed=0, cache_dir=tmp_path)
        build_tiny_model(small, TASK, seed=0, cache_dir=tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        f"building the tiny model (2 warm-start steps; once: later runs take it from {tmp_path})"]


def test_key_covers_model_task_and_seed():
    keys = {
        build_key(MODEL, TASK, 0),
        build_key(MODEL, TASK, 1),
        build_key(MODEL.model_copy(update={"warm_start_steps": 61}), TASK, 0),
        build_key(MODEL, TASK.model_copy(update={"num_digits": 3}), 0),
    }
    assert len(keys) == 4


def test_concurrent_builders_agree_and_leave_no_temp_dirs(tmp_path):
    cfg = TinyModelConfig(warm_start_steps=2)
    results = []
    threads = [threading.Thread(target=lambda: results.append(build_tiny_model(cfg, TASK, 0, tmp_path)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]


def test_answer_batch_masks_the_prompt():
    tok = train_char_tokenizer(["1+2=3", "10+20=30"], model_max_length=32)
    input_ids, labels = answer_batch(tok, [Prompt("a", "1+2=", "3"), Prompt("b", "10+20=", "30")])
    enc = tok.convert_tokens_to_ids
    assert input_ids[0].tolist() == [enc(c) for c in "1+2=3"] + [tok.eos_token_id] + [tok.pad_token_id] * 3
    assert labels[0].tolist() == [IGNORE] * 4 + [enc("3"), tok.eos_token_id] + [IGNORE] * 3
    assert labels[1].tolist() == [IGNORE] * 6 + [enc("3"), enc("0"), tok.eos_token_id]


def test_tokenizer_needs_text():
    with pytest.raises(ValueError, match="training text is empty"):
        train_char_tokenizer([], model_max_length=32)


def test_a_saved_tokenizer_encodes_as_in_memory_after_any_reload(tmp_path):
    """Found by a probe: beside a ``qwen2`` config transformers (so vLLM) reloads any tokenizer as
    ``Qwen2Tokenizer``, a byte-level BPE built from the vocabulary; the plain character vocabulary then
    lost every space, newline and non-ASCII character ('Question: What is' -> 'Question:Whatis') while the
    warm start had trained on them. The byte-level vocabulary encodes the same ids in memory, through
    AutoTokenizer and through vLLM's loader; with ``all_bytes`` an unseen character is kept too."""
    from vllm.tokenizers import get_tokenizer

    from system.models.tiny import qwen2_config

    tok = train_char_tokenizer(["Question: What is 3 plus 4?\nAnswer: 7", "fa più"], 128, all_bytes=True)
    tok.save_pretrained(tmp_path)
    qwen2_config(TinyModelConfig(), len(tok), tok.eos_token_id, tok.pad_token_id).save_pretrained(tmp_path)
    reloaded, engine_side = AutoTokenizer.from_pretrained(tmp_path), get_tokenizer(str(tmp_path))
    for text in ("Question: What is 3 plus 4?\nAnswer:", "fa più", "Ω ünseen"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text and reloaded.encode(text) == ids and engine_side.encode(text) == ids, text
    # 3 specials + 256 bytes; "Q" is one token, "ù" two (its UTF-8 bytes), " " one
    assert len(tok) == 259 and len(tok.encode("Q")) == 1 and len(tok.encode("ù")) == 2 and len(tok.encode(" ")) == 1


def test_a_built_in_task_keeps_its_character_ids():
    """The byte-level form gives an ASCII task the ids of a plain character tokenizer (specials 0-2, then
    the characters by frequency): the default model is the same model. In "11+2=13" "1" is the most
    frequent character (4), then "+", "2", "3", "=" (1 each, in character order)."""
    tok = train_char_tokenizer(["11+2=13"], 32)
    assert [tok.convert_tokens_to_ids(c) for c in "1+23="] == [3, 4, 5, 6, 7] and len(tok) == 8


def test_the_key_covers_a_dataset_files_content(tmp_path):
    """Found by a probe: the cache key held the dataset's path only, so an edited file reused the old
    build (and its tokenizer, which lacked the new characters)."""
    from system.config.data import JsonlTaskConfig

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    task = JsonlTaskConfig(path=str(data))
    before = build_key(MODEL, task, 0)
    assert build_key(MODEL, task, 0) == before
    data.write_text('{"question": "1+1 ù?", "answer": "#### 2"}\n')
    assert build_key(MODEL, task, 0) != before


def test_the_warm_start_draws_again_past_a_prompt_too_long_for_the_context(monkeypatch):
    """Found by a probe: one 50 KB prompt in a dataset padded a warm-start batch to its length (a 160 GB
    allocation) before the run's context check could refuse or skip it. Such a prompt is drawn again;
    every batch fits the 32 positions; with only overlong prompts the warm start ends at once."""
    import system.models.warm_start as ws
    from system.models.tiny import qwen2_config

    tok = train_char_tokenizer(["1+2=3", "10+20=30"], model_max_length=32)
    model = AutoModelForCausalLM.from_config(qwen2_config(TinyModelConfig(), len(tok), 1, 0))
    widths, real = [], ws.answer_batch
    monkeypatch.setattr(ws, "answer_batch", lambda t, b: widths.append(real(t, b)[0].shape[1]) or real(t, b))
    prompts = [Prompt("a", "1+2=", "3"), Prompt("long", "1+2=" * 5000, "3"), Prompt("b", "10+20=", "30")]
    losses = ws.warm_start(model, tok, prompts, num_steps=3, lr=1e-3, seed=0, batch_size=8)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and max(widths) <= 9  # "10+20=30<eos>"
    assert ws.warm_start(model, tok, [Prompt("long", "1+2=" * 5000, "3")], 3, 1e-3, 0, batch_size=8) == []


def test_a_context_too_short_for_the_tasks_prompt_and_answer_is_refused_and_nothing_cached(tmp_path):
    """Found by a probe: ``num_digits=9`` with a 24-position context (a 20-character prompt, a 10-digit
    answer) warm-started 0 of its steps, silently; the untrained model was cached and trained on."""
    model = TinyModelConfig(warm_start_steps=5, max_position_embeddings=24)
    with pytest.raises(ValueError, match=r"model.max_position_embeddings=24: the task's prompts and answers do not "
                                         r"fit .* it ended after 0 of 5 steps"):
        build_tiny_model(model, ArithmeticTaskConfig(num_prompts=100, num_digits=9), seed=0, cache_dir=tmp_path)
    assert not any(p.is_dir() and (p / "config.json").exists() for p in tmp_path.rglob("*"))
    # such a model cached by an older version (0 warm-start steps recorded) is built again, so refused
    cached = tmp_path / f"tiny-{build_key(model, ArithmeticTaskConfig(num_prompts=100, num_digits=9), 0)}"
    cached.mkdir()
    (cached / "aisrl_build.json").write_text(json.dumps({"warm_start_losses": []}))
    with pytest.raises(ValueError, match="ended after 0 of 5 steps"):
        build_tiny_model(model, ArithmeticTaskConfig(num_prompts=100, num_digits=9), seed=0, cache_dir=tmp_path)
