"""The connect-time address policy: no private or loopback host, also not through an IPv6
address that embeds one, and no plain http:// unless private networks are allowed."""

from __future__ import annotations

import asyncio
import socket

import pytest

from probes import ProbeSpec, probe
from probes.transport import address_allowed, warm_clients


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:10.0.0.1",
        "64:ff9b::7f00:1",  # NAT64 well-known prefix -> 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # -> 169.254.169.254, the cloud metadata service
        "64:ff9b:1::c0a8:1",  # NAT64 local-use prefix -> 192.168.0.1
        "2002:7f00:1::1",  # 6to4 -> 127.0.0.1
        "2002:a00:1::1",  # 6to4 -> 10.0.0.1
        "::127.0.0.1",  # IPv4-compatible
        "::10.0.0.1",
        "fd00::1",
    ],
)
def test_private_addresses_are_refused_however_they_are_written(address: str) -> None:
    assert not address_allowed(address)


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "64:ff9b::5db8:d822"]
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_allowed(address)


def test_plain_http_to_a_public_address_is_refused_before_any_byte_is_sent() -> None:
    # A public address written as such: no DNS; the refusal comes before the TCP connect.
    spec = ProbeSpec(
        base_url="http://93.184.216.34:9/v1",
        format="openai",
        model="m",
        api_key="sk-never-sent-0123456789",
        allow_private=False,
        total_timeout_s=5,
    )

    async def go():  # type: ignore[no-untyped-def]
        try:
            return await probe(spec)
        finally:
            await warm_clients.aclose()

    result = asyncio.run(go())
    assert result.error_kind == "blocked_url"
    assert "plain http://" in result.error_detail


def test_an_ipv6_literal_embedding_loopback_is_refused_at_connect() -> None:
    trap = socket.create_server(("127.0.0.1", 0))
    trap.settimeout(0.2)
    port = trap.getsockname()[1]
    spec = ProbeSpec(
        base_url=f"https://[::ffff:127.0.0.1]:{port}/v1",
        format="openai",
        model="m",
        api_key="sk-never-sent-0123456789",
        allow_private=False,
        total_timeout_s=5,
    )

    async def go():  # type: ignore[no-untyped-def]
        try:
            return await probe(spec)
        finally:
            await warm_clients.aclose()

    try:
        result = asyncio.run(go())
        assert result.error_kind == "blocked_url"
        with pytest.raises(TimeoutError):
            trap.accept()  # nothing connected
    finally:
        trap.close()
