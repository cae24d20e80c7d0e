"""Our own SIP stack (RFC 3261): sans-IO cores with a thin asyncio adapter in ``sip.aio``."""
