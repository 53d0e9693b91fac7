"""The trajectory buffer between rollout and training, with the staleness bound at batch time.

A group generated with weights of version ``v_b`` may be trained at step ``k`` (with the
learner at version ``k``) only if ``k - v_b <= max_lag``; older groups are returned as stale
so the caller drops them with that reason. Groups leave oldest first.
"""

from collections import deque

from system.types import RolloutGroup


class TrajectoryBuffer:
    def __init__(self, max_lag: int) -> None:
        if max_lag < 0:
            raise ValueError(f"max_lag must be >= 0, got {max_lag}")
        self.max_lag = max_lag
        self._groups: deque[RolloutGroup] = deque()

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, group: RolloutGroup) -> None:
        self._groups.append(group)

    def evict_stale(self, learner_version: int) -> list[RolloutGroup]:
        """Remove and return the groups too old to train at ``learner_version``."""
        keep, stale = deque(), []
        for g in self._groups:
            (stale if learner_version - g.policy_version > self.max_lag else keep).append(g)
        self._groups = keep
        return stale

    def take(self, n: int, learner_version: int) -> tuple[list[RolloutGroup], list[RolloutGroup]]:
        """(``n`` trainable groups or [] if fewer are ready, the stale groups evicted on the way)."""
        stale = self.evict_stale(learner_version)
        if len(self._groups) < n:
            return [], stale
        return [self._groups.popleft() for _ in range(n)], stale

    def groups(self) -> list[RolloutGroup]:
        return list(self._groups)

    def restore(self, groups: list[RolloutGroup]) -> None:
        self._groups = deque(groups)
