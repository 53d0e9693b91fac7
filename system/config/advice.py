"""Settings that are valid but likely not what the user meant: said at start (and by ``--dry-run``),
never refused."""

from system.config.run import RunConfig


def config_warnings(cfg: RunConfig) -> list[str]:
    """One sentence per questionable setting of ``cfg``, saying what to do instead."""
    out = []
    method = cfg.correction.method
    if method.type == "geo-rs" and (method.lo, method.hi) == (0.999, 1.001) and cfg.rollout.quantization == "fp8":
        out.append("correction.method geo-rs at its BF16 band [0.999, 1.001] with FP8 rollouts rejects nearly every "
                   "sequence (0.2 % kept on the default run): set correction.method.lo / hi for FP8 "
                   "(configs/correction/geo-rs.yaml)")
    if cfg.rollout.num_workers == 0:
        out.append(f"rollout.num_workers=0: nothing generates until workers are added (aisrl scale {cfg.output_dir} "
                   f"--workers N{'' if cfg.rollout.follow_cluster else '; or rollout.follow_cluster on a cluster'})")
    return out
