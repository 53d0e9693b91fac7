"""Dataset prompts the model's context cannot hold are found at start (``system.data.context_fit``).

Found by a probe (2026-11-27): a GSM8K prompt longer than the model's context reached vLLM, which
refuses it inside a generate call; the run ended, and every resume issued that prompt first again."""

import json

import pytest
from transformers import Qwen2Config

from system.config import ConfigError, resolve_config
from system.data.context_fit import (
    KeptPrompts,
    context_length,
    fit_dataset_prompts,
    fit_to_context,
    token_counter,
)
from system.models.tokenizer import train_char_tokenizer
from system.types import Prompt


def test_context_length_as_vllm_derives_it():
    """vLLM 0.32's rule (``vllm/config/model.py``, ``_get_and_verify_max_len``), case by case."""
    assert context_length(Qwen2Config(max_position_embeddings=4096)) == 4096
    # YaRN's max_position_embeddings already counts the scaling; a linear factor multiplies it
    assert context_length(Qwen2Config(max_position_embeddings=4096, rope_scaling={"rope_type": "yarn", "factor": 4.0})) == 4096
    assert context_length(Qwen2Config(max_position_embeddings=4096, rope_scaling={"rope_type": "linear", "factor": 4.0})) == 16384
    cfg = Qwen2Config(max_position_embeddings=4096)
    cfg.seq_length = 2048  # the smallest of the length keys wins
    assert context_length(cfg) == 2048
    cfg.model_max_length = 3000  # set in the model's config, it overrides the keys
    assert context_length(cfg) == 3000
    assert context_length(object()) is None


@pytest.mark.parametrize("change, needle", [
    # a probe: a string factor made the context "2" repeated 2048 times, every prompt passing the check
    (dict(rope_scaling={"type": "linear", "factor": "2"}), "the RoPE factor is '2'"),
    (dict(rope_scaling={"type": "linear", "factor": -2.0}), "the RoPE factor is -2.0"),  # refused every prompt
    (dict(rope_scaling={"type": "linear", "factor": 0.0}), "the RoPE factor is 0.0"),
    (dict(seq_length=float("inf")), "seq_length is inf"),  # an OverflowError naming nothing
    (dict(seq_length="4096"), "seq_length is '4096'"),
])
def test_a_model_config_with_a_nonsense_length_or_rope_factor_is_refused_naming_the_key(change, needle):
    cfg = Qwen2Config(max_position_embeddings=2048)
    for key, value in change.items():  # seq_length: a length key Qwen2Config does not validate itself
        setattr(cfg, key, value)
    with pytest.raises(ValueError, match="the model's config.json: " + needle.replace("(", r"\(")):
        context_length(cfg)


def test_a_model_max_length_of_zero_or_below_counts_as_not_given():
    """A probe: model_max_length -5 won over max_position_embeddings 2048 (the ``or`` skipped only 0)."""
    cfg = Qwen2Config(max_position_embeddings=2048)
    cfg.model_max_length = -5
    assert context_length(cfg) == 2048


def _prompts(*lengths: int) -> list[Prompt]:
    return [Prompt(f"p{i}", "x" * n, "1") for i, n in enumerate(lengths)]


def count_chars(prompts):
    return [len(p.text) for p in prompts]


def test_overlong_prompts_are_refused_or_left_out_and_counted():
    source = _prompts(5, 12, 9, 10, 3, 30)  # limit 10: 12, 10 and 30 cannot leave room for one token
    with pytest.raises(ValueError, match=r"data\.task\.path d\.jsonl: 3 of 6 prompts have at least 10 tokens.*"
                                         r"the longest: p5 \(30\), p1 \(12\), p3 \(10\)\. .*data\.overlong_prompts=skip"):
        fit_to_context(source, count_chars, 10, "error", "data.task.path d.jsonl", batch=4)
    fitted = fit_to_context(source, count_chars, 10, "skip", "data.task.path d.jsonl", batch=4)
    assert [fitted.source[i].prompt_id for i in range(len(fitted.source))] == ["p0", "p2", "p4"]
    assert sorted(fitted.skipped) == [("p1", 12), ("p3", 10), ("p5", 30)]
    assert fit_to_context(source, count_chars, 31, "error", "w").source is source  # all fit: the source itself
    with pytest.raises(ValueError, match="every prompt is too long"):
        fit_to_context(_prompts(20, 30), count_chars, 10, "skip", "w")
    assert len(KeptPrompts(source, [])) == 0


def test_a_gsm8k_run_on_a_small_context_model_is_refused_at_start(tmp_path):
    model_dir = tmp_path / "m"
    tok = train_char_tokenizer(["Qabcx"], 16)  # one token per known character
    tok.save_pretrained(model_dir)
    Qwen2Config(max_position_embeddings=16, vocab_size=len(tok)).save_pretrained(model_dir)
    count, context = token_counter(str(model_dir), chat_template=False)
    assert context == 16 and count(_prompts(3, 0)) == [3, 0]  # one token a character: 3 and none
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "ab", "answer": "#### 1"}\n{"question": "' + "c" * 40 + '", "answer": "#### 2"}\n')
    cfg = resolve_config([], [f"data.task={{type: gsm8k, path: {data}, prompt_template: 'Q{{question}}'}}",
                              "data.reward.type=math-answer", "model={type: pretrained, path: x}"])
    from system.data.prompt_source import build_prompt_source

    source = build_prompt_source(cfg.data.task, cfg.seed)
    with pytest.raises(ValueError, match=r"d\.jsonl: 1 of 2 prompts leave less than rollout.max_new_tokens \(6\) "
                                         r"of the model's 16-token context .*d-line2 \(41\)\. Shorten them, use"):
        fit_dataset_prompts(source, str(model_dir), cfg)
    skip = cfg.model_copy(update={"data": cfg.data.model_copy(update={"overlong_prompts": "skip"})})
    fitted = fit_dataset_prompts(source, str(model_dir), skip)
    assert len(fitted.source) == 1 and fitted.source[0].prompt_id == "d-line1" and fitted.skipped == (("d-line2", 41),)
    with pytest.raises(ConfigError, match="data.overlong_prompts"):
        resolve_config([], ["data.overlong_prompts=truncate"])


def test_a_synthetic_task_on_a_small_context_pretrained_model_is_refused_at_start(tmp_path):
    """Found by probe 10: on a pretrained model with a 16-token context, max_new_tokens=16 after 6-token
    arithmetic prompts cut the responses at the context without a word (the tiny model's config refuses
    it; a pretrained model was never checked), and 20-token prompts failed inside vLLM after start-up."""
    from system.data.prompt_source import build_prompt_source

    model_dir = tmp_path / "m"
    tok = train_char_tokenizer(["0123456789+="], 16)  # one token a character
    tok.save_pretrained(model_dir)
    Qwen2Config(max_position_embeddings=16, vocab_size=len(tok)).save_pretrained(model_dir)
    cfg = resolve_config([], ["model={type: pretrained, path: x}", "data.task.num_digits=2", "rollout.max_new_tokens=8"])
    source = build_prompt_source(cfg.data.task, cfg.seed)
    count, _ = token_counter(str(model_dir), chat_template=False)
    longest = max(count([source[i] for i in range(2048)]))
    assert longest == len("12+34=")  # two 2-digit numbers, '+' and '='
    fit_dataset_prompts(source, str(model_dir), cfg)  # 6 + 8 <= 16: fits
    room = 16 - longest
    fits = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": room})})
    fit_dataset_prompts(source, str(model_dir), fits)  # exactly the context
    over = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": room + 1})})
    with pytest.raises(ValueError, match=rf"context is 16 tokens; data.task \(arithmetic\) prompts take up to "
                                         rf"{longest} and rollout.max_new_tokens is {room + 1}: .* lower "
                                         rf"rollout.max_new_tokens to {room} or less"):
        fit_dataset_prompts(source, str(model_dir), over)
    tiny = resolve_config([], ["data.task.num_digits=2", "rollout.max_new_tokens=8"])  # the tiny model: its config checks
    assert len(fit_dataset_prompts(source, str(model_dir), tiny).source) == len(source)


def test_a_dataset_prompt_must_leave_room_for_max_new_tokens(tmp_path):
    """Found by a probe: only prompts of the whole context or more were refused; a 58-token prompt on a
    64-token model with max_new_tokens=32 was kept and its response cut at 6 tokens without a word (as
    check_synthetic_fit already refuses for a synthetic task). Here one token a character, context 16,
    prompts 'Q' + question: 3, 9 and 12 tokens."""
    from system.data.prompt_source import build_prompt_source

    model_dir = tmp_path / "m"
    tok = train_char_tokenizer(["Qabc"], 16)
    tok.save_pretrained(model_dir)
    Qwen2Config(max_position_embeddings=16, vocab_size=len(tok)).save_pretrained(model_dir)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n" for q in ("ab", "a" * 8, "c" * 11)))

    def run(max_new_tokens, policy="error"):
        cfg = resolve_config([], [f"data.task={{type: gsm8k, path: {data}, prompt_template: 'Q{{question}}'}}",
                                  "data.reward.type=math-answer", "model={type: pretrained, path: x}",
                                  f"rollout.max_new_tokens={max_new_tokens}", f"data.overlong_prompts={policy}"])
        return fit_dataset_prompts(build_prompt_source(cfg.data.task, cfg.seed), str(model_dir), cfg)

    assert len(run(4).source) == 3  # 12 + 4 = 16: the longest fills the context exactly
    with pytest.raises(ValueError, match=r"1 of 3 prompts leave less than rollout.max_new_tokens \(5\) of the "
                                         r"model's 16-token context .*d-line3 \(12\)\. Shorten them, lower "
                                         r"rollout.max_new_tokens to 4 or less, use a model with a longer context"):
        run(5)
    fitted = run(8, "skip")  # 9 + 8 > 16 and 12 + 8 > 16: only the 3-token prompt is kept
    assert [fitted.source[i].prompt_id for i in range(len(fitted.source))] == ["d-line1"]
    assert fitted.skipped == (("d-line2", 9), ("d-line3", 12))
    with pytest.raises(ValueError, match="every prompt is too long"):
        run(14, "skip")  # 3 + 14 > 16


def test_the_tokenizers_model_max_length_does_not_bound_the_context(tmp_path):
    """Found by a review: the check capped the context at the tokenizer's ``model_max_length``, which
    vLLM 0.32 reads only for pooling models, so a model of 64 positions whose tokenizer says 16 had
    every prompt that vLLM would take refused. The context is the model config's; vLLM's own
    derivation (``_get_and_verify_max_len`` without a tokenizer config, as a generating model gets it)
    agrees."""
    model_dir = tmp_path / "m"
    tok = train_char_tokenizer(["0123456789+="], 16)
    tok.model_max_length = 16
    tok.save_pretrained(model_dir)
    hf = Qwen2Config(max_position_embeddings=64, vocab_size=len(tok))
    hf.save_pretrained(model_dir)
    _, context = token_counter(str(model_dir), chat_template=False)
    assert context == 64
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    arch = ModelArchConfigConvertorBase(hf, hf).convert()
    assert _get_and_verify_max_len(hf, arch, None, None, False, None) == 64
