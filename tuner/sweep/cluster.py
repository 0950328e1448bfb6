"""Where trials run: what each asks for (checked before Ray starts, and against the cluster's nodes once
connected), Ray started or joined, and how many trials share a worker, and so its compiled programs."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from tuner.errors import UserError
from tuner.sweep.console import quiet


@dataclass
class Resources:
    cpus_per_trial: float = 1
    gpus_per_trial: float | None = None  # None: 1 / TRIALS_PER_GPU when the cluster has GPUs, else 0
    max_concurrent: int | None = None
    address: str | None = None
    verbose: bool = False
    # where trials keep compiled programs (torch's on-disk caches); None: beside the sweep
    compile_cache: Path | None = None
    pack: int = 1  # trials a device steps as one pack (tuner/sweep/pack_host.py); 1: each trial its own run; 0: auto


def check_request(res: Resources) -> None:
    """What a trial asks for, checked before Ray starts (Ray waits for ever on a request no node can meet)."""
    if not res.cpus_per_trial > 0:
        raise UserError(f"--cpus-per-trial must be positive, not {res.cpus_per_trial:g}.")
    gpus = res.gpus_per_trial
    if gpus is not None and (gpus < 0 or (gpus > 1 and not float(gpus).is_integer())):
        raise UserError(
            f"--gpus-per-trial must be 0, a fraction of one GPU (0.5) or a whole number of GPUs, not {gpus:g}."
        )
    if res.max_concurrent is not None and res.max_concurrent < 1:
        raise UserError(f"--max-concurrent must be at least 1, not {res.max_concurrent}.")
    if res.pack != 1 and gpus is not None:
        raise UserError("--pack gives each GPU's pack the whole GPU; drop --gpus-per-trial, or --pack.")


def check_fits(request: dict[str, float]) -> None:
    """A trial must fit on one node of the cluster (once connected): else it would never be placed."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(n.get("CPU", 0) >= request["cpu"] and n.get("GPU", 0) >= request["gpu"] for n in nodes):
        return
    largest: dict[str, float] = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
    raise UserError(
        f"No node of the Ray cluster has {request['cpu']:g} CPUs and {request['gpu']:g} GPUs for one trial "
        "(the largest has "
        f"{largest.get('CPU', 0):g} CPUs and {largest.get('GPU', 0):g} GPUs); lower --cpus-per-trial or "
        "--gpus-per-trial."
    )


# Ray starts one worker per CPU for a new driver, ahead of its tasks; Tune's trials start workers of their own and
# never use those (seen: a 3-trial sweep on 2 CPUs started 4 workers, 2 of them never used), so the Ray a sweep starts
# itself prestarts none: on a 16-core node, 16 idle Python processes fewer as the sweep begins.
OWN_RAY_CONFIG = {"prestart_worker_first_driver": False}


def start_ray(res: Resources) -> None:
    import ray

    quiet(res.verbose)
    check_request(res)
    _check_reachable(res.address)
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    main = threading.current_thread() is threading.main_thread()
    # Ray's processes (its head, and the workers it starts) inherit a blocked SIGINT: a terminal's Ctrl-C, sent to the
    # whole process group, reaches this process alone, which stops the sweep as one (a Ctrl-C that reached Ray's
    # processes while they started could crash them, or be lost, and the sweep ran on). One during the start
    # arrives when it is unblocked, below.
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    # Without --address, Ray would join any cluster `ray start` left on this machine (someone else's, sized for
    # their work): a sweep starts its own, unless RAY_ADDRESS names one (as on a job submitted to a cluster).
    address = res.address or os.environ.get("RAY_ADDRESS") or "local"
    try:
        ray.init(
            address=address,
            logging_level=logging.INFO if res.verbose else logging.ERROR,
            log_to_driver=res.verbose,
            include_dashboard=False,
            configure_logging=True,
            _system_config=OWN_RAY_CONFIG if address == "local" else None,
        )
    except ConnectionError as e:  # it answered a TCP connect (_check_reachable): most often its token was missing
        token = (
            ""
            if os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
            else (
                "if it was started with token authentication (Ray's default where a token exists), set "
                "RAY_AUTH_MODE=token "
                "and its token in RAY_AUTH_TOKEN or ~/.ray/auth_token; else "
            )
        )
        raise UserError(
            f"Cannot join the Ray cluster at {address} ({e}): {token}check --address, or start one with `ray "
            "start --head`."
        ) from None
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if main:  # after ray.init, which installs its own handler
        signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    joined = None if address == "local" else address
    if joined:  # whose cluster it is shows in its size
        total = {"node": sum(1 for n in ray.nodes() if n.get("Alive")), **ray.cluster_resources()}
        size = ", ".join(
            f"{total.get(k, 0):g} {k}{'' if total.get(k, 0) == 1 else 's'}" for k in ("node", "CPU", "GPU")
        )
        print(f"joined the Ray cluster at {ray.get_runtime_context().gcs_address}: {size}", flush=True)
    _watch_cluster(joined)


WATCH_EVERY_S, WATCH_MISSES = 2.0, 3  # a head that refuses 3 connections in a row, 2 s apart, is gone


def _watch_cluster(address: str | None) -> None:
    """A cluster stopped under a sweep (`ray stop`, its head node down, Ray's local processes killed) ends this
    process a minute later from inside Ray, with a log line; this says it in one sentence, within seconds. What the
    sweep wrote stays: Tune saves its experiment's state every few seconds, and trials their checkpoints."""
    import ray

    context = ray.get_runtime_context()
    session, (host, _, port) = context.get_session_name(), context.gcs_address.rpartition(":")
    if address:
        gone = f"The Ray cluster at {context.gcs_address} stopped answering (stopped, or its head node went down)"
        again = "once the cluster is up again, "
    else:
        gone, again = "The Ray processes this sweep started stopped answering (killed, or out of memory)", ""

    def ours() -> bool:  # the session this process joined, not a later one (tests start several in one process)
        return ray.is_initialized() and ray.get_runtime_context().get_session_name() == session

    def watch() -> None:
        misses = 0
        while ours():
            time.sleep(WATCH_EVERY_S)
            try:
                socket.create_connection((host, int(port)), timeout=WATCH_EVERY_S).close()
                misses = 0
            except OSError:
                misses += 1
            if misses >= WATCH_MISSES and ours():
                sys.stderr.write(
                    f"\nerror: {gone}; the sweep's finished trials, checkpoints and state stay in its storage: "
                    f"{again}run the same command with --resume.\n"
                )
                sys.stderr.flush()
                os._exit(1)  # Ray would end this process anyway, a minute later

    threading.Thread(target=watch, name="cluster-watch", daemon=True).start()


def _check_reachable(address: str | None) -> None:
    """ray.init retries an unreachable head for minutes; a plain TCP connect says so in seconds."""
    if not address or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or address, int(port or 6379)), timeout=5).close()
    except (OSError, ValueError):
        raise UserError(
            f"No Ray cluster answers at {address}; start one with `ray start --head` there, or fix --address."
        ) from None


def _stop_like_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a scheduler's stop) ends a sweep as Ctrl-C does: Ray Tune saves the experiment's state and stops."""
    os.kill(os.getpid(), signal.SIGINT)


# Runs that share one GPU before their total rounds/s stops rising by 10 %: the GPU campaign's sharing
# stage (bench/gpu_campaign.py), H100 80GB, commit 91f1f1c, eager engine: k=1 0.24, k=2 0.47 rounds/s
# (the stage ran out of time before k=4). Fourteen eager runs of different methods at once (commit 0f70fac)
# kept the H100 91-99 % busy at 3.6 times one eager run's rounds/s, so eager's knee is far above 2; but a
# sweep on CUDA of a method and backbone checked there compiles (tuner/engine/compile.py auto_engine), which busies one
# GPU
# more: measure the knee compiled first (bench/gpu_campaign.py's sharing stage).
TRIALS_PER_GPU = 2


def trial_resources(res: Resources) -> dict[str, float]:
    import ray

    gpus = res.gpus_per_trial
    if gpus is None:
        gpus = 1 / TRIALS_PER_GPU if ray.cluster_resources().get("GPU", 0) > 0 else 0
    return {"cpu": res.cpus_per_trial, "gpu": gpus}


def worker_rounds(
    request: dict[str, float], trials: int, rounds: int, max_concurrent: int | None, cluster: dict
) -> int:
    """The rounds one worker runs in a stage: its share of the trials (Tune reuses workers, and their programs)."""
    return rounds * math.ceil(trials / min(trial_slots(request, max_concurrent, cluster), trials))


def trial_slots(request: dict[str, float], max_concurrent: int | None, cluster: dict) -> int:
    """How many trials of this request run at once on the cluster."""
    workers = int(cluster.get("CPU", 1) // request["cpu"])
    if request["gpu"]:
        workers = min(workers, int(cluster.get("GPU", 0) // request["gpu"]))
    return max(1, min(workers, max_concurrent or workers))
