"""Throwaway certificates for the tests of mutual TLS between peer farms: a CA, and
certificates it signs for servers (with 127.0.0.1 and localhost as their names) and for
clients (a farm's name as the subject's common name)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def cn(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class Pki:
    """A CA and the certificates it signs, written as PEM files under `d`."""

    def __init__(self, d: Path, ca_name: str = "voxfarm peers CA") -> None:
        self.d = d
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = self._sign(cn(ca_name), self.key.public_key(), ca=True)
        self.ca_path = d / f"{ca_name.replace(' ', '_')}.crt"
        self.ca_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _sign(self, subject: x509.Name, public_key, ca: bool,
              server: bool = False) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(subject)
                   .issuer_name(subject if ca else self.cert.subject)
                   .public_key(public_key).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                                  critical=True))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.DNSName("localhost")]), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def issue(self, stem: str, subject: x509.Name, server: bool = False) -> tuple[Path, Path]:
        """A certificate for `subject` and its key: (certificate file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._sign(subject, key.public_key(), ca=False, server=server)
        crt, pem = self.d / f"{stem}.crt", self.d / f"{stem}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
        return crt, pem
