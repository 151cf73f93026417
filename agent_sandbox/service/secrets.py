"""The host's secret store and each sandbox's secret material.

Store: one 0600 file per secret (born 0600: written to a new O_EXCL file, then renamed)
in a 0700 directory per owner (an API key on the gateway, "" for a local user's own
engine) under ``DATA_DIR/secrets``. A value is read only to hand it to a sandbox's proxy;
no API returns it, nothing logs it.

Material: when a sandbox is created with secrets, the host makes it a CA of its own (its
key never leaves the host; a name constraint limits it to the secrets' hosts), a
certificate for each secret host signed by it, and writes what the sandbox's proxy needs
(values, rules, certificates and keys) to a 0600 file in the host-only
``secrets/sandboxes`` directory; the sandbox gets only the CA's certificate (added to a
copy of the host's trust bundle, mounted read-only) and placeholders."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, WrongStateError
from agent_sandbox.core.secrets import SecretInfo, SecretRule, check_name, check_value, split_host

SANDBOX_CA_PATH = "/etc/abx/ca-certificates.crt"  # inside the sandbox, read-only
_HOST_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
MAX_STORED = 256  # secrets per owner
# What the tools inside a sandbox read for their trust store (curl, pip, requests, npm,
# node, git, OpenSSL itself).
_CA_ENVS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT",
            "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")


def _write_new(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``path`` replaced atomically by a file that has ``mode`` from its birth."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class SecretStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, data_dir: Path) -> SecretStore:
        """The store of the engine whose data directory is ``data_dir``."""
        return cls(data_dir / "secrets")

    def _dir(self, owner: str) -> Path:
        return self.root / "owners" / hashlib.sha256(owner.encode()).hexdigest()[:32]

    def put(self, owner: str, rule: SecretRule, value: str, *, replace: bool = False
            ) -> SecretInfo:
        check_value(value)
        where = _private_dir(self._dir(owner))
        path = where / f"{rule.name}.json"
        if path.exists() and not replace:
            raise WrongStateError(f"secret {rule.name} exists; delete it first or "
                                       "replace it (--replace)")
        if not path.exists() and len(list(where.glob("*.json"))) >= MAX_STORED:
            raise InvalidArgumentError(f"at most {MAX_STORED} secrets per owner")
        info = SecretInfo(**rule.model_dump(), created_at=time.time())
        _write_new(path, json.dumps({"rule": info.model_dump(mode="json"),
                                     "value": value}).encode())
        return info

    def _read(self, owner: str, name: str) -> dict[str, Any]:
        path = self._dir(owner) / f"{check_name(name)}.json"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFoundError(f"no secret named {name} (abx secrets list shows yours)"
                                ) from None
        with os.fdopen(fd, "rb") as f:
            return json.loads(f.read(1 << 20))

    def get(self, owner: str, name: str) -> SecretInfo:
        return SecretInfo(**self._read(owner, name)["rule"])

    def list(self, owner: str) -> list[SecretInfo]:
        out = []
        for path in sorted(self._dir(owner).glob("*.json")):
            with contextlib.suppress(NotFoundError, ValueError, OSError):
                out.append(self.get(owner, path.stem))
        return out

    def delete(self, owner: str, name: str) -> None:
        path = self._dir(owner) / f"{check_name(name)}.json"
        try:
            path.unlink()
        except FileNotFoundError:
            raise NotFoundError(f"no secret named {name}") from None

    def resolve(self, owner: str, names: list[str]) -> list[tuple[SecretRule, str]]:
        """The rules and values of ``names`` (NotFoundError for a name the owner has not)."""
        out = []
        for name in names:
            data = self._read(owner, name)
            out.append((SecretRule(**{k: v for k, v in data["rule"].items()
                                      if k != "created_at"}), data["value"]))
        return out

    # per sandbox ------------------------------------------------------------------------
    def _material(self, sandbox_id: str) -> Path:
        return self.root / "sandboxes" / f"{check_sandbox_id(sandbox_id)}.json"

    def ca_bundle(self, sandbox_id: str) -> Path:
        return self.root / "sandboxes" / f"{check_sandbox_id(sandbox_id)}.ca.pem"

    def prepare(self, sandbox_id: str, resolved: list[tuple[SecretRule, str]]) -> None:
        """The sandbox's CA, its certificates for the secrets' hosts, and the proxy's
        file; the sandbox's trust bundle (host CAs + its CA)."""
        hosts = sorted({split_host(h)[0] for rule, _ in resolved for h in rule.hosts})
        ca_cert, ca_key = _make_ca(sandbox_id, hosts)
        leaves = {h: _make_leaf(h, ca_cert, ca_key) for h in hosts}
        where = self.root / "sandboxes"
        _private_dir(self.root)
        where.mkdir(mode=0o711, exist_ok=True)
        os.chmod(self.root, 0o711)  # the bundle is mounted into the sandbox
        os.chmod(where, 0o711)
        material = {"secrets": [{**rule.model_dump(mode="json"), "value": value}
                                for rule, value in resolved],
                    "leaves": {h: list(pair) for h, pair in leaves.items()}}
        _write_new(self._material(sandbox_id), json.dumps(material).encode())
        bundle = b""
        for system in _HOST_BUNDLES:
            with contextlib.suppress(OSError):
                bundle = Path(system).read_bytes()
                break
        _write_new(self.ca_bundle(sandbox_id), bundle.rstrip(b"\n") + b"\n" + _pem(ca_cert),
                   0o644)

    def material(self, sandbox_id: str) -> SandboxSecrets | None:
        try:
            fd = os.open(self._material(sandbox_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(16 << 20))
        return SandboxSecrets(secrets=data["secrets"],
                              leaves={h: tuple(p) for h, p in data["leaves"].items()},
                              ca_bundle=str(self.ca_bundle(sandbox_id)))

    def forget(self, sandbox_id: str) -> None:
        for path in (self._material(sandbox_id), self.ca_bundle(sandbox_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


@dataclass(frozen=True)
class SandboxSecrets:
    """What a sandbox's proxy is given (values included) and what the sandbox sees."""

    secrets: list[dict[str, Any]]
    leaves: dict[str, tuple[str, str]]  # host -> (certificate PEM, key PEM)
    ca_bundle: str  # host path of the bundle mounted at SANDBOX_CA_PATH

    def envs(self) -> dict[str, str]:
        """The sandbox's side: placeholders and its trust bundle."""
        out = {s["env"]: f"abx-secret:{s['name']}" for s in self.secrets}
        return {**dict.fromkeys(_CA_ENVS, SANDBOX_CA_PATH), **out}


def check_sandbox_id(sandbox_id: str) -> str:
    if not sandbox_id.replace("-", "").isalnum() or len(sandbox_id) > 64:
        raise InvalidArgumentError(f"{sandbox_id[:80]!r} is not a sandbox id")
    return sandbox_id


# certificates -----------------------------------------------------------------------------
def _pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _make_ca(sandbox_id: str, hosts: list[str]) -> tuple[Any, Any]:
    """A CA for this sandbox only, limited by a name constraint to ``hosts``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                         f"abx sandbox {sandbox_id} secrets CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.NameConstraints(
                permitted_subtrees=[x509.DNSName(h) for h in hosts], excluded_subtrees=None),
                critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _make_leaf(host: str, ca_cert: Any, ca_key: Any) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=397))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return _pem(cert).decode(), key_pem.decode()
