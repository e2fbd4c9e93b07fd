"""TLS for the node service, configured as MindSpore's dynamic cluster is.

``--tls_config config.json`` (or ``MSLAUNCH_TLS_CONFIG``) names a file with
the fields of the dynamic-cluster document: ``server_cert_path`` and
``client_cert_path`` (PKCS#12 files, as documented, or PEM files holding a
certificate and its key), ``ca_cert_path``, ``crl_path`` (may be empty),
``cipher_list`` and ``cert_expire_warning_time_in_day``.  Passwords of the
PKCS#12 files (or encrypted PEM keys) come from ``MSLAUNCH_TLS_SERVER_PASSWORD``
and ``MSLAUNCH_TLS_CLIENT_PASSWORD``, never from argv.  Both sides check the
other's certificate against the CA (and the CRL when given): a node without
a valid certificate is refused.  A certificate within the warning window of
its expiry gives one warning line.  Host names are not checked (nodes are
often addressed by IP); the CA is what is trusted.
"""

from __future__ import annotations

import datetime
import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from ..core.errors import LaunchError

_FIELDS = ("server_cert_path", "client_cert_path", "ca_cert_path", "crl_path", "cipher_list",
           "cert_expire_warning_time_in_day")


def read_config(path: str) -> Dict[str, Any]:
    """The config file's fields (LaunchError naming the file for anything wrong)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 20))
    except OSError as err:
        raise LaunchError(f"TLS config {path}: {err.strerror}") from None
    except ValueError as err:
        raise LaunchError(f"TLS config {path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise LaunchError(f"TLS config {path}: expected a JSON object")
    config = {k: data.get(k) for k in _FIELDS}
    base = os.path.dirname(os.path.abspath(path))
    for key in ("server_cert_path", "client_cert_path", "ca_cert_path", "crl_path"):
        value = config[key]
        if value in (None, ""):
            config[key] = None
            continue
        if not isinstance(value, str):
            raise LaunchError(f"TLS config {path}: {key} must be a path")
        config[key] = os.path.join(base, value)
    for key in ("server_cert_path", "client_cert_path", "ca_cert_path"):
        if config[key] is None:
            raise LaunchError(f"TLS config {path}: {key} is missing")
    days = config["cert_expire_warning_time_in_day"]
    if days is None:
        days = 90
    if isinstance(days, bool) or not isinstance(days, int) or days < 0:
        raise LaunchError(f"TLS config {path}: cert_expire_warning_time_in_day must be a "
                          f"whole number of days")
    config["cert_expire_warning_time_in_day"] = days
    if config["cipher_list"] is not None and not isinstance(config["cipher_list"], str):
        raise LaunchError(f"TLS config {path}: cipher_list must be a string")
    return config


def _load_identity(path: str, password: Optional[str]) -> Tuple[bytes, bytes, Any]:
    """(key PEM, certificate chain PEM, certificate) from a PKCS#12 or PEM file."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        import sys
        raise LaunchError("TLS for the node service needs the cryptography package: "
                          f"{sys.executable} -m pip install cryptography") from None
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as err:
        raise LaunchError(f"TLS: {path}: {err.strerror}") from None
    secret = password.encode() if password else None
    key: Optional[PrivateKeyTypes]
    try:
        if data.lstrip().startswith(b"-----"):
            key = serialization.load_pem_private_key(data, secret)
            certs = x509.load_pem_x509_certificates(data)
        else:
            from cryptography.hazmat.primitives.serialization import pkcs12
            key, cert, extra = pkcs12.load_key_and_certificates(data, secret)
            certs = [c for c in [cert, *(extra or [])] if c is not None]
    except (ValueError, TypeError) as err:
        raise LaunchError(f"TLS: {path}: cannot read the key and certificate ({err}); is "
                          f"the password right?") from None
    if key is None or not certs:
        raise LaunchError(f"TLS: {path}: no key and certificate in it")
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
    return key_pem, chain, certs[0]


def _expiry_warning(cert, days: int, path: str, warn: Callable[[str], None]) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    try:
        end = cert.not_valid_after_utc
    except AttributeError:      # older cryptography
        end = cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)
    if end < now:
        raise LaunchError(f"TLS: the certificate in {path} expired on {end:%Y-%m-%d}")
    if end - now < datetime.timedelta(days=days):
        warn(f"warning: the certificate in {path} expires on {end:%Y-%m-%d}, within "
             f"{days} days")


def context(config: Dict[str, Any], server: bool, warn: Callable[[str], None]):
    """An SSLContext for the service (``server``) or a node, with mutual checks."""
    import ssl
    import tempfile
    role = "server" if server else "client"
    path = config[f"{role}_cert_path"]
    password = os.environ.get(f"MSLAUNCH_TLS_{role.upper()}_PASSWORD")
    key_pem, chain_pem, cert = _load_identity(path, password)
    _expiry_warning(cert, config["cert_expire_warning_time_in_day"], path, warn)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.check_hostname = False
    try:
        ctx.load_verify_locations(cafile=config["ca_cert_path"])
        if config["crl_path"]:
            ctx.load_verify_locations(cafile=config["crl_path"])
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
        if config["cipher_list"]:
            ctx.set_ciphers(config["cipher_list"])
    except (ssl.SSLError, OSError) as err:
        raise LaunchError(f"TLS: {err}") from None
    # load_cert_chain reads files only: a private file that lives for an instant.
    with tempfile.TemporaryDirectory() as tmp:
        pem = os.path.join(tmp, "identity.pem")
        with open(os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(key_pem + chain_pem)
        try:
            ctx.load_cert_chain(pem)
        except ssl.SSLError as err:
            raise LaunchError(f"TLS: {path}: {err}") from None
    return ctx


def contexts(path: Optional[str], warn: Callable[[str], None]) -> List[Any]:
    """(server context, node context), or [] without a TLS config."""
    path = path or os.environ.get("MSLAUNCH_TLS_CONFIG")
    if not path:
        return []
    config = read_config(path)
    return [context(config, True, warn), context(config, False, warn)]
