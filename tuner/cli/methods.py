"""`tuner methods`: every method and variant with its paper and hyperparameters, or a starting file for one's own."""

from __future__ import annotations

import typer
from rich.table import Table

from tuner.cli.common import app, console, user_errors
from tuner.plugins import method_class


@app.command()
@user_errors
def methods(
    template: str | None = typer.Option(
        None,
        help="Print a starting file for a method of your own called NAME: tuner methods --template fednew > fednew.py",
    ),
):
    """List every method and variant: its paper, the code it follows, what it shares and its hyperparameters;
    with those installed packages add."""
    if template is not None:
        from tuner.method_template import template as starting_file

        typer.echo(starting_file(template), nl=False)
        return
    from dataclasses import asdict

    from algorithms import METHODS
    from tuner.plugins import installed_methods
    from tuner.settings.tuned_files import tuned_settings

    table = Table(title="Methods (tuner run NAME --set hyperparameter=value; your own: tuner run FILE.py:CLASS)")
    table.add_column("name", no_wrap=True)  # what a user types: never broken over lines
    for col in ("paper name", "paper", "follows", "shared", "hyperparameters (defaults)", "tuned for (--tuned)"):
        table.add_column(col)
    installed, tuned = installed_methods(), tuned_settings()
    for name in [*METHODS, *installed]:
        cls = method_class(name)
        hp = ", ".join(f"{k}={v}" for k, v in asdict(cls.Hparams()).items()) or "-"
        where = f" (from {installed[name].value})" if name in installed else ""
        shared = " ".join(p.rstrip(".") for p in cls.shared) or "-"
        settings = " ".join(tuned.get(cls.name, [])) or "-"
        table.add_row(name, cls.title + where, cls.paper or "-", cls.source or "-", shared, hp, settings)
    console.print(table)
