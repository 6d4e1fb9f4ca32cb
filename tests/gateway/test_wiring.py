"""The gateway's wiring: the local backend it starts replicas with, what replicas inherit, where logs go."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tandem.cluster.backend import BackendError
from tandem.cluster.local import PortRange, find_free_port
from tandem.edge.settings import Settings
from tandem.gateway.wiring import default_log_dir, local_backend, refuse_the_gateways_port, replica_environment


def test_replicas_never_inherit_the_gateways_own_settings():
    """A TANDEM_REPLICAS_MAX meant for the gateway would make every replica a gateway too."""
    environ = {
        "TANDEM_REPLICAS_MAX": "4", "TANDEM_API_KEY": "k", "TANDEM_CONFIG": "gw.yaml", "TANDEM_CACHE": "/c",
        "TANDEM_KERNELS": "torch", "PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE",
    }  # fmt: skip
    assert replica_environment(environ) == {
        "TANDEM_CACHE": "/c", "TANDEM_KERNELS": "torch", "PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE",
    }  # fmt: skip


def test_the_local_backend_takes_ports_from_the_range_and_outlives_the_replicas_drain(tmp_path):
    backend = local_backend(Settings(replica_ports=(9000, 9099), shutdown_timeout=5), tmp_path, environ={})
    assert isinstance(backend.ports, PortRange) and (backend.ports.low, backend.ports.high) == (9000, 9099)
    assert backend.kill_after_s == 15.0 and backend.base_env == {}
    assert local_backend(Settings(), tmp_path, environ={}).ports is find_free_port


def test_logs_go_to_one_folder_per_gateway_run_under_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    folder = default_log_dir(now=lambda: 0.0)
    assert folder.parent == Path(tmp_path) / "logs" and folder.name.startswith("gateway-")


def test_the_deployment_chooses_the_backend_and_the_banner_says_where_replicas_run(monkeypatch, tmp_path):
    import tandem.cluster.ray as ray_package
    from tandem.cluster.local import LocalBackend
    from tandem.deployment import parse_deployment
    from tandem.gateway.wiring import choose_backend

    local = parse_deployment({"variants": [{"name": "a"}], "policy": {"name": "hpa"}})
    backend, where = choose_backend(Settings(), local, tmp_path, environ={})
    assert isinstance(backend, LocalBackend) and where == "local processes on this machine"

    asked = {}

    def ray_backend(address, **options):
        asked.update(options, address=address)
        return SimpleNamespace(description="connected to the Ray cluster at a:1 (given); 2 nodes")

    monkeypatch.setattr(ray_package, "ray_backend", ray_backend)
    ray_file = {"variants": [{"name": "a"}], "policy": {"name": "hpa"}, "backend": {"name": "ray", "address": "a:1"}}
    on_ray = parse_deployment(ray_file)
    backend, where = choose_backend(Settings(replica_ports=(9000, 9099), shutdown_timeout=5), on_ray, tmp_path)
    assert where == "Ray: connected to the Ray cluster at a:1 (given); 2 nodes"
    assert asked["address"] == "a:1" and asked["log_dir"] == str(tmp_path) and asked["ports"] == (9000, 9099)
    assert asked["kill_after_s"] == 15.0 and "TANDEM_REPLICAS_MAX" in asked["unset_env"]

    def missing(address, **options):
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    monkeypatch.setattr(ray_package, "ray_backend", missing)
    with pytest.raises(BackendError, match=r"the ray backend needs Ray: pip install 'tandem\[ray\]'"):
        choose_backend(Settings(), on_ray, tmp_path)


def test_a_replica_port_range_may_not_hold_the_gateways_own_port():
    for ports in ((8000, 8000), (7990, 8010)):
        with pytest.raises(BackendError, match=f"--replica-ports {ports[0]}-{ports[1]} holds the gateway's own port"):
            refuse_the_gateways_port(Settings(port=8000, replica_ports=ports))
    refuse_the_gateways_port(Settings(port=8000, replica_ports=(9000, 9099)))
    refuse_the_gateways_port(Settings(port=8000))
    refuse_the_gateways_port(Settings(port=0, replica_ports=(1, 65535)))  # the OS picks the gateway's port
