"""Build the embedded tiny policy as a Hugging Face model directory, cached by config hash.

``build_tiny_model`` trains a character tokenizer on the task's text, initialises a
Qwen2-style causal LM from :class:`TinyModelConfig` (untied embeddings), warm-starts it on
the task's reference answers and saves ``config.json``, ``generation_config.json``,
``model.safetensors`` (float32), the tokenizer files and ``aisrl_build.json`` (what was
built, how long it took, the warm-start losses). Both ``AutoModelForCausalLM.from_pretrained``
and ``vllm.LLM`` load the directory.

The directory lives at ``cache_dir/tiny-<hash>``, where the hash covers the model config,
the task config, the seed, :data:`BUILD_FORMAT` and a dataset file's content; a second call
returns it at once. It is written to a temporary sibling and renamed into place, so a reader
never sees half a model, and of two concurrent builders the second simply keeps the first
one's result.
"""

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

from system.config.model import TinyModelConfig
from system.data.prompt_source import AnyTaskConfig, PromptSource, build_prompt_source
from system.models.tokenizer import train_char_tokenizer
from system.models.warm_start import MAX_DRAWS_PER_ROW, warm_start

log = logging.getLogger(__name__)

BUILD_FORMAT = 2
"""Bumped whenever the build recipe changes, so stale cache entries are never reused (2: the byte-level
tokenizer, ``system.models.tokenizer``)."""

TOKENIZER_SAMPLE = 4096
"""Prompts whose text (and reference) the tokenizer is trained on."""


def default_cache_dir() -> Path:
    """``$AISRL_CACHE_DIR`` or ``~/.cache/aisrl/models``."""
    return Path(os.environ.get("AISRL_CACHE_DIR", Path.home() / ".cache" / "aisrl" / "models"))


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def dataset_file(task: AnyTaskConfig) -> str | None:
    """The file a task reads its prompts from; None for a built-in task (generated, from a closed
    alphabet)."""
    return getattr(task, "path", None)


def build_key(model: TinyModelConfig, task: AnyTaskConfig, seed: int) -> str:
    """A short hash of everything that determines the built directory: the configs, the seed, the
    build format and, for a task read from a file, the file's content (an edited dataset is a new
    build, not the old one under the same path)."""
    path = dataset_file(task)
    content = file_digest(path) if path is not None and Path(path).is_file() else None
    blob = json.dumps({"format": BUILD_FORMAT, "model": model.model_dump(mode="json"),
                       "task": task.model_dump(mode="json"), "seed": seed, "content": content}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def qwen2_config(model: TinyModelConfig, vocab_size: int, eos_id: int, pad_id: int) -> Qwen2Config:
    """The Qwen2 config of the tiny model: untied embeddings, float32 weights on disk."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_kv_heads,
        max_position_embeddings=model.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def _tokenizer_texts(prompts: PromptSource) -> list[str]:
    n = min(len(prompts), TOKENIZER_SAMPLE)
    return [prompts[i].text + prompts[i].reference for i in range(n)]


def _write_model(out: Path, model_cfg: TinyModelConfig, prompts: PromptSource, seed: int, all_bytes: bool) -> dict:
    tokenizer = train_char_tokenizer(_tokenizer_texts(prompts), model_cfg.max_position_embeddings, all_bytes)
    config = qwen2_config(model_cfg, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    started = time.perf_counter()
    losses = warm_start(model, tokenizer, prompts, model_cfg.warm_start_steps,
                        model_cfg.warm_start_lr, seed, model_cfg.warm_start_label_smoothing)
    if len(losses) < model_cfg.warm_start_steps:  # an untrained model must not be cached and trained on
        raise ValueError(
            f"model.max_position_embeddings={model_cfg.max_position_embeddings}: the task's prompts and answers do "
            f"not fit in the context (the warm start drew {MAX_DRAWS_PER_ROW} prompts in a row whose text + answer + "
            f"<eos> take more positions; it ended after {len(losses)} of {model_cfg.warm_start_steps} steps). Raise "
            "it, or shorten the task's prompts and answers")
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"num_parameters": sum(p.numel() for p in model.parameters()),
            "warm_start_seconds": round(time.perf_counter() - started, 3),
            "warm_start_losses": [round(x, 5) for x in losses]}


def build_tiny_model(
    model_cfg: TinyModelConfig,
    task_cfg: AnyTaskConfig,
    seed: int,
    cache_dir: str | Path,
) -> Path:
    """The directory of the warm-started tiny model for these configs (built once, then cached)."""
    cache_dir = Path(cache_dir)
    key = build_key(model_cfg, task_cfg, seed)
    final = cache_dir / f"tiny-{key}"
    if (final / "aisrl_build.json").is_file():
        info = json.loads((final / "aisrl_build.json").read_text())
        if len(info.get("warm_start_losses", ())) >= model_cfg.warm_start_steps:
            return final
        shutil.rmtree(final, ignore_errors=True)  # cached by an older version with its warm start cut short
    cache_dir.mkdir(parents=True, exist_ok=True)
    # said: a first run was silent for minutes here (a probe: 179 s for configs/long_cpu.yaml's 1200 steps)
    log.warning("building the tiny model (%d warm-start steps; once: later runs take it from %s)",
                model_cfg.warm_start_steps, cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{key}-", dir=cache_dir))
    try:
        started = time.perf_counter()
        # a task read from a file may hold any character
        info = _write_model(tmp, model_cfg, build_prompt_source(task_cfg, seed), seed,
                            all_bytes=dataset_file(task_cfg) is not None)
        info.update(key=key, seed=seed, build_seconds=round(time.perf_counter() - started, 3),
                    model=model_cfg.model_dump(mode="json"), task=task_cfg.model_dump(mode="json"))
        (tmp / "aisrl_build.json").write_text(json.dumps(info, indent=1))
        try:
            tmp.rename(final)
        except OSError:  # another process renamed its build into place first: keep that one
            if not (final / "aisrl_build.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
