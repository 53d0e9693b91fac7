"""One learner rank: FSDP2 policy, AdamW, schedule and the methods the Ray actor calls on every rank.

Per policy version the controller drives all R ranks in lock-step (every method below except
``policy_version`` is collective: call it on every rank, with that rank's shard):

    batch  = collate_groups(groups, scale_advantages_by_std)      (driver, global batch; collate)
    shard  = shard_batch(batch, rank, R, M)                         (batch.shard_rows)
    old_r  = core.compute_proximal_logprobs(shard)                  [B/R, T] per rank
    old    = concat(old_r over ranks);  w, ... = correction service(mu, old, mask, lag)
    norms  = loss_normalisers(mask, mu, old)                        (global, once)
    core.train_step(shard, w[rows of rank], norms)                  policy_version += 1
    payload = core.export_weights()                                 (rank 0 only; others None)

``lag`` for the correction service is ``core.policy_version - batch.policy_version_B``.
``train_step`` reuses the proximal log-probs of the last ``compute_proximal_logprobs`` call
for the same shard (checked by uid), or takes them explicitly. Shards must have equal sizes
on all ranks (``shard_batch`` guarantees it): FSDP2 runs one collective per micro-batch.

Decisions: one rank still builds a 1-rank process group (one code path for FSDP2, DCP and
the export). ``updates_per_batch`` x ``mini_batches`` optimiser steps per batch: epochs over
the batch, each of ``mini_batches`` steps on consecutive row slices of every rank's shard
(``step.train_updates``), which together are one global mini-batch, the same rows for any number
of ranks (``batch.shard_rows``). Every update uses the same proximal log-probs (the PPO clip then
bounds ``cur/old`` from the second update on), the same weights, and the normalisers of its
mini-batch over all ranks (the global ones with one mini-batch); the policy version advances
once per batch.
"""

from collections.abc import Callable

import numpy as np
import torch

from system.config.run import RunConfig
from system.learner import checkpoint, distributed
from system.learner.batch import LearnerBatch
from system.learner.export import ExportInto, export_weights
from system.learner.forward import proximal_logprobs, shard_tensors
from system.learner.logprobs import Sampling
from system.learner.model import build_fsdp_model
from system.learner.optim import build_optimizer, build_scheduler
from system.learner.step import Trainee, train_updates
from system.losses.aggregation import LossNormalisers
from system.weight_payload import WeightPayload


def nonfinite_parameters(model: torch.nn.Module) -> bool:
    """Whether any parameter holds a NaN or an infinity, over every rank (collective): each rank
    reads its own shards once, ``get_total_norm`` of them being finite exactly when every element
    is (unless the norm of finite values overflows, which counts as diverged too)."""
    local = [t.detach() for t in (p.to_local() if hasattr(p, "to_local") else p for p in model.parameters())
             if t.numel()]
    device = next(model.parameters()).device
    finite = bool(torch.isfinite(torch.nn.utils.get_total_norm(local))) if local else True
    return distributed.any_rank(not finite, device)


class LearnerCore:
    """A plain (Ray-free) learner rank; the Ray actor is a shell around one of these."""

    def __init__(
        self,
        run_cfg: RunConfig,
        model_dir: str,
        rank: int,
        world_size: int,
        master_port: int,
        master_addr: str = "127.0.0.1",
        listen_fd: int | None = None,
    ) -> None:
        if world_size != run_cfg.learner.num_ranks:
            raise ValueError(
                f"world_size {world_size} differs from learner.num_ranks {run_cfg.learner.num_ranks}"
            )
        self.cfg = run_cfg.learner
        r = run_cfg.rollout
        self.sampling = Sampling(r.temperature, r.top_p, r.top_k)
        """The rollout's temperature, top-p and top-k: ``old`` and ``cur`` are log-probs of the
        distribution vLLM sampled from (spec section 0)."""
        self.rank, self.world_size = rank, world_size
        self.device = distributed.init_process_group(rank, world_size, master_port, master_addr,
                                                     listen_fd=listen_fd)
        trust = getattr(run_cfg.model, "trust_remote_code", False)
        self.model = build_fsdp_model(model_dir, self.device, world_size, self.cfg.param_dtype, trust)
        self.optimizer = build_optimizer(self.model, self.cfg)
        self.scheduler = build_scheduler(self.optimizer, self.cfg)
        self.optimizer_step = 0
        self._policy_version = 0
        self._proximal: tuple[tuple[str, ...], torch.Tensor] | None = None

    @property
    def policy_version(self) -> int:
        """Number of batches trained (the version of the weights ``export_weights`` returns)."""
        return self._policy_version

    def compute_proximal_logprobs(self, batch_shard: LearnerBatch) -> np.ndarray:
        """float32 ``old[B_shard, T]`` with the current weights (response view, 0 past each response)."""
        shard = shard_tensors(batch_shard, self.device)
        proximal_BT = proximal_logprobs(self.model, shard, self.cfg.micro_batch_size, self.sampling, self.cfg.mini_batches)
        self._proximal = (batch_shard.uids, proximal_BT)
        return proximal_BT.cpu().numpy()

    def train_step(
        self,
        batch_shard: LearnerBatch,
        weights: np.ndarray | Callable[[], np.ndarray],
        normalisers: LossNormalisers,
        proximal_logp: np.ndarray | None = None,
    ) -> dict[str, float]:
        """``updates_per_batch`` x ``mini_batches`` optimiser steps on this shard; the policy version
        advances by one.

        ``weights`` is this shard's ``[B_shard, T]`` block of the correction weights, or a callable
        returning it (a correction call in flight, waited for after the first forward pass);
        ``normalisers`` the global batch's counts. Metrics are global over ranks: means over the
        updates, ``last/<key>`` on the last update (``step_metrics.combine_updates``).
        """
        shard = shard_tensors(batch_shard, self.device)
        proximal_BT = self._proximal_for(batch_shard, proximal_logp)
        def as_tensor(w: np.ndarray) -> torch.Tensor:
            return torch.tensor(np.asarray(w, dtype=np.float32), device=self.device)

        # in flight (a callable): fetched by the update after its first forward pass (``step``)
        w_BT = (lambda: as_tensor(weights())) if callable(weights) else as_tensor(weights)
        trainee = Trainee(self.model, self.optimizer, self.scheduler, self.cfg, self.sampling)
        metrics = train_updates(trainee, shard, proximal_BT, w_BT, normalisers)
        metrics["nonfinite_params"] = float(nonfinite_parameters(self.model))
        self.optimizer_step += int(metrics["updates"] - metrics["skipped_updates"])
        self._policy_version += 1
        self._proximal = None
        metrics["policy_version"] = float(self._policy_version)
        return metrics

    def export_weights(self, into: ExportInto | None = None) -> WeightPayload | None:
        """bf16 full weights of the current version on rank 0; None on the other ranks (``into``: where
        rank 0 may export them, ``system.learner.export.export_weights``)."""
        return export_weights(self.model, self._policy_version, into)

    def save_checkpoint(self, path: str) -> None:
        """Write a DCP checkpoint (collective); a model with a non-finite parameter on any rank is
        refused on every rank (:class:`NonFiniteModelError`), so no checkpoint ever holds one."""
        if nonfinite_parameters(self.model):
            raise NonFiniteModelError(f"refusing to checkpoint policy version {self._policy_version} to {path}: "
                                      "the model has non-finite parameters (the run diverged)")
        counters = {"policy_version": self._policy_version, "optimizer_step": self.optimizer_step}
        checkpoint.save_checkpoint(path, self.model, self.optimizer, self.scheduler, counters)

    def load_checkpoint(self, path: str) -> None:
        counters = checkpoint.load_checkpoint(path, self.model, self.optimizer, self.scheduler)
        self._policy_version = counters["policy_version"]
        self.optimizer_step = counters["optimizer_step"]
        self._proximal = None

    def close(self) -> None:
        """Wait for every rank, then destroy the process group. Collective: call on every rank."""
        distributed.destroy_process_group(barrier=True)

    def _proximal_for(self, batch_shard: LearnerBatch, proximal_logp: np.ndarray | None) -> torch.Tensor:
        if proximal_logp is not None:
            return torch.as_tensor(np.asarray(proximal_logp, dtype=np.float32), device=self.device)
        if self._proximal is None or self._proximal[0] != batch_shard.uids:
            raise ValueError(
                "train_step needs the proximal log-probs of this shard: call compute_proximal_logprobs "
                "on it first (with the current weights) or pass proximal_logp"
            )
        return self._proximal[1]


class NonFiniteModelError(RuntimeError):
    """The learner's parameters are no longer finite: the run diverged."""


__all__ = ["LearnerCore", "LossNormalisers", "NonFiniteModelError"]
