"""What the Ray backend is told: which cluster, where Ray keeps its files, and its timeouts.

Pure data: no `ray` import, so `dlrover.master.config` can hold a `RaySettings` without the `ray` extra.
"""

from __future__ import annotations

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative, positive

__all__ = ["SUPPORTED_RAY_VERSIONS", "RaySettings"]

SUPPORTED_RAY_VERSIONS = ((2, 40), (3, 0))
"""Ray versions the backend runs on: at least the first, below the second (the public APIs it uses:
`ray.init`, `ray.nodes`, actors with `NodeAffinitySchedulingStrategy`, `ray.wait`, `ray.kill`)."""


def _address(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise ConfigError(f"{attribute.name} must be a Ray address (host:port, ray://host:port or auto), not {value!r}")


@attrs.frozen
class RaySettings:
    """How the master's Ray backend runs a job's agents, one actor per Ray node.

    Attributes:
        address: the cluster: `host:port` of its head (GCS), `ray://host:port` (Ray Client), or
            `auto` for the cluster this host belongs to (`RAY_ADDRESS`, else the one started here).
        namespace: the Ray namespace of the job's actors; None: `dlrover-<job name>`.
        temp_dir: the temp directory of the Ray node on this host the master attaches to, when that
            node was started with one other than Ray's default (`ray start --temp-dir`); Ray picks the
            node by it, and the master's own Ray files go there. None: Ray's default.
        connect_timeout_s: how long the start waits for the cluster's head to answer before saying
            there is no cluster at `address`.
        agent_cpus: CPUs an agent actor asks for when the job states no node resources: a head
            started with `--num-cpus=0` then never gets an agent, and each Ray node with a CPU can
            hold one.
        death_confirm_s: how long an agent actor Ray reports dead while its Ray node still shows alive is
            given for the node table to say the node died (a lost node, relaunched without charge) before the
            death is taken as the agent's own failure. Keep it above the cluster's node health check (its
            period times its failure threshold plus its timeout: about 13 s with Ray's defaults). An actor
            Ray only cannot reach is never charged for that: it keeps running until it answers, Ray says it
            died, or its agent's heartbeats time out at the master.
        poll_interval_s: how often the backend re-reads the cluster's node table (nodes that joined
            or died) between agent exits, which it is told of at once.
        stop_grace_s: how long a stopped agent is given between SIGTERM and SIGKILL (its workers save
            a checkpoint first where they poll for it), before its actor is killed: 30 s, as
            dlrover-master's `--node-stop-grace-s`, above the agent's round-save timeout and its
            workers' shutdown grace (10 s each by default). An agent SIGKILLed before it is done
            leaves its private files behind and its newest checkpoint unpersisted.
        master_address: the `host:port` agents dial; None: the master's own address, with a wildcard bind
            address (`0.0.0.0`, `::`) replaced by the address of the Ray node this master is attached to.
        call_timeout_s: how long a call to an agent actor may take beyond what it waits for itself (a
            stop's grace) before it is given up (the actor is then killed).
        log_dir: where each agent writes `node-<id>.log` on its Ray node's host (made there); None: into
            the actor's own Ray log (`ray logs`, the node's session directory).
    """

    address: str = attrs.field(default="auto", validator=_address)
    namespace: str | None = None
    temp_dir: str | None = None
    connect_timeout_s: float = attrs.field(default=15.0, validator=positive)
    agent_cpus: float = attrs.field(default=1.0, validator=non_negative)
    death_confirm_s: float = attrs.field(default=30.0, validator=non_negative)
    poll_interval_s: float = attrs.field(default=0.5, validator=positive)
    stop_grace_s: float = attrs.field(default=30.0, validator=non_negative)
    master_address: str | None = None
    call_timeout_s: float = attrs.field(default=10.0, validator=positive)
    log_dir: str | None = None
