"""The benchmark scripts check their arguments before measuring anything: ``benchmarks/harness.py``'s
argparse types, the refusals of bad arguments (exit 2, ``error: argument ...``, nothing written under
``benchmarks/results/``), and ``bench_cpu_targets.py``'s result names, reference and failure report, without
running any benchmark."""

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))
import bench_cpu_targets  # noqa: E402
import bench_default_run  # noqa: E402
from harness import (  # noqa: E402
    SEED,
    choice_list,
    emit,
    float_range,
    int_list,
    int_range,
    nonnegative_int,
    positive_float,
    positive_int,
    result_name,
    result_tag,
)

BAD = argparse.ArgumentTypeError


# --- the argparse types


def test_positive_and_nonnegative_ints():
    assert positive_int("7") == 7
    assert positive_int("1") == 1
    for text in ("0", "-3", "abc", "2.5", ""):
        with pytest.raises(BAD, match="positive integer"):
            positive_int(text)
    assert nonnegative_int("0") == 0
    assert nonnegative_int("12") == 12
    with pytest.raises(BAD, match="non-negative integer"):
        nonnegative_int("-1")


def test_int_range_and_seed():
    at_least_two = int_range(2)
    assert at_least_two("2") == 2
    with pytest.raises(BAD, match=">= 2"):
        at_least_two("1")
    assert SEED("0") == 0
    assert SEED("4294967295") == 4294967295  # 2**32 - 1, RunConfig.seed's maximum
    for text in ("-1", "4294967296"):
        with pytest.raises(BAD, match=r"\[0, 4294967295\]"):
            SEED(text)


def test_floats_are_finite_and_in_range():
    assert positive_float("0.5") == 0.5
    assert positive_float("1e-3") == 0.001
    for text in ("0", "-1", "nan", "inf", "-inf", "x"):
        with pytest.raises(BAD, match="finite number > 0"):
            positive_float(text)
    unit = float_range(0.0, 1.0)
    assert unit("0") == 0.0
    assert unit("1") == 1.0
    for text in ("1.5", "-0.1", "nan"):
        with pytest.raises(BAD, match=">= 0 and <= 1"):
            unit(text)


def test_size_list():
    sizes = int_list(minimum=1024, multiple=1024, what="size")
    assert sizes("1024,4096") == [1024, 4096]
    assert sizes(" 2048 , 1024") == [2048, 1024]  # the order given
    with pytest.raises(BAD, match="at least 1024"):
        sizes("100")
    with pytest.raises(BAD, match="multiple of 1024"):
        sizes("1500")  # one row of 1024 tokens, reported as 1500
    with pytest.raises(BAD, match="got -5"):
        sizes("-5")
    with pytest.raises(BAD, match="'abc' is not an integer"):
        sizes("abc")
    for text in ("", "1024,,2048", "1024,"):
        with pytest.raises(BAD, match="comma-separated"):
            sizes(text)
    assert int_list(minimum=1)("1,2") == [1, 2]


def test_choice_list():
    sizes = choice_list(["64k", "1M", "10M"])
    assert sizes("1M,64k") == ["1M", "64k"]
    with pytest.raises(BAD, match="unknown '5k'.*64k,1M,10M"):
        sizes("5k")
    with pytest.raises(BAD, match="unknown ''"):
        sizes("")


def test_result_names_and_tags():
    assert result_name("ais_sanity_cpu") == "ais_sanity_cpu"
    for text, why in (("a/b", "plain file name"), ("no/such/dir/x", "plain file name"), ("", "empty"),
                      (".x", "start with '.'"), ("../x", "start with '.'"), ("a\0b", "NUL"),
                      ("x" * 201, "at most 200 bytes")):
        with pytest.raises(BAD, match=why):
            result_name(text)
    assert result_tag("") == ""
    assert result_tag("_amd_check") == "_amd_check"
    with pytest.raises(BAD, match="must not contain '/'"):
        result_tag("_a/b")


def test_argparse_reports_the_message_and_converts_string_defaults(capsys):
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--repeats", type=positive_int, default=9)
    parser.add_argument("--sizes", type=int_list(minimum=1024, multiple=1024), default="65536,262144")
    args = parser.parse_args([])
    assert args.repeats == 9 and args.sizes == [65536, 262144]  # argparse applies type= to a string default
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--repeats", "0"])
    assert exc.value.code == 2
    assert "bench: error: argument --repeats: expected a positive integer, got '0'" in capsys.readouterr().err


# --- the scripts, in subprocesses (only ones that fail at argument parsing)


def _snapshot() -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in RESULTS.iterdir()}


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(BENCH / name), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_ais_sanity_refuses_a_run_without_dumps(tmp_path, kind):
    run = tmp_path / "run"
    if kind == "empty":
        (run / "dumps").mkdir(parents=True)
        (run / "dumps" / "other.npz").write_bytes(b"")  # not a step_*.npz
    written = RESULTS / f"test_ais_sanity_{uuid.uuid4().hex}.json"
    before = _snapshot()
    try:
        proc = _script("bench_ais_sanity.py", str(run), "--name", written.stem)
        assert proc.returncode == 2, proc.stderr
        assert "error: argument RUN_DIR" in proc.stderr
        assert str(run) in proc.stderr
        assert ("no such run directory" if kind == "missing" else "holds no dumps/step_*.npz") in proc.stderr
        assert not written.exists()
        assert _snapshot() == before
    finally:
        written.unlink(missing_ok=True)  # were it written (a regression), not left in the checkout


# Each bad argument also fails fast where it is not checked (an invalid override, max_steps=0), so a regression
# fails this test in seconds instead of starting a training run.
@pytest.mark.parametrize(("script", "args", "message"), [
    ("bench_report.py", ["--sizes", "5k"], "error: argument --sizes: unknown '5k'"),
    ("bench_default_run.py", ["no_such_key=1", "--name", "no/such/dir/x"],
     "error: argument --name: a result name is a plain file name"),
    ("bench_correction_ablation.py", ["--steps", "0"], "error: argument --steps: expected a positive integer, got '0'"),
    ("bench_correction.py", ["--sizes", "100"], "error: argument --sizes: each size (tokens) must be at least 1024"),
    ("bench_loopback_ceiling.py", ["--mib", "0"], "error: argument --mib: expected a positive integer, got '0'"),
    ("bench_memory_growth.py", ["--steps", "0"], "error: argument --steps: expected a positive integer, got '0'"),
    ("bench_memory_growth.py", ["no_such_key=1"], "error: overrides: "),
    ("bench_startup.py", ["--base", "no-such-revision"], "error: --base no-such-revision: not a revision"),
    ("bench_startup.py", ["--base", "HEAD", "--rounds", "0"], "error: argument --rounds: expected a positive integer"),
    ("bench_ray_hops.py", ["--rounds", "0"], "error: argument --rounds: expected a positive integer, got '0'"),
    ("bench_transport_cycle.py", ["--rounds", "0"], "error: argument --rounds: expected a positive integer, got '0'"),
    ("bench_transport_cycle.py", ["--steps", "4"], "error: --warmup (4) must be below --steps (4)"),
    ("bench_correction.py", ["--tag", "/x"], "error: argument --tag: "),
    ("bench_report.py", ["--tag", "/x"], "error: argument --tag: "),
])
def test_scripts_refuse_bad_arguments(script, args, message):
    before = _snapshot()
    proc = _script(script, *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _snapshot() == before


def test_correction_refuses_cuda_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = _script("bench_correction.py", "--device", "cuda")
    assert proc.returncode == 2, proc.stderr
    assert "error: argument --device: CUDA is not available" in proc.stderr


# --- bench_default_run.run_train: a failed training run says why


def test_run_train_shows_the_end_of_a_failed_runs_stderr(capsys):
    cmd = [sys.executable, "-c", "import sys\nfor i in range(50): print(f'l{i}', file=sys.stderr)\nsys.exit(4)"]
    with pytest.raises(SystemExit) as exc:
        bench_default_run.run_train(cmd)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "aisrl train failed (exit status 4); the last 40 lines of its stderr:" in err
    assert "l10\n" in err and "l49\n" in err  # lines 10-49: the last 40
    assert "l9\n" not in err
    assert bench_default_run.run_train([sys.executable, "-c", "pass"]) > 0


def test_the_ablation_says_why_a_run_failed(tmp_path):
    """A failed run of the ablation was a bare CalledProcessError; its log's last lines are said now.
    ``max_steps=abc`` is refused by the config before anything starts (exit 2, a few seconds)."""
    import bench_correction_ablation

    with pytest.raises(SystemExit) as exc:
        bench_correction_ablation.train(["max_steps=abc"], tmp_path / "run.log")
    said = str(exc.value.code)
    assert said.startswith("aisrl train max_steps=abc failed (exit 2); the last lines of ")
    assert "max_steps" in said.split("\n", 1)[1]  # the config error itself, from the run's log


def test_a_result_without_rows_does_not_replace_the_last_measured_one(capsys):
    """A benchmark whose every row was skipped (too little memory) wrote ``rows: []`` over the committed
    result; ``emit`` keeps the file as it was (and still prints the line)."""
    name = f"test_emit_{uuid.uuid4().hex}"
    path = RESULTS / f"{name}.json"
    try:
        emit(name, {"rows": []})
        assert not path.exists() and "nothing measured (no rows)" in capsys.readouterr().err
        emit(name, {"rows": [{"x": 1}]})
        assert json.loads(path.read_text())["rows"] == [{"x": 1}]
        emit(name, {"rows": []})  # the measured one stays
        assert json.loads(path.read_text())["rows"] == [{"x": 1}]
        emit(name, {"value": 3})  # a result without rows is written as before
        assert json.loads(path.read_text())["value"] == 3
    finally:
        path.unlink(missing_ok=True)


# --- bench_cpu_targets: names, reference, failures (no benchmark runs)


def test_cpu_targets_check_names_by_default():
    assert bench_cpu_targets.plan("_amd", record=False) == [
        ("bench_fp8_kernels.py", ["--tag", "_amd_check"], "fp8_kernels_cpu_amd_check"),
        ("bench_vllm_precision.py", ["--tag", "_amd_check"], "vllm_precision_cpu_amd_check"),
        ("bench_default_run.py", ["--name", "default_run_cpu_amd_check"], "default_run_cpu_amd_check"),
    ]
    assert bench_cpu_targets.summary_name("_amd", record=False) == "cpu_targets_amd_check"


def test_cpu_targets_plain_names_with_record():
    assert bench_cpu_targets.plan("_amx", record=True) == [
        ("bench_fp8_kernels.py", ["--tag", "_amx"], "fp8_kernels_cpu_amx"),
        ("bench_vllm_precision.py", ["--tag", "_amx"], "vllm_precision_cpu_amx"),
        ("bench_default_run.py", ["--name", "default_run_cpu_amx"], "default_run_cpu_amx"),
    ]
    assert bench_cpu_targets.summary_name("_amx", record=True) == "cpu_targets_amx"


def test_check_results_are_ignored_by_git_and_recorded_ones_are_not():
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    for record, ignored in ((False, True), (True, False)):
        names = [name for *_, name in bench_cpu_targets.plan("_amd", record)]
        names.append(bench_cpu_targets.summary_name("_amd", record))
        for name in names:
            proc = subprocess.run(["git", "check-ignore", "-q", f"benchmarks/results/{name}.json"], cwd=ROOT)
            assert (proc.returncode == 0) == ignored, name


def test_cpu_targets_reference_is_the_amd_default_run():
    assert bench_cpu_targets.REFERENCE == RESULTS / "default_run_cpu_amd.json"
    reference = bench_cpu_targets.read_reference()
    assert 216 <= reference["steps_per_minute"] < 217  # README: 216 steps/min on the AMD EPYC
    assert reference["processor"] == "AMD EPYC"


def _fake_results(reference: Path, calls: list) -> callable:
    def run(script, args, name):
        calls.append((script, args, name))
        if script == "bench_fp8_kernels.py":
            return {"benchmark": name, "rows": [{"model": "tiny default", "m": 16, "speed_vs_bf16": {"upcast": 3.0}}]}
        if script == "bench_vllm_precision.py":
            return {"benchmark": name, "fp8_auto_over_bf16_throughput": 0.6, "auto_fp8_kernel": {"kernel": "upcast"},
                    "cpu_has_amx": False, "rows": {"bf16": {"tokens_per_s": 1000.0}}}
        # what --record does on an AMD EPYC: the default run rewrites the reference file itself
        reference.write_text(json.dumps({"steps_per_minute": 150.0}))
        return {"benchmark": name, "steps_per_minute": 150.0, "wall_seconds_incl_startup": 70.0,
                "reward_first_10": 0.28, "reward_last_10": 0.52, "kl_k1_median": 0.04}
    return run


def test_cpu_targets_reads_the_reference_before_running(tmp_path, monkeypatch):
    reference = tmp_path / "default_run_cpu_amd.json"
    reference.write_text(json.dumps({"steps_per_minute": 200.0, "commit": "abc1234", "processor": "AMD EPYC"}))
    calls, emitted = [], []
    monkeypatch.setattr(bench_cpu_targets, "REFERENCE", reference)
    monkeypatch.setattr(bench_cpu_targets, "cpu_tag", lambda: "_amd")
    monkeypatch.setattr(bench_cpu_targets, "run", _fake_results(reference, calls))
    monkeypatch.setattr(bench_cpu_targets, "emit", lambda name, result, save=True: emitted.append((name, result)))
    monkeypatch.setattr(sys, "argv", ["bench_cpu_targets.py", "--record"])
    bench_cpu_targets.main()
    assert [c[2] for c in calls] == ["fp8_kernels_cpu_amd", "vllm_precision_cpu_amd", "default_run_cpu_amd"]
    [(name, result)] = emitted
    assert name == "cpu_targets_amd"
    speed = result["targets"]["default_run_steps_per_minute_over_amd_reference"]
    assert speed["reference"] == 200.0  # the file as it was before the run, not the run's own 150
    assert speed["value"] == 0.75 and speed["met"]  # 150 / 200
    fp8 = result["targets"]["fp8_auto_over_bf16_rollout_tokens_per_s"]
    assert fp8["value"] == 0.6 and fp8["met"]


def test_cpu_targets_without_a_reference_runs_nothing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bench_cpu_targets, "REFERENCE", tmp_path / "missing.json")
    monkeypatch.setattr(bench_cpu_targets, "cpu_tag", lambda: calls.append("cpu_tag") or "_amd")
    monkeypatch.setattr(bench_cpu_targets, "run", lambda *a: calls.append(a))
    monkeypatch.setattr(sys, "argv", ["bench_cpu_targets.py"])
    with pytest.raises(SystemExit, match="missing.json"):
        bench_cpu_targets.main()
    assert calls == []


def test_cpu_targets_reports_a_failed_sub_benchmark(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_cpu_targets, "HERE", tmp_path)
    (tmp_path / "bench_fails.py").write_text(
        "import sys\nprint('partial output')\nfor i in range(50): print(f'line {i}', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(SystemExit) as exc:
        bench_cpu_targets.run("bench_fails.py", [], "x")
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "bench_fails.py failed (exit status 3); the last 40 lines of its stderr:" in err
    assert "  line 10\n" in err and "  line 49\n" in err  # lines 10-49: the last 40
    assert "  line 9\n" not in err
    assert "cpu-check stopped: bench_fails.py failed" in err


def test_cpu_targets_checks_the_name_a_sub_benchmark_wrote(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_cpu_targets, "HERE", tmp_path)
    (tmp_path / "bench_named.py").write_text("import json\nprint(json.dumps({'benchmark': 'other', 'v': 1}))\n")
    assert bench_cpu_targets.run("bench_named.py", [], "other") == {"benchmark": "other", "v": 1}
    with pytest.raises(SystemExit) as exc:
        bench_cpu_targets.run("bench_named.py", [], "fp8_kernels_cpu_amd_check")
    assert exc.value.code == 1
    assert "bench_named.py wrote 'other', not 'fp8_kernels_cpu_amd_check'" in capsys.readouterr().err
