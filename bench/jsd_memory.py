"""Peak extra memory (and time) of the JSD weights at a Qwen3-sized vocabulary, chunked versus naive.

    OMP_NUM_THREADS=1 .venv/bin/python bench/jsd_memory.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/jsd_memory.py --tokens 4096 --variants chunked,compiled

Every variant computes the JSD weights and causal log-probs of ``--tokens`` tokens from
random final hidden states of both views through a random LM head [V, H] (V = 151,936,
H = 1,024 by default), in a fresh process of its own. Peak extra memory is the peak
resident set size during the computation minus the resident size just before it (the
peak is reset through /proc/self/clear_refs; where that is refused, the process's
lifetime peak is used, which can only overstate). Variants:

* ``naive``: logits of all tokens at once, then ``jsd_from_logits`` over [T, V]. Every
  large tensor is [T, V], so its memory is linear in T: it runs at ``--naive-tokens``
  (default 512, so that it cannot exhaust a shared machine) and the table also scales
  that figure to ``--tokens``.
* ``whole-chunk``: logits ``--chunk-size`` tokens at a time, the JSD formula over the
  whole chunk (the code before this benchmark).
* ``chunked``: logits ``--chunk-size`` tokens at a time, the JSD formula ``1 << 23``
  elements at a time (``jsd_weights_from_hidden``'s defaults).
* ``compiled``: as ``chunked``, through ``torch.compile`` (compiled once before the peak
  is reset; the compile itself is timed apart).

The resident peak of identical runs varies (1.40 to 2.02 GB for ``chunked`` at 1,024
tokens a chunk): glibc keeps some freed blocks in its heap instead of returning them,
depending on the order of allocations. Each variant but ``naive`` therefore runs
``--repeats`` times in fresh processes and the largest peak is the one reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from hp_agent.kernels import chosen_logprobs, jsd_from_logits, jsd_weights_from_hidden

VARIANTS = ("naive", "whole-chunk", "chunked", "compiled")
TARGET_GB = 2.0


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(variant: str, tokens: int, vocab: int, hidden_size: int, chunk_size: int, seed: int) -> dict:
    """Run one variant in this process; returns its peak extra memory and seconds."""
    torch.manual_seed(seed)
    head = torch.nn.Linear(hidden_size, vocab, bias=False).requires_grad_(False)
    causal, hindsight = torch.randn(tokens, hidden_size), torch.randn(tokens, hidden_size)
    ids = torch.randint(0, vocab, (tokens,))
    compile_s = 0.0
    if variant == "compiled":  # compile (and its memory) before the measured call
        started = time.perf_counter()
        jsd_weights_from_hidden(causal[:3], hindsight[:3], ids[:3], head, chunk_size, compiled=True)
        compile_s = time.perf_counter() - started

    def run() -> tuple[torch.Tensor, ...]:
        if variant == "naive":
            p_logits, q_logits = head(causal), head(hindsight)
            return jsd_from_logits(p_logits, q_logits), chosen_logprobs(p_logits, ids), chosen_logprobs(q_logits, ids)
        elements = 1 << 62 if variant == "whole-chunk" else 1 << 23
        return jsd_weights_from_hidden(causal, hindsight, ids, head, chunk_size, elements, variant == "compiled")

    reset = _reset_peak()
    before_kib = _status_kib("VmRSS")
    started = time.perf_counter()
    weights = run()[0]
    seconds = time.perf_counter() - started
    peak_kib = _status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "tokens": tokens, "peak_extra_gb": (peak_kib - before_kib) / 2**20, "seconds": seconds,
            "compile_s": compile_s, "peak_reset": reset, "weight_mean": float(weights.mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="scored tokens T")
    parser.add_argument("--naive-tokens", type=int, default=512, help="T for the naive variant (its memory is linear in T)")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size V (Qwen3: 151,936)")
    parser.add_argument("--hidden-size", type=int, default=1024, help="hidden size H of the random LM head")
    parser.add_argument("--chunk-size", type=int, default=512, help="tokens of logits at a time (hindsight.jsd_chunk_tokens)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fresh processes per variant but naive; the largest peak is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: run one variant, print JSON
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.child:
        tokens = args.naive_tokens if args.child == "naive" else args.tokens
        print(json.dumps(measure(args.child, tokens, args.vocab, args.hidden_size, args.chunk_size, args.seed)))
        return 0

    rows = []
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
        command = [sys.executable, __file__, "--child", variant] + [a for a in (argv or sys.argv[1:]) if a != "--child"]
        runs = []
        for _ in range(1 if variant == "naive" else args.repeats):
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        peaks = [run["peak_extra_gb"] for run in runs]
        rows.append({**runs[0], "peak_extra_gb": max(peaks), "peak_extra_gb_runs": peaks,
                     "seconds": statistics.median(run["seconds"] for run in runs)})
        print(f"[{variant} done]", file=sys.stderr, flush=True)

    print(f"V {args.vocab}  H {args.hidden_size}  T {args.tokens}  chunk {args.chunk_size} tokens  "
          f"torch threads {torch.get_num_threads()}  target < {TARGET_GB:g} GB extra")
    print(f"{'variant':>12} {'T run':>6} {'peak GB':>8} {f'GB at T={args.tokens}':>12} {'seconds':>8} {'compile s':>9}"
          "  peak GB per run")
    for row in rows:
        scaled = row["peak_extra_gb"] * args.tokens / row["tokens"] if row["variant"] == "naive" else row["peak_extra_gb"]
        row["peak_extra_gb_at_tokens"] = scaled
        print(f"{row['variant']:>12} {row['tokens']:>6} {row['peak_extra_gb']:>8.2f} {scaled:>12.2f} "
              f"{row['seconds']:>8.1f} {row['compile_s']:>9.1f}  " + " ".join(f"{p:.2f}" for p in row["peak_extra_gb_runs"]))
    by_name = {row["variant"]: row for row in rows}
    if "naive" in by_name and "chunked" in by_name:
        print(f"naive / chunked memory at T={args.tokens}: "
              f"{by_name['naive']['peak_extra_gb_at_tokens'] / by_name['chunked']['peak_extra_gb']:.1f}x")
    if "chunked" in by_name and "compiled" in by_name:
        print(f"chunked / compiled seconds: {by_name['chunked']['seconds'] / by_name['compiled']['seconds']:.2f}x")
    for name in ("chunked", "compiled"):
        if name in by_name:
            verdict = "met" if by_name[name]["peak_extra_gb"] < TARGET_GB else "NOT met"
            print(f"{name}: {by_name[name]['peak_extra_gb']:.2f} GB extra, target < {TARGET_GB:g} GB {verdict}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
