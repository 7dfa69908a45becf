"""Version skew between linked peerds, pure: what a box's answer says it speaks, which calls need
a newer box, and the sentence naming the machine to update (`peerd.peer.client` uses them).

Each answer of a peerd carries `Peerd-Protocol` (the wire revision, `contracts.WIRE_PROTOCOL`) and
`Peerd-Version` (its release); an answer without them is revision 1, the releases before the
header. See docs/internals/links.md#protocol-revisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peerd import __version__
from peerd import contracts as c

# The wire revision a call needs at the box: an older box answers these `not_found`.
REQUIRED_PROTOCOL: dict[str, int] = {
    "/v1/feed/subscription": c.FEED_PROTOCOL,
    "/v1/feed/changes": c.FEED_PROTOCOL,
}


@dataclass(frozen=True)
class PeerProtocol:
    """What a box's last answer said it speaks: the wire revision and its release (if it said)."""

    revision: int
    version: str | None

    @classmethod
    def of(cls, headers: Any) -> PeerProtocol:
        raw = str(headers.get(c.PROTOCOL_HEADER, "") or "")
        revision = int(raw) if raw.isdigit() and 0 < int(raw) < 1_000_000 else 1
        version = headers.get(c.VERSION_HEADER)
        return cls(revision, None if not version else str(version)[:64])


def skew_message(label: str, peer: PeerProtocol) -> str:
    """The sentence for a box too old for what this peerd needs: which machine to update."""
    release = f"peerd {peer.version}" if peer.version else "an older peerd"
    return (
        f"{label} runs {release} (wire protocol {peer.revision}) without the change feed this peerd "
        f"({__version__}, protocol {c.WIRE_PROTOCOL}) follows delegated tasks with; update peerd on "
        f"{label}. Until then its tasks are followed through its older watch, without its pending "
        "approvals or capacity."
    )
