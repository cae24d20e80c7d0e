"""mdeci: SIP-based mobility session service for publish/subscribe."""

__version__ = "0.1.0"
