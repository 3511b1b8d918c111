"""The command-line flags of the Kubernetes backend, shared by `dlrover-master` and `dlrover-master ps-job`."""

from __future__ import annotations

import argparse
import math

from dlrover.common import ConfigError
from dlrover.master.kube.watch import WatchSettings
from dlrover.master.scheduler.kubernetes.settings import KubernetesSettings

__all__ = ["add_kubernetes_flags", "kubernetes_settings"]


def add_kubernetes_flags(p: argparse.ArgumentParser) -> None:
    """The kubernetes backend: which ElasticJob, how to reach the API server, its timeouts."""
    g = p.add_argument_group("kubernetes backend (--backend kubernetes)")
    g.add_argument("--kube-namespace", default=None, help="the ElasticJob's namespace (required)")
    g.add_argument("--kube-job", default=None, help="the ElasticJob's name (required; also the job name by default)")
    g.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: the pod's service account inside a pod, else $KUBECONFIG or ~/.kube/config)",
    )
    g.add_argument(
        "--kube-master-address",
        default=None,
        help="host:port workers dial (default: the master Service <job>-master.<namespace>.svc:<port>)",
    )
    g.add_argument(
        "--kube-watch-timeout-s",
        type=float,
        default=60.0,
        help="each pod watch request lasts this long, then resumes from its last resourceVersion",
    )
    g.add_argument(
        "--kube-request-timeout-s",
        type=float,
        default=30.0,
        help="connect timeout of every API request and read timeout of a list",
    )
    g.add_argument("--kube-backoff-initial-s", type=float, default=0.2, help="first wait after a failed API request")
    g.add_argument("--kube-backoff-max-s", type=float, default=10.0, help="the longest wait between retries (the cap)")
    g.add_argument(
        "--kube-sync-timeout-s", type=float, default=30.0, help="how long the start waits for the first list of pods"
    )
    g.add_argument(
        "--kube-request-retries",
        type=int,
        default=3,
        help="retries of a pod create or delete answered 429, 5xx or cut, before the launch fails",
    )
    g.add_argument(
        "--kube-node-state-mb",
        type=int,
        default=0,
        help="one snapshot of a node's training state in MiB: /dev/shm is twice this, added to the pod's memory "
        "(0: a quarter of --node-memory)",
    )
    g.add_argument("--kube-gpu-resource", default="nvidia.com/gpu", help="the resource a node's GPUs are asked as")
    g.add_argument(
        "--kube-gpu-type-label",
        default="nvidia.com/gpu.product",
        help="the node label --node-gpu-type is matched against (nodeSelector)",
    )
    g.add_argument(
        "--kube-tls-secret",
        default=None,
        help="the Secret of the TLS this master serves (--tls-cert): workers mount it to verify the master",
    )
    g.add_argument(
        "--kube-tls-ca-key",
        default="tls.crt",
        help="the key of --kube-tls-secret that verifies the master (tls.crt: self-signed; ca.crt: CA-signed)",
    )


def kubernetes_settings(
    args: argparse.Namespace, *, tls_cert: str | None, stop_grace_s: float, tf_tasks: bool = False
) -> KubernetesSettings | None:
    """The kubernetes backend's settings from its flags (`args.backend` names the backend); None for another
    backend given none of them.

    Args:
        args: parsed with `add_kubernetes_flags`.
        tls_cert: the certificate the master serves (None: no TLS); `--kube-tls-secret` must go with it.
        stop_grace_s: a stopped node's grace (its pod's deletion grace, rounded up).
        tf_tasks: the pods are a TensorFlow parameter-server job's tasks (`KubernetesSettings.tf_tasks`).

    Raises:
        ConfigError: a flag is missing, contradicts another, or has a bad value.
    """
    if args.backend != "kubernetes" and args.kube_namespace is None and args.kube_job is None:
        return None
    if not args.kube_namespace or not args.kube_job:
        raise ConfigError("--backend kubernetes needs --kube-namespace and --kube-job (the ElasticJob it runs)")
    if (args.kube_tls_secret is None) != (tls_cert is None):
        raise ConfigError(
            "--kube-tls-secret and --tls-cert go together: workers verify the TLS the master serves with that Secret"
        )
    return KubernetesSettings(
        namespace=args.kube_namespace,
        job=args.kube_job,
        kubeconfig=args.kubeconfig,
        master_address=args.kube_master_address,
        watch=WatchSettings(
            watch_timeout_s=args.kube_watch_timeout_s,
            request_timeout_s=args.kube_request_timeout_s,
            backoff_initial_s=args.kube_backoff_initial_s,
            backoff_max_s=args.kube_backoff_max_s,
        ),
        sync_timeout_s=args.kube_sync_timeout_s,
        pod_deletion_grace_s=math.ceil(stop_grace_s),
        request_retries=args.kube_request_retries,
        node_state_mb=args.kube_node_state_mb,
        gpu_resource=args.kube_gpu_resource,
        gpu_type_label=args.kube_gpu_type_label,
        tls_secret=args.kube_tls_secret,
        tls_ca_key=args.kube_tls_ca_key,
        tf_tasks=tf_tasks,
    )
