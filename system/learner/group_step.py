"""One policy-version step on every learner rank: proximal log-probs, the correction, the update, the export.

The driver makes ONE call per step, to every rank at once (``actors.learner_worker``); each
rank then runs :func:`run_step`, and no token array goes back through the driver::

    rank r (of R), shard = its B/R rows of the global batch (``batch.shard_rows``: the block
                   [r B/R, (r+1) B/R) with one mini-batch; with M, its part of each global mini-batch)
      1. proximal_r = log-probs of the shard's sampled tokens, current weights, no grad   [B/R, T]
      2. proximal   = all-gather of every rank's proximal_r (process group), in batch order [B, T]
      3. rank 0:  correct(proximal) STARTS the one call to the correction service (which
                  reads the batch itself from the object store; the Ray shell sends the call from
                  a thread of its own, packed to the response tokens: ``actors.correction_call``)
      4. the update on the shard with the GLOBAL loss normalisers (valid tokens and sequences
         of the whole batch, spec section 5); after its first micro-batch's forward pass, the
         first point that needs a weight, rank 0 waits for the call and every rank receives
         weights[rows] by a broadcast from rank 0 (process group), so the call of step 3
         overlaps that forward pass                                                          [B, T]
      5. export of the new weights (collective; the payload lands on rank 0)

Every rank computes the normalisers itself from the all-gathered ``proximal`` and the batch's
own arrays, so they agree without a further collective. ``correct`` is the only link to the
rest of the system (the Ray actor passes a call to the correction service), which keeps this
module Ray-free and testable in one process.

Shape suffixes: ``B`` sequences, ``T`` response positions (the legend is in the README's "Layout" part).
"""

import time
from collections.abc import Callable

import numpy as np

from system.correction.ratios import valid_tokens
from system.learner import distributed
from system.learner.batch import LearnerBatch, rows_in_rank_order, shard_batch, shard_rows
from system.learner.export import ExportInto
from system.learner.step_outcome import StepOutcome
from system.losses.aggregation import LossNormalisers, loss_normalisers

Correct = Callable[[np.ndarray], Callable[[], tuple[np.ndarray, dict]]]
"""``proximal_BT -> wait``: starts the correction of the global batch (rank 0 only) and returns the
call in flight, ``wait() -> (weights_BT, correction metrics)``, called when the update needs them."""


def nonfinite_proximal_tokens(mask_BT: np.ndarray, behaviour_BT: np.ndarray, proximal_BT: np.ndarray,
                              truncated: bool = False) -> int:
    """Response tokens whose behaviour log-prob is finite but whose recomputed one is not: the
    learner's own forward pass broke (a diverged model), as opposed to a NaN from the sampler.

    With ``truncated`` sampling (top-p < 1 or top-k on) a recomputed ``-inf`` is not counted: the
    sampled token fell outside the learner's kept set (its logits differ from the rollout's near the
    set's boundary), a legal value that the correction excludes and counts (spec section 0); only
    NaN and ``+inf`` are then a broken forward pass."""
    broken_BT = np.isnan(proximal_BT) | np.isposinf(proximal_BT) if truncated else ~np.isfinite(proximal_BT)
    return int((valid_tokens(mask_BT, behaviour_BT) & broken_BT).sum())


def run_step(core, batch: LearnerBatch, rank: int, world_size: int, correct: Correct | None,
             export_into: ExportInto | None = None) -> StepOutcome:
    """Steps 1-5 of the module docstring on this rank (collective: every rank calls it together).

    ``core`` is this rank's ``LearnerCore``; ``correct`` is called on rank 0 only (None elsewhere);
    ``export_into``: where rank 0 may export the new weights (``system.learner.export.export_weights``).
    """
    if (rank == 0) != (correct is not None):
        raise ValueError("rank 0, and only rank 0, needs the correction call")
    t0 = time.perf_counter()
    mini_batches = core.cfg.mini_batches
    shard = shard_batch(batch, rank, world_size, mini_batches)
    proximal_shard_BT = core.compute_proximal_logprobs(shard)
    t1 = time.perf_counter()
    gathered_BT = distributed.all_gather_rows(proximal_shard_BT, core.device)  # rows in rank order
    proximal_BT = np.empty_like(gathered_BT)
    proximal_BT[rows_in_rank_order(batch.num_sequences, world_size, mini_batches)] = gathered_BT
    started = correct(proximal_BT) if rank == 0 else None  # rank 0: the call is on its way
    t2 = time.perf_counter()
    mine = shard_rows(batch.num_sequences, rank, world_size, mini_batches)
    got: dict = {"correction": {}, "wait": 0.0}

    def weights_of_this_shard() -> np.ndarray:
        """Called by the update after its first forward pass, on every rank (collective)."""
        tw = time.perf_counter()
        weights_BT = None
        if rank == 0:
            weights_BT, got["correction"] = started()
        weights_BT = distributed.broadcast_array(weights_BT, proximal_BT.shape, np.float32, core.device)
        got["wait"] = time.perf_counter() - tw
        # checked whole on every rank, so all refuse together: a rank refusing its rows alone would leave
        # the others waiting in the update's collectives until the process-group timeout
        valid_BT = valid_tokens(resp.mask_BT, resp.behaviour_BT, proximal_BT)
        bad = valid_BT & ~(np.isfinite(weights_BT) & (weights_BT >= 0))
        if bad.any():
            raise ValueError(f"{int(bad.sum())} correction weights on valid tokens are negative or non-finite")
        return weights_BT[mine]

    resp = batch.response_arrays()
    norms: LossNormalisers = loss_normalisers(resp.mask_BT, resp.behaviour_BT, proximal_BT)
    learner = core.train_step(shard, weights_of_this_shard, norms)
    learner["nonfinite_proximal_tokens"] = float(
        nonfinite_proximal_tokens(resp.mask_BT, resp.behaviour_BT, proximal_BT, core.sampling.truncates))
    t3 = time.perf_counter()
    payload = core.export_weights(export_into)
    t4 = time.perf_counter()
    # correction: starting the call + waiting for it (+ the broadcast); update: the rest of the update
    return StepOutcome(learner=learner, correction=dict(got["correction"]),
                       seconds={"proximal": t1 - t0, "correction": t2 - t1 + got["wait"],
                                "update": t3 - t2 - got["wait"], "export": t4 - t3},
                       payload=payload)
