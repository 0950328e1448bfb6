"""Copy reproduction runs (config + metrics) into results/reproduction and print them beside the papers.

Usage: python bench/collect_reproduction.py RUN_DIR... (each a `tuner run` output directory)
`tuner report` will replace this once the platform has it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd
import yaml

from algorithms import METHODS

SETTING = {"pac": ("FedPAC", "Table1", "dominant_s20"), "pat": ("GPFL", "Table1", "pathological"), "dir": ("GPFL", "Table1", "practical")}


def main() -> None:
    papers = pd.read_csv(Path(__file__).parent.parent / "results" / "paper_tables.csv")
    out = Path(__file__).parent.parent / "results" / "reproduction"
    rows = []
    for run in map(Path, sys.argv[1:]):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        metrics = pd.read_parquet(run / "metrics.parquet")
        kind = cfg["partition"].split(":")[0]
        paper, table, setting = SETTING[kind]
        title = METHODS[cfg["method"]].title
        if title.startswith("FedPAC-") and title != "FedPAC-protoweights":
            table = "Table2-ablation"
        published = papers[(papers.paper == paper) & (papers.table == table) & (papers.setting == setting) & (papers.dataset == "FMNIST") & (papers.method == title)]
        if kind == "pac":
            published = published[published.num_clients == cfg["clients"]]
        ours = 100 * metrics["best_acc"].iloc[-1]
        pub = float(published["mean"].iloc[0]) if len(published) else float("nan")
        rows.append({"paper table": f"{paper} {table}", "setting": cfg["partition"], "method": title, "rounds": int(metrics["round"].iloc[-1]),
                     "ours (best acc %)": round(ours, 2), "paper": pub, "difference": round(ours - pub, 2)})  # fmt: skip
        dest = out / f"{kind}-{cfg['method']}"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("config.yaml", "metrics.parquet"):
            shutil.copy(run / name, dest / name)
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False))
    table.to_csv(out / "summary.csv", index=False)


if __name__ == "__main__":
    main()
