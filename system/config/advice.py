"""Settings that are valid but likely not what the user meant: said at start (and by ``--dry-run``),
never refused."""

import os

from system.config.run import RunConfig


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def config_warnings(cfg: RunConfig, cores: int | None = None) -> list[str]:
    """One sentence per questionable setting of ``cfg``, saying what to do instead. ``cores``: this
    machine's usable cores (default :func:`usable_cores`), for a private local cluster's processes."""
    out = []
    cores = usable_cores() if cores is None else cores
    processes = cfg.learner.num_ranks + cfg.rollout.num_workers
    if cfg.ray.address is None and cfg.ray.learner_gpus == 0 and processes > 2 * cores:
        out.append(f"learner.num_ranks={cfg.learner.num_ranks} and rollout.num_workers={cfg.rollout.num_workers} "
                   f"start {processes} computing processes on this machine's {cores} cores: they take turns on "
                   f"them, so ranks beyond the cores add no compute, and each holds its own memory (at most "
                   f"{max(2 * cores - cfg.rollout.num_workers, 1)} rank(s) here, or join a cluster with ray.address)")
    method = cfg.correction.method
    if method.type == "geo-rs" and (method.lo, method.hi) == (0.999, 1.001) and cfg.rollout.quantization == "fp8":
        out.append("correction.method geo-rs at its BF16 band [0.999, 1.001] with FP8 rollouts rejects nearly every "
                   "sequence (0.2 % kept on the default run): set correction.method.lo / hi for FP8 "
                   "(configs/correction/geo-rs.yaml)")
    if cfg.async_.queue_ahead and cfg.async_.max_lag == 0:
        out.append("async.queue_ahead has no effect with async.max_lag=0: a synchronous step's batch needs the "
                   "weights the step before it produces, so no step can wait in the learners' queue")
    if cfg.rollout.fp8_kernel != "auto" and cfg.rollout.quantization != "fp8":
        out.append(f"rollout.fp8_kernel={cfg.rollout.fp8_kernel} has no effect with rollout.quantization="
                   f"{cfg.rollout.quantization}: it picks the kernel of FP8 rollouts only")
    task = cfg.data.task
    if (task.type == "gsm8k" and not task.chat_template and not cfg.rollout.stop
            and task.prompt_template.lstrip().startswith("Question:")):
        out.append("data.task: a base model prompted 'Question: ...\\nAnswer:' without its chat template goes on "
                   "writing new questions and their '####' answers, and the reward reads the last marker: set "
                   "'rollout.stop=[\"\\nQuestion:\"]' (or data.task.chat_template=true for an instruct model)")
    if cfg.rollout.num_workers == 0:
        out.append(f"rollout.num_workers=0: nothing generates until workers are added (aisrl scale {cfg.output_dir} "
                   f"--workers N{'' if cfg.rollout.follow_cluster else '; or rollout.follow_cluster on a cluster'})")
    return out
