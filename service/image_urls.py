"""Images a request names by ``http(s)://`` URL, fetched only from the hosts the operator allows.

A request that makes the server fetch a URL can reach what only the server can (server-side request forgery):
cloud metadata at 169.254.169.254, services on loopback, the private network. So nothing is fetched unless the
URL's host is in ``image_url_hosts``; then the host is resolved once, every address it resolves to must be a
public one (``image_url_private`` allows loopback, private and link-local ones, for an intranet image server),
and the connection goes to the address that was checked (an https one still verifies the certificate against
the host's name), so a second DNS answer cannot point it elsewhere. The body is read up to
``max_image_bytes``, within ``image_fetch_seconds``; a redirect is followed only to the same scheme and host
(at most :data:`MAX_REDIRECTS`). Every refusal is a 4xx naming the input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
import time
from collections.abc import Sequence
from urllib.parse import urljoin, urlsplit

import httpx

from embedrank.serving.image_text import ImageInput, is_remote_url
from service.errors import APIError, invalid
from service.settings import Images, Limits

MAX_REDIRECTS = 3


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Whether ``host`` is one of ``allowed`` (``*.example.com``: any subdomain of example.com).

    >>> host_allowed("cdn.example.com", ["*.example.com"]), host_allowed("example.com", ["*.example.com"])
    (True, False)
    >>> host_allowed("Images.Example.com", ["images.example.com"]), host_allowed("evil.com", [])
    (True, False)
    >>> host_allowed("::1", ["[::1]"])
    True
    """
    host = host.lower().rstrip(".").strip("[]")
    for entry in allowed:
        entry = entry.lower().rstrip(".").strip("[]")  # an IPv6 address may be written in brackets
        if host == entry or (entry.startswith("*.") and host.endswith(entry[1:])):
            return True
    return False


def public_address(address: str) -> bool:
    """Whether ``address`` is a public unicast address (not loopback, private, link-local, multicast, reserved
    or unspecified; an IPv4-mapped IPv6 address is judged as its IPv4 one).

    >>> [public_address(a) for a in ("93.184.215.14", "127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "::ffff:10.0.0.1")]
    [True, False, False, False, False, False]
    """
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _refused(image: ImageInput, why: str, code: str = "image_url_not_allowed") -> APIError:
    return invalid(f"{image.name} {why}", param=image.field, code=code)


async def _resolve(host: str, port: int, image: ImageInput, policy: Images) -> str:
    """One address of ``host``, after checking every address it resolves to."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise _refused(image, f"names the host {host!r}, which does not resolve", "image_fetch_failed") from None
    addresses = [str(info[4][0]) for info in infos]
    if not policy.image_url_private and not all(public_address(a) for a in addresses):
        raise _refused(image, f"names the host {host!r}, which resolves to a private or loopback address")
    return addresses[0]


async def fetch_image(image: ImageInput, policy: Images, limits: Limits) -> bytes:
    """The bytes at ``image``'s URL, within the policy and ``limits.max_image_bytes`` (see the module docstring).

    Raises:
        APIError: 400 (a host not allowed, a private address, a redirect elsewhere, a failed or slow fetch,
            an HTTP error), 413 (more than ``max_image_bytes``).
    """
    url = str(image.source)
    deadline = time.monotonic() + policy.image_fetch_seconds
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https") or not host_allowed(host, policy.image_url_hosts):
            what = "a remote URL" if parts.scheme in ("http", "https") else "not an http(s) URL"
            raise _refused(
                image,
                f"is {what} of a host this server does not fetch from ({host or 'none'}); send the image as a base64 "
                "data URL (data:image/png;base64,...)",
            )
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = await _resolve(host, port, image, policy)
        pinned = parts._replace(netloc=f"[{address}]:{port}" if ":" in address else f"{address}:{port}").geturl()
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        headers = {"Host": parts.netloc.rsplit("@", 1)[-1], "Accept": "image/*"}
        left = deadline - time.monotonic()
        try:
            async with (
                httpx.AsyncClient(timeout=max(left, 0.001), follow_redirects=False, trust_env=False) as http,
                http.stream("GET", pinned, headers=headers, extensions=extensions) as response,
            ):
                if response.is_redirect:
                    target = urljoin(url, response.headers.get("location", ""))
                    moved = urlsplit(target)
                    if (moved.scheme, moved.hostname) != (parts.scheme, parts.hostname):
                        raise _refused(image, f"redirects to another host or scheme ({moved.hostname}); not followed")
                    url = target
                    continue
                if response.status_code != 200:
                    raise _refused(image, f"could not be fetched: HTTP {response.status_code}", "image_fetch_failed")
                declared = int(response.headers.get("content-length") or 0)
                if declared > limits.max_image_bytes:
                    raise image.too_large(declared, limits.max_image_bytes)
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limits.max_image_bytes:
                        raise image.too_large(len(body), limits.max_image_bytes, at_least=True)
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("past the deadline")
                return bytes(body)
        except httpx.TimeoutException:
            raise _refused(
                image,
                f"could not be fetched within image_fetch_seconds={policy.image_fetch_seconds:g}",
                "image_fetch_failed",
            ) from None
        except httpx.HTTPError as exc:
            raise _refused(image, f"could not be fetched: {type(exc).__name__}", "image_fetch_failed") from None
    raise _refused(image, f"redirects more than {MAX_REDIRECTS} times; not followed")


async def fetched(items: list[str | ImageInput], policy: Images, limits: Limits) -> list[str | ImageInput]:
    """``items`` with each image named by an ``http(s)`` URL replaced by its bytes (fetched at once, within
    the policy); nothing is fetched when no host is allowed (such an item was refused before)."""
    remote = [
        i
        for i, item in enumerate(items)
        if isinstance(item, ImageInput) and isinstance(item.source, str) and is_remote_url(item.source)
    ]
    if not remote:
        return items
    bodies = await asyncio.gather(
        *(fetch_image(items[i], policy, limits) for i in remote)  # type: ignore[arg-type]
    )
    out = list(items)
    for i, body in zip(remote, bodies, strict=True):
        out[i] = dataclasses.replace(items[i], source=body)  # type: ignore[type-var]
    return out
