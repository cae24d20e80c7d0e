"""Taking one broker of a cluster out of service (``mdeci admin drain``).

Theory of operation
-------------------
Several brokers share one PostgreSQL behind a Kamailio dispatcher (configs/kamailio.cfg,
``-A WITH_DISPATCHER``). A drained broker answers every new INVITE and every
out-of-dialog OPTIONS with :func:`draining` (503 + Retry-After; the UA core's
``out_of_service``): the dispatcher's OPTIONS probe then marks it inactive and its
failure route hands a new INVITE that reached it to the next broker. Its sessions end
through the Session Manager (:meth:`~mdeci.broker.sessions.SessionManager.drain`): a BYE
to each agent, which INVITEs again through Kamailio, reaches another broker and resumes
its queue there from the shared store. In-dialog requests are still served, so the BYEs
complete. A drain lasts until the broker process stops; a restarted broker serves again.
"""

from __future__ import annotations

from sip.ua import Reply

# Seconds a client is told to wait before it tries this broker again; the proxy does not
# wait: it tries the next broker at once.
RETRY_AFTER = 30
WARN_AGENT = "mdeci"


def draining(node: str, retry_after: int = RETRY_AFTER) -> Reply:
    """The answer of a drained broker to new INVITEs and OPTIONS (RFC 3261 §21.5.4)."""
    name = node.replace('"', "'")
    return Reply(
        503,
        reason="Service Unavailable",
        headers=(
            ("Retry-After", str(retry_after)),
            ("Warning", f'399 {WARN_AGENT} "broker {name} is draining"'),
        ),
    )
