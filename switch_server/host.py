"""What the switch's parts need from the server that owns them: small protocols, so that the peer links and the
local side depend on these and never on `switch_server.server` itself."""
from __future__ import annotations

__all__ = ["Host", "LinkHost", "LocalHost", "Origin"]

from typing import Any, Callable, Protocol

from nebula.config import SwitchConfig
from nebula.config.budgets import Budgets
from switch_server.budget import MemoryBudget
from switch_server.metrics import SwitchMetrics
from switch_server.shaper import TokenBucket


class Origin(Protocol):
    """Where a queued frame came from: told when its bytes leave the switch (a peer session then grants credit), or
    when the switch dropped it for a rank of its account that is not connected (the peer is asked to hold that
    account's frames back a while)."""

    def release(self, nbytes: int) -> None: ...

    def dropped(self, key: Any, nbytes: int) -> None: ...


class Host(Protocol):
    """What every part of the switch may use: configuration, metrics, the memory budget, audit and routing."""

    cfg: SwitchConfig
    metrics: SwitchMetrics
    budget: MemoryBudget
    budgets: Budgets  # nebula.config.budgets.resolve(cfg), renewed on reload

    def audit(self, actor: str, action: str, target: str, outcome: str = "ok", detail: dict | None = None) -> None:
        """Append one audit record."""

    def route(self, frame: Any, head: bytes, payload: Any, origin: Origin | None,
              from_peer: str | None = None, party: Any = None, stages: tuple[str, ...] = ()) -> tuple[str, str] | None:
        """Send a frame on towards its destination; (code, reason) if it cannot go anywhere."""


class LocalHost(Host, Protocol):
    """What the local (worker) side needs besides routing."""

    route_grants: Any  # switch_server.routegrants.RouteGrants

    def route_refused(self, account: str, cluster: str, why: str, stages: tuple[str, ...] = ()) -> tuple[str, str]:
        """Count and audit a refusal by route grants; (code, reason) for the worker."""

    def account_bucket(self, account: str) -> TokenBucket:
        """Token bucket of an account's rate limit."""

    def welcome_meta(self) -> dict[str, Any]:
        """WELCOME meta for workers."""

    def audit_limited(self, kind: Any, actor: str, action: str, target: str, outcome: str = "ok",
                      detail: dict | None = None) -> bool:
        """Audit a repeatable event, at most a few per kind and period (the rest counted); True if written now."""


class LinkHost(Host, Protocol):
    """What the peer links need: TLS trust, the boot epoch, link state, refusals and audit checkpoints."""

    epoch: int
    trust: Any  # switch_server.peers.PeerTrust
    checkpoints: Any  # switch_server.checkpoints.CheckpointExchange

    def link_window(self) -> int:
        """Bytes one peer may have queued here."""

    def link_in_state(self, cluster: str) -> dict[str, int]:
        """Receive state (epoch, last link sequence) of `cluster`'s link."""

    def link_changed(self, peer_restarted: bool = False) -> None:
        """A link went up or down."""

    def refuse_remote(self, frame: Any, code: str, message: str) -> None:
        """Tell a peer cluster's worker why its frame was refused."""

    def place(self, key: Any, nbytes: int) -> memoryview | None:
        """Where a peer's payload of `nbytes` on channel `key` should be read: the shared-memory arena of the local
        worker it is for, which then reads it there (None: into a buffer of its own)."""

    policy: Any  # switch_server.authz.PeerPolicy
    actor: str

    def audit_limited(self, kind: Any, actor: str, action: str, target: str, outcome: str = "ok",
                      detail: dict | None = None) -> bool:
        """Audit a repeatable event, at most once per kind and period (the rest counted); True if written now."""


ErrorSink = Callable[[str, str], None]
