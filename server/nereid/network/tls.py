"""TLS for the listening ports: the server-side ``ssl.SSLContext`` that HTTPS
(``--http-use-ssl``) and gRPC over TLS (``--grpc-use-ssl``, Triton's flags) listen with,
mutual TLS (client certificates checked against a root) optional.

Owns reading the certificate files and the words for what is wrong with them; the engines
only pass the context to their listener. Certificates are read at start; the server's
certificate and key can be read again into the same context (``reload_certificate``, on
SIGHUP for nereid's own engines): connections made after it use the new pair. A failure
names the flag, never a path or a key's contents.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from nereid.network.listening import StartupError

__all__ = ["TlsFiles", "reload_certificate", "server_context"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One port's TLS settings, as its flags gave them. ``prefix`` is the flags' prefix
    (``--http`` or ``--grpc``), for messages."""

    prefix: str
    cert: Path | None
    key: Path | None
    root: Path | None = None
    mutual: bool = False

    def check(self) -> None:
        """StartupError when the flags do not make a usable set (files not read yet)."""
        p = self.prefix
        if self.cert is None or self.key is None:
            raise StartupError(f"{p}-use-ssl needs {p}-server-cert and {p}-server-key")
        if self.mutual and self.root is None:
            raise StartupError(f"{p}-use-ssl-mutual needs {p}-root-cert (the CA that signs client certificates)")


def server_context(files: TlsFiles, alpn: tuple[str, ...]) -> ssl.SSLContext:
    """The server context for ``files``, offering ``alpn`` (``("h2",)`` for gRPC).
    StartupError names the flag whose file cannot be used."""
    files.check()
    assert files.cert is not None and files.key is not None
    p = files.prefix
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    reload_certificate(context, files)
    if files.root is not None:
        try:
            context.load_verify_locations(cafile=files.root)
        except OSError as exc:
            raise StartupError(f"{p}-root-cert: {exc.strerror}") from None
        except ssl.SSLError as exc:
            raise StartupError(f"{p}-root-cert: not a PEM certificate ({exc.reason})") from None
    context.verify_mode = ssl.CERT_REQUIRED if files.mutual else ssl.CERT_NONE
    context.set_alpn_protocols(list(alpn))
    return context


def reload_certificate(context: ssl.SSLContext, files: TlsFiles) -> None:
    """Read the server's certificate and key into ``context`` (new connections use them).
    StartupError naming the flags when they cannot be used; ``context`` keeps its pair."""
    assert files.cert is not None and files.key is not None
    p = files.prefix
    try:
        context.load_cert_chain(files.cert, files.key)
    except OSError as exc:
        raise StartupError(f"{p}-server-cert / {p}-server-key: {exc.strerror or 'cannot be read'}") from None
    except ssl.SSLError as exc:
        raise StartupError(
            f"{p}-server-cert / {p}-server-key: not a PEM certificate and its matching private key ({exc.reason})"
        ) from None
