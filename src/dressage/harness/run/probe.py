"""Start-up check of an external engine: is anything answering at ``--engine-url``?

``dressage run --engine-url URL`` asks the engine's ``/health`` once before any agent starts, so
that an unreachable engine is one line naming the URL and the cause (connection refused, a host
name that does not resolve, a timeout, an error status) instead of a rollout of failed sessions.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.parse
import urllib.request

from dressage.errors import ConfigError, EngineTimeout, EngineUnavailable

__all__ = ["check_engine_reachable"]


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--engine-url: expected http://HOST:PORT, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"--engine-url: bad port in {url!r}") from None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def check_engine_reachable(url: str, *, timeout_s: float = 10.0) -> None:
    """Return when ``url`` answers ``GET /health`` below 500; raise naming ``url`` and the cause.

    :class:`ConfigError` for a URL that is not ``http(s)://HOST[:PORT]``, :class:`EngineTimeout`
    when it does not answer within ``timeout_s``, :class:`EngineUnavailable` otherwise.
    """
    host, port = _host_port(url)
    where = f"engine {url}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise EngineUnavailable(f"{where} is unreachable: DNS lookup of {host!r} failed ({exc.strerror})") from None
    errors: list[str] = []
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout_s)
                sock.connect(address)
            break
        except socket.timeout:
            raise EngineTimeout(f"{where} is unreachable: connecting to {host}:{port} timed out after "
                                f"{timeout_s:g} s") from None
        except ConnectionRefusedError:
            errors.append(f"connection refused by {host}:{port}")
        except OSError as exc:
            errors.append(f"cannot connect to {host}:{port} ({exc.strerror or exc})")
    else:
        raise EngineUnavailable(f"{where} is unreachable: {errors[0] if errors else 'no address to connect to'}")
    health = url.rstrip("/") + "/health"
    try:
        # No proxy from the environment: the engine is asked directly, as the Proxy will.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(health, timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        if exc.code < 500:
            return  # something answers; the first /generate reports what it thinks of our requests
        raise EngineUnavailable(f"{where} is not ready: GET /health answered HTTP {exc.code}") from None
    except (socket.timeout, TimeoutError):
        raise EngineTimeout(f"{where} did not answer GET /health within {timeout_s:g} s") from None
    except urllib.error.URLError as exc:
        reason = exc.reason if isinstance(exc.reason, str) else (getattr(exc.reason, "strerror", None) or exc.reason)
        raise EngineUnavailable(f"{where} is unreachable: {reason}") from None
    except (ConnectionError, OSError) as exc:
        raise EngineUnavailable(f"{where} is unreachable: {exc.strerror or exc}") from None
