"""Settings that are valid but likely not meant (``system.config.advice``): said, never refused."""

from system.config import resolve_config
from system.config.advice import config_warnings, usable_cores


def warnings_for(*overrides: str, cores: int = 2) -> list[str]:
    return config_warnings(resolve_config([], list(overrides)), cores=cores)


def test_the_default_run_gets_no_warning_on_two_cores():
    assert warnings_for() == []
    assert usable_cores() >= 1


def test_geo_rs_at_its_bf16_band_with_fp8_rollouts_is_said_and_not_with_a_wider_band():
    [said] = warnings_for("correction.method.type=geo-rs")
    assert said.startswith("correction.method geo-rs at its BF16 band [0.999, 1.001] with FP8 rollouts")
    assert warnings_for("correction.method.type=geo-rs", "correction.method.lo=0.9",
                        "correction.method.hi=1.1") == []


def test_no_rollout_workers_is_said():
    [said] = warnings_for("rollout.num_workers=0", "output_dir=runs/x")
    assert said.startswith("rollout.num_workers=0: nothing generates until workers are added (aisrl scale runs/x")


def test_more_than_twice_as_many_processes_as_cores_on_a_private_cluster_is_said():
    """Found by a probe: ``learner.num_ranks=16`` on 2 cores ran without a word. Ranks + workers
    above 2 x cores warns (the tests' 2 ranks + 1 worker on 2 cores do not: 3 <= 4)."""
    assert warnings_for("learner.num_ranks=2", cores=2) == []
    assert warnings_for("learner.num_ranks=2", "rollout.num_workers=2", cores=2) == []  # 4 <= 4
    assert len(warnings_for("learner.num_ranks=4", cores=2)) == 1  # 5 > 4
    [said] = warnings_for("learner.num_ranks=8", "prompts_per_step=8", cores=2)
    assert said.startswith("learner.num_ranks=8 and rollout.num_workers=1 start 9 computing processes on "
                           "this machine's 2 cores")
    assert "at most 3 rank(s) here" in said  # 2 x 2 cores - 1 worker: the same limit as the warning
    assert warnings_for("learner.num_ranks=8", "prompts_per_step=8", cores=8) == []
    # a cluster joined at run time places them on its own nodes: not this machine's matter
    assert warnings_for("learner.num_ranks=8", "prompts_per_step=8", "ray.address=auto", cores=2) == []


def test_settings_with_no_effect_are_said():
    """Found by a review: both passed without a word. ``queue_ahead`` with ``max_lag=0`` cannot queue
    (the next batch needs this step's weights); ``fp8_kernel`` applies to FP8 rollouts only."""
    [queue] = warnings_for("async.queue_ahead=true", "async.max_lag=0")
    assert queue.startswith("async.queue_ahead has no effect with async.max_lag=0")
    assert warnings_for("async.queue_ahead=true", "async.max_lag=1") == []
    [kernel] = warnings_for("rollout.fp8_kernel=upcast", "rollout.quantization=bf16")
    assert kernel.startswith("rollout.fp8_kernel=upcast has no effect with rollout.quantization=bf16")
    assert warnings_for("rollout.fp8_kernel=rowwise") == []  # FP8 rollouts (the default): it applies


def test_a_base_model_on_the_gsm8k_template_without_a_stop_is_said(tmp_path):
    """Found by a review: a base model prompted 'Question: ...\\nAnswer:' writes new questions after its
    answer, and the reward scored the last '####' (a made-up question's). The advice names the fix, and
    the override it prints gives the stop string with its newline."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    task = [f"data.task={{type: gsm8k, path: {data}}}", "data.reward.type=math-answer", "model={type: pretrained, path: x}"]
    [said] = warnings_for(*task)
    assert said.startswith("data.task: a base model prompted 'Question: ...\\nAnswer:'")
    override = said.split("set '")[1].split("'")[0]
    assert override == 'rollout.stop=["\\nQuestion:"]'
    assert resolve_config([], [*task, override]).rollout.stop == ["\nQuestion:"]
    assert warnings_for(*task, override) == []
    assert warnings_for(*task, "data.task.chat_template=true") == []
