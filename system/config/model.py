"""Config of the policy model: a tiny Qwen2-style model built from a config, or a pretrained one."""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from system.config.base import StrictModel

VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM 0.32's CPU attention backend supports (GPU backends accept these too)."""


class TinyModelConfig(StrictModel):
    type: Literal["tiny"] = "tiny"
    """A Qwen2-style causal LM built from this config (untied embeddings) with a tokenizer trained on the task."""
    hidden_size: int = Field(default=64, ge=8)
    """Width of the residual stream."""
    num_layers: int = Field(default=2, ge=1)
    """Number of decoder layers."""
    num_heads: int = Field(default=2, ge=1)
    """Attention heads; ``hidden_size / num_heads`` must be a head size vLLM's CPU attention supports."""
    num_kv_heads: int = Field(default=1, ge=1)
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = Field(default=256, ge=8)
    """MLP width."""
    max_position_embeddings: int = Field(default=128, ge=16)
    """Longest prompt + response, in tokens."""
    warm_start_steps: int = Field(default=800, ge=0)
    """Supervised steps (64 prompts each) on the task's reference answers before RL."""
    warm_start_lr: float = Field(default=3e-3, gt=0.0)
    """Peak learning rate of the supervised warm start (linear decay to zero)."""
    warm_start_label_smoothing: float = Field(default=0.5, ge=0.0, lt=1.0)
    """Label smoothing of the warm start: caps the learned answer probability, so the policy knows the answer (greedy) but samples it rarely at temperature 1, and RL improves it by sharpening."""

    @model_validator(mode="after")
    def _heads(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads ({self.num_kv_heads})")
        if self.hidden_size // self.num_heads not in VLLM_HEAD_SIZES:
            raise ValueError(
                f"head size hidden_size / num_heads = {self.hidden_size // self.num_heads} is not one "
                f"vLLM's CPU attention supports {VLLM_HEAD_SIZES}"
            )
        return self


class PretrainedModelConfig(StrictModel):
    type: Literal["pretrained"] = "pretrained"
    """A Hugging Face causal LM loaded with ``from_pretrained``."""
    path: str = Field(min_length=1)
    """A local directory or a hub id (e.g. ``Qwen/Qwen2.5-1.5B-Instruct``)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained`` and to vLLM."""


ModelConfig = Annotated[TinyModelConfig | PretrainedModelConfig, Field(discriminator="type")]
