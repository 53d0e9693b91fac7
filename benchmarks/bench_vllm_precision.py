"""vLLM rollout throughput, BF16 vs FP8 (``fp8_per_channel`` on CPU), on the same prompts, and
each precision's log-prob gap to the learner's recompute of the sampled tokens.

The learner side is transformers in float32 on the bf16-rounded weights with logits divided
by the temperature (what the BF16 FSDP2 learner computes). On CPU FP8 is not expected to be
faster: vLLM's CPU path de-quantizes per channel; the number is recorded as measured.

FP8 runs once per CPU kernel (``rollout.fp8_kernel``: vLLM's channel-wise one, aisrl's row-wise
one and aisrl's upcast one), beside the ``auto`` decision this CPU's probe makes; the CPU's name
and whether it has AMX are recorded (the channel-wise kernel is pathological on Intel AMX CPUs).
Config overrides (``model.hidden_size=512 ...``) run the same on another model.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import emit, positive_int, result_tag  # noqa: E402

from system.config import resolve_config  # noqa: E402
from system.cpu_info import cpuinfo_fields  # noqa: E402
from system.data.prompt_source import build_prompt_source  # noqa: E402
from system.models.model_dir import resolve_model_dir  # noqa: E402
from system.rollout.fp8_kernels import cpu_identity  # noqa: E402
from system.rollout.vllm_engine import VLLMEngine, decide_fp8_kernel  # noqa: E402


def learner_logprobs(model, prompt_ids, response_ids, temperature) -> np.ndarray:
    ids = torch.tensor(np.concatenate([prompt_ids, response_ids]), dtype=torch.long)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, ids[0, len(prompt_ids):, None]).squeeze(-1).numpy()


def measure(engine, prompts, cfg, repeats, model) -> dict:
    r = cfg.rollout
    args = dict(n=r.group_size, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)
    engine.generate(prompts, seed=123, **args)  # warm-up (kernel compile, caches)
    times, tokens = [], 0
    for i in range(repeats):
        t0 = time.perf_counter()
        samples = engine.generate(prompts, seed=i, **args)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(s.response_token_ids) for p in samples for s in p.responses)
    gaps = np.concatenate([
        np.abs(s.behaviour_logprobs - learner_logprobs(model, p.prompt_token_ids, s.response_token_ids, r.temperature))
        for p in samples for s in p.responses if len(s.response_token_ids)
    ])
    t = float(np.median(times))
    return {"scheme": engine.quantization_scheme, "seconds_per_call": t, "tokens_per_call": tokens,
            "tokens_per_s": tokens / t, "logprob_gap_mean": float(gaps.mean()),
            "logprob_gap_p99": float(np.quantile(gaps, 0.99)), "logprob_gap_max": float(gaps.max())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--tag", type=result_tag, default="", help="suffix of the result's name (e.g. _h512)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.hidden_size=512")
    args = parser.parse_args()
    cfg = resolve_config([], args.overrides)
    model_dir = resolve_model_dir(cfg)
    source = build_prompt_source(cfg.data.task, cfg.seed)
    prompts = [source[i].text for i in range(args.prompts)]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    variants = {"bf16": ("bf16", "auto"), "fp8": ("fp8", "vllm"), "fp8_rowwise": ("fp8", "rowwise"),
                "fp8_upcast": ("fp8", "upcast")}
    rows, auto = {}, decide_fp8_kernel(model_dir, "auto")
    for name, (q, kernel) in variants.items():
        engine = VLLMEngine(model_dir, q, cfg.rollout.engine, seed=cfg.seed, fp8_kernel=kernel)
        rows[name] = {**measure(engine, prompts, cfg, args.repeats, model), "fp8_kernel": engine.fp8_kernel}
        del engine
    for name, row in rows.items():
        print(f"{name:11s} ({row['scheme']}): {row['tokens_per_s']:8.0f} tok/s, gap mean {row['logprob_gap_mean']:.4f} "
              f"max {row['logprob_gap_max']:.3f}", file=sys.stderr)
    bf16 = rows["bf16"]["tokens_per_s"]
    auto_row = {"vllm": "fp8", "rowwise": "fp8_rowwise", "upcast": "fp8_upcast"}[auto.kernel]
    emit(f"vllm_precision_cpu{args.tag}", {
        "model": "tiny default" if not args.overrides else f"tiny {' '.join(args.overrides)}",
        "hidden_size": cfg.model.hidden_size, "intermediate_size": cfg.model.intermediate_size,
        "prompts": args.prompts, "group_size": cfg.rollout.group_size,
        "max_new_tokens": cfg.rollout.max_new_tokens, "cpu_model": cpuinfo_fields().get("model name", "unknown"), "cpu_has_amx": cpu_has_amx(),
        "auto_fp8_kernel": auto.as_dict(), "rows": rows,
        "fp8_over_bf16_throughput": rows["fp8"]["tokens_per_s"] / bf16,
        "fp8_rowwise_over_bf16_throughput": rows["fp8_rowwise"]["tokens_per_s"] / bf16,
        "fp8_upcast_over_bf16_throughput": rows["fp8_upcast"]["tokens_per_s"] / bf16,
        "fp8_auto_over_bf16_throughput": rows[auto_row]["tokens_per_s"] / bf16,
    })


def cpu_has_amx() -> bool:
    return "amx_tile" in cpu_identity()


if __name__ == "__main__":
    main()
