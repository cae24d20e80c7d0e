"""Kannel gateway: MT through smsbox's sendsms HTTP API, MO through a get-url callback.

Out: ``GET <sendsms_url>?username=..&password=..&from=..&to=..&udh=..&text=..&coding=1``
(binary: ``udh`` with its length octet and ``text`` percent-encoded octet by octet,
``coding=1`` = 8-bit). smsbox answers 202 ``0: Accepted for delivery``.

In: an ``sms-service`` whose ``get-url`` calls this gateway's small HTTP server, e.g.
``http://127.0.0.1:13080/kannel/mo?from=%p&to=%P&udh=%u&text=%b`` (configs/kannel.conf):
``%b`` is the message body in binary and ``%u`` its UDH, both percent-encoded by Kannel;
the server answers 204 so smsbox sends no reply SMS.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, quote_from_bytes

import aiohttp
from aiohttp import web
from yarl import URL

from mdeci.sms.codec import Sms
from mdeci.sms.errors import GatewayError, PduError
from mdeci.sms.gateway import SmsHandler


@dataclass(frozen=True, kw_only=True, slots=True)
class KannelConfig:
    """Where smsbox is and where Kannel calls back."""

    sendsms_url: str = "http://127.0.0.1:13013/cgi-bin/sendsms"
    username: str = "mdeci"
    password: str = ""
    smsc_id: str | None = None  # route MT through this SMSC (``smsc=`` parameter)
    callback_host: str = "127.0.0.1"
    callback_port: int = 13080  # 0: any free port (tests)
    callback_path: str = "/kannel/mo"
    timeout: float = 10.0


def sendsms_url(config: KannelConfig, sms: Sms) -> URL:
    """The sendsms request for ``sms`` (already percent-encoded)."""
    params = [
        ("username", quote(config.username, safe="")),
        ("password", quote(config.password, safe="")),
        ("from", quote(sms.sender, safe="")),
        ("to", quote(sms.recipient, safe="")),
        ("text", quote_from_bytes(sms.body, safe="")),
        ("coding", "1"),
    ]
    if sms.udh:
        params.append(("udh", quote_from_bytes(sms.udh, safe="")))
    if config.smsc_id:
        params.append(("smsc", quote(config.smsc_id, safe="")))
    query = "&".join(f"{k}={v}" for k, v in params)
    return URL(f"{config.sendsms_url}?{query}", encoded=True)


def parse_mo_query(raw_query: str) -> Sms:
    """An SMS from the get-url callback's raw query; raises :class:`PduError`."""
    fields = {
        k: v.encode("latin-1")
        for k, v in parse_qsl(raw_query, keep_blank_values=True, encoding="latin-1")
    }
    try:
        sender = fields["from"].decode("ascii")
        recipient = fields["to"].decode("ascii")
    except (KeyError, UnicodeDecodeError) as exc:
        raise PduError(f"MO callback without a usable from/to: {exc}") from None
    return Sms(sender, recipient, fields.get("udh", b""), fields.get("text", b""))


class KannelGateway:
    """MT via Kannel's sendsms; MO via an aiohttp server Kannel's get-url calls."""

    def __init__(self, config: KannelConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._on_sms: SmsHandler | None = None
        self.port: int | None = None
        self.rejected_mo = 0

    @property
    def callback_url(self) -> str:
        """Base URL of the MO callback (for Kannel's ``get-url``), once started."""
        return f"http://{self.config.callback_host}:{self.port}{self.config.callback_path}"

    async def start(self, on_sms: SmsHandler) -> None:
        self._on_sms = on_sms
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.config.timeout)
        )
        app = web.Application()
        app.router.add_get(self.config.callback_path, self._mo)
        app.router.add_post(self.config.callback_path, self._mo)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.callback_host, self.config.callback_port)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self.config.callback_port

    async def _mo(self, request: web.Request) -> web.Response:
        try:
            sms = parse_mo_query(request.rel_url.raw_query_string)
        except PduError as exc:
            self.rejected_mo += 1
            return web.Response(status=400, text=str(exc))
        if self._on_sms is not None:
            self._on_sms(sms)
        return web.Response(status=204)

    async def send(self, sms: Sms) -> None:
        if self._session is None:
            raise GatewayError("gateway not started")
        try:
            async with self._session.get(sendsms_url(self.config, sms)) as resp:
                text = await resp.text()
                if resp.status not in (200, 202):
                    raise GatewayError(f"sendsms answered {resp.status}: {text.strip()}")
        except aiohttp.ClientError as exc:
            raise GatewayError(f"sendsms failed: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
