"""Where the policy's weights come from: the cached tiny build, or a pretrained directory / hub id."""

from pathlib import Path

from system.config import ConfigError, RunConfig
from system.config.model import VLLM_HEAD_SIZES
from system.models.hf_files import load_config, load_tokenizer
from system.models.tiny import build_tiny_model, default_cache_dir

NOT_GENERATIVE = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                  "ForMultipleChoice", "ForNextSentencePrediction", "ForPreTraining", "ForImageClassification",
                  "ForAudioClassification", "ForCTC")
"""Architecture name endings of heads that score or classify instead of generating (a BERT checkpoint
was refused only by the engine, after the cluster had started). Only these are refused here: a
generative model may carry any name (``ChatGLMModel``), and vLLM names what it cannot run itself."""


def resolve_model_dir(cfg: RunConfig, cache_dir: str | Path | None = None) -> str:
    """A path (or hub id) that transformers' ``from_pretrained`` and vLLM both load."""
    if cfg.model.type == "pretrained":
        local = Path(cfg.model.path).expanduser()
        path = str(local) if local.exists() else cfg.model.path
        config = check_loadable(path, cfg.model.trust_remote_code)
        if not cfg.ray.rollout_gpus:
            check_cpu_attention(path, config)
        return path
    return str(build_tiny_model(cfg.model, cfg.data.task, cfg.seed, cache_dir or default_cache_dir()))


def check_cpu_attention(path: str, config) -> None:
    """ConfigError naming ``model.path`` for a head size vLLM's CPU attention cannot run (rollout workers
    without GPUs, ``ray.rollout_gpus`` 0): it failed inside the engine after start-up ("Unsupported CPU
    attention configuration: head_dim=16"; probe 10). The tiny model's config checks its own."""
    text = getattr(config, "text_config", None) or config
    heads, width = getattr(text, "num_attention_heads", None), getattr(text, "hidden_size", None)
    head_dim = getattr(text, "head_dim", None) or (width // heads if heads and width else None)
    if isinstance(head_dim, int) and head_dim not in VLLM_HEAD_SIZES:
        raise ConfigError(f"model.path {path}: head size {head_dim}, which vLLM's CPU attention cannot run "
                          f"({', '.join(map(str, VLLM_HEAD_SIZES))}); rollout workers on GPUs "
                          "(ray.rollout_gpus) run more")


def check_loadable(path: str, trust_remote_code: bool = False):
    """Raise ConfigError naming ``model.path`` when its config cannot be loaded here (a hub id with no
    network and no local copy, a directory without ``config.json``): the driver reads it first (the
    dataset's context check, the report's tokenizer), and a failure there was a 400-line traceback.

    Its tokenizer too (found by probe 10; each failed only once the cluster was up, naming no field): a
    directory without tokenizer files (transformers builds an empty tokenizer: every prompt encoded to
    nothing, "The decoder prompt cannot be empty"), and one with more tokens than the model's embedding
    rows (vLLM sampled on; the learner's first step raised "IndexError: index out of range"). Returns
    the model's config."""
    try:
        config = load_config(path, trust_remote_code)
    except (OSError, ValueError) as exc:
        first = " ".join(str(exc).split())[:300]
        raise ConfigError(f"model.path {path}: cannot be loaded here ({type(exc).__name__}: {first}); a hub id "
                          "needs the network or a copy in the Hugging Face cache (HF_HOME), a local directory "
                          "its config.json") from None
    try:
        tokens = len(load_tokenizer(path, trust_remote_code))
    except (OSError, ValueError, TypeError) as exc:
        first = " ".join(str(exc).split())[:300]
        raise ConfigError(f"model.path {path}: its tokenizer cannot be loaded here ({type(exc).__name__}: "
                          f"{first})") from None
    if tokens <= 1:
        raise ConfigError(f"model.path {path}: no tokenizer there ({tokens} token; save the tokenizer beside the "
                          "model: tokenizer.json and tokenizer_config.json)")
    heads = getattr(config, "architectures", None) or []
    if heads and all(name.endswith(NOT_GENERATIVE) for name in heads):
        raise ConfigError(f"model.path {path}: a {'/'.join(heads)} checkpoint, whose head does not generate text "
                          "(masked-LM, classification, ...); give a causal language model (...ForCausalLM)")
    rows = getattr(config, "vocab_size", None)
    if isinstance(rows, int) and tokens > rows:
        raise ConfigError(f"model.path {path}: its tokenizer has {tokens} tokens, the model's embeddings {rows} "
                          f"rows (vocab_size): token ids {rows} and up have no embedding")
    return config
