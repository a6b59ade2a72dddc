"""`python -m app.cli`: the `voxfarm` command, as the Procfile's lines run it."""

from app.cli import main

main()
