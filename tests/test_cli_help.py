"""`tandem serve --help` lists its flags under model, engine, server and gateway headings, in order."""

from click.testing import CliRunner

from tandem.cli import cli
from tandem.cli_help import SERVE_GROUPS


def test_serve_help_is_grouped_model_engine_server_gateway():
    out = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).output
    headings = [out.index(f"\n{title}:\n") for title, _ in SERVE_GROUPS]
    assert headings == sorted(headings)  # in that order
    sections = [out[a:b] for a, b in zip(headings, [*headings[1:], len(out)], strict=True)]
    model, engine, server, gateway = sections
    assert "--recipe" in model and "--threads" in engine and "--port" in server and "--replicas-max" in gateway
    assert "--replicas-max" not in server and "--replica-id" not in out  # hidden flags stay hidden


def test_every_visible_serve_flag_is_in_a_group():
    command = cli.commands["serve"]
    grouped = set().union(*(names for _, names in SERVE_GROUPS))
    visible = {p.name for p in command.params if not getattr(p, "hidden", False)}
    assert visible - grouped == set()  # a new flag lands under "Other options" until a group names it
