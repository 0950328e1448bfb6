"""Stages 3 and 4: bench/engine_speed.py's figures in the papers' Table 1 settings, and where 20 compiled steps
of GPFL's cohort spend their time (torch.profiler)."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from bench.engine_speed import NotCompiled, measure, table1, what_ran
from tuner.federated_run import build_simulation

SPEED_METHODS = [
    "fedavg",
    "gpfl",
    "fedcp",
    "fedpac",
    "pfedme",
    "pfedhn",
    "fedem",
]  # the targets: Table 1 settings; the last three ≤ 3× FedAvg


def speed(campaign, deadline: float) -> dict:
    out: dict = {}
    # smoke: every figure's code, once
    for method in ["fedavg"] if campaign.args.smoke else campaign.args.speed_methods:
        if time.monotonic() > deadline:
            break
        # the bench's code, in seconds
        smoke = dict(dataset="digits", partition="dir:0.3", clients=4, batch_size=40, backbone="mlp")
        figures = out[method] = {}
        try:
            if campaign.args.smoke:
                measure(method, campaign.device, rounds=1, out=figures, **smoke)
            else:
                measure(method, campaign.device, rounds=2, out=figures, data_dir=campaign.data)
        except NotCompiled as e:  # a finding, not a figure: the next method is still measured
            figures["not compiled"] = str(e)
        except Exception as e:  # the figures measured before it are kept
            figures["error"] = f"{type(e).__name__}: {e}"[:2000]
        except KeyboardInterrupt:  # a command's time limit (timeout -s INT): the figures this method reached are kept
            campaign.progress(speed_result(out))
            raise
        campaign.progress(speed_result(out))  # a command stopped in the next method keeps this one's figures
    return speed_result(out)


def speed_result(out: dict) -> dict:
    """The stage's result from the figures measured so far: a method stopped mid-measure shows what it reached."""

    def part(m: str, r: dict) -> str:
        if "not compiled" in r or "error" in r:
            return f"{m}: " + (f"not compiled ({r['not compiled']})" if "not compiled" in r else r["error"])
        if "second trial programs" not in r:
            return f"{m}: stopped before its figures were complete"
        return (
            f"{m} {r['eager s/round']:.3g} -> {r['compiled s/round']:.3g} s/round (compile + first round "
            f"{r['compile + first round s']:.0f} s, "
            f"a second trial's {r['second trial: compile + first round s']:.1f} s, "
            f"{r['second trial programs']} programs; CUDA graphs "
            f"{r['graph calls']} calls, {r['graph skips']} skipped)"
        )

    parts = [part(m, r) for m, r in out.items()]
    return {"figures": out, "line": "; ".join(parts) if parts else "no time left"}


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) spans: time the device was doing something, overlaps once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def profile(campaign, deadline: float) -> dict:
    """20 compiled steps of GPFL's Table 1 cohort (smoke: digits): timed with no profiler running (CUDA events on a
    GPU), then under torch.profiler, where the busy share is the union of the GPU's own spans inside one timed window
    (the profiler's start, stop and parsing left out) over that window."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    if campaign.args.smoke:
        cfg = campaign.digits("gpfl", dtype="float32", device=campaign.device, engine="compiled", executor="vectorized")
    else:
        cfg = table1("gpfl", campaign.device, data_dir=campaign.data, engine="compiled")
    sim = build_simulation(cfg)
    at = sim.at(1, list(range(sim.data.num_clients)))
    phases = [replace(p, steps=20) for p in sim.method.phases()]
    cohort = {k: v.clone() for k, v in sim.clients.items()}

    def steps() -> None:
        sim.executor.train(phases, cohort, sim.server, at, 0)

    steps()  # compiles the programs these steps need
    cuda = campaign.device.startswith("cuda")
    steps_s = timed(steps, cuda)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with record_function(WINDOW):
            window_s = timed(steps, cuda)
    events = prof.events()
    window = next(e.time_range for e in events if e.key == WINDOW)
    # the GPU's own events (kernels, copies): a CPU op's device time repeats its kernels', an annotation spans them
    if cuda:
        on_gpu = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
        names = {e.key for e in on_gpu}
        spans = [(max(e.time_range.start, window.start), min(e.time_range.end, window.end)) for e in on_gpu]
        busy = busy_seconds([(a, b) for a, b in spans if b > a]) / ((window.end - window.start) or 1)
        averages = [e for e in prof.key_averages() if e.key in names]
    else:
        busy, averages = float("nan"), [e for e in prof.key_averages() if e.key != WINDOW]
    time_of = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    kernels = [
        {"name": e.key[:80], "calls": e.count, "ms": time_of(e) / 1e3}
        for e in sorted(averages, key=time_of, reverse=True)[:10]
    ]
    by_width = step_seconds_by_width(sim, phases, cuda)
    if why := sim.executor.ran.not_compiled():  # the profile of an eager fallback is not the compiled engine's
        raise NotCompiled(f"the profiled steps {why}")
    ran = what_ran(sim)
    line = (
        f"20 steps in {steps_s:.3f} s ({window_s:.3f} profiled); device busy {100 * busy:.0f} % of the profiled "
        f"window; CUDA graphs {ran['graph calls']} calls, {ran['graph skips']} skipped; top: {kernels[0]['name']} "
        f"({kernels[0]['ms']:.1f} ms)"
    )
    line += "; a step by padded width: " + ", ".join(f"{w}: {1e3 * t:.2f} ms" for w, t in by_width.items())
    return {
        "steps_s": steps_s,
        "window_s": window_s,
        "device_busy_share": busy,
        "top": kernels,
        "step_s_by_width": by_width,
        **ran,
        "line": line,
    }


def step_seconds_by_width(sim, phases, cuda: bool) -> dict[int, float]:
    """Seconds a compiled step takes at each padded width (1, 2, 4, ... and the whole cohort), timed with no profiler
    running: the cohort's largest clients, as many as the width, through the profile's steps (compiled first)."""
    largest = sorted(range(sim.data.num_clients), key=lambda i: -int(sim.data.train.counts[i]))
    n, widths = sim.data.num_clients, [1]
    while widths[-1] * 2 < n:
        widths.append(widths[-1] * 2)
    out = {}
    for w in [*widths, n]:
        at = sim.at(1, sorted(largest[:w]))
        cohort = {k: v[at.clients].clone() for k, v in sim.clients.items()}

        def run(cohort=cohort, at=at) -> None:
            sim.executor.train(phases, cohort, sim.server, at, 0)

        run()  # compiles this width's programs
        before = sim.executor.ran.compiled_steps
        seconds = timed(run, cuda)
        out[w] = seconds / max(1, sim.executor.ran.compiled_steps - before)
    return out


WINDOW = "pfl-tuner: timed window"  # the profiler's annotation around the timed steps


def timed(fn, cuda: bool) -> float:
    """Seconds `fn` takes, the device's queue drained before and after: by CUDA events on a GPU, else the clock."""
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3
