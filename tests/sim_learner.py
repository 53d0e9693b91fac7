"""The simulated learner rank: ``actors.learner_worker.LearnerRank``'s methods, sleeps instead of FSDP2
(the simulated rollout worker, and what both are for, in ``sim_actors.py``)::

    learner_cls = SimulatedLearnerRank.actor_class(train_seconds=0.5, payload_params=1_000_000)

Pickled by value, as ``sim_actors.py`` is, so Ray's worker processes need not find ``tests/``.
"""

import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import ray
from ray import cloudpickle
from sim_actors import _deadline_sleep, stamp

from actors.correction_call import CorrectionCall
from actors.export_handoff import ExportHandoff
from system.config import RunConfig
from system.learner.batch import LearnerBatch
from system.learner.step_outcome import StepOutcome
from system.weight_payload import WeightPayload

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass(frozen=True)
class SimulatedLearnerSettings:
    train_seconds: float = 0.0
    """Simulated time of one ``train_step``."""
    proximal_seconds: float = 0.0
    """Simulated time of the proximal log-probs of one step."""
    export_seconds: float = 0.0
    """Simulated time of one ``export_weights`` (the all-gather and cast), on every rank."""
    payload_params: int = 1_000_000
    """Parameters in the exported bf16 payload (2 bytes each)."""
    proximal_noise: float = 0.01
    """Std of the Gaussian noise added to the behaviour log-probs to make ``old``."""
    timeline: str | None = None
    """A JSONL file to stamp ``step_call`` and ``step_end`` (with step and rank) into."""
    connect_seconds: float = 0.0
    """Simulated time of ``connect`` (a rank loading its model and joining the process group)."""
    nonfinite_versions: tuple[int, ...] = ()
    """Policy versions whose step reports a skipped update (a non-finite gradient), as a diverging
    learner would."""


def synthetic_weight_shapes(num_params: int, width: int = 1536, max_rows: int = 8960) -> dict[str, tuple[int, int]]:
    """Tensor names and shapes of about ``num_params`` parameters: matrices of ``width`` columns."""
    rows_total = max(1, num_params // width)
    shapes, i = {}, 0
    while rows_total > 0:
        rows = min(max_rows, rows_total)
        shapes[f"model.layers.{i}.weight"] = (rows, width)
        rows_total -= rows
        i += 1
    return shapes


class SimulatedLearnerRank:
    """A simulated learner rank: ``LearnerRank``'s methods, a sleep instead of FSDP2."""

    settings = SimulatedLearnerSettings()

    @classmethod
    def actor_class(cls, **settings) -> ray.actor.ActorClass:
        """A Ray actor class of this simulated rank with ``settings`` (see ``SimulatedLearnerSettings``)."""
        baked = type(cls.__name__, (cls,), {"settings": replace(cls.settings, **settings)})
        return ray.remote(concurrency_groups={"export": 1})(baked)

    def __init__(self, cfg: RunConfig, model_dir: str, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self._policy_version = 0
        self.optimizer_step = 0
        self._rng = np.random.default_rng([cfg.seed, rank])
        self._arrays: dict[str, np.ndarray] = {}
        self.exports = ExportHandoff()
        self.correction = None  # rank 0's call to the service, from use_service
        self.sender = None  # rank 0's with weight_sync.type=collective (connect)
        if rank == 0 and self.settings.payload_params > 0:
            shapes = synthetic_weight_shapes(self.settings.payload_params)
            # Filled (so resident), not random: a 1.5 B payload must build in seconds.
            self._arrays = {name: np.full(shape, i, dtype=np.int16) for i, (name, shape) in enumerate(shapes.items())}

    def rendezvous_address(self) -> tuple[str, int]:
        """As ``LearnerRank``'s (no process group is formed here)."""
        return ray.util.get_node_ip_address(), 0

    def connect(self, master_addr: str, master_port: int) -> None:
        time.sleep(self.settings.connect_seconds)
        sync = self.cfg.weight_sync
        if sync.type == "delta":
            raise ValueError("the simulated learner broadcasts full versions only: weight_sync.type=collective "
                             "or object_store (a delta run needs the real learner)")
        if sync.type == "collective" and self.rank == 0:  # as LearnerRank's (imports torch: only then)
            from system.weight_generations import BroadcastSender

            self.sender = BroadcastSender(sync.timeout_s, sync.chunk_mb << 20, None, sync.shared_memory)
        stamp(self.settings.timeline, "connect_end", rank=self.rank)

    def open_broadcast(self, number: int, world_size: int):
        """As ``LearnerRank.open_broadcast``."""
        return self.sender.open(f"generation-{number}", world_size, ray.util.get_node_ip_address(), number)

    def close_broadcast(self) -> None:
        """As ``LearnerRank.close_broadcast``."""
        self.sender.close()

    def policy_version(self) -> int:
        return self._policy_version

    def use_service(self, service) -> None:
        """As ``LearnerRank.use_service``."""
        self.correction = CorrectionCall(service)

    def step(self, batch: LearnerBatch, holder: list, step: int) -> StepOutcome | None:
        """``LearnerRank.step`` simulated: the protocol of ``system.learner.group_step`` (rank 0 calls the
        real correction service once and hands the payload to its ``weights`` call) with sleeps for the
        compute and no process group (rank 0 simulates the all-gathered proximal log-probs of the batch)."""
        try:
            return self._step(batch, holder, step)
        except BaseException as exc:
            if self.rank == 0:
                self.exports.fail(step, f"{type(exc).__name__}: {exc}")
            raise

    @ray.method(concurrency_group="export")
    def weights(self, step: int) -> WeightPayload:
        """As ``LearnerRank.weights``."""
        payload = self.exports.take(step)
        stamp(self.settings.timeline, "weights_return", step=step)
        return payload

    def _step(self, batch: LearnerBatch, holder: list, step: int) -> StepOutcome | None:
        stamp(self.settings.timeline, "step_call", step=step, rank=self.rank)
        t0 = time.perf_counter()
        resp = batch.response_arrays()
        mask = resp.mask_BT
        noise = self._rng.normal(0.0, self.settings.proximal_noise, mask.shape)
        proximal = np.where(mask, np.minimum(resp.behaviour_BT + noise, 0.0), 0.0).astype(np.float32)
        _deadline_sleep(t0, self.settings.proximal_seconds)
        t1 = time.perf_counter()
        # as run_step: the call starts, the update's first micro-batch forward runs, then the wait
        wait_call = self.correction.start(step, batch, holder, proximal, self._policy_version) if self.rank == 0 else None
        t2 = time.perf_counter()
        _deadline_sleep(t2, self.settings.train_seconds * self._first_forward_share(batch.num_sequences))
        tw = time.perf_counter()
        weights, correction = wait_call() if wait_call is not None else (np.ones_like(proximal), {})
        wait = time.perf_counter() - tw
        learner = self._train_metrics(batch, mask, weights)
        _deadline_sleep(t2, self.settings.train_seconds + wait)
        t3 = time.perf_counter()
        payload = self.export_weights()
        t4 = time.perf_counter()
        stamp(self.settings.timeline, "step_end", step=step, rank=self.rank)
        if self.rank != 0:
            return None
        sync = {"payload_bytes": payload.num_bytes if payload is not None else 0}
        if self.sender is not None and payload is not None:  # as LearnerRank: broadcast, then the object store
            sync.update(self.sender.send(payload))
        self.exports.put(step, payload)
        return StepOutcome(learner=learner, correction=correction, payload=None, weight_sync=sync,
                           seconds={"proximal": t1 - t0, "correction": t2 - t1 + wait, "update": t3 - t2 - wait,
                                    "export": t4 - t3})

    def _first_forward_share(self, num_sequences: int) -> float:
        """The share of the simulated update before its first loss: one micro-batch's forward pass,
        a third of that micro-batch's forward + backward, of ``updates x mini-batches x micro-batches``."""
        lc = self.cfg.learner
        rows = max(1, num_sequences // self.world_size // lc.mini_batches)
        micro = -(-rows // lc.micro_batch_size)
        return 1.0 / (3.0 * lc.updates_per_batch * lc.mini_batches * micro)

    def _train_metrics(self, batch: LearnerBatch, mask: np.ndarray, weights_BT: np.ndarray) -> dict:
        """Global metrics with the real keys (``mask``: the batch's response mask); the policy version
        advances by one."""
        weights = np.asarray(weights_BT, dtype=np.float32)
        if weights.shape != mask.shape:
            raise ValueError(f"weights {weights.shape} do not match the batch's response view {mask.shape}")
        n_tok = max(1.0, float(mask.sum()))
        adv_BT = np.broadcast_to(batch.advantages_B[:, None], mask.shape)
        self.optimizer_step += self.cfg.learner.updates_per_batch
        self._policy_version += 1
        return {
            "loss": float(-(weights * adv_BT)[mask].sum() / n_tok),
            "entropy": 1.0, "weight_mean": float(weights[mask].sum() / n_tok),
            "keep_token_frac": float((mask & (weights > 0)).sum() / n_tok),
            "num_valid_tokens": float(mask.sum()), "num_sequences": float((mask.sum(axis=1) >= 1).sum()),
            "clip_frac": 0.0, "grad_norm": float(abs(self._rng.normal(1.0, 0.1))), "lr": self.cfg.learner.lr,
            "skipped_step": float(self._policy_version in self.settings.nonfinite_versions),
            "nonfinite_proximal_tokens": 0.0, "policy_version": float(self._policy_version),
        }

    def export_weights(self) -> WeightPayload | None:
        """The configured bf16 payload (int16 view) of the current version on rank 0; None on the others."""
        _deadline_sleep(time.perf_counter(), self.settings.export_seconds)
        if self.rank != 0:
            return None
        return WeightPayload(policy_version=self._policy_version, arrays=self._arrays,
                             dtypes=dict.fromkeys(self._arrays, "bfloat16"))

    def save_checkpoint(self, path: str) -> None:
        """A tiny JSON file per rank holding the counters."""
        Path(path).mkdir(parents=True, exist_ok=True)
        counters = {"policy_version": self._policy_version, "optimizer_step": self.optimizer_step, "simulated": True}
        (Path(path) / f"simulated_rank{self.rank}.json").write_text(json.dumps(counters))

    def load_checkpoint(self, path: str) -> None:
        counters = json.loads((Path(path) / f"simulated_rank{self.rank}.json").read_text())
        self._policy_version, self.optimizer_step = counters["policy_version"], counters["optimizer_step"]

    def close(self) -> None:
        self.exports.close()

