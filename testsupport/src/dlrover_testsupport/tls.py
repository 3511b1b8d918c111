"""Certificates for tests of TLS: made on the spot, valid for ``localhost`` and 127.0.0.1.

With the `cryptography` package when it is installed, else the ``openssl`` command; a test that
has neither is skipped, saying so (`require_tls_tools`).
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

__all__ = ["CertPair", "MutualTLSFiles", "mutual_tls_files", "require_tls_tools", "self_signed"]

_NAMES = ("localhost",)
_IPS = ("127.0.0.1",)


@attrs.frozen
class CertPair:
    """A PEM certificate file and its private key file."""

    cert: str
    key: str


@attrs.frozen
class MutualTLSFiles:
    """A CA, a server certificate (``localhost``, 127.0.0.1) and a client certificate it signed."""

    ca: str
    server: CertPair
    client: CertPair


def _have_cryptography() -> bool:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False
    return True


def require_tls_tools() -> None:
    """Skip the calling test when neither `cryptography` nor ``openssl`` can make a certificate."""
    if not _have_cryptography() and shutil.which("openssl") is None:
        pytest.skip("making a certificate needs the cryptography package or the openssl command; neither is here")


def self_signed(directory: Path, stem: str = "server") -> CertPair:
    """A self-signed certificate for ``localhost`` and 127.0.0.1 (it is its own CA).

    Skips the test when no tool can make one (see `require_tls_tools`).
    """
    require_tls_tools()
    pair = CertPair(str(directory / f"{stem}.crt"), str(directory / f"{stem}.key"))
    if _have_cryptography():
        _crypto_cert(pair, subject="localhost", issuer=None, ca=True, server=True)
    else:
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", "/CN=localhost", "-addext", _san_text(), "-keyout", pair.key, "-out", pair.cert,
        )  # fmt: skip
    return pair


def mutual_tls_files(directory: Path) -> MutualTLSFiles:
    """A CA and the server and client certificates it signed.

    Skips the test when no tool can make them (see `require_tls_tools`).
    """
    require_tls_tools()
    ca = CertPair(str(directory / "ca.crt"), str(directory / "ca.key"))
    server = CertPair(str(directory / "server.crt"), str(directory / "server.key"))
    client = CertPair(str(directory / "client.crt"), str(directory / "client.key"))
    if _have_cryptography():
        _crypto_cert(ca, subject="dlrover test CA", issuer=None, ca=True, server=False)
        _crypto_cert(server, subject="localhost", issuer=ca, ca=False, server=True)
        _crypto_cert(client, subject="dlrover agent", issuer=ca, ca=False, server=False)
    else:
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", "/CN=dlrover test CA", "-keyout", ca.key, "-out", ca.cert,
        )  # fmt: skip
        for pair, subject, ext in ((server, "localhost", _san_text()), (client, "dlrover agent", "")):
            csr = str(Path(pair.cert).with_suffix(".csr"))
            _openssl(
                "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-subj", f"/CN={subject}", "-keyout", pair.key, "-out", csr,
            )  # fmt: skip
            extfile = Path(pair.cert).with_suffix(".ext")
            extfile.write_text(ext.replace("subjectAltName=", "subjectAltName = ") + "\n" if ext else "\n")
            _openssl(
                "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial", "-days", "2",
                "-extfile", str(extfile), "-out", pair.cert,
            )  # fmt: skip
    return MutualTLSFiles(ca.cert, server, client)


def _san_text() -> str:
    return "subjectAltName=" + ",".join([*(f"DNS:{n}" for n in _NAMES), *(f"IP:{ip}" for ip in _IPS)])


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _crypto_cert(pair: CertPair, *, subject: str, issuer: CertPair | None, ca: bool, server: bool) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    if issuer is None:
        issuer_name, signing_key = name, key
    else:
        issuer_cert = x509.load_pem_x509_certificate(Path(issuer.cert).read_bytes())
        loaded = serialization.load_pem_private_key(Path(issuer.key).read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        issuer_name, signing_key = issuer_cert.subject, loaded
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in _NAMES]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _IPS]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(signing_key, hashes.SHA256())
    Path(pair.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(pair.key).write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    Path(pair.key).chmod(0o600)
