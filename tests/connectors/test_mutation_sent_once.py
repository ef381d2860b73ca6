"""A mutation reaches Proxmox at most once: when the connection drops after a PUT or DELETE was
written, the answer is missing (the call is recorded interrupted and reconciled), it is never
sent again. aiohttp itself resent PUT and DELETE on a reused connection (it counts them as
idempotent): `guest_disk_resize` `+100G` grew the disk twice, a firewall rule delete by
position deleted a second rule no one approved."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from gateway.tools.runtimes.transport import AnswerMissing, PveHttp


class DroppingServer:
    """HTTP/1.1 with keep-alive: answers GETs; reads a mutation, then drops the connection
    without an answer, as a Proxmox that ran it and then lost the connection would."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method = lines[0].split()[0]
                length = next((int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                self.seen[method] += 1
                if method != "GET":
                    return  # ran it; the answer never comes
                body = json.dumps({"data": None}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/api2/json"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.parametrize("method", ["PUT", "DELETE", "POST"])
async def test_a_mutation_whose_connection_drops_is_sent_once(method: str) -> None:
    server = DroppingServer()
    async with server as url:
        http = PveHttp(url, {}, verify=False, timeout=5)
        try:
            await http.request("GET", "/version")  # the connection is now pooled, kept alive
            with pytest.raises(AnswerMissing):
                await http.request(method, "/nodes/pve1/qemu/100/resize", data={"disk": "scsi0", "size": "+100G"})
        finally:
            await http.close()
    assert server.seen[method] == 1, server.seen
