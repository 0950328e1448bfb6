"""The campaign's results as summary.md: one line a stage, then the speed figures, the profile's top kernels,
the real runs and any failed check."""

from __future__ import annotations


def summary_markdown(results: dict) -> str:
    lines = ["# GPU campaign", ""]
    env = results.get("environment", {})
    if env:
        lines += [
            f"Device: {env.get('name')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, TF32 matmul "
            f"{env.get('tf32_matmul')}; "
            f"commit {env.get('commit') or 'unknown'}",
            "",
        ]
    lines += ["| stage | result | seconds |", "|:--|:--|--:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r.get('line', r.get('error', ''))} | {r['seconds']} |")
    speed = results.get("speed", {}).get("figures", {})
    if speed:
        names = list(dict.fromkeys(k for r in speed.values() for k in r))
        lines += ["", "| method | " + " | ".join(names) + " |", "|:--|" + "--:|" * len(names)]
        lines += [f"| {m} | " + " | ".join(_cell(r.get(n, "")) for n in names) + " |" for m, r in speed.items()]
    top = results.get("profile", {}).get("top", [])
    if top:
        lines += ["", "| profiled kernel (20 steps) | calls | ms |", "|:--|--:|--:|"] + [
            f"| `{k['name']}` | {k['calls']} | {k['ms']:.2f} |" for k in top
        ]
    runs = results.get("real run", {}).get("runs", {})
    if runs:
        lines += [
            "",
            "| run | rounds | finished | s/round | best acc | final acc | note |",
            "|:--|--:|:--|--:|--:|--:|:--|",
        ]
        lines += [
            f"| {k} | {r['rounds']} | {r['finished']} | {r['s_per_round']:.3g} | {r['best_acc']:.4f} | "
            f"{r.get('final_acc', float('nan')):.4f} | "
            + (f"finished earlier, in {r['where']}" if "where" in r else r.get("left", ""))
            + " |"
            for k, r in runs.items()
        ]
    failed = results.get("correctness", {}).get("checks", {})
    bad = {k: v for k, v in failed.items() if v["status"] == "failed"}
    if bad:
        lines += ["", "Failed checks:", ""] + [f"- {k}: {v['message'].splitlines()[0]}" for k, v in bad.items()]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
