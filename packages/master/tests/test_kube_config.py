"""dlrover.master.kube.config and names: which configuration is loaded, and the errors when none is."""

# ruff: noqa: F811 (pytest fixtures imported by name are parameters of the tests)
from __future__ import annotations

from pathlib import Path

import pytest
from dlrover_testsupport.kube import ApiServer
from dlrover_testsupport.kube.fixtures import kube_api  # noqa: F401 (a fixture)

from dlrover.common import ConfigError
from dlrover.master.kube import IN_CLUSTER_ENV_VAR, KUBECONFIG_ENV_VAR, load_api_client, names

kubernetes = pytest.importorskip("kubernetes")


def namespaces(api: object) -> list[str]:
    return [ns.metadata.name for ns in kubernetes.client.CoreV1Api(api).list_namespace().items]


def test_an_explicit_kubeconfig_reaches_its_server(kube_api: ApiServer, tmp_path: Path) -> None:
    path = kube_api.write_kubeconfig(tmp_path / "config")
    api = load_api_client(path, environ={IN_CLUSTER_ENV_VAR: "10.0.0.1"})  # explicit beats in-cluster
    try:
        assert api.configuration.host == kube_api.url
        assert "default" in namespaces(api)
    finally:
        api.close()


def test_kubeconfig_env_is_used_and_its_first_file_read(kube_api: ApiServer, tmp_path: Path) -> None:
    path = kube_api.write_kubeconfig(tmp_path / "config")
    api = load_api_client(environ={KUBECONFIG_ENV_VAR: f"{path}:{tmp_path / 'other'}"})
    try:
        assert api.configuration.host == kube_api.url
    finally:
        api.close()


def test_the_process_default_configuration_is_left_alone(kube_api: ApiServer, tmp_path: Path) -> None:
    before = kubernetes.client.Configuration.get_default_copy().host
    api = load_api_client(kube_api.write_kubeconfig(tmp_path / "config"))
    api.close()
    assert kubernetes.client.Configuration.get_default_copy().host == before


def test_a_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=f"{missing}.*does not exist.*--kubeconfig"):
        load_api_client(missing)
    with pytest.raises(ConfigError, match="named by KUBECONFIG"):
        load_api_client(environ={KUBECONFIG_ENV_VAR: str(missing)})


def test_a_broken_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text('{"apiVersion": "v1", "kind": "Config", "contexts": []}')
    with pytest.raises(ConfigError, match=f"cannot load the kubeconfig {path}"):
        load_api_client(path)


def test_in_cluster_without_a_service_account_is_a_clear_error() -> None:
    # The service account token file is absent outside a pod.
    env = {IN_CLUSTER_ENV_VAR: "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match="in-cluster"):
        load_api_client(environ=env)


def test_names_follow_the_contract() -> None:
    assert names.CRD_NAME == "elasticjobs.elastic.dlrover.io"
    assert names.api_version() == "elastic.dlrover.io/v1alpha1"
    assert names.worker_pod_name("j", 3) == "j-worker-3"
    assert names.master_name("j") == "j-master"
    assert names.token_secret_name("j") == "j-token"
    assert names.worker_labels("j", 3, 1) == {
        "app.kubernetes.io/managed-by": "dlrover",
        "elastic.dlrover.io/job": "j",
        "elastic.dlrover.io/component": "worker",
        "elastic.dlrover.io/role": "worker",
        "elastic.dlrover.io/node-id": "3",
        "elastic.dlrover.io/rank": "1",
    }
    assert names.worker_labels("j", 4, -1)["elastic.dlrover.io/rank"] == "spare"  # a warm spare: "-1" is no label value
    assert names.worker_selector("j") == "elastic.dlrover.io/job=j,elastic.dlrover.io/component=worker"


def test_the_kubernetes_flags_make_the_backends_settings() -> None:
    from dlrover.master.cli import _run_parser, build_config

    args = _run_parser().parse_args(
        [
            "--backend=kubernetes",
            "--kube-namespace=team",
            "--kube-job=gpt",
            "--kubeconfig=/k",
            "--kube-master-address=10.0.0.1:9",
            "--kube-watch-timeout-s=5",
            "--kube-request-timeout-s=6",
            "--kube-backoff-initial-s=0.5",
            "--kube-backoff-max-s=2",
            "--kube-sync-timeout-s=7",
            "--kube-request-retries=1",
            "--kube-node-state-mb=512",
            "--node-stop-grace-s=7.5",
        ]
    )
    config = build_config(args)
    assert config.job_name == "gpt"  # the ElasticJob names the job
    settings = config.kubernetes
    assert settings is not None
    assert (settings.namespace, settings.job, settings.kubeconfig, settings.master_address) == (
        "team",
        "gpt",
        "/k",
        "10.0.0.1:9",
    )
    watch = settings.watch
    assert (watch.watch_timeout_s, watch.request_timeout_s, watch.backoff_initial_s, watch.backoff_max_s) == (
        5,
        6,
        0.5,
        2,
    )
    assert (settings.sync_timeout_s, settings.request_retries, settings.node_state_mb) == (7, 1, 512)
    assert settings.pod_deletion_grace_s == 8  # whole seconds, rounded up


def test_kubernetes_flags_need_their_backend_and_each_other() -> None:
    from dlrover.master.cli import _run_parser, build_config

    with pytest.raises(ConfigError, match="--kube-namespace and --kube-job"):
        build_config(_run_parser().parse_args(["--backend=kubernetes", "--kube-job=gpt"]))
    with pytest.raises(ConfigError, match="not the local backend"):
        build_config(_run_parser().parse_args(["--kube-namespace=a", "--kube-job=b", "--agent-command=x"]))
    with pytest.raises(ConfigError, match="backoff_max_s"):
        build_config(
            _run_parser().parse_args(
                ["--backend=kubernetes", "--kube-namespace=a", "--kube-job=b", "--kube-backoff-max-s=0.01"]
            )
        )
    # Workers verify a TLS master with the Secret it serves from: one without the other is refused.
    with pytest.raises(ConfigError, match="--kube-tls-secret and --tls-cert go together"):
        build_config(
            _run_parser().parse_args(
                ["--backend=kubernetes", "--kube-namespace=a", "--kube-job=b", "--kube-tls-secret=t"]
            )
        )
