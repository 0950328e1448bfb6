"""The CLI as a test calls it: in this process, every argument as text, and never a traceback."""

from typer.testing import CliRunner

from tuner.cli import app

runner = CliRunner()


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    return res
