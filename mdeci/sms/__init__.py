"""SMS transport for mdeci frames: codec, reassembly, acknowledged links, gateways.

See docs/sms.md.
"""
