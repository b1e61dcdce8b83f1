"""Who may call the KV handoff service, and how the bytes are protected.

- Authentication: every call carries the run's KV token in its metadata
  (`AUTH_METADATA_KEY`); the server compares it in constant time and
  answers UNAUTHENTICATED otherwise. The token is derived from the run's
  secret for this service alone (`cluster.wall.auth.derive_key`), so it
  opens nothing else. Without TLS it crosses the wire in clear: anyone who
  can read the network can replay it, hence TLS or an isolated network
  (docs/security.md).
- TLS (optional): the server presents `cert_chain`/`private_key`; the
  client trusts `root_certificates` and checks the certificate against
  `server_name` (the certificate's name, since producers are reached by
  address). Certificates are PEM bytes; tests make a fresh CA at test time.
- Request-level access (a ticket per request, bound to one consumer) is
  the producer's (`node.access`), checked after authentication.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc

AUTH_METADATA_KEY = "x-disagg-kv-auth"


@dataclass(frozen=True)
class KVSecurity:
    auth_token: str | None = field(default=None, repr=False)
    # TLS, server side: PEM certificate chain and private key.
    cert_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    # TLS, client side: the PEM CA to trust and the name the certificate carries.
    root_certificates: bytes | None = field(default=None, repr=False)
    server_name: str | None = None

    @property
    def tls(self) -> bool:
        return self.root_certificates is not None or self.cert_chain is not None

    def call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        return None if self.auth_token is None else ((AUTH_METADATA_KEY, self.auth_token),)

    def authenticated(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        """True when the call's metadata carries the token (or none is required)."""
        if self.auth_token is None:
            return True
        for key, value in metadata or ():
            if key == AUTH_METADATA_KEY and isinstance(value, str):
                return hmac.compare_digest(value.encode(), self.auth_token.encode())
        return False

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if self.cert_chain is None or self.private_key is None:
            return None
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)])

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if self.root_certificates is None:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates)

    def channel_options(self) -> list[tuple[str, str]]:
        if self.root_certificates is not None and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []
