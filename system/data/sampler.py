"""Exactly-once prompt sampler and its ledger: every issued prompt ends trained or dropped with a reason.

Prompts are served in a per-epoch permutation of the source's indices (seeded), each issue
stamped with a unique ``prompt_id`` = ``e<epoch>-<index>``. A prompt whose worker died is
handed back with :meth:`requeue` and served again before new ones, under the same id, so a
late duplicate result is recognised and discarded instead of trained twice.

The ledger keeps one entry per prompt of the current epoch and per prompt still in flight; when an
epoch starts, the earlier epochs' trained and dropped prompts are folded into counts (``folded``):
the driver held ~180 B per prompt ever issued (17 MiB over 1,500 default steps, growing without
bound; ``benchmarks/bench_memory_growth.py``), and so did every checkpoint's ``controller.pkl``.
A late result for a folded prompt is a duplicate, as it was for a trained one.
"""

import hashlib
from collections import Counter, deque
from dataclasses import replace

import numpy as np

from system.data.prompt_source import PromptSource
from system.types import Prompt

ISSUED, GENERATED, TRAINED, DROPPED = "issued", "generated", "trained", "dropped"


def epoch_order(seed: int, epoch: int, num_prompts: int) -> np.ndarray:
    """The order in which epoch ``epoch`` serves the source's indices (a seeded permutation)."""
    return np.random.default_rng([seed, epoch]).permutation(num_prompts)


FINGERPRINT_PROMPTS = 1024
"""Prompts (evenly spaced, the first and last included) whose text and reference the fingerprint hashes."""


def source_fingerprint(source: PromptSource) -> str:
    """A hash of the prompt source's size and of the text and reference of up to
    ``FINGERPRINT_PROMPTS`` evenly spaced prompts: a resumed run refuses a source that changed under
    the same size (a data file edited or replaced), which would otherwise resume on other prompts.
    (A few milliseconds for any size; an edit that touches none of the sampled rows goes unseen.)"""
    n = len(source)
    m = min(n, FINGERPRINT_PROMPTS)
    digest = hashlib.sha256(str(n).encode())
    for i in sorted({round(k * (n - 1) / max(m - 1, 1)) for k in range(m)}):
        prompt = source[i]
        digest.update(b"\0%d\0" % i + prompt.text.encode() + b"\0" + prompt.reference.encode())
    return digest.hexdigest()[:16]


def check_cursor(sd: dict) -> None:
    """Raise ``ValueError`` when a sampler state's cursor disagrees with its ledger.

    The cursor's epoch has issued exactly the ids at positions ``[0, cursor)`` of its order: an
    id at or past the cursor already in the ledger would be issued a second time (a cursor older
    than the ledger), an id before it missing from the ledger was lost (a ledger older than the
    cursor). Checked when a checkpoint is read, before anything of a resumed run starts.
    """
    order = epoch_order(sd["seed"], sd["epoch"], sd["num_prompts"])
    ids = [f"e{sd['epoch']}-{int(i)}" for i in order]
    ahead = [pid for pid in ids[sd["cursor"]:] if pid in sd["state"]]
    lost = [pid for pid in ids[:sd["cursor"]] if pid not in sd["state"]]
    if ahead or lost:
        raise ValueError(
            f"sampler: the cursor (epoch {sd['epoch']}, {sd['cursor']}) disagrees with its ledger: "
            + (f"{len(ahead)} ids at or past it already issued (first {ahead[0]}; they would be issued a "
               "second time)" if ahead else f"{len(lost)} ids before it not in the ledger (first {lost[0]})"))


class PromptSampler:
    def __init__(self, source: PromptSource, seed: int) -> None:
        if len(source) == 0:
            raise ValueError("the prompt source is empty")
        self.source = source
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self._order = self._permutation(0)
        self.requeued: deque[str] = deque()
        self.state: dict[str, str] = {}  # prompt_id -> ISSUED / GENERATED / TRAINED / DROPPED
        self.drop_reasons: Counter[str] = Counter()
        self.duplicates = 0
        self.folded: Counter[str] = Counter()  # TRAINED / DROPPED prompts of finished epochs, by state

    def _permutation(self, epoch: int) -> np.ndarray:
        return epoch_order(self.seed, epoch, len(self.source))

    def _prompt(self, prompt_id: str) -> Prompt:
        index = int(prompt_id.split("-", 1)[1])
        return replace(self.source[index], prompt_id=prompt_id)

    def next_prompts(self, k: int) -> list[Prompt]:
        """Issue ``k`` prompts: requeued ones first, then the next of the permutation."""
        out = []
        while len(out) < k and self.requeued:
            out.append(self._prompt(self.requeued.popleft()))
        while len(out) < k:
            if self.cursor == len(self._order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
                self._fold_finished()
            pid = f"e{self.epoch}-{int(self._order[self.cursor])}"
            if pid in self.state:
                raise RuntimeError(f"prompt {pid} would be issued a second time (it is {self.state[pid]}): "
                                   f"the sampler's cursor (epoch {self.epoch}, {self.cursor}) is behind its ledger")
            self.cursor += 1
            self.state[pid] = ISSUED
            out.append(self._prompt(pid))
        return out

    def _fold_finished(self) -> None:
        """Count, and forget, the trained and dropped prompts of epochs before the current one."""
        for pid, state in list(self.state.items()):
            if state in (TRAINED, DROPPED) and int(pid[1:pid.index("-")]) < self.epoch:
                self.folded[state] += 1
                del self.state[pid]

    def requeue(self, prompt_ids: list[str]) -> None:
        """Hand back issued prompts whose generation was lost (dead worker, removed worker)."""
        for pid in prompt_ids:
            if self.state.get(pid) == ISSUED and pid not in self.requeued:
                self.requeued.append(pid)

    def mark_generated(self, prompt_id: str) -> bool:
        """Record a finished generation; False (and counted) for a duplicate or unknown id."""
        if self.state.get(prompt_id) != ISSUED:
            self.duplicates += 1
            return False
        if prompt_id in self.requeued:
            self.requeued.remove(prompt_id)
        self.state[prompt_id] = GENERATED
        return True

    def mark_trained(self, prompt_ids: list[str]) -> None:
        for pid in prompt_ids:
            if self.state.get(pid) != GENERATED:
                raise AssertionError(f"prompt {pid} trained from state {self.state.get(pid)}")
            self.state[pid] = TRAINED

    def mark_dropped(self, prompt_id: str, reason: str) -> None:
        if self.state.get(prompt_id) not in (ISSUED, GENERATED):
            raise AssertionError(f"prompt {prompt_id} dropped from state {self.state.get(prompt_id)}")
        self.state[prompt_id] = DROPPED
        self.drop_reasons[reason] += 1

    def drop_in_flight(self, reason: str) -> int:
        """Drop every prompt still issued (generation lost or still running when the run ends) and forget
        the requeued ones; how many were dropped. The final ledger then holds no prompt in flight."""
        in_flight = [pid for pid, s in self.state.items() if s == ISSUED]
        for pid in in_flight:
            self.mark_dropped(pid, reason)
        self.requeued.clear()
        return len(in_flight)

    def counts(self) -> dict[str, int]:
        c = Counter(self.state.values())
        return {
            "issued": len(self.state) + sum(self.folded.values()), "in_flight": c[ISSUED], "buffered": c[GENERATED],
            "trained": c[TRAINED] + self.folded[TRAINED], "dropped": c[DROPPED] + self.folded[DROPPED],
            "duplicates": self.duplicates,
            **{f"dropped/{r}": n for r, n in sorted(self.drop_reasons.items())},
        }

    def state_dict(self) -> dict:
        return {
            "seed": self.seed, "num_prompts": len(self.source), "fingerprint": source_fingerprint(self.source),
            "epoch": self.epoch, "cursor": self.cursor,
            "requeued": list(self.requeued), "state": dict(self.state),
            "drop_reasons": dict(self.drop_reasons), "duplicates": self.duplicates, "folded": dict(self.folded),
        }

    def load_state_dict(self, sd: dict) -> None:
        if sd["seed"] != self.seed:
            raise ValueError(f"sampler checkpoint has seed {sd['seed']}, the config {self.seed}")
        if sd.get("num_prompts", len(self.source)) != len(self.source):
            raise ValueError(f"sampler checkpoint was taken over {sd['num_prompts']} prompts, the configured task has "
                             f"{len(self.source)}: resume with the run's data.* settings (and, under data.overlong_prompts=skip, "
                             "its rollout.max_new_tokens: the prompts left out depend on it)")
        saved = sd.get("fingerprint")  # (absent in checkpoints written before it was kept)
        if saved is not None and saved != source_fingerprint(self.source):
            raise ValueError("sampler checkpoint was taken over other prompts than the configured task's (same "
                             f"count, {len(self.source)}, other content: a data file edited or replaced?); resume "
                             "with the run's data, or start a new run")
        check_cursor({**sd, "num_prompts": len(self.source)})
        self.epoch, self.cursor = sd["epoch"], sd["cursor"]
        self._order = self._permutation(self.epoch)
        self.requeued = deque(sd["requeued"])
        self.state = dict(sd["state"])
        self.drop_reasons = Counter(sd["drop_reasons"])
        self.duplicates = sd["duplicates"]
        self.folded = Counter(sd.get("folded", {}))  # (absent in checkpoints written before the folding)
