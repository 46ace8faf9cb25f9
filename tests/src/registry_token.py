"""A registry token server for tests (the `WWW-Authenticate: Bearer` flow of the distribution
spec): GET /token?service=&scope= with the one user's Basic credentials answers a JWT signed
RS256 (by `openssl dgst`) with the test key, its certificate in `x5c`, granting the scopes
asked; anything else is 401. Usage: registry_token.py PORTFILE KEY CERT USER PASSWORD ISSUER."""

import base64
import http.server
import json
import subprocess
import sys
import time
import urllib.parse
import uuid

PORTFILE, KEY, CERT, USER, PASSWORD, ISSUER = sys.argv[1:7]


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def certificate_der():
    pem = open(CERT).read()
    body = "".join(l for l in pem.splitlines() if "CERTIFICATE" not in l)
    return body  # base64 DER, as x5c wants (standard alphabet)


def token(service, scopes):
    access = []
    for scope in scopes:
        kind, name, actions = scope.split(":", 2)
        access.append({"type": kind, "name": name, "actions": actions.split(",")})
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT", "x5c": [certificate_der()]}
    claims = {
        "iss": ISSUER, "sub": USER, "aud": service, "exp": now + 600, "nbf": now - 10,
        "iat": now, "jti": str(uuid.uuid4()), "access": access,
    }
    signing = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", KEY], input=signing.encode(), capture_output=True, check=True
    ).stdout
    return f"{signing}.{b64url(signature)}"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if url.path != "/token" or self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        issued = token(query.get("service", [""])[0], query.get("scope", []))
        body = json.dumps({"token": issued, "access_token": issued, "expires_in": 600}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(PORTFILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os

os.rename(PORTFILE + ".tmp", PORTFILE)
server.serve_forever()
