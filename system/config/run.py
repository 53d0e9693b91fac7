"""The whole run's config: one section per component plus the run-level keys."""


from pydantic import Field, field_validator, model_validator

from system.config.base import StrictModel, expand_home
from system.config.cluster import AsyncConfig, RayConfig
from system.config.correction import CorrectionConfig
from system.config.data import DataConfig
from system.config.learner import LearnerConfig
from system.config.model import ModelConfig, TinyModelConfig
from system.config.report import ReportConfig
from system.config.rollout import RolloutConfig
from system.config.weight_sync import ObjectStoreSyncConfig, WeightSyncConfig

MAX_SEQUENCES_PER_STEP = 10**6
"""The largest batch (``prompts_per_step x rollout.group_size``); the largest public recipes use ~10**4."""


class RunConfig(StrictModel):
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Seed of every random generator of the run (numpy, and so vLLM's engine, takes 0 .. 2**32 - 1)."""
    max_steps: int = Field(default=150, ge=1)
    """Learner steps (policy versions) to train."""
    output_dir: str = Field(default="runs/default", min_length=1)
    """Run directory: config, metrics, dumps, report, checkpoints."""
    prompts_per_step: int = Field(default=64, ge=1)
    """Prompts per training batch; the batch holds ``prompts_per_step * rollout.group_size`` sequences."""
    checkpoint_every: int = Field(default=50, ge=0)
    """Save a checkpoint every this many steps (and at the end); 0 = only at the end."""
    model: ModelConfig = Field(default_factory=TinyModelConfig)
    """The policy model."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Prompts and reward."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Rollout workers."""
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    """FSDP2 learner and policy loss."""
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    """Mismatch diagnostics and importance-sampling correction."""
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    """Staleness bound of the asynchronous pipeline."""
    report: ReportConfig = Field(default_factory=ReportConfig)
    """Sinks, W&B and dumps."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """The Ray cluster."""
    weight_sync: WeightSyncConfig = Field(default_factory=ObjectStoreSyncConfig)
    """How new weights reach the rollout workers: ``object_store``, ``collective`` or ``delta``."""

    @field_validator("output_dir")
    @classmethod
    def _home(cls, value: str) -> str:
        return expand_home(value)

    @property
    def sequences_per_step(self) -> int:
        return self.prompts_per_step * self.rollout.group_size

    @model_validator(mode="after")
    def _batch_divides(self) -> "RunConfig":
        n, r = self.sequences_per_step, self.learner.num_ranks
        if n > MAX_SEQUENCES_PER_STEP:
            raise ValueError(
                f"prompts_per_step x rollout.group_size = {n:,} sequences a step, above {MAX_SEQUENCES_PER_STEP:,}: "
                "every step's batch is collated in the driver's memory (a probe's 10**15 passed --dry-run)")
        if n % r:
            raise ValueError(
                f"learner.num_ranks ({r}) must divide the batch of prompts_per_step x "
                f"rollout.group_size = {n} sequences"
            )
        if self.learner.mini_batches > n // r:  # checked here, not at the first step
            raise ValueError(
                f"learner.mini_batches ({self.learner.mini_batches}) is more than the {n // r} sequences of a "
                f"learner rank's shard (prompts_per_step x rollout.group_size / learner.num_ranks)"
            )
        self._task_and_reward_agree()
        cpus, need = self.ray.num_cpus, self.learner.num_ranks + self.rollout.num_workers
        if self.ray.address is None and cpus is not None and cpus < need:
            raise ValueError(
                f"ray.num_cpus ({cpus}) is below the {need} CPUs that the {self.learner.num_ranks} learner rank(s) "
                f"and {self.rollout.num_workers} rollout worker(s) reserve (one each) on the private cluster: "
                "the last ones could never be placed and the run would wait for ever; unset it to size the "
                "cluster from the plan")
        tiny = self.model if isinstance(self.model, TinyModelConfig) else None
        if tiny is not None and getattr(self.data.task, "chat_template", False):
            raise ValueError("data.task.chat_template needs a model whose tokenizer has a chat template (an "
                             "Instruct model); the tiny model's character tokenizer has none")
        if tiny is not None and self.rollout.max_new_tokens >= tiny.max_position_embeddings:
            raise ValueError(
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}) leaves no room for the prompt in "
                f"model.max_position_embeddings ({tiny.max_position_embeddings}): prompt + response must fit "
                "(vLLM would stop every response at the model's length without a word)"
            )
        if tiny is not None and self.rollout.max_new_tokens < (need := self.data.task.answer_chars()):
            raise ValueError(
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}) is below the {need} tokens of a full "
                f"answer to data.task {self.data.task.type} with num_digits {self.data.task.num_digits} (the tiny "
                "model writes a character a token): every answer would be cut and the reward capped"
            )
        return self

    def _task_and_reward_agree(self) -> None:
        task, reward = self.data.task.type, self.data.reward.type
        if task == "gsm8k" and reward == "digit-match":
            raise ValueError(
                "data.task.type gsm8k needs data.reward.type math-answer, got digit-match: digit-match scores "
                "the digits of a synthetic sum position by position ('#### 72' or -3.5 against 72 or -3.5 scores 0)")
        if (task == "addition-scratchpad") != (reward == "scratchpad"):
            raise ValueError(
                f"data.task.type {task} needs data.reward.type "
                f"{'scratchpad' if task == 'addition-scratchpad' else 'digit-match or math-answer'}, got {reward}: "
                "the scratchpad task's reference is a tape that only the scratchpad reward scores "
                "(configs/long_cpu.yaml sets both)")
