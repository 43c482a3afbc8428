"""A stand-in for the two HyperPod endpoints the sagemaker_ray toolkit talks to, on 127.0.0.1 over TLS.

What toolkit-for-ray-on-sagemaker-ai 1.0.4 does for ``sagemaker_ray://<cluster>/<ns>`` (read from
its source, ``toolkit_for_ray_on_sagemaker_ai/job_submission/``):
1. reads the kubeconfig (``$KUBECONFIG``): current context -> cluster ``server`` + CA, user token
   (a static ``token`` or an ``exec`` plugin such as ``aws eks get-token``);
2. POSTs a ``RayDashboardConnection`` (group ``connection.access.sagemaker.amazonaws.com``,
   ``v1alpha1``, body ``spec.clusterName``, ``metadata.generateName: <cluster>-``) to
   ``<server>/apis/<group>/v1alpha1/namespaces/<ns>/raydashboardconnections`` with
   ``Authorization: Bearer <token>``, and reads ``status.connectionUrl`` = ``https://<host>/...?token=<jwt>``;
3. GETs ``https://<host>/bearer-auth?token=<jwt>`` (no redirects) and keeps the ``ray_session`` cookie;
4. hands Ray ``https://<host>`` plus that cookie, which Ray sends with every Jobs API request.

:class:`MockEKS` answers step 2, :class:`MockDashboard` answers step 3 and then forwards every
request carrying a valid session cookie to a real local Ray dashboard (plain http), so jobs really
run. Both record what they receive for the tests to check, and the dashboard can expire a session
after a number of requests to exercise re-authentication.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

GROUP = "connection.access.sagemaker.amazonaws.com"
VERSION = "v1alpha1"


@dataclass
class Certs:
    ca: Path
    cert: Path
    key: Path


def make_certs(folder: Path) -> Certs:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rlkit test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = Certs(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return out


def write_kubeconfig(path: Path, server: str, ca: Path, token: str, name: str = "hyperpod-test") -> Path:
    """An EKS-shaped kubeconfig with inline CA data and a static bearer token."""
    import yaml

    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": {"token": token}}],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


class _Server:
    def __init__(self, handler: type, certs: Certs) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(certs.cert), str(certs.key))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    @property
    def owner(self) -> Any:
        return self.server.owner  # type: ignore[attr-defined]

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, body: bytes, ctype: str = "application/json",
              extra: Optional[dict[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


@dataclass
class EKSRequest:
    path: str
    authorization: Optional[str]
    content_type: Optional[str]
    body: dict


class MockEKS(_Server):
    """The EKS API server's RayDashboardConnection endpoint (the HyperPod Ray Endpoint Operator's)."""

    def __init__(self, certs: Certs, token: str, clusters: dict[tuple[str, str], "MockDashboard"]) -> None:
        self.token = token
        self.clusters = clusters  # (namespace, cluster name) -> its dashboard
        self.requests: list[EKSRequest] = []
        super().__init__(_EKSHandler, certs)


class _EKSHandler(_Handler):
    def do_POST(self) -> None:  # noqa: N802 - http.server API
        eks: MockEKS = self.owner
        raw = self._body()
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"_raw": raw.decode(errors="replace")}
        with eks.lock:
            eks.requests.append(EKSRequest(self.path, self.headers.get("Authorization"),
                                           self.headers.get("Content-Type"), body))
        if self.headers.get("Authorization") != f"Bearer {eks.token}":
            return self._send(401, b'{"kind":"Status","code":401,"reason":"Unauthorized"}')
        parts = self.path.strip("/").split("/")
        # apis/<group>/<version>/namespaces/<ns>/raydashboardconnections
        if len(parts) != 6 or parts[:3] != ["apis", GROUP, VERSION] or parts[3] != "namespaces" \
                or parts[5] != "raydashboardconnections":
            return self._send(404, b'{"kind":"Status","code":404,"reason":"NotFound"}')
        ns, name = parts[4], (body.get("spec") or {}).get("clusterName")
        dash = eks.clusters.get((ns, name))
        if dash is None:
            return self._send(404, json.dumps({"kind": "Status", "code": 404,
                                               "message": f"raycluster {ns}/{name} not found"}).encode())
        jwt = dash.issue_token()
        obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RayDashboardConnection",
               "metadata": {"name": f"{body['metadata'].get('generateName', '')}abcde", "namespace": ns},
               "spec": body.get("spec"),
               "status": {"connectionUrl": f"{dash.url}/?token={jwt}"}}
        self._send(201, json.dumps(obj).encode())


@dataclass
class DashRequest:
    method: str
    path: str
    session: Optional[str]
    status: int


@dataclass
class MockDashboard(_Server):
    """The cluster's secured dashboard endpoint: /bearer-auth, then a cookie-checked proxy to Ray."""

    certs: Certs
    upstream: str                      # http://127.0.0.1:<ray dashboard port>
    expire_after: Optional[int] = None  # requests a session may make before it is revoked (401)
    tokens: dict[str, bool] = field(default_factory=dict)     # issued jwt -> unused
    sessions: dict[str, int] = field(default_factory=dict)    # session cookie -> requests made
    revoked: set[str] = field(default_factory=set)
    exchanges: list[str] = field(default_factory=list)        # jwts exchanged at /bearer-auth
    requests: list[DashRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(_DashHandler, self.certs)

    def issue_token(self) -> str:
        with self.lock:
            jwt = f"jwt-{len(self.tokens) + 1}"
            self.tokens[jwt] = True
        return jwt


class _DashHandler(_Handler):
    def _handle(self) -> None:
        dash: MockDashboard = self.owner
        url = urlsplit(self.path)
        body = self._body()
        if url.path == "/bearer-auth":
            jwt = (parse_qs(url.query).get("token") or [None])[0]
            with dash.lock:
                dash.exchanges.append(str(jwt))
                ok = jwt is not None and dash.tokens.get(jwt, False)
                if ok:
                    dash.tokens[jwt] = False  # single use
                    cookie = f"session-{len(dash.sessions) + 1}"
                    dash.sessions[cookie] = 0
            if not ok:
                return self._send(401, b"invalid or used token", "text/plain")
            return self._send(200, b"ok", "text/plain",
                              {"Set-Cookie": f"ray_session={cookie}; Path=/; Secure; HttpOnly"})
        session = None
        for part in (self.headers.get("Cookie") or "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == "ray_session":
                session = v
        with dash.lock:
            valid = session in dash.sessions and session not in dash.revoked
            if valid:
                dash.sessions[session] += 1
                if dash.expire_after is not None and dash.sessions[session] > dash.expire_after:
                    dash.revoked.add(session)
                    valid = False
        if not valid:
            with dash.lock:
                dash.requests.append(DashRequest(self.command, url.path, session, 401))
            return self._send(401, b"Unauthorized: missing or expired session", "text/plain")
        up = urlsplit(dash.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
        conn.request(self.command, self.path, body=body or None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        with dash.lock:
            dash.requests.append(DashRequest(self.command, url.path, session, resp.status))
        self._send(resp.status, data, resp.getheader("Content-Type") or "application/octet-stream")

    do_GET = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815 - http.server API
