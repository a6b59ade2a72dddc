"""Every command that calls a farm's API takes its API key (--api-key, or VOXFARM_API_KEY)
and says so in its --help: a farm with keys on answers 401 to a command that has no way to
pass one. (What a 401 then says: tests/integration/test_keys_closed.py, against a served
farm.)"""

from __future__ import annotations

import click
from click.testing import CliRunner

from app.cli import main


def client_commands(group: click.Group = main, path: tuple[str, ...] = ()):
    """Every command (nested groups included) that talks to a farm over HTTP: those with a
    --server option."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from client_commands(command, (*path, name))
        elif any("--server" in p.opts for p in command.params if isinstance(p, click.Option)):
            yield (*path, name)


def test_the_client_commands_are_found():
    assert {("say",), ("book", "render"), ("voices",)} <= set(client_commands())


def test_every_client_command_lists_api_key_in_its_help():
    runner = CliRunner()
    for command in client_commands():
        result = runner.invoke(main, [*command, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert "--api-key KEY" in result.output, (command, result.output)
        assert "VOXFARM_API_KEY" in result.output, (command, result.output)
