"""The long-response task: multi-digit addition written out as a tape, one line per column.

Prompt ``i`` of seed ``s`` is ``"a+b="`` with two operands of exactly ``n = num_digits``
digits, drawn from its own generator seeded by ``(s, i)``, so, as in
:mod:`system.data.arithmetic`, the pool is never materialised. The reference is the column
addition from the units up, one line (a *step*) per column, then the sum::

    "4729+3856="  ->  ".472+.385|1|5...;..47+..38|0|85..;...4+...3|1|585.;....+....|0|8585>08585"

Line ``k`` (``k = 1..n``) is the state after ``k`` columns: both operands with their last
``k`` digits consumed (shifted right, ``"."`` entering on the left), ``"|"``, the carry out of
column ``k``, ``"|"``, the ``k`` sum digits written so far followed by ``n - k`` blanks.
Lines are joined by ``";"``; ``">"`` introduces the sum written with ``n + 1`` digits (a
leading 0 when there is no final carry).

Why a tape and not the compact ``"9+6+0=15,2+5+1=08,..."``: every line has the same width,
so each character is a copy from a fixed distance back (one line, plus one for the shift)
or the sum of three characters at fixed distances, which the two-layer tiny model learns
in a couple of minutes of warm start on two cores (1200 steps: greedy reward 0.99 on
4-digit prompts of another seed). In the compact form the digits a step reads sit at a
distance that grows with the step; after 400 steps (5-9 digits) its greedy reward was 0.08
where the tape's copies were already right. One width per pool: the distances depend on
``n``, and 4- and 5-digit tapes mixed in one pool reached only 0.25 greedy in 1200 steps.

Every line is ``3n + 4`` characters, so the reference is ``n (3n + 4) + (n - 1) + 1 + (n + 1)
= 3n^2 + 6n + 1`` characters: with the character tokenizer of the tiny model one token
each, plus ``<eos>``: 73 + 1 tokens for 4 digits (the preset ``configs/long_cpu.yaml``),
106 + 1 for 5, 145 + 1 for 6.
"""


from system.config.data import ScratchpadAdditionTaskConfig
from system.data.arithmetic import ArithmeticPrompts
from system.types import Prompt

ALPHABET = "0123456789+|.;>="
"""Every character a prompt or reference of this task can contain."""

BLANK = "."
"""A tape cell with nothing in it (a consumed operand digit, a sum digit not written yet)."""

STEP_SEPARATOR = ";"
"""Between two scratchpad lines."""

ANSWER_MARKER = ">"
"""Between the scratchpad and the final sum."""


def scratchpad_lines(a: int, b: int) -> list[str]:
    """The tape after each column of ``a + b``, units column first (operands padded to one width)."""
    width = max(len(str(a)), len(str(b)))
    xs, ys = str(a).zfill(width), str(b).zfill(width)
    lines, carry, written = [], 0, ""
    for k in range(1, width + 1):
        total = int(xs[width - k]) + int(ys[width - k]) + carry
        carry, written = total // 10, str(total % 10) + written
        rest = BLANK * k
        lines.append(f"{rest}{xs[: width - k]}+{rest}{ys[: width - k]}|{carry}|{written}{BLANK * (width - k)}")
    return lines


def scratchpad_reference(a: int, b: int) -> str:
    """The full response for ``"a+b="``: the lines, ``">"``, the sum with one digit more than the operands."""
    width = max(len(str(a)), len(str(b)))
    return STEP_SEPARATOR.join(scratchpad_lines(a, b)) + ANSWER_MARKER + str(a + b).zfill(width + 1)


def scratchpad_prompt(a: int, b: int, prompt_id: str) -> Prompt:
    """The prompt ``"a+b="`` with the written column addition as its reference."""
    return Prompt(prompt_id=prompt_id, text=f"{a}+{b}=", reference=scratchpad_reference(a, b))


class ScratchpadAdditionPrompts(ArithmeticPrompts):
    """``num_prompts`` seeded scratchpad-addition prompts, addressed by index (the operands drawn as
    ``ArithmeticPrompts`` draws them, in their own seed namespace)."""

    namespace, id_prefix = "addition-scratchpad", "scratch"
    make_prompt = staticmethod(scratchpad_prompt)

    def __init__(self, cfg: ScratchpadAdditionTaskConfig, seed: int) -> None:
        super().__init__(cfg, seed)
