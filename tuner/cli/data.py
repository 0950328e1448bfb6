"""`tuner data show`: a partition drawn as the papers draw it, and summarized."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from tuner.cli.common import absolute, console, data_app, make_config, user_errors
from tuner.data.user_data import is_user_data


@data_app.command("show")
@user_errors
def data_show(
    dataset: str = typer.Option(
        "fmnist",
        help="A built-in dataset's name, or your own data as a path: a .parquet or .npz file, or PFLlib's "
        "train/ and test/ folders.",
    ),
    partition: str = typer.Option("dir:0.1", help="iid, pat:N, dir:BETA, pac:S, or natural (your data's own clients)."),
    clients: int | None = typer.Option(
        None, help="Number of clients \\[default: 20; with --partition natural, the data's own]."
    ),
    out: Path = typer.Option(Path("partition.png"), callback=absolute, help="PNG file to draw the partition into."),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="Other data settings as name=value: seed, train_frac, val_frac, balance, groups, shift, "
        "pac_train, pac_test, data_dir.",
    ),
):
    """Draw a partition as the papers do (clients x classes, circle size = samples) and summarize it."""
    import torch

    from tuner.data.show import draw_partition, summary_rows
    from tuner.federated_run import build_data

    cfg = make_config("fedavg", None, {"dataset": dataset, "partition": partition, "clients": clients}, set_)
    data = build_data(cfg, torch.device("cpu"))
    name = Path(cfg.dataset).name if is_user_data(cfg.dataset) else cfg.dataset
    draw_partition(data, out, f"{name} {cfg.partition}, {cfg.clients} clients")
    table = Table(title=f"{name} {cfg.partition}: {cfg.clients} clients")
    rows = summary_rows(data)
    for col in rows[0]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*[str(v) for v in r.values()])
    console.print(table)
    console.print(f"partition drawn to {out}")
