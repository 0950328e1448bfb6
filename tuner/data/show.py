"""Drawing a partition as the papers do: clients x classes, circle area = samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tuner.data.federated import FederatedData
from tuner.files import write_atomic


def draw_partition(data: FederatedData, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = data.label_counts()
    clients, classes = np.nonzero(counts)
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * data.num_clients + 2), max(3, 0.3 * data.num_classes + 1.5)))
    sizes = counts[clients, classes]
    ax.scatter(clients, classes, s=600 * sizes / max(sizes.max(), 1), alpha=0.6, color="tab:red", edgecolors="none")
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    ax.set_xticks(range(data.num_clients))
    ax.set_yticks(range(data.num_classes) if data.num_classes <= 20 else range(0, data.num_classes, 10))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda p: fig.savefig(p, dpi=120, format="png"))
    plt.close(fig)


def summary_rows(data: FederatedData) -> list[dict]:
    counts = data.label_counts()
    val = data.val.counts if data.val is not None else [0] * data.num_clients
    rows = []
    for i in range(data.num_clients):
        c = counts[i]
        rows.append(
            {
                "client": i,
                "group": int(data.group[i]),
                "train": int(c.sum()),
                "test": data.test.counts[i],
                "val": val[i],
                "classes": int((c > 0).sum()),
                "top class": f"{int(c.argmax())} ({100 * c.max() / max(c.sum(), 1):.0f}%)",
            }
        )
    return rows
