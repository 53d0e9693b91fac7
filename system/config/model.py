"""Config of the policy model: a tiny Qwen2-style model built from a config, or a pretrained one."""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from system.config.base import StrictModel

VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM 0.32's CPU attention backend supports (GPU backends accept these too)."""
MAX_TINY_PARAMS = 2 * 10**9
"""The largest tiny model (``TinyModelConfig.approx_params``): a probe's ``num_layers=1e9`` passed
``--dry-run``, and the run would have run out of memory building it. A model that size is a real one."""


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
        if (params := self.approx_params()) > MAX_TINY_PARAMS:
            raise ValueError(
                f"hidden_size {self.hidden_size}, num_layers {self.num_layers} and intermediate_size "
                f"{self.intermediate_size} make a tiny model of about {params:.2g} parameters, above the "
                f"{MAX_TINY_PARAMS:.0e} a tiny model built from scratch may have (about {16 * params / 2**30:,.0f} GiB "
                "for the learner's weights and optimiser); train a real model with model.type=pretrained")
        return self

    def approx_params(self) -> int:
        """Parameters of the decoder layers (the character vocabulary's embeddings are a few thousand more):
        per layer ``q, o: h^2``, ``k, v: h * kv`` (``kv = h * num_kv_heads / num_heads``), MLP ``3 h i``."""
        h, kv = self.hidden_size, self.hidden_size * self.num_kv_heads // self.num_heads
        return self.num_layers * (2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size)


class PretrainedModelConfig(StrictModel):
    type: Literal["pretrained"] = "pretrained"
    """A Hugging Face causal LM loaded with ``from_pretrained``."""
    path: str = Field(min_length=1)
    """A local directory or a hub id (e.g. ``Qwen/Qwen2.5-1.5B-Instruct``)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained`` and to vLLM."""


ModelConfig = Annotated[TinyModelConfig | PretrainedModelConfig, Field(discriminator="type")]
