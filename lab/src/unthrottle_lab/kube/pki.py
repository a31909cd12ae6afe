"""The control plane's keys and certificates, made fresh for each start (``cryptography``).

One CA signs the API server's serving certificate (for 127.0.0.1, localhost, the
in-cluster names and the address it advertises, where a real node's pods reach it), the
admin's client certificate (group ``system:masters``), the API
server's client certificate for kubelets (logs, exec, port-forward) and, for a real node,
the kubelet's client certificate (``system:node:NAME`` in ``system:nodes``, as a kubelet
has after its TLS bootstrap), its serving certificate and kube-proxy's client certificate
(``system:kube-proxy``, the user the default ``system:node-proxier`` binding names); an
RSA key pair signs and checks service-account tokens. Nothing is reused between starts.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["NodePki", "Pki", "make_node_pki", "make_pki"]

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files in one folder."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def server(self) -> tuple[Path, Path]:
        return self.folder / "apiserver.crt", self.folder / "apiserver.key"

    @property
    def admin(self) -> tuple[Path, Path]:
        return self.folder / "admin.crt", self.folder / "admin.key"

    @property
    def kubelet_client(self) -> tuple[Path, Path]:
        """The API server's client certificate for kubelets (group ``system:masters``)."""
        return (
            self.folder / "apiserver-kubelet-client.crt",
            self.folder / "apiserver-kubelet-client.key",
        )

    @property
    def service_accounts(self) -> tuple[Path, Path]:
        """(public key, private key) for service-account tokens."""
        return self.folder / "sa.pub", self.folder / "sa.key"


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def _name(common: str, org: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(parts)


def _signed(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
            signer: ec.EllipticCurvePrivateKey, *, ca: bool = False,
            usage: list[x509.ObjectIdentifier] | None = None,
            sans: list[x509.GeneralName] | None = None) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY).not_valid_after(now + 30 * _DAY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )  # fmt: skip
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False), critical=True)  # fmt: skip
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def make_pki(folder: Path, *, service_ip: str, addresses: tuple[str, ...] = ()) -> Pki:
    """A CA, the API server's and the admin's certificates, and the service-account keys.
    The server's certificate names 127.0.0.1, ``service_ip`` and each of ``addresses``."""
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(folder)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("unthrottle-test-ca")
    ca = _signed(ca_name, ca_key, ca_name, ca_key, ca=True)
    _write(pki.ca, ca.public_bytes(serialization.Encoding.PEM))
    _write(pki.ca_key, _key_pem(ca_key))
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(service_ip)),
        *(x509.IPAddress(ipaddress.ip_address(a)) for a in addresses),
        *(x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                    "kubernetes.default.svc",
                                    "kubernetes.default.svc.cluster.local")),
    ]  # fmt: skip
    for (cert_path, key_path), subject, usage, names in (
        (pki.server, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, sans),
        (pki.admin, _name("admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, None),
        (
            pki.kubelet_client,
            _name("kube-apiserver-kubelet-client", "system:masters"),
            ExtendedKeyUsageOID.CLIENT_AUTH,
            None,
        ),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _signed(subject, key, ca_name, ca_key, usage=[usage], sans=names)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _key_pem(key))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public, private = pki.service_accounts
    _write(private, _key_pem(sa_key))
    _write(public, sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return pki


@dataclass(frozen=True)
class NodePki:
    """A real node's certificates, in a folder of its own."""

    folder: Path

    @property
    def client(self) -> tuple[Path, Path]:
        """The kubelet's client certificate: user ``system:node:NAME``, group ``system:nodes``."""
        return self.folder / "kubelet-client.crt", self.folder / "kubelet-client.key"

    @property
    def serving(self) -> tuple[Path, Path]:
        """The kubelet's serving certificate, for 127.0.0.1 and the node's address."""
        return self.folder / "kubelet.crt", self.folder / "kubelet.key"

    @property
    def proxy(self) -> tuple[Path, Path]:
        """kube-proxy's client certificate: user ``system:kube-proxy``, whom the default
        ClusterRoleBinding ``system:node-proxier`` lets watch Services and EndpointSlices."""
        return self.folder / "kube-proxy.crt", self.folder / "kube-proxy.key"


def _load_ca(pki: Pki) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return ca.subject, key


def make_node_pki(pki: Pki, folder: Path, *, node: str, address: str) -> NodePki:
    """A kubelet's client and serving certificates and kube-proxy's client certificate,
    signed by the control plane's CA."""
    folder.mkdir(parents=True, exist_ok=True)
    out = NodePki(folder)
    ca_name, ca_key = _load_ca(pki)
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(address)),
        x509.DNSName(node), x509.DNSName("localhost"),
    ]  # fmt: skip
    for (cert_path, key_path), subject, usage, names in (
        (out.client, _name(f"system:node:{node}", "system:nodes"),
         ExtendedKeyUsageOID.CLIENT_AUTH, None),
        (out.serving, _name(node), ExtendedKeyUsageOID.SERVER_AUTH, sans),
        (out.proxy, _name("system:kube-proxy"), ExtendedKeyUsageOID.CLIENT_AUTH, None),
    ):  # fmt: skip
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _signed(subject, key, ca_name, ca_key, usage=[usage], sans=names)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _key_pem(key))
    return out
