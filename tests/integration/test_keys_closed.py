"""Once a farm has had API keys, revoking the last one leaves its API closed, never open to
whoever reaches it; `voxfarm keys open` opens it on purpose. And what the client commands say
to a farm with keys on: how to pass a key (--api-key, VOXFARM_API_KEY), or that the one passed
is refused.

The farm's web as gunicorn serves it, on a real Redis, and the `voxfarm` commands as a user
types them (in this process: click's runner). No worker runs: listing the voices needs
none."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from app.cli import main
from app.cli.client import KEY_REFUSED, NEEDS_KEY
from tests.brokers import use_amqp
from tests.helpers import served_web_only, wait_until
from web import auth, create_app

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(use_amqp(), reason="the keys live in Redis; no broker work")]


@pytest.fixture(scope="module")
def served(redis_url, tmp_path_factory):
    with served_web_only(redis_url, 9, tmp_path_factory.mktemp("keys-closed")) as (tf, base):
        yield tf, base


def voxfarm(tf, *args: str, **env: str) -> Result:
    """`voxfarm ARGS` against the test farm's Redis, with no key from the test's own
    environment unless given."""
    return CliRunner().invoke(main, list(args), env={
        "VOXFARM_REDIS_URL": tf.settings.redis_url, "VOXFARM_SERVER": None,
        "VOXFARM_API_KEY": None, **env})


def voices(tf, base: str, *args: str, **env: str) -> Result:
    return voxfarm(tf, "voices", "--server", base, *args, **env)


def test_a_keyed_farm_says_how_to_pass_a_key_and_stays_closed_once_every_key_is_revoked(
        served):
    tf, base = served
    assert voices(tf, base).exit_code == 0  # no key was ever made: open
    made = voxfarm(tf, "keys", "create", "ops")
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[-1]
    key_id = token.split("_")[1]

    # Keys on (the web notices within a moment): a command without a key is told how.
    wait_until(lambda: voices(tf, base).exit_code == 1, 10, "the web still open")
    refused = voices(tf, base)
    assert refused.stderr.strip() == f"Error: {NEEDS_KEY}", refused.stderr
    for given in (voices(tf, base, "--api-key", token),
                  voices(tf, base, VOXFARM_API_KEY=token)):
        assert given.exit_code == 0, given.output
        assert given.stdout.startswith("NAME ")
    wrong = voices(tf, base, "--api-key", token[:-2] + "xx")
    assert wrong.exit_code == 1 and wrong.stderr.strip() == f"Error: {KEY_REFUSED}"

    # Revoking the last key: closed, and the command says how to open it.
    revoked = voxfarm(tf, "keys", "revoke", key_id)
    assert revoked.exit_code == 0, revoked.output
    assert "the API stays closed" in revoked.stdout and "voxfarm keys open" in revoked.stdout
    wait_until(lambda: voices(tf, base, "--api-key", token).exit_code == 1, 10,
               "the revoked key still taken")
    # The web's view of whether keys are on, read afresh (not its copy of a moment ago).
    auth._enabled_cache.clear()
    client = create_app(tf.settings, tf.farm).test_client()
    closed = client.get("/v1/voices")
    assert closed.status_code == 401, closed.get_data(as_text=True)
    assert client.post("/v1/jobs", json={"text": "Nobody may."}).status_code == 401
    assert voices(tf, base).stderr.strip() == f"Error: {NEEDS_KEY}"
    listed = voxfarm(tf, "keys", "list")
    assert "revoked" in listed.stdout and "the API stays closed" in listed.stdout

    # Opened on purpose: open to whoever reaches it, until a key is made again.
    opened = voxfarm(tf, "keys", "open")
    assert opened.exit_code == 0 and "the API is open" in opened.stdout, opened.output
    wait_until(lambda: voices(tf, base).exit_code == 0, 10, "the web still closed")
    again = voxfarm(tf, "keys", "create", "ops again")
    assert again.exit_code == 0
    refused_open = voxfarm(tf, "keys", "open")
    assert refused_open.exit_code == 1 and "1 live key(s)" in refused_open.stderr
    wait_until(lambda: voices(tf, base).exit_code == 1, 10, "the web still open")
