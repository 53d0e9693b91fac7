"""The console line (``system.report.console_sink``): its rollout rate is over the last steps; it shows
both pauses (the learner waiting for rollouts, the rollout side idle)."""

import io

from rich.console import Console

from system.report.console_sink import RATE_WINDOW, ConsoleSink, format_fields


def lines_of(records: list[dict]) -> list[str]:
    out = io.StringIO()
    sink = ConsoleSink(len(records), console=Console(file=out, force_terminal=False, width=400))
    for step, metrics in enumerate(records, start=1):
        sink.log(step, metrics)
    sink.close()
    return out.getvalue().splitlines()


def test_a_step_without_generation_does_not_read_zero_tokens_per_second():
    """Found by a probe: a run's last step read ``tok/s 0`` (nothing was generated since the step
    before). Steps of 1 s at 100 tok/s, then 3 s at 400, then 1 s at 0:
    (100 + 1200) / 4 s = 325 tok/s after two steps; (100 + 1200 + 0) / 5 s = 260 after three."""
    records = [{"throughput/rollout_tokens_per_s": r, "time/step": s} for r, s in ((100, 1.0), (400, 3.0), (0, 1.0))]
    lines = lines_of(records)
    assert [line.split("tok/s ")[1].split()[0] for line in lines] == ["100", "325", "260"]


def test_the_rate_forgets_steps_older_than_its_window():
    # RATE_WINDOW steps of 0 tok/s after one of 1000: the 1000 has left the window
    records = [{"throughput/rollout_tokens_per_s": 1000.0, "time/step": 1.0}]
    records += [{"throughput/rollout_tokens_per_s": 0.0, "time/step": 1.0}] * RATE_WINDOW
    assert lines_of(records)[-1].split("tok/s ")[1].split()[0] == "0"
    assert lines_of(records[:RATE_WINDOW])[-1].split("tok/s ")[1].split()[0] == f"{1000 / RATE_WINDOW:.0f}"


def test_a_record_without_the_rate_or_its_seconds_shows_what_it_has():
    lines = lines_of([{"reward/mean": 0.5}, {"throughput/rollout_tokens_per_s": 7.0}])
    assert "tok/s -" in lines[0] and "tok/s 7" in lines[1]


def test_kept_shows_sequences_and_tokens():
    """A token-level method keeps nearly every sequence while it masks tokens: the line showed only the
    sequence fraction (a probe read ``kept 99%`` at 15 % of tokens masked). Both fractions, as logged."""
    [line] = lines_of([{"correction/keep_seq_frac": 0.995, "correction/keep_token_frac": 0.85}])
    assert "kept seq 100%  tok 85%" in line  # 0.995 rounds to 100 % at the console's precision
    [line] = lines_of([{"correction/keep_seq_frac": 0.5}])
    assert "kept seq 50%  tok -" in line


def test_console_line_shows_both_pauses():
    line = format_fields({"reward/mean": 0.5, "time/wait_rollout": 1.234, "time/rollout_idle": 0.0})
    assert "reward 0.500" in line and "learner waited 1.23s" in line and "rollout idle 0.00s" in line
    assert "kl -" in line  # an absent metric shows as '-'
