"""Shared fixtures: a real Redis, real Celery worker processes, the app as gunicorn serves it.

Redis: `VOXFARM_REDIS_URL` when set (give the tests a database of their own), else an
embedded `redis-server` started for the session. Each farm a test needs lives in its own
Redis database, so killing one farm's workers never disturbs another's queues. The harness
these fixtures build on (farms, gunicorn, bounded waits) is in tests/helpers.py.
"""

from __future__ import annotations

import os

import pytest

from app.local.embedded_redis import EmbeddedRedis
from tests import brokers
from tests.helpers import FarmUnderTest, gunicorn_server, running_farm, slowdown

# The test farms inherit the environment: each would load Kokoro-82M (82M parameters) at its
# pools' start for no test of its own. Kokoro's tests ask for it warm (lazy_engines="").
os.environ.setdefault("VOXFARM_LAZY_ENGINES", "kokoro")


def pytest_report_header(config) -> str:
    if not brokers.use_amqp():
        return "voxfarm broker: Redis (VOXFARM_TEST_BROKER=amqp runs the farms on RabbitMQ)"
    why = brokers.amqp_unavailable()
    return f"voxfarm broker: RabbitMQ at {brokers.AMQP_WHERE}" + (
        f" -- UNAVAILABLE: {why}; the farm tests skip" if why else "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the shared farm shows its workers' log tails and queues: a farm that
    stopped rendering fails every test after it, and the log says why."""
    report = yield
    tf = item.funcargs.get("farm") if report.failed and call.when == "call" else None
    if isinstance(tf, FarmUnderTest):
        report.sections.append(("shared farm", tf.diagnosis()))
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """pytest-timeout's bound on a whole test (setup.cfg, or a test's own `timeout` mark) is
    a safety net against a hang, written for an idle box: it stretches with the load the way
    the tests' own waits do (tests/helpers.py, `slowdown`), so on a busy box it still fires
    only after every wait inside the test has had its time."""
    marker = item.get_closest_marker("timeout")
    base = marker.args[0] if marker and marker.args else (
        item.config.getoption("timeout", None) or item.config.getini("timeout"))
    if base and float(base) > 0:
        item.add_marker(pytest.mark.timeout(float(base) * slowdown()), append=False)
    return (yield)


def pytest_sessionstart(session) -> None:
    if brokers.use_amqp() and not brokers.amqp_unavailable():
        brokers.remove_stale_vhosts()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    url = os.environ.get("VOXFARM_REDIS_URL")
    if url:
        yield url
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def farm(redis_url, tmp_path_factory) -> FarmUnderTest:
    """The shared farm (database 0): one acoustic and one vocoder worker process."""
    with running_farm(redis_url, 0, tmp_path_factory.mktemp("farm"),
                      visibility_timeout=60) as tf:
        yield tf


@pytest.fixture(scope="session")
def client(farm):
    from web import create_app

    app = create_app(farm.settings, farm.farm)
    return app.test_client()


# -- gunicorn ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def server(farm, tmp_path_factory) -> str:
    """The web app as gunicorn (gevent workers) serves it, on the shared farm."""
    with gunicorn_server(farm.env, tmp_path_factory.mktemp("web") / "gunicorn.log") as base:
        yield base
