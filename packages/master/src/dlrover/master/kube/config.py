"""Connect to a Kubernetes API server: in-cluster config inside a pod, else a kubeconfig.

The official client is imported lazily (the `k8s` extra); nothing here touches the client's
process-wide default configuration, so two clients to two clusters can live in one process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlrover.common import ConfigError

__all__ = ["IN_CLUSTER_ENV_VAR", "KUBECONFIG_ENV_VAR", "import_kubernetes", "load_api_client"]

IN_CLUSTER_ENV_VAR = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every pod: its presence means in-cluster config is available."""
KUBECONFIG_ENV_VAR = "KUBECONFIG"


def import_kubernetes() -> Any:
    """The `kubernetes` module, or a ConfigError saying how to install it.

    Raises:
        ConfigError: the official client is not installed.
    """
    try:
        import kubernetes  # lazy: the `k8s` extra
    except ImportError as exc:
        raise ConfigError(
            "the Kubernetes backend needs the official client: pip install 'dlrover-master[k8s]'"
        ) from exc
    return kubernetes


def load_api_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    environ: dict[str, str] | None = None,
) -> Any:
    """A `kubernetes.client.ApiClient` for the cluster this process should talk to.

    Order: an explicit `kubeconfig`; inside a pod (`KUBERNETES_SERVICE_HOST` set) the pod's service
    account; else the file `KUBECONFIG` names; else `~/.kube/config`.

    Args:
        kubeconfig: a kubeconfig file to use; None to decide as above.
        context: the kubeconfig context (None: its current context).
        environ: the environment to decide by (default `os.environ`).

    Returns:
        A client the caller closes (`close()`) when done.

    Raises:
        ConfigError: no configuration found, or it cannot be read; the message says which and why.
    """
    kubernetes = import_kubernetes()
    env = os.environ if environ is None else environ
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and env.get(IN_CLUSTER_ENV_VAR):
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException as exc:
            raise ConfigError(f"cannot load the in-cluster Kubernetes config: {exc}") from exc
        return kubernetes.client.ApiClient(configuration)
    path = _kubeconfig_path(kubeconfig, env)
    try:
        kubernetes.config.load_kube_config(
            config_file=str(path), context=context, client_configuration=configuration, persist_config=False
        )
    except (kubernetes.config.ConfigException, OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"cannot load the kubeconfig {path}: {exc}") from exc
    return kubernetes.client.ApiClient(configuration)


def _kubeconfig_path(kubeconfig: str | os.PathLike[str] | None, env: dict[str, str] | os._Environ[str]) -> Path:
    if kubeconfig is not None:
        path = Path(kubeconfig)
        where = "given"
    elif env.get(KUBECONFIG_ENV_VAR):
        # KUBECONFIG may list several files; the first one is the one we read.
        path = Path(env[KUBECONFIG_ENV_VAR].split(os.pathsep)[0])
        where = f"named by {KUBECONFIG_ENV_VAR}"
    else:
        path = Path.home() / ".kube" / "config"
        where = "default"
    if not path.is_file():
        raise ConfigError(
            f"no Kubernetes configuration: the {where} kubeconfig {path} does not exist, and this process is "
            f"not in a pod ({IN_CLUSTER_ENV_VAR} unset); pass --kubeconfig or set {KUBECONFIG_ENV_VAR}"
        )
    return path
