"""An IP address and port as the broker's logs and stored rows write it (``ip:port``)."""

from __future__ import annotations

Address = tuple[str, int]


def addr_text(addr: Address) -> str:
    """``ip:port`` (``[v6]:port``)."""
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_addr_text(text: str) -> Address:
    """Inverse of :func:`addr_text`. Raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not ip:port: {text!r}")
    return host.strip("[]"), int(port)
