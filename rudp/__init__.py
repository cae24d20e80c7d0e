"""Reliable UDP for mdeci's data channel: sans-IO core with an asyncio adapter in ``rudp.aio``."""
