"""The channel to the coordinator and calls on it: deadlines, the client token, TLS, and gRPC
errors turned into StagecoachError subclasses. Internal to the package."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import grpc

from stagecoach.errors import StagecoachError, from_rpc_error
from stagecoach.v1 import coordinator_pb2_grpc, generation_pb2_grpc

MAX_MESSAGE_BYTES = 64 << 20  # as the daemons (common/rpc/channel.h)


@dataclass
class TLS:
    """How to reach a coordinator that serves TLS (stagectl's --tls-* flags).

    Attributes:
        ca: PEM file of the CA that signed the coordinator's certificate; None: system roots.
        cert, key: PEM files of this client's certificate and key, for a coordinator that
            requires client certificates.
        server_name: the name the server's certificate carries, when it is not the address's host.
    """

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Optional[str], what: str) -> Optional[bytes]:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise StagecoachError(f"tls.{what}: cannot read '{path}': {e.strerror}") from None

        if (self.cert is None) != (self.key is None):
            raise StagecoachError("tls: cert and key go together")
        return grpc.ssl_channel_credentials(read(self.ca, "ca"), read(self.key, "key"),
                                            read(self.cert, "cert"))


def read_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    """The client token: `token`, or the first line of `token_file`."""
    if token is not None and token_file is not None:
        raise StagecoachError("give token or token_file, not both")
    if token_file is None:
        return token
    try:
        with open(os.path.expanduser(token_file), encoding="utf-8") as f:
            value = f.readline().strip()
    except OSError as e:
        raise StagecoachError(f"token_file: cannot read '{token_file}': {e.strerror}") from None
    if not value:
        raise StagecoachError(f"token_file: '{token_file}' is empty")
    return value


class Connection:
    """A channel and the stubs on it; every call has a deadline and raises StagecoachError."""

    def __init__(self, address: str, token: Optional[str], tls: Optional[TLS]):
        options: Sequence[Tuple[str, Any]] = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # A coordinator that went away is noticed within half a minute, even mid-stream.
            ("grpc.keepalive_time_ms", 20000),
            ("grpc.keepalive_timeout_ms", 10000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        if tls is not None:
            if tls.server_name:
                options = list(options) + [("grpc.ssl_target_name_override", tls.server_name)]
            self.channel = grpc.secure_channel(address, tls.credentials(), options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.coordinator = coordinator_pb2_grpc.CoordinatorServiceStub(self.channel)
        self.generation = generation_pb2_grpc.GenerationServiceStub(self.channel)
        self.address = address

    def call(self, name: str, request: Any, timeout: float, stub: Any = None) -> Any:
        """The unary call `name` on the coordinator (or `stub`) with a deadline."""
        method: Callable[..., Any] = getattr(stub or self.coordinator, name)
        try:
            return method(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, name) from None

    def stream(self, name: str, request: Any, timeout: Optional[float],
               stub: Any = None) -> Iterator[Any]:
        """The server-streaming call `name`: its messages; errors raised as StagecoachError.
        `timeout` None: the stream lasts as long as the server sends (keepalive notices a dead
        coordinator)."""
        method: Callable[..., Any] = getattr(stub or self.coordinator, name)
        responses = method(request, timeout=timeout, metadata=self.metadata)
        try:
            for response in responses:
                yield response
        except grpc.RpcError as e:
            raise from_rpc_error(e, name) from None
        finally:
            responses.cancel()

    def close(self) -> None:
        self.channel.close()
