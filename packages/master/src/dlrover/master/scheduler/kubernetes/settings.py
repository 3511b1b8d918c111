"""What the Kubernetes backend is told: where the job lives, its timeouts, and its worker template.

Pure data: no client import, so `dlrover.master.config` can hold a `KubernetesSettings` without
the `k8s` extra installed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative_int, positive
from dlrover.master.kube.watch import WatchSettings

__all__ = ["DEFAULT_SHM_FRACTION", "KubernetesSettings", "WorkerTemplate"]

DEFAULT_SHM_FRACTION = 0.25
"""Without a stated size, one snapshot of a node's state is taken to be this fraction of the node's memory."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _dns_label(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    # Object names built from these (`<job>-worker-<id>`) must stay valid DNS labels.
    if not isinstance(value, str) or not _DNS_LABEL.match(value) or len(value) > 63:
        raise ConfigError(
            f"{attribute.name} must be a DNS label (lowercase letters, digits and '-', at most 63), not {value!r}"
        )


@attrs.frozen
class KubernetesSettings:
    """How the master's Kubernetes backend runs a job's worker pods.

    Attributes:
        namespace: the job's namespace (where its ElasticJob, Secret, Service and pods live).
        job: the ElasticJob's name; worker pods are `<job>-worker-<node id>`.
        kubeconfig: a kubeconfig file; None: in-cluster config inside a pod, else `KUBECONFIG`
            or `~/.kube/config` (see `dlrover.master.kube.load_api_client`).
        master_address: what workers dial; None: the master Service, `<job>-master.<namespace>.svc:<port>`
            with the port the master listens on.
        watch: list + watch timeouts and backoff of the pod watch.
        sync_timeout_s: how long the backend waits at start for its first list of the job's pods.
        pod_deletion_grace_s: a stopped worker pod's grace between SIGTERM and SIGKILL (its
            `terminationGracePeriodSeconds`, unless the template sets one, and the delete's
            `gracePeriodSeconds`).
        request_retries: how often a pod create or delete answered 429, 5xx or a broken connection
            is retried (after the watch's backoff) before the launch fails.
        node_state_mb: the size of one snapshot of a node's training state in MiB (its share of
            model and optimizer): `/dev/shm` is sized for two snapshots. 0: a quarter of the node's
            memory (`DEFAULT_SHM_FRACTION`).
        gpu_resource: the extended resource a node's GPUs are asked as.
        gpu_type_label: the node label a node's `gpu_type` is matched against (nodeSelector).
        tls_secret: the Secret of the TLS the master serves (set when it serves TLS): workers mount its
            `tls_ca_key` to verify the master, and check its certificate against the Service's name.
        tls_ca_key: the key of `tls_secret` that verifies the master: `tls.crt` for a self-signed
            certificate, `ca.crt` for one a CA signed (cert-manager writes it).
        tf_tasks: the pods are the tasks of a TensorFlow parameter-server job: each is made from its role's
            template, named `<job>-<role>-<index>-<node id>`, and has the task's DNS name for the whole job
            (hostname `<job>-<role>-<index>` under the headless Service `<job>-tasks`, which the backend creates).
        lost_pod_margin_s: a parameter-server job's pod the master stopped counts as running until it has ended
            (its task's next pod takes over its DNS name), or until this long past its deletion's grace (its node
            is lost and will not confirm it).
    """

    namespace: str = attrs.field(validator=_dns_label)
    job: str = attrs.field(validator=_dns_label)
    kubeconfig: str | None = None
    master_address: str | None = None
    watch: WatchSettings = attrs.field(factory=WatchSettings)
    sync_timeout_s: float = attrs.field(default=30.0, validator=positive)
    pod_deletion_grace_s: int = attrs.field(default=30, validator=non_negative_int)
    request_retries: int = attrs.field(default=3, validator=non_negative_int)
    node_state_mb: int = attrs.field(default=0, validator=non_negative_int)
    gpu_resource: str = "nvidia.com/gpu"
    gpu_type_label: str = "nvidia.com/gpu.product"
    tls_secret: str | None = None
    tls_ca_key: str = "tls.crt"
    tf_tasks: bool = False
    lost_pod_margin_s: float = attrs.field(default=30.0, validator=positive)


def _check_template(role: str, template: object) -> None:
    spec = template.get("spec") if isinstance(template, Mapping) else None
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not containers or not isinstance(containers, list):
        raise ConfigError(f"the {role} template (spec.replicaSpecs.{role}.template) has no spec.containers")


@attrs.frozen
class WorkerTemplate:
    """What the backend takes from the ElasticJob: its pod templates and what ties pods to the job.

    Attributes:
        template: the PodTemplateSpec (`metadata`, `spec`) of role `worker`, as JSON.
        job_uid: the ElasticJob's uid, for the pods' ownerReference; empty: pods get no owner
            (a backend used without an ElasticJob, as in tests).
        checkpoint_volume: the Volume source of `spec.checkpoint.volume`, mounted at
            `/checkpoints` in workers; None without one.
        roles: the templates of the job's other roles (`chief`, `ps`, `evaluator` of a parameter-server job), by
            role name.
    """

    template: Mapping[str, Any]
    job_uid: str = ""
    checkpoint_volume: Mapping[str, Any] | None = None
    roles: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        _check_template("worker", self.template)
        for role, template in self.roles.items():
            _check_template(role, template)

    def template_for(self, role: str) -> Mapping[str, Any]:
        """The pod template of `role`.

        Raises:
            ConfigError: the ElasticJob has no template for it.
        """
        if role == "worker":
            return self.template
        template = self.roles.get(role)
        if template is None:
            raise ConfigError(f"the ElasticJob has no {role} template (spec.replicaSpecs.{role}.template)")
        return template

    def command_of(self, role: str) -> list[str]:
        """The command and arguments of `role`'s main container (the one named `main`, else the first).

        Raises:
            ConfigError: no template for `role`, or its main container runs no command.
        """
        containers = self.template_for(role)["spec"]["containers"]
        main = next((c for c in containers if isinstance(c, Mapping) and c.get("name") == "main"), containers[0])
        command = [str(part) for part in (main.get("command") or []) + (main.get("args") or [])]
        if not command:
            raise ConfigError(f"the {role}'s main container (spec.replicaSpecs.{role}.template) has no command")
        return command
