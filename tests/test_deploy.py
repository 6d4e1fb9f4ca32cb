"""Deploying: the Dockerfile (hadolint, non-root, health check) and the Kubernetes example (schema-valid,
probes on the server's own endpoints, a grace period longer than the drain deadline)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import dockerfile
import kubernetes_validate
import pytest
import yaml

from tandem.cli import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def instructions() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(ROOT / "Dockerfile")))


def test_the_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    out = subprocess.run([str(hadolint), str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_image_runs_as_a_non_root_user_and_checks_health(instructions):
    users = [c.value[0] for c in instructions if c.cmd == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) != 0
    health = next(c for c in instructions if c.cmd == "HEALTHCHECK")
    assert any("127.0.0.1:8000/health" in part for part in health.value)
    entry = next(c for c in instructions if c.cmd == "ENTRYPOINT").value
    assert entry[:2] == ("tandem", "serve") and "0.0.0.0" in entry and "8000" in entry
    assert any(c.cmd == "COPY" and c.value[0] == "src" for c in instructions)  # the package data comes along
    torch_install = next(c.value[0] for c in instructions if c.cmd == "RUN" and "torch==" in c.value[0])
    assert "torch==2.13.0" in torch_install and "/whl/cpu" in torch_install  # never the CUDA build


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    return [doc for doc in yaml.safe_load_all((ROOT / "deploy" / "k8s.yaml").read_text()) if doc]


def test_the_kubernetes_example_is_schema_valid(manifests):
    assert {m["kind"] for m in manifests} == {"Deployment", "Service"}
    for manifest in manifests:
        kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)


def test_probes_grace_period_and_args_fit_the_server(manifests):
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    args = container["args"]
    drain_s = float(args[args.index("--shutdown-timeout") + 1])
    assert pod["terminationGracePeriodSeconds"] > drain_s
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The args are flags `tandem serve` accepts (parsed by the real command, nothing started).
    serve = cli.get_command(click.Context(cli), "serve")
    context = serve.make_context("serve", list(args))
    assert context.params["shutdown_timeout"] == drain_s
    service = next(m for m in manifests if m["kind"] == "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
