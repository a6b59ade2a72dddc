"""The book pool warms its text frontend at start, as the model pools warm their models: it
is live (counted by /readyz, its heartbeat) only once a first book's plan would not pay for
loading the default voice's G2P."""

from __future__ import annotations

import pytest
import requests

from tests.helpers import free_port, running_farm, wait_until

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_the_book_pool_is_live_only_with_its_frontend_warm(redis_url, tmp_path):
    port = free_port()
    with running_farm(redis_url, 12, tmp_path, workers=False) as tf:
        tf.start_worker("book", "--loglevel", "INFO", "--metrics-port", str(port),
                        "--metrics-addr", "127.0.0.1")
        tf.wait_live("book")
        # Live means warm: the gauge the model pools report, set by the frontend's warm-up.
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        warm = [line for line in text.splitlines()
                if line.startswith("voxfarm_model_processes_warm")]
        assert warm and float(warm[0].split()[-1]) == 1.0, warm
        # The log says what was loaded, for which voice (the worker writes it before the
        # heartbeat starts; its output reaches the file through a pipe: wait for it).
        voice = tf.settings.default_voice
        wait_until(lambda: f"text frontend warm for voice {voice}" in tf.log_tail("book"), 30,
                   lambda: f"no warm-up line in the book log:\n{tf.log_tail('book')}")
