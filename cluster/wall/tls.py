"""TLS for a run's KV handoff (and, with the same certificates, its
framed-TCP links: the proxy channel and the stage links, `frames.py`): a certificate authority and a server
certificate made for one run (or read from files the user gives), as the
`KVSecurity` every node of the run shares (connector/grpc/security.py).

Producers are reached by address, and which machine hosts which node is
Ray's choice, so the certificate names the run's KV service (`SERVER_NAME`)
instead of an address; clients check the certificate against that name
(`grpc.ssl_target_name_override`) and trust only the run's CA. The private
keys travel to the actors in their constructor arguments, like the run
secret (Ray's channels, authenticated with the cluster's token), and live
only as long as the run: a fresh CA per run, so a key from one run opens no
other.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile
from pathlib import Path

from connector.grpc.security import KVSecurity

SERVER_NAME = "kv.disagg-sim.run"
VALID_FOR = datetime.timedelta(days=2)  # a run is bounded by MAX_RUN_S (a day)


def run_kv_tls() -> KVSecurity:
    """A fresh CA and a server certificate for `SERVER_NAME` signed by it (EC P-256)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "disagg-sim run CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return KVSecurity(
        cert_chain=cert.public_bytes(pem),
        private_key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        root_certificates=ca_cert.public_bytes(pem),
        server_name=SERVER_NAME,
    )


def kv_tls_from_files(cert_chain: str, private_key: str, root_certificates: str, server_name: str) -> KVSecurity:
    """The user's own certificates (PEM files): `server_name` is the name the
    server certificate carries, which every client checks."""
    read: dict[str, bytes] = {}
    for what, path in (
        ("cert_chain", cert_chain),
        ("private_key", private_key),
        ("root_certificates", root_certificates),
    ):
        try:
            read[what] = Path(path).read_bytes()
        except OSError as err:
            raise ValueError(
                f"tls {what}={path!r}: cannot read it ({err.strerror or err}); allowed: a PEM file"
            ) from None
        if b"-----BEGIN " not in read[what]:
            raise ValueError(f"tls {what}={path!r}: not a PEM file; allowed: a PEM file")
    return KVSecurity(
        cert_chain=read["cert_chain"],
        private_key=read["private_key"],
        root_certificates=read["root_certificates"],
        server_name=server_name,
    )


def tls_wanted(mode: str, attached: bool) -> bool:
    """`cluster.tls`: on, off, or auto (on when attached to a cluster, which
    may span machines; off on the local default, all on 127.0.0.1)."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"tls={mode!r} is invalid; allowed: auto, on, off")
    return mode == "on" or (mode == "auto" and attached)


# The user's own certificates for the KV handoff: all four, or none (then one is made per run).
TLS_FILES_ENV = ("DISAGG_SIM_KV_TLS_CERT", "DISAGG_SIM_KV_TLS_KEY", "DISAGG_SIM_KV_TLS_CA", "DISAGG_SIM_KV_TLS_NAME")


def kv_tls_for_run(mode: str, attached: bool, environ: dict[str, str] | None = None) -> tuple[KVSecurity | None, str]:
    """The run's KV TLS (None: off) and a line saying what it is, for the results."""
    import os

    env = os.environ if environ is None else environ
    if not tls_wanted(mode, attached):
        return None, f"off (cluster.tls={mode}{', the local default on 127.0.0.1' if mode == 'auto' else ''})"
    given = [env.get(k) for k in TLS_FILES_ENV]
    if any(given) and not all(given):
        missing = [k for k, v in zip(TLS_FILES_ENV, given, strict=True) if not v]
        raise ValueError(
            f"KV TLS files: {', '.join(missing)} not set; allowed: all of {', '.join(TLS_FILES_ENV)}, or none"
        )
    if all(given):
        cert, key, ca, name = (str(v) for v in given)
        return kv_tls_from_files(cert, key, ca, name), f"on (cluster.tls={mode}; certificates from {cert})"
    return run_kv_tls(), f"on (cluster.tls={mode}; certificates generated for this run)"


def server_ssl_context(security: KVSecurity) -> ssl.SSLContext:
    """The run's certificate for a framed-TCP server (the proxy channel,
    the stage links): the same one the KV handoff presents."""
    if security.cert_chain is None or security.private_key is None:
        raise ValueError("server_ssl_context: the run's TLS has no certificate and key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The ssl module loads a certificate and key from files only: written
    # 0600 into a 0700 directory of this process, and removed at once.
    with tempfile.TemporaryDirectory(prefix="dsr-tls-") as directory:
        cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        for path, data in ((cert, security.cert_chain), (key, security.private_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        context.load_cert_chain(cert, key)
    return context


def client_ssl_context(security: KVSecurity) -> ssl.SSLContext:
    """Trusts the run's CA only, and checks the certificate's name (`server_hostname`)."""
    if security.root_certificates is None:
        raise ValueError("client_ssl_context: the run's TLS has no CA")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=security.root_certificates.decode())
    return context
