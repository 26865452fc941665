#!/usr/bin/env python3
"""An analytic step-time model for data x tensor (x fsdp, x pipeline) parallel training.

Two uses (docs/scaling_runs.md):
  * train_mlp on a namespace cluster (bench/scaling/run_scaling.py): calibrated by measured
    single-rank compute speed and measured all-reduce latency and bandwidth, it predicts the
    step time at other node counts, checked against measurements;
  * transformers on H100 clusters (published peak rates and link bandwidths): step time,
    exposed communication, MFU and the FP8 speed-up for 8 to 1024 GPUs.

Collectives follow the ring algorithm: an all-reduce of B bytes over n ranks costs
2(n-1) latency steps plus 2(n-1)/n * B / bandwidth (reduce-scatter or all-gather: half).

    python3 bench/scaling/model.py h100 [--json FILE] [--png FILE]   # the H100 predictions
"""
import argparse
import importlib.util
import json
import sys
from dataclasses import dataclass, asdict


def all_reduce_time(nbytes, n, bandwidth, latency):
    """Seconds for a ring all-reduce of `nbytes` over `n` ranks (bandwidth in bytes/s)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / bandwidth


@dataclass(frozen=True)
class Hardware:
    name: str
    bf16_flops: float        # dense peak per device, FLOP/s
    fp8_flops: float         # dense peak per device, FLOP/s
    gemm_efficiency: float   # fraction of peak that large GEMMs reach
    attention_efficiency: float  # fraction of BF16 peak that fused attention reaches
    other_fraction: float    # non-GEMM work (norms, softmax, optimizer) as a fraction of GEMM time
    intra_bw: float          # bytes/s per device and direction inside a node
    inter_bw: float          # bytes/s per device and direction between nodes
    latency: float           # s per ring step
    devices_per_node: int
    dp_overlap: float        # fraction of the backward pass that hides gradient reduction
    tp_overlap: float        # fraction of tensor-parallel communication hidden behind GEMMs


# Published H100 SXM figures: 989 TFLOP/s BF16 and 1979 TFLOP/s FP8 dense, NVLink 4 at
# 450 GB/s per direction, one 400 Gb/s InfiniBand NIC per GPU. The efficiencies and overlaps
# are assumptions of the model (docs/scaling_runs.md), not fitted to the figures it is
# compared with.
H100 = Hardware("H100 SXM, NVLink 450 GB/s, 400 Gb/s IB per GPU", 989e12, 1979e12,
                gemm_efficiency=0.70, attention_efficiency=0.45, other_fraction=0.15, intra_bw=450e9, inter_bw=50e9,
                latency=8e-6, devices_per_node=8, dp_overlap=0.8, tp_overlap=0.6)


@dataclass(frozen=True)
class Transformer:
    name: str
    layers: int
    hidden: int
    ffn: int
    seq: int
    vocab: int
    global_batch: int        # sequences per step

    def linear_params(self):
        """Parameters of the linear layers (attention projections and MLP)."""
        return self.layers * (4 * self.hidden ** 2 + 2 * self.hidden * self.ffn)

    def params(self):
        return self.linear_params() + self.vocab * self.hidden

    def flops_per_token(self):
        """Training FLOPs per token (forward + backward = 3 x forward): (linear, other GEMMs)."""
        linear = 6 * self.linear_params()
        attention = 3 * 4 * self.layers * self.seq * self.hidden  # QK^T and AV, causal not halved
        logits = 6 * self.vocab * self.hidden
        return linear, attention + logits


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int = 1
    fsdp: bool = False       # shard parameters over dp (all-gather + reduce-scatter)
    microbatches: int = 1    # per step and pipeline, for the pipeline bubble

    @property
    def devices(self):
        return self.dp * self.tp * self.pp


def predict(model, layout, hw, fp8=False):
    """Step time (s), its parts, and MFU for `model` trained with `layout` on `hw`."""
    tokens = model.global_batch * model.seq
    linear_ft, other_ft = model.flops_per_token()
    per_device = 1.0 / layout.devices
    linear_rate = (hw.fp8_flops if fp8 else hw.bf16_flops) * hw.gemm_efficiency
    attention_ft = 3 * 4 * model.layers * model.seq * model.hidden
    gemm = tokens * per_device * (linear_ft / linear_rate +
                                  (other_ft - attention_ft) / (hw.bf16_flops * hw.gemm_efficiency) +
                                  attention_ft / (hw.bf16_flops * hw.attention_efficiency))
    compute = gemm * (1 + hw.other_fraction)
    bubble = compute * (layout.pp - 1) / max(layout.microbatches, 1) if layout.pp > 1 else 0.0

    # Tensor parallelism (sequence parallel): per layer 2 all-gathers + 2 reduce-scatters
    # forward and again backward of the replica's activations (BF16) = 4 all-reduces.
    tp_bw = hw.intra_bw if layout.tp <= hw.devices_per_node else hw.inter_bw
    act_bytes = 2 * tokens / layout.dp * model.hidden
    tp_comm = 4 * model.layers / layout.pp * all_reduce_time(act_bytes, layout.tp, tp_bw, hw.latency)
    tp_exposed = tp_comm * (1 - hw.tp_overlap)

    # Data parallelism: BF16 gradients of this device's shard, reduced over dp, hidden behind
    # part of backward. With fsdp the parameters are all-gathered in forward and again in
    # backward and the gradients reduce-scattered: 3 half-all-reduces, 1.5 x the bytes.
    same_node = layout.dp * layout.tp <= hw.devices_per_node
    dp_bw = hw.intra_bw if same_node else hw.inter_bw
    grad_bytes = 2 * model.params() / (layout.tp * layout.pp)
    dp_comm = all_reduce_time(grad_bytes, layout.dp, dp_bw, hw.latency) * (1.5 if layout.fsdp else 1)
    dp_exposed = max(0.0, dp_comm - hw.dp_overlap * compute * 2 / 3)

    step = compute + bubble + tp_exposed + dp_exposed
    model_flops = tokens * (linear_ft + other_ft)
    return {
        "step_s": step,
        "compute_s": compute,
        "bubble_s": bubble,
        "exposed_comm_s": tp_exposed + dp_exposed,
        "tp_comm_s": tp_comm,
        "dp_comm_s": dp_comm,
        "mfu": model_flops / (step * layout.devices * hw.bf16_flops),
    }


# ---- train_mlp on a CPU namespace cluster ----------------------------------------------------

@dataclass(frozen=True)
class CpuCalibration:
    """Measured on the machine: seconds per FLOP (train_mlp's count, 12 x tokens x hidden x
    ffn x layers) of one rank while as many ranks as the job has compute at once without
    communicating (the cores' sharing included), and the all-reduce latency per ring step and
    bus bandwidth on the cluster's link."""
    s_per_flop: float
    latency: float
    bus_bw: float


def predict_train_mlp(layers, hidden, ffn, tokens_per_rank, dp, tp, cal, small_collectives=3):
    """Step time (s) and its parts for train_mlp with dp x tp ranks on the CPU cluster;
    nothing is overlapped (on a loaded CPU no core is idle to progress messages)."""
    ranks = dp * tp
    compute = 12.0 * tokens_per_rank * hidden * ffn * layers / tp * cal.s_per_flop
    grad_bytes = 4.0 * layers * (2 * hidden * ffn / tp + ffn / tp + 3 * hidden)
    comm = all_reduce_time(grad_bytes, dp, cal.bus_bw, cal.latency)
    # tp without sequence parallelism: 2 all-reduces of the activations (fp32) per layer
    # forward and 2 backward.
    comm += 4 * layers * all_reduce_time(4.0 * tokens_per_rank * hidden, tp, cal.bus_bw, cal.latency)
    comm += small_collectives * all_reduce_time(8, ranks, cal.bus_bw, cal.latency)  # loss, amax
    return {"step_s": compute + comm, "compute_s": compute, "comm_s": comm}


# ---- the H100 table ---------------------------------------------------------------------------

GPT_175B = Transformer("GPT-3 175B", layers=96, hidden=12288, ffn=49152, seq=4096, vocab=131072,
                       global_batch=1152)
LLAMA_8B = Transformer("8B (Llama-3-like)", layers=32, hidden=4096, ffn=14336, seq=4096,
                       vocab=131072, global_batch=512)
GPT_70B = Transformer("70B", layers=80, hidden=8192, ffn=28672, seq=4096, vocab=131072,
                      global_batch=1024)


def h100_table():
    rows = []
    plans = [  # (model, tp, pp, gpus)
        (LLAMA_8B, 1, 1, [8, 64, 256, 1024]),
        (LLAMA_8B, 8, 1, [8, 64, 256, 1024]),
        (GPT_70B, 8, 1, [64, 256, 1024]),
        (GPT_70B, 16, 1, [256, 1024]),
        (GPT_175B, 8, 8, [128, 256, 512, 1024]),
    ]
    for model, tp, pp, counts in plans:
        for n in counts:
            dp = n // (tp * pp)
            if dp < 1 or model.global_batch % dp:
                continue
            layout = Layout(dp=dp, tp=tp, pp=pp, fsdp=pp == 1 and model is not LLAMA_8B,
                            microbatches=model.global_batch // dp)
            bf16 = predict(model, layout, H100)
            fp8 = predict(model, layout, H100, fp8=True)
            rows.append({"model": model.name, "gpus": n, "dp": dp, "tp": tp, "pp": pp,
                         "step_s_bf16": bf16["step_s"], "exposed_comm_s_bf16": bf16["exposed_comm_s"],
                         "mfu_bf16": bf16["mfu"], "step_s_fp8": fp8["step_s"],
                         "mfu_fp8_vs_bf16_peak": fp8["mfu"],
                         "fp8_speedup": bf16["step_s"] / fp8["step_s"]})
    return rows


# Megatron-LM's published strong scaling of GPT-3 175B on H100 (its README): the same batch
# of 1152 sequences of 4096 tokens from 96 to 4608 GPUs, MFU from 47% down to 42%.
MEGATRON_STRONG = {96: 0.47, 4608: 0.42}


def megatron_comparison():
    """The model's MFU for that run (tp 4 x pp 8, the rest data parallel), BF16."""
    rows = []
    for n in [96, 192, 384, 768, 1536, 3072, 4608]:
        dp = n // 32
        layout = Layout(dp=dp, tp=4, pp=8, microbatches=GPT_175B.global_batch // dp)
        r = predict(GPT_175B, layout, H100)
        rows.append({"gpus": n, "dp": dp, "tp": 4, "pp": 8, "mfu_model": r["mfu"],
                     "exposed_comm_s": r["exposed_comm_s"], "bubble_s": r["bubble_s"],
                     "mfu_published": MEGATRON_STRONG.get(n)})
    return rows


def charts(rows, comparison, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    by_plan = {}
    for r in rows:
        by_plan.setdefault(f"{r['model']} tp{r['tp']} pp{r['pp']}", []).append(r)
    for name, rs in by_plan.items():
        g = [r["gpus"] for r in rs]
        axes[0].plot(g, [100 * r["mfu_bf16"] for r in rs], "o-", label=name)
        axes[1].plot(g, [r["fp8_speedup"] for r in rs], "o-", label=name)
    axes[0].set_title("model: BF16 MFU on H100")
    axes[1].set_title("model: FP8 step-time speed-up over BF16")
    axes[2].plot([c["gpus"] for c in comparison], [100 * c["mfu_model"] for c in comparison],
                 "o-", label="model, tp4 pp8")
    pub = [c for c in comparison if c["mfu_published"]]
    axes[2].plot([c["gpus"] for c in pub], [100 * c["mfu_published"] for c in pub], "ks",
                 markersize=9, label="Megatron-LM published")
    axes[2].set_title("GPT-3 175B strong scaling, 1152 x 4096 tokens")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("MFU %")
    axes[2].set_ylabel("MFU %")
    axes[1].set_ylabel("x")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["h100"], help="h100: the H100 prediction table")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--png", help="also draw the charts into this PNG (needs matplotlib)")
    args = ap.parse_args(argv)
    if args.png and importlib.util.find_spec("matplotlib") is None:
        ap.error("--png needs matplotlib (apt-get install python3-matplotlib, or pip install "
                 "matplotlib); without --png the table and --json need nothing")
    rows = h100_table()
    comparison = megatron_comparison()
    print(f"{'model':20} {'gpus':>5} {'dp':>4} {'tp':>3} {'pp':>3} {'step bf16':>10} "
          f"{'exposed':>8} {'MFU bf16':>9} {'step fp8':>9} {'FP8 x':>6}")
    for r in rows:
        print(f"{r['model']:20} {r['gpus']:5d} {r['dp']:4d} {r['tp']:3d} {r['pp']:3d} "
              f"{r['step_s_bf16']:9.3f}s {r['exposed_comm_s_bf16']:7.3f}s {100 * r['mfu_bf16']:8.1f}% "
              f"{r['step_s_fp8']:8.3f}s {r['fp8_speedup']:6.2f}")
    print("\nGPT-3 175B strong scaling (tp 4 x pp 8) vs Megatron-LM's published MFU:")
    for c in comparison:
        pub = f"{100 * c['mfu_published']:.0f}%" if c["mfu_published"] else "-"
        print(f"  {c['gpus']:5d} GPUs: model {100 * c['mfu_model']:5.1f}%, published {pub}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hardware": asdict(H100), "rows": rows, "megatron_strong": comparison},
                      f, indent=1)
    if args.png:
        charts(rows, comparison, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
