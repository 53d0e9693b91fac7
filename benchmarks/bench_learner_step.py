"""The learner's step on this machine's device: tokens/s and model FLOPs utilisation of the real
``LearnerCore`` (FSDP2, BF16 compute over fp32 master weights, AdamW), one rank, with a randomly
initialised Qwen2 model of a named size, and the weight export that follows each step.

Per step, as the controller runs it: the proximal forward over the batch, one update (forward +
backward + clip + AdamW), the bf16 export of the full weights to host memory. Model FLOPs per
step and MFU as ``system/learner/flops.py`` defines them (PaLM's accounting: ``8 N D + 16 L d S D``
for one update); the peak is ``--peak-tflops`` or the table there for known GPUs; none on CPU,
where only tokens/s is reported. Tokens/s and MFU count the proximal forward and the update, not
the export (reported on its own, in GB/s).

The model is made from its configuration alone (nothing is downloaded: a GPU machine without
network runs it) and saved to a temporary directory, which ``LearnerCore`` loads as it loads a
checkpoint. Sizes: ``tiny`` (the CPU smoke size), ``0.5b`` and ``1.5b`` (Qwen2.5's shapes).

Run: ``python benchmarks/bench_learner_step.py --size 0.5b`` (device: CUDA if available, else CPU).
JSON last line; kept as ``results/learner_step_<device>_<size>.json``.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import emit, int_range, nonnegative_int, positive_float, positive_int  # noqa: E402

from system.config.learner import LearnerConfig  # noqa: E402
from system.config.rollout import RolloutConfig  # noqa: E402
from system.config.run import RunConfig  # noqa: E402
from system.learner.collate import collate_groups  # noqa: E402
from system.learner.distributed import find_free_port  # noqa: E402
from system.learner.flops import matmul_parameters, peak_tflops, step_flops  # noqa: E402
from system.losses.aggregation import loss_normalisers  # noqa: E402
from system.types import Completion, Prompt, RolloutGroup  # noqa: E402

SIZES = {
    # name: Qwen2Config fields (Qwen2.5-0.5B / 1.5B shapes; tiny: a smoke size for CPU)
    "tiny": dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
}  # fmt: skip

def save_random_model(size: str, path: str, seed: int = 0) -> None:
    """A randomly initialised Qwen2 causal LM of ``size`` written as a Hugging Face directory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(max_position_embeddings=4096, **SIZES[size])
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def make_batch(num_prompts: int, group_size: int, prompt_len: int, response_len: int, vocab: int,
               seed: int = 0):
    """Random prompts and responses of fixed lengths (no padding inside the batch), rewards in {0, 1}."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(num_prompts):
        prompt_ids = rng.integers(1, vocab, size=prompt_len).astype(np.int32)
        completions = tuple(
            Completion(f"p{g}", k, prompt_ids, rng.integers(1, vocab, size=response_len).astype(np.int32),
                       (-rng.random(response_len) * 3).astype(np.float32), "", float(rng.integers(0, 2)), 0)
            for k in range(group_size)
        )
        groups.append(RolloutGroup(Prompt(f"p{g}", "", ""), completions, 0))
    return collate_groups(groups, scale_advantages_by_std=True)


def run(size: str, num_prompts: int, group_size: int, prompt_len: int, response_len: int, micro_batch: int,
        steps: int, warmup: int, given_peak: float | None) -> dict:
    from transformers.utils import logging as hf_logging

    from system.learner.core import LearnerCore

    hf_logging.disable_progress_bar()

    with tempfile.TemporaryDirectory(prefix="aisrl-learner-bench-") as tmp:
        t0 = time.perf_counter()
        save_random_model(size, tmp)
        save_s = time.perf_counter() - t0
        cfg = RunConfig(learner=LearnerConfig(num_ranks=1, lr=1e-6, micro_batch_size=micro_batch),
                        rollout=RolloutConfig(group_size=group_size), prompts_per_step=num_prompts)
        core = LearnerCore(cfg, tmp, rank=0, world_size=1, master_port=find_free_port())
    device = core.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    batch = make_batch(num_prompts, group_size, prompt_len, response_len, SIZES[size]["vocab_size"])
    arrays = batch.response_arrays()
    mask_BT = arrays.mask_BT
    weights_BT = mask_BT.astype(np.float32)  # every valid token kept at weight 1
    tokens = int(batch.attention_mask_BS.sum())
    times = {"proximal": [], "update": [], "export": []}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        proximal_BT = core.compute_proximal_logprobs(batch)
        sync()
        t1 = time.perf_counter()
        norms = loss_normalisers(mask_BT, arrays.behaviour_BT, proximal_BT)
        metrics = core.train_step(batch, weights_BT, norms)
        sync()
        t2 = time.perf_counter()
        payload = core.export_weights()
        sync()
        t3 = time.perf_counter()
        if not np.isfinite(metrics["loss"]):
            raise RuntimeError(f"step {i}: non-finite loss {metrics['loss']}")
        if i >= warmup:
            times["proximal"].append(t1 - t0)
            times["update"].append(t2 - t1)
            times["export"].append(t3 - t2)
    n_matmul = matmul_parameters(core.model)
    model_cfg = SIZES[size]
    flops = step_flops(n_matmul, model_cfg["num_hidden_layers"], model_cfg["hidden_size"],
                       batch.input_ids_BS.shape[1], tokens, updates=1)
    median = {k: float(np.median(v)) for k, v in times.items()}
    train_s = median["proximal"] + median["update"]
    peak = peak_tflops(device, given_peak)
    export_bytes = payload.num_bytes if payload is not None else 0
    out = {
        "device": str(device), "size": size, "model": model_cfg, "matmul_parameters": n_matmul,
        "batch": {"sequences": batch.num_sequences, "prompt_len": prompt_len, "response_len": response_len,
                  "tokens": tokens, "micro_batch_size": micro_batch},
        "steps": steps, "warmup": warmup, "model_save_s": save_s,
        **{f"{k}_s": v for k, v in median.items()},
        "tokens_per_s": tokens / train_s, "model_tflops_per_step": flops / 1e12,
        "achieved_tflops": flops / train_s / 1e12, "peak_bf16_tflops": peak,
        "mfu": None if peak is None else flops / train_s / (peak * 1e12),
        "export_bytes": export_bytes, "export_gb_per_s": export_bytes / median["export"] / 1e9,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "last_loss": float(metrics["loss"]),
    }
    core.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--prompts", type=positive_int, default=8)
    parser.add_argument("--group-size", type=int_range(2), default=8, help="samples per prompt (GRPO: at least 2)")
    parser.add_argument("--prompt-len", type=positive_int, default=256)
    parser.add_argument("--response-len", type=positive_int, default=768)
    parser.add_argument("--micro-batch", type=positive_int, default=8)
    parser.add_argument("--steps", type=positive_int, default=3, help="timed steps")
    parser.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed steps before them")
    parser.add_argument("--peak-tflops", type=positive_float, default=None, help="dense BF16 peak of the device")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads on CPU (default: all)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run(args.size, args.prompts, args.group_size, args.prompt_len, args.response_len, args.micro_batch,
                 args.steps, args.warmup, args.peak_tflops)
    kind = "cuda" if result["device"].startswith("cuda") else "cpu"
    emit(f"learner_step_{kind}_{args.size}", result, save=not args.no_save)


if __name__ == "__main__":
    main()
