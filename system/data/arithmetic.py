"""The synthetic addition task: a deterministic, seeded pool of prompts like ``"37+45="``.

Prompt ``i`` of seed ``s`` is drawn from its own generator seeded by ``(s, i)``, so the pool
is never materialised: any index is computed in O(1), the same on every machine and run.
Operands have exactly ``num_digits`` digits (0-9 when ``num_digits`` is 1); the reference
is the plain decimal sum, e.g. ``"82"``.
"""

import random

from system.config.data import ArithmeticTaskConfig
from system.types import Prompt

ALPHABET = "0123456789+="
"""Every character a prompt or reference of this task can contain."""


def operand_range(num_digits: int) -> tuple[int, int]:
    """Inclusive bounds of an operand with exactly ``num_digits`` digits."""
    low = 0 if num_digits == 1 else 10 ** (num_digits - 1)
    return low, 10**num_digits - 1


def addition_prompt(a: int, b: int, prompt_id: str) -> Prompt:
    """The prompt ``"a+b="`` with reference ``str(a + b)``."""
    return Prompt(prompt_id=prompt_id, text=f"{a}+{b}=", reference=str(a + b))


class ArithmeticPrompts:
    """``num_prompts`` seeded addition prompts, addressed by index.

    Subclasses change what a prompt holds (``make_prompt``) and the seed namespace and id prefix
    (``namespace``, ``id_prefix``); the operands of index i are drawn the same way.
    """

    namespace, id_prefix = "arithmetic", "arith"
    make_prompt = staticmethod(addition_prompt)

    def __init__(self, cfg: ArithmeticTaskConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self._low, self._high = operand_range(cfg.num_digits)

    def __len__(self) -> int:
        return self.cfg.num_prompts

    def __getitem__(self, index: int) -> Prompt:
        if not -len(self) <= index < len(self):
            raise IndexError(f"prompt index {index} out of range for {len(self)} prompts")
        index %= len(self)
        rng = random.Random(f"{self.namespace}/{self.seed}/{index}")
        a = rng.randint(self._low, self._high)
        b = rng.randint(self._low, self._high)
        return self.make_prompt(a, b, prompt_id=f"{self.id_prefix}-{self.seed}-{index}")
