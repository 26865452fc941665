#!/usr/bin/env python3
"""Weak and strong scaling of train_mlp over 1, 2, 4 namespace nodes (launch/cluster/nscluster,
one rank per node, data parallel, CPU backend), each step split by train_mlp --timing into
compute, exposed communication and idle; compared with bench/scaling/model.py calibrated on
the same machine (the compute speed of as many single-rank processes
computing at once as the run has ranks, and comm_bench's all-reduce latency and bandwidth on
the cluster's link). Writes one JSON per run, a summary JSON and a PNG chart.

    sudo /usr/bin/python3 bench/scaling/run_scaling.py --build build --out docs/benchmarks

Needs root (network namespaces) and Debian's python3-matplotlib for the chart.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NSCLUSTER = os.path.join(ROOT, "launch", "cluster", "nscluster")
TIMING = re.compile(r"^timing: (\d+) steps, per step ([\d.]+) ms = compute ([\d.]+) ms \+ "
                    r"exposed communication ([\d.]+) ms \+ idle ([\d.]+) ms", re.M)


def env():
    e = dict(os.environ)
    # One thread per rank: the ranks share the machine's cores.
    e.update(QMESH_CPU_THREADS="1", OPENBLAS_NUM_THREADS="1", QMESH_COMM_TIMEOUT_S="600")
    return e


def cluster_run(nodes, argv, timeout):
    cmd = ["timeout", str(timeout), NSCLUSTER, "run", "-n", str(nodes), "--ppn", "1"] + argv
    p = subprocess.run(cmd, capture_output=True, text=True, env=env())
    if p.returncode != 0:
        sys.exit(f"run_scaling: failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def train(args, nodes, batch):
    argv = [os.path.join(args.build, "examples", "train_mlp", "train_mlp"), "--dp", str(nodes),
            "--tp", "1", "--layers", str(args.layers), "--hidden", str(args.hidden), "--ffn",
            str(args.ffn), "--seq", str(args.seq), "--batch", str(batch), "--steps", str(args.steps),
            "--recipe", "bf16", "--device", "cpu", "--timing", "--log-every", "100000"]
    out = cluster_run(nodes, argv, 900)
    m = TIMING.search(out)
    if not m:
        sys.exit(f"run_scaling: no timing line in:\n{out}")
    steps, step, compute, comm, idle = m.groups()
    return {"steps": int(steps), "step_ms": float(step), "compute_ms": float(compute),
            "exposed_comm_ms": float(comm), "idle_ms": float(idle)}


def all_reduce_us(args, nbytes):
    """Mean time (us) of an all-reduce of nbytes on 2 nodes, from comm_bench."""
    path = f"/tmp/qmesh-scaling-comm-{os.getpid()}.json"
    cluster_run(2, [os.path.join(args.build, "bench", "comm_bench"), "--backend", "mpi",
                    "--min-bytes", str(nbytes), "--max-bytes", str(nbytes), "--bytes-per-size",
                    str(max(nbytes * 16, 1 << 16)), "--json", path], 600)
    with open(path) as f:
        rows = json.load(f)["results"]
    os.remove(path)
    return next(r["time_us"] for r in rows if r["op"] == "all_reduce")


def compute_alone(args, copies, batch):
    """Seconds per FLOP of one rank while `copies` single-rank train_mlp processes compute at
    once (no communication): the compute speed the ranks of a `copies`-rank job get."""
    argv = [os.path.join(args.build, "examples", "train_mlp", "train_mlp"), "--dp", "1",
            "--layers", str(args.layers), "--hidden", str(args.hidden), "--ffn", str(args.ffn),
            "--seq", str(args.seq), "--batch", str(batch), "--steps", str(args.steps),
            "--recipe", "bf16", "--device", "cpu", "--timing", "--log-every", "100000"]
    procs = [subprocess.Popen(["timeout", "900"] + argv, stdout=subprocess.PIPE, text=True,
                              env=env()) for _ in range(copies)]
    per_step = []
    for p in procs:
        out, _ = p.communicate()
        m = TIMING.search(out)
        if p.returncode != 0 or not m:
            sys.exit(f"run_scaling: the compute calibration failed:\n{out}")
        per_step.append(float(m.group(3)) * 1e-3)
    flops = 12.0 * args.seq * batch * args.hidden * args.ffn * args.layers
    return statistics.mean(per_step) / flops


def calibrate_link(args):
    """All-reduce latency per ring step and bus bandwidth between two nodes (comm_bench)."""
    small = all_reduce_us(args, 8)
    big_bytes = 4 << 20
    big = all_reduce_us(args, big_bytes)
    latency = small * 1e-6 / 2  # a 2-rank ring all-reduce takes 2 steps
    # 2 ranks: time = 2 latency + B / busbw (2(n-1)/n = 1)
    return latency, big_bytes / max(big * 1e-6 - 2 * latency, 1e-9)


def chart(summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, mode in zip(axes, ["weak", "strong"]):
        runs = [r for r in summary["runs"] if r["mode"] == mode]
        x = list(range(len(runs)))
        c = [r["measured"]["compute_ms"] for r in runs]
        e = [r["measured"]["exposed_comm_ms"] for r in runs]
        i = [r["measured"]["idle_ms"] for r in runs]
        ax.bar(x, c, label="compute")
        ax.bar(x, e, bottom=c, label="exposed communication")
        ax.bar(x, i, bottom=[a + b for a, b in zip(c, e)], label="idle")
        ax.plot(x, [r["predicted"]["step_ms"] for r in runs], "kD", label="model")
        ax.set_xticks(x, [f"{r['nodes']} node{'s' if r['nodes'] > 1 else ''}" for r in runs])
        ax.set_ylabel("ms per step")
        ax.set_title(f"{mode} scaling, train_mlp dp over namespace nodes")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank (weak); per "
                    "step / largest node count (strong)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="calibration + measurement pairs "
                    "per run (medians)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("run_scaling: needs root (network namespaces): run it with sudo")
    os.makedirs(args.out, exist_ok=True)
    latency, bus_bw = calibrate_link(args)
    print(f"link: all-reduce latency {latency * 1e6:.0f} us per ring step, bus bandwidth "
          f"{bus_bw / 1e9:.3f} GB/s")
    summary = {"machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "link": {"latency_s": latency, "bus_bw_Bps": bus_bw}, "runs": []}
    biggest = max(args.nodes)
    for mode in ["weak", "strong"]:
        for n in args.nodes:
            batch = args.batch if mode == "weak" else args.batch * biggest // n
            # Calibration and measurement alternate, --repeats times; medians of each, so that
            # both see the same load of the machine as far as possible.
            rates, trials = [], []
            for _ in range(args.repeats):
                rates.append(compute_alone(args, n, batch))
                trials.append(train(args, n, batch))
            cal = model.CpuCalibration(s_per_flop=statistics.median(rates), latency=latency,
                                       bus_bw=bus_bw)
            measured = min(trials, key=lambda t: abs(t["step_ms"] - statistics.median(
                [u["step_ms"] for u in trials])))  # the trial with the median step time
            pred = model.predict_train_mlp(args.layers, args.hidden, args.ffn, args.seq * batch,
                                           dp=n, tp=1, cal=cal)
            run = {"mode": mode, "nodes": n, "ranks": n, "batch_per_rank": batch,
                   "calibration_s_per_flop": cal.s_per_flop, "repeats": args.repeats,
                   "step_ms_trials": [t["step_ms"] for t in trials],
                   "tokens_per_step": args.seq * batch * n, "measured": measured,
                   "predicted": {k: v * 1e3 for k, v in
                                 (("step_ms", pred["step_s"]), ("compute_ms", pred["compute_s"]),
                                  ("comm_ms", pred["comm_s"]))}}
            run["error"] = run["predicted"]["step_ms"] / measured["step_ms"] - 1
            run["tokens_per_s"] = run["tokens_per_step"] / (measured["step_ms"] * 1e-3)
            summary["runs"].append(run)
            with open(os.path.join(args.out, f"scaling-cpu-{mode}-{n}nodes.json"), "w") as f:
                json.dump(run, f, indent=1)
            print(f"{mode:6} {n} nodes: measured {measured['step_ms']:8.1f} ms (compute "
                  f"{measured['compute_ms']:.1f}, comm {measured['exposed_comm_ms']:.1f}, idle "
                  f"{measured['idle_ms']:.1f}), model {run['predicted']['step_ms']:8.1f} ms "
                  f"({100 * run['error']:+.0f}%)", flush=True)
    summary["within_20_percent"] = all(abs(r["error"]) <= 0.2 for r in summary["runs"])
    with open(os.path.join(args.out, "scaling-cpu.json"), "w") as f:
        json.dump(summary, f, indent=1)
    chart(summary, os.path.join(args.out, "scaling-cpu.png"))
    print(f"wrote {args.out}/scaling-cpu.json and scaling-cpu.png; model within 20% of every "
          f"run: {summary['within_20_percent']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
