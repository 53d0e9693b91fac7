"""The learner's padded batch: its response views, its shards over ranks and its slices (numpy only;
``system.learner.collate`` builds it from rollout groups).

Legend: ``B`` sequences, ``S`` positions of prompt + response (right-padded), ``T`` positions
of the response-only view (the global batch's longest response).

Alignment: sequence b holds its prompt at positions ``[0, P_b)`` and its response at
``[P_b, P_b + T_b)`` with ``P_b = response_start_B[b]``, ``T_b = response_len_B[b]``. Every
per-position array is indexed by the token it scores: ``behaviour_logp_BS[b, s]`` is log mu of
``input_ids_BS[b, s]`` given the tokens before it, exactly like the learner's
``logp_BS[b, s]`` (``system.learner.logprobs``). The response view is
``x_BT[b, t] = x_BS[b, P_b + t]`` for ``t < T_b`` and 0 beyond.

Advantages are computed by ``collate.collate_groups`` over whole groups, before any sharding, so
``shard_batch`` may cut anywhere without changing them (``shard_rows``: which rows each rank holds).
"""

from dataclasses import dataclass, fields, replace

import numpy as np

from system.types import CorrectionInput


@dataclass(frozen=True)
class LearnerBatch:
    """Padded numpy arrays of B sequences (cheap to move through Ray's object store)."""

    input_ids_BS: np.ndarray  # int64, prompt + response, right-padded with pad_token_id
    attention_mask_BS: np.ndarray  # bool, 1 on prompt and response tokens
    response_mask_BS: np.ndarray  # bool, 1 on response tokens
    behaviour_logp_BS: np.ndarray  # float32, log mu of token s at s (response only, else 0)
    response_start_B: np.ndarray  # int64, P_b: prompt length = first response position
    response_len_B: np.ndarray  # int64, T_b
    rewards_B: np.ndarray  # float32
    advantages_B: np.ndarray  # float32, computed over the whole groups at collate time
    group_index_B: np.ndarray  # int64, index of the prompt group in the global batch
    policy_version_B: np.ndarray  # int64, behaviour policy version of each sequence
    uids: tuple[str, ...]  # completion uids ("prompt_id#sample_index")
    num_response_tokens: int  # T: width of response views (the global batch's longest response)
    prompt_texts: tuple[str, ...] = ()  # for batch dumps and the report
    response_texts: tuple[str, ...] = ()

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids_BS.shape[0])

    def rows(self, index: "slice | np.ndarray") -> "LearnerBatch":
        """The sub-batch of rows ``index`` (a slice, or an integer array of rows in the order to keep);
        keeps S and T of the full batch."""
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                values[f.name] = value[index]
            elif isinstance(value, tuple):  # an empty tuple (no texts) stays empty
                values[f.name] = value[index] if isinstance(index, slice) or not value else tuple(value[i] for i in index)
            else:
                values[f.name] = value
        return replace(self, **values)

    def response_view(self, x_BS: np.ndarray) -> np.ndarray:
        """``x_BT[b, t] = x_BS[b, P_b + t]`` for ``t < T_b``, 0 elsewhere (a new array, same dtype)."""
        return response_view(np.asarray(x_BS), self.response_start_B, self.response_len_B, self.num_response_tokens)

    def lag_B(self, learner_policy_version: int) -> np.ndarray:
        """int32 staleness ``lag = learner version - behaviour version`` of each sequence (spec section 0).
        A lag below 0 (a sample newer than the learner) or beyond int32 is refused naming the sequence: a
        probe found the service taking it (AIS's per-lag weights then moved) and the dump it wrote refused
        by the report."""
        lag = learner_policy_version - np.asarray(self.policy_version_B, dtype=np.int64)
        bad = np.flatnonzero((lag < 0) | (lag > np.iinfo(np.int32).max))
        if bad.size:
            row = int(bad[0])
            name = self.uids[row] if row < len(self.uids) else f"row {row}"
            raise ValueError(f"sequence {name}: behaviour policy version {int(self.policy_version_B[row])} against "
                             f"learner version {learner_policy_version} ({bad.size} sequence(s)); a lag (learner "
                             "minus behaviour version) must be in 0 .. 2**31 - 1")
        return lag.astype(np.int32)

    def correction_input(self, proximal_N: np.ndarray, learner_policy_version: int) -> CorrectionInput:
        """The correction service's typed view of this (global) batch with its proximal log-probs, given
        packed: one per response token, ``proximal_BT[mask_BT]`` (``pack_response``)."""
        resp = self.response_arrays()
        proximal_BT = unpack_response(proximal_N, resp.mask_BT, "proximal log-probs")
        texts = (self.prompt_texts, self.response_texts) if self.prompt_texts else (("",) * self.num_sequences,) * 2
        return CorrectionInput(
            behaviour_BT=resp.behaviour_BT, proximal_BT=np.asarray(proximal_BT, dtype=np.float32),
            mask_BT=resp.mask_BT, lag_B=self.lag_B(learner_policy_version),
            advantage_B=self.advantages_B.astype(np.float32), reward_B=self.rewards_B.astype(np.float32),
            response_ids_BT=resp.ids_BT, uids=self.uids, prompt_texts=texts[0], response_texts=texts[1])

    def response_mask_BT(self) -> np.ndarray:
        """bool ``[B, T]``: the response tokens (what ``pack_response`` packs, on every side of a call)."""
        return self.response_view(self.response_mask_BS).astype(bool)

    def response_arrays(self) -> "ResponseArrays":
        """The response-only ``[B, T]`` view of the batch (for the loss, the correction and dumps)."""
        return ResponseArrays(
            behaviour_BT=self.response_view(self.behaviour_logp_BS).astype(np.float32),
            mask_BT=self.response_mask_BT(),
            ids_BT=self.response_view(self.input_ids_BS).astype(np.int32),
        )


def response_view(x_BS: np.ndarray, response_start_B: np.ndarray, response_len_B: np.ndarray,
                  num_tokens: int) -> np.ndarray:
    """Response-only view ``x_BT`` of a per-position array: ``x_BT[b, t] = x_BS[b, start_b + t]`` for
    ``t < len_b``, 0 past each response (numpy; ``system.learner.forward.gather_response`` is the same
    view of torch tensors, differentiable, on the learner's device)."""
    t_T = np.arange(num_tokens)
    inside_BT = t_T[None, :] < np.asarray(response_len_B)[:, None]
    pos_BT = np.where(inside_BT, np.asarray(response_start_B)[:, None] + t_T[None, :], 0)
    gathered_BT = np.take_along_axis(x_BS, np.minimum(pos_BT, x_BS.shape[1] - 1), axis=1)
    return np.where(inside_BT, gathered_BT, np.zeros((), dtype=x_BS.dtype))


def pack_response(x_BT: np.ndarray, mask_BT: np.ndarray) -> np.ndarray:
    """``x_N = x_BT[mask_BT]`` as float32: one value per response token, in row-major order (what the
    correction call carries each way instead of ``[B, T]``: a batch's padding is often most of it, and
    a packed array small enough rides inline in Ray's call and reply, not through the object store)."""
    x_BT = np.asarray(x_BT, dtype=np.float32)
    mask_BT = _checked_mask(mask_BT)
    if x_BT.shape != mask_BT.shape:  # a per-row mask would pack whole rows (a probe)
        raise ValueError(f"packing {tuple(x_BT.shape)} values with a {tuple(mask_BT.shape)} response mask")
    return np.ascontiguousarray(x_BT[mask_BT])


def _checked_mask(mask_BT) -> np.ndarray:
    """A packing mask must be a bool ``[B, T]`` array: an integer one would index positions instead of
    selecting them."""
    mask_BT = np.asarray(mask_BT)
    if mask_BT.dtype != np.bool_ or mask_BT.ndim != 2:
        raise TypeError(f"a response mask must be a bool [B, T] array, got {mask_BT.dtype} of shape {mask_BT.shape}")
    return mask_BT


def unpack_response(x_N: np.ndarray, mask_BT: np.ndarray, what: str) -> np.ndarray:
    """The inverse of :func:`pack_response`: ``x_BT[mask_BT] = x_N``, 0 elsewhere (float32). ``what``
    names the values in the error when ``x_N`` does not hold one per response token."""
    mask_BT = _checked_mask(mask_BT)
    x_N = np.asarray(x_N, dtype=np.float32)
    count = int(mask_BT.sum())
    if x_N.ndim != 1 or x_N.shape[0] != count:
        raise ValueError(f"{what}: {tuple(x_N.shape)} values packed, the batch has {count} response tokens")
    x_BT = np.zeros(mask_BT.shape, dtype=np.float32)
    x_BT[mask_BT] = x_N
    return x_BT


@dataclass(frozen=True)
class ResponseArrays:
    """A batch's response positions only, left-aligned and padded to the longest response ``T``."""

    behaviour_BT: np.ndarray  # float32 behaviour log-probs (0 at padding)
    mask_BT: np.ndarray  # bool, response tokens
    ids_BT: np.ndarray  # int32 token ids


def shard_rows(num_sequences: int, rank: int, world_size: int, mini_batches: int = 1) -> np.ndarray:
    """The global rows of rank ``rank``'s shard, in order, chosen so that an update does not depend on
    the number of ranks: global mini-batch k is the ``world_size * n_k`` consecutive rows after the
    earlier ones, where ``n_k`` is the size of slice k of a shard (``mini_batch_slices(B / R, M)``), and
    rank r holds the r-th run of ``n_k`` rows of each. So a rank's mini-batch k (its slice k) together
    with the other ranks' is exactly global mini-batch k, the rows one process would train in that
    optimiser step (when M divides B / R, as verl requires of its mini-batch size; else the global
    mini-batches' sizes differ from one process's by at most R - 1 rows). With one mini-batch the
    shard is the contiguous block ``[r B/R, (r+1) B/R)``.

    Example: B = 12, R = 2, M = 2: rank 0 holds rows 0-2 and 6-8, rank 1 rows 3-5 and 9-11; one
    process's mini-batches are rows 0-5 and 6-11, and so are the two ranks' together."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if num_sequences % world_size:
        raise ValueError(
            f"the batch of {num_sequences} sequences does not split evenly over "
            f"{world_size} learner ranks; choose prompts_per_step x group_size divisible by num_ranks"
        )
    size = num_sequences // world_size
    if mini_batches == 1:
        return np.arange(rank * size, (rank + 1) * size)
    parts = [np.arange(world_size * local.start + rank * (local.stop - local.start),
                       world_size * local.start + (rank + 1) * (local.stop - local.start))
             for local in mini_batch_slices(size, mini_batches)]
    return np.concatenate(parts)


def shard_batch(batch: LearnerBatch, rank: int, world_size: int, mini_batches: int = 1) -> LearnerBatch:
    """Rank ``rank``'s ``B / world_size`` sequences (``shard_rows``: a contiguous block with one
    mini-batch; with several, the rank's part of each global mini-batch)."""
    rows = shard_rows(batch.num_sequences, rank, world_size, mini_batches)
    return batch.rows(slice(int(rows[0]), int(rows[-1]) + 1) if mini_batches == 1 else rows)


def rows_in_rank_order(num_sequences: int, world_size: int, mini_batches: int = 1) -> np.ndarray:
    """The global row of each row of the ranks' shards concatenated in rank order (what an all-gather
    of per-shard rows returns): ``x_global[order] = gathered`` puts them back in batch order."""
    return np.concatenate([shard_rows(num_sequences, r, world_size, mini_batches) for r in range(world_size)])


def micro_batch_slices(num_sequences: int, micro_batch_size: int) -> list[slice]:
    """Consecutive row slices of at most ``micro_batch_size`` sequences (the last may be shorter)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    starts = range(0, num_sequences, micro_batch_size)
    return [slice(s, min(s + micro_batch_size, num_sequences)) for s in starts]


def update_micro_slices(num_sequences: int, mini_batches: int, micro_batch_size: int) -> list[slice]:
    """The micro-batches of an update, in shard rows: ``micro_batch_slices`` of each mini-batch in turn
    (what ``train_updates`` runs), so a pass over them gives every row the batch shape it is trained
    in (the proximal recompute uses them: ``cur - old`` is then exactly 0 on the first update)."""
    return [slice(mini.start + micro.start, mini.start + micro.stop)
            for mini in mini_batch_slices(num_sequences, mini_batches)
            for micro in micro_batch_slices(mini.stop - mini.start, micro_batch_size)]


def mini_batch_slices(num_sequences: int, mini_batches: int) -> list[slice]:
    """``mini_batches`` consecutive row slices covering ``num_sequences`` rows, sizes differing by at most 1
    (the first ``num_sequences % mini_batches`` slices hold one row more). Every slice is non-empty."""
    if mini_batches < 1:
        raise ValueError(f"mini_batches must be >= 1, got {mini_batches}")
    if num_sequences < mini_batches:
        raise ValueError(
            f"a shard of {num_sequences} sequences cannot be split into {mini_batches} mini-batches; "
            "lower learner.mini_batches or raise prompts_per_step x group_size"
        )
    size, extra = divmod(num_sequences, mini_batches)
    bounds = [k * size + min(k, extra) for k in range(mini_batches + 1)]
    return [slice(bounds[k], bounds[k + 1]) for k in range(mini_batches)]
