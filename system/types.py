"""Frozen records that cross actor boundaries: prompts, completions, groups, the correction's input, step records.

Token sequences are stored as read-only numpy arrays, which travel through Ray's object store
without a copy; every completion carries the ``policy_version`` of the weights that produced it.
"""

from dataclasses import asdict, dataclass, field
from itertools import accumulate

import numpy as np


def frozen_array(values, dtype) -> np.ndarray:
    """A read-only 1-D numpy copy of ``values``."""
    arr = np.array(values, dtype=dtype).reshape(-1)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True)
class Prompt:
    """One task instance: the text the policy sees and the reference its reward is scored against."""

    prompt_id: str
    text: str
    reference: str


@dataclass(frozen=True)
class Completion:
    """One sampled response with its behaviour log-probs (processed, after temperature)."""

    prompt_id: str
    sample_index: int
    prompt_token_ids: np.ndarray  # int32 [P]
    response_token_ids: np.ndarray  # int32 [T]
    behaviour_logprobs: np.ndarray  # float32 [T], log mu of each sampled token
    response_text: str
    reward: float
    policy_version: int
    finish_reason: str = "length"
    worker_id: str = ""

    def __post_init__(self) -> None:
        if len(self.response_token_ids) != len(self.behaviour_logprobs):
            raise ValueError(
                f"completion {self.prompt_id}/{self.sample_index}: {len(self.response_token_ids)} "
                f"response tokens but {len(self.behaviour_logprobs)} behaviour log-probs"
            )

    @property
    def uid(self) -> str:
        return f"{self.prompt_id}#{self.sample_index}"


@dataclass(frozen=True)
class RolloutGroup:
    """The G completions of one prompt, all generated with the same policy version."""

    prompt: Prompt
    completions: tuple[Completion, ...]
    policy_version: int
    worker_id: str = ""
    weights_wait_s: float = 0.0
    """Seconds the generate call that made this group waited, before sampling, for the weights the
    staleness bound required (carried by the call's first group; the rollout side's pause)."""

    def __post_init__(self) -> None:
        for c in self.completions:
            if c.prompt_id != self.prompt.prompt_id:
                raise ValueError(f"group of {self.prompt.prompt_id} holds a completion of {c.prompt_id}")

    def __reduce__(self):
        """Pickled as columns (``GroupList``'s packing of this one group), or field by field when its
        completions' arrays do not share one dtype per field."""
        packed = _pack_groups([self])
        if packed is None:
            return RolloutGroup, (self.prompt, self.completions, self.policy_version, self.worker_id,
                                  self.weights_wait_s)
        return _unpack_group, packed


class GroupList(list):
    """Groups that cross Ray together (a generate call's result, ``with_weights_wait``): pickled as ONE
    set of columns for all their completions, loaded back as a plain list of groups.

    Each array field of every completion is one bytes object (with its dtype and the lengths), the
    scalar fields one list each, and a group's prompt token ids are stored once when its completions
    share them (one prompt: they do). A 64-prompt x 8-sample call then pickles in about a third of
    the time of its groups one by one, and in under Ray's 100 KB inline limit where the groups one by
    one were not (so the result rides in the call's reply instead of the object store; measured in
    ``benchmarks/README.md``). Groups whose arrays do not share one dtype per field are pickled one
    by one (``RolloutGroup.__reduce__``)."""

    def __reduce__(self):
        packed = _pack_groups(self)
        return (_unpack_groups, packed) if packed is not None else (list, (list(self),))


_SCALAR_FIELDS = ("sample_index", "response_text", "reward", "policy_version", "finish_reason", "worker_id")
"""A completion's scalar fields as packed (its ``prompt_id`` is its group's)."""


def _column(arrays: list) -> tuple[str, list[int], bytes] | None:
    """``(dtype, lengths, concatenated bytes)`` of 1-D arrays of one dtype; None otherwise."""
    arrays = [np.asarray(a) for a in arrays]
    dtypes = {a.dtype.str for a in arrays}
    if len(dtypes) > 1 or any(a.ndim != 1 for a in arrays):
        return None
    return dtypes.pop() if dtypes else "<i4", [len(a) for a in arrays], b"".join(a.tobytes() for a in arrays)


def _shares_prompt(group: RolloutGroup) -> bool:
    """Whether every completion of ``group`` holds the same prompt token ids (the same array, or equal)."""
    arrays = [c.prompt_token_ids for c in group.completions]
    if not arrays:
        return True
    first = arrays[0]
    first_bytes = None
    for a in arrays[1:]:
        if a is first:
            continue
        if first_bytes is None:
            first_bytes = np.asarray(first).tobytes()
        a = np.asarray(a)
        if a.dtype != np.asarray(first).dtype or a.shape != np.shape(first) or a.tobytes() != first_bytes:
            return False
    return True


def _pack_groups(groups: list[RolloutGroup]) -> tuple | None:
    """The columns of ``groups`` (``GroupList``), or None when an array field's dtypes differ."""
    completions = [c for g in groups for c in g.completions]
    columns = {}
    for name in ("response_token_ids", "behaviour_logprobs"):
        columns[name] = _column([getattr(c, name) for c in completions])
    per_group = all(_shares_prompt(g) for g in groups)
    columns["prompt_token_ids"] = _column(
        [g.completions[0].prompt_token_ids for g in groups if g.completions] if per_group
        else [c.prompt_token_ids for c in completions])
    if any(col is None for col in columns.values()):
        return None
    heads = [(g.prompt, g.policy_version, g.worker_id, g.weights_wait_s, len(g.completions)) for g in groups]
    scalars = {name: [getattr(c, name) for c in completions] for name in _SCALAR_FIELDS}
    return heads, columns, per_group, scalars


def _unpack_groups(heads: list, columns: dict, prompt_per_group: bool, scalars: dict) -> list[RolloutGroup]:
    """``_pack_groups``' inverse: groups whose arrays are read-only views into the unpickled bytes."""
    counts = [head[-1] for head in heads]
    responses, logprobs = columns["response_token_ids"][1], columns["behaviour_logprobs"][1]
    if responses != logprobs:
        first = next(i for i, (a, b) in enumerate(zip(responses, logprobs, strict=True)) if a != b)
        group = next(g for g, end in enumerate(accumulate(counts)) if first < end)
        start = sum(counts[:group])
        raise ValueError(f"group of {heads[group][0].prompt_id}: response lengths "
                         f"{responses[start:start + counts[group]]} but behaviour log-prob lengths "
                         f"{logprobs[start:start + counts[group]]}")
    arrays = {}
    for name, (dtype, lengths, data) in columns.items():
        flat = np.frombuffer(data, dtype=dtype)
        arrays[name] = [flat[end - n:end] for n, end in zip(lengths, accumulate(lengths), strict=True)]
    if prompt_per_group:  # one array per group with completions, shared by them
        shared = iter(arrays["prompt_token_ids"])
        arrays["prompt_token_ids"] = [a for n in counts if n for a in [next(shared)] * n]
    names = ("prompt_id", *scalars, *arrays)
    fields = zip(*scalars.values(), *arrays.values(), strict=True)
    groups = []
    for prompt, policy_version, worker_id, weights_wait_s, count in heads:
        completions = []
        for _ in range(count):  # the lengths were checked above, for every completion at once
            c = object.__new__(Completion)
            c.__dict__.update(zip(names, (prompt.prompt_id, *next(fields)), strict=True))
            completions.append(c)
        g = object.__new__(RolloutGroup)  # its completions carry its prompt's id by construction
        g.__dict__.update(prompt=prompt, completions=tuple(completions), policy_version=policy_version,
                          worker_id=worker_id, weights_wait_s=weights_wait_s)
        groups.append(g)
    if next(fields, None) is not None:
        raise ValueError(f"the groups hold {sum(counts)} completions but the columns more")
    return groups


def _unpack_group(*packed) -> RolloutGroup:
    return _unpack_groups(*packed)[0]


def _group_from_columns(prompt: Prompt, policy_version: int, worker_id: str, columns: dict,
                        scalars: dict, weights_wait_s: float = 0.0) -> RolloutGroup:
    """A group pickled by the earlier layout (one group's columns, prompt ids per completion, the
    completions' ``prompt_id`` among the scalars), as checkpoints written before ``GroupList`` hold it
    in their buffer (``controller.pkl``): loaded through ``_unpack_groups``."""
    scalars = dict(scalars)
    ids = scalars.pop("prompt_id", [prompt.prompt_id] * len(columns["response_token_ids"][1]))
    if any(i != prompt.prompt_id for i in ids):
        raise ValueError(f"group of {prompt.prompt_id} holds a completion of another prompt")
    count = len(columns["response_token_ids"][1])
    return _unpack_groups([(prompt, policy_version, worker_id, weights_wait_s, count)], columns, False, scalars)[0]


@dataclass(frozen=True)
class CorrectionInput:
    """One global batch as the correction service sees it (spec section 0), built from the learner's
    batch and its proximal log-probs (``LearnerBatch.correction_input``). Batch dumps hold these
    fields under the spec's key names (``system.report.dump``'s constants; ``samples.json`` and its
    page reuse them)."""

    behaviour_BT: np.ndarray  # float32, mu: log-prob of each sampled token under the behaviour policy
    proximal_BT: np.ndarray  # float32, old: the learner's recompute at the start of the step
    mask_BT: np.ndarray  # bool, response tokens
    lag_B: np.ndarray  # int32, learner version - behaviour version
    advantage_B: np.ndarray  # float32, the advantage each response carries into the loss
    reward_B: np.ndarray  # float32
    response_ids_BT: np.ndarray  # int32
    uids: tuple[str, ...]
    prompt_texts: tuple[str, ...]
    response_texts: tuple[str, ...]

    def __post_init__(self) -> None:
        shape = self.behaviour_BT.shape
        for name in ("proximal_BT", "mask_BT", "response_ids_BT"):
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, behaviour_BT {shape}")
        for name in ("lag_B", "advantage_B", "reward_B", "uids", "prompt_texts", "response_texts"):
            if len(getattr(self, name)) != shape[0]:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, behaviour_BT {shape[0]}")

    @property
    def num_tokens(self) -> int:
        """Response tokens (``mask`` only; the correction's valid tokens also need finite log-probs)."""
        return int(self.mask_BT.sum())


@dataclass(frozen=True)
class StepSeconds:
    """Where one step's wall time went (``time/<field>`` in the record), seconds."""

    wait_rollout: float = 0.0
    """The learner's pause: waiting for the step's batch."""
    proximal: float = 0.0
    correction: float = 0.0
    update: float = 0.0
    sync: float = 0.0
    """Rank 0's export of the new weights (and their broadcast with ``weight_sync.type`` collective or delta)."""
    step: float = 0.0
    """The driver's wall time from the previous step's completion to this one's."""
    rollout_idle: float = 0.0
    """The rollout side's pause: seconds a ready worker sat idle since the previous step, mean over workers."""


@dataclass(frozen=True)
class StepRecord:
    """What one learner step reports, from the driver to the sinks (``metrics.jsonl``, W&B, console).

    ``metrics()`` is the flat record with the metric names of the README; the groups keep their
    prefix there (``learner/...``, ``ledger/...``, ``time/...``; the correction's metrics already
    carry theirs: ``mismatch/...``, ``correction/...``, ``ais/...``).
    """

    step: int
    policy_version: int
    reward_mean: float
    reward_std: float
    lag_mean: float
    lag_max: int
    tokens_trained: int
    learner: dict = field(default_factory=dict)
    correction: dict = field(default_factory=dict)
    ledger: dict = field(default_factory=dict)
    seconds: StepSeconds = field(default_factory=StepSeconds)
    rollout_tokens_per_s: float = 0.0
    weight_sync: dict = field(default_factory=dict)
    """How the step's new weights travelled (``weight_sync/<key>``: payload and broadcast bytes, seconds)."""
    lag_counts: dict = field(default_factory=dict)
    """Sequences trained at each lag (``{lag: count}``, every lag from 0 to ``async.max_lag``, zeros too),
    streamed as ``staleness/sequences_lag_<lag>``."""
    queued_ahead: bool = False
    """The step was submitted while the previous one ran (its batch was ready early), so the learner
    went on without a pause; streamed as ``pipeline/queued_ahead`` (0/1)."""
    workers_ready: int = 0
    worker_failures: int = 0

    def metrics(self) -> dict:
        step_s = self.seconds.step
        return {
            "policy_version": self.policy_version, "reward/mean": self.reward_mean, "reward/std": self.reward_std,
            "staleness/lag_mean": self.lag_mean, "staleness/lag_max": self.lag_max,
            **{f"staleness/sequences_lag_{lag}": int(n) for lag, n in sorted(self.lag_counts.items())},
            **self.correction,
            **{f"learner/{k}": v for k, v in self.learner.items()},
            **{f"ledger/{k}": v for k, v in self.ledger.items()},
            **{f"weight_sync/{k}": v for k, v in self.weight_sync.items()},
            **{f"time/{k}": v for k, v in asdict(self.seconds).items()},
            "throughput/learner_tokens_per_s": self.tokens_trained / max(step_s, 1e-9),
            "throughput/rollout_tokens_per_s": self.rollout_tokens_per_s,
            "tokens/trained": self.tokens_trained,
            "pipeline/queued_ahead": int(self.queued_ahead),
            "rollout/workers_ready": self.workers_ready, "rollout/worker_failures": self.worker_failures,
        }
