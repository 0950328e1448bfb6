"""The convolution forms under vmap (`conv_form`, tuner/models.py), side by side in one run: cnn4 on Fashion-MNIST's
shape (1 x 28 x 28), 20 clients of batch 10, each client its own weights (vmap over clients, as a round's step):
milliseconds a step (forward, backward) eager and compiled, each form's ratio to `grouped` (vmap's own rule, one
grouped convolution of every client's), and the largest difference of its gradients from grouped's (float32).

Usage: python bench/conv_forms.py [--clients 20] [--batch 10] [--steps 20] [--device auto] [--json FILE]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a source checkout, with or without PYTHONPATH=.

from bench import provenance  # noqa: E402
from tuner.engine.compile import INDUCTOR_CONFIGS, compile_program  # noqa: E402
from tuner.models import CONV_FORMS, build_backbone, with_conv_form  # noqa: E402


def step_of(net):
    def loss(p, x, y):
        return F.cross_entropy(functional_call(net, p, (x,)), y)

    return vmap(grad_and_value(loss))


def timed(fn, args, steps: int, device: torch.device) -> float:
    """Seconds a call, after two warm-up calls (a compiled program's compiling, CUDA graphs' recording)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        fn(*args)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn(*args)
    sync()
    return (time.perf_counter() - t0) / steps


def forms(device: torch.device, clients: int = 20, batch: int = 10, steps: int = 20) -> dict:
    """Each form's ms a step eager and compiled, its ratios to grouped and its gradients' distance from grouped's."""
    torch.manual_seed(0)
    base = build_backbone("cnn4", (1, 28, 28), 10).to(device)
    params = {k: torch.stack([v.detach()] * clients) for k, v in base.named_parameters()}
    x = torch.randn(clients, batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (clients, batch), device=device)
    out, reference = {}, None
    for form in CONV_FORMS:
        step = step_of(with_conv_form(copy.deepcopy(base), form))
        grads, _ = step(params, x, y)
        reference = reference or grads
        program = compile_program(step, device, INDUCTOR_CONFIGS[-1][1])
        out[form] = {
            "eager ms/step": 1e3 * timed(step, (params, x, y), steps, device),
            "compiled ms/step": 1e3 * timed(program, (params, x, y), steps, device),
            "largest gradient difference from grouped": max(
                (grads[k] - reference[k]).abs().max().item() for k in grads
            ),
        }
    for f in out.values():
        for engine in ("eager", "compiled"):
            f[f"{engine} / grouped"] = f[f"{engine} ms/step"] / out["grouped"][f"{engine} ms/step"]
    return out


def line(out: dict) -> str:
    return "; ".join(
        f"{form} eager {f['eager ms/step']:.2f} ms ({f['eager / grouped']:.2f}), compiled {f['compiled ms/step']:.2f} "
        f"({f['compiled / grouped']:.2f})"
        for form, f in out.items()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    print(f"conv_forms on {provenance.machine()}, torch {torch.__version__}, {device}", flush=True)
    out = forms(device, args.clients, args.batch, args.steps)
    for form, f in out.items():
        print(
            f"  {form}: eager {f['eager ms/step']:.2f} ms a step ({f['eager / grouped']:.2f} of grouped), compiled "
            f"{f['compiled ms/step']:.2f} ({f['compiled / grouped']:.2f}); gradients within "
            f"{f['largest gradient difference from grouped']:.1e} of grouped's",
            flush=True,
        )
    if args.json:
        provenance.write(args.json, {"setting": vars(args), "forms": out})


if __name__ == "__main__":
    main()
