"""The browser boundary of `lathe api` and `lathe webui`: which `Host` and `Origin` headers a request may carry.

A web page the user merely visits can make their browser send requests to a server on 127.0.0.1: a form post
(any content type, no preflight) or, after DNS rebinding (the attacker's name re-pointed at 127.0.0.1), reads
too. Two checks stop both, as Jupyter's server does:
- `Host` must name this server: the bound address, `localhost`, a loopback IP, any IP literal when bound to all
  interfaces (an IP cannot be re-pointed), or a name the user allowed (`--allowed_host`, `*` allows any).
- a state-changing request (POST, PUT, PATCH, DELETE) whose `Origin` (or, absent, `Referer`) is not this
  server's own origin is refused, whatever its content type. Clients that are not browsers (curl, the OpenAI
  client) send neither header and pass; browsers always send `Origin` with a cross-site POST.
`refusal(...)` returns the reason (naming the header) or None; each server turns it into a 403 JSON body.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

LOCAL_NAMES = ("localhost",)
WILDCARDS = ("0.0.0.0", "::", "")
STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")
_HOST_PORT = re.compile(r"^(\[[^\]]*\]|[^:]*)(?::(\d+))?$")


def split_host(value: str) -> tuple[str, str | None]:
    """'name:port' / '[::1]:port' / 'name' -> (lower-case name without brackets, port or None)."""
    match = _HOST_PORT.match(value.strip())
    if match is None:
        return value.strip().lower(), None
    name = match.group(1)
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name.lower().rstrip("."), match.group(2)


def _ip(name: str):
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class Boundary:
    """The names a server answers to (`bound`: the address it listens on; `allowed`: --allowed_host values)."""

    def __init__(self, bound: str = "127.0.0.1", allowed: tuple[str, ...] | list[str] = ()):
        self.bound = split_host(bound)[0]
        self.any_host = "*" in allowed
        self.names = {*LOCAL_NAMES, self.bound, *(split_host(name)[0] for name in allowed if name != "*")}

    def host_allowed(self, host: str | None) -> bool:
        if self.any_host:
            return True
        if not host:
            return False
        name, _ = split_host(host)
        if name in self.names:
            return True
        address = _ip(name)
        if address is None:
            return False  # a name the user did not allow: what DNS rebinding would send
        return address.is_loopback or self.bound in WILDCARDS

    def refusal(self, method: str, headers) -> str | None:
        """Why a request (its method and headers: a case-insensitive mapping) is refused, or None."""
        host = headers.get("host")
        if not self.host_allowed(host):
            return (
                f"the Host header {host!r} is not a name of this server (allowed: the bound address, localhost, "
                "loopback addresses and --allowed_host names)."
            )
        if method.upper() not in STATE_CHANGING:
            return None
        origin, header = headers.get("origin"), "Origin"
        if origin is None and headers.get("referer") is not None:
            parts = urlsplit(headers["referer"])
            origin, header = f"{parts.scheme}://{parts.netloc}", "Referer"
        if origin is None:
            return None  # not sent by a browser page
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or split_host(parts.netloc) != split_host(host):
            return (
                f"the {header} header {origin!r} is not this server's own origin (http://{host}): "
                "requests that change state are accepted from this server's page only."
            )
        return None
