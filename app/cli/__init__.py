"""The `voxfarm` command: run the farm, one of its pools, or speak through a running farm.

    voxfarm up [--port N]                   the whole farm on one machine (what `make run`
                                            starts): the Procfile's lines, restarted if they exit
    voxfarm worker acoustic|vocoder|book|quality    one worker pool
    voxfarm models list|canary|promote|rollback|log   voice versions and their canary
    voxfarm flower                          Flower against the farm's broker
    voxfarm say "text" -o out.wav           synthesize through a farm's HTTP API
    voxfarm book render FILE -o DIR         render a book through a farm's HTTP API
    voxfarm voices [--language L ...]       the voices a farm takes, custom ones included

`voxfarm up` writes where the farm listens to `<var>/farm.json` (app/local/farmstate.py); `say`,
`book render` and `flower` read it, so they find the farm `make run` started by themselves.
Flags and environment variables (VOXFARM_SERVER, VOXFARM_REDIS_URL) win over the file.

One module a command (app/cli/up.py, pools.py, say.py, book.py, keys.py, models.py,
voices.py); the
Procfile's parser and the supervisor `up` runs are modules of their own. Commands import
what they run lazily: `say` needs neither Celery workers nor torch.
"""

from __future__ import annotations

import click

from app.cli.book import book
from app.cli.keys import at_rest_key, keys
from app.cli.models import models
from app.cli.pools import flower, worker
from app.cli.say import say
from app.cli.up import up
from app.cli.voices import voices


@click.group()
def main() -> None:
    """voxfarm: a text-to-speech synthesis farm."""


for command in (up, worker, models, flower, say, book, keys, at_rest_key, voices):
    main.add_command(command)
