"""The certificate renewal CronJob: rendered without cert-manager, valid for Kubernetes, its
commands accepted by the real CLI parser and aimed at the Secret, Service and webhook
configuration the chart itself renders, with exactly the RBAC those commands need."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest

from kube_vgpu.certs.errors import EXIT_UNREACHABLE
from kube_vgpu.cli.main import build_parser, main
from tests.support.helm_render import Rendered, render

KUBE = "v1.31.0"


def renewal_objects(rendered: Rendered) -> list[dict[str, Any]]:
    return [o for o in rendered.objects if o["metadata"]["name"].endswith("-certs-renew")]


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render(None, kube_version=KUBE)


def cronjob(rendered: Rendered) -> dict[str, Any]:
    (found,) = rendered.of_kind("CronJob")
    return found


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = cronjob(rendered)["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def parse(args: list[str]) -> argparse.Namespace:
    return build_parser("certs").parse_args(args)


def test_rendered_by_default_and_valid_for_kubernetes(rendered: Rendered) -> None:
    objects = renewal_objects(rendered)
    assert {o["kind"] for o in objects} == {
        "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "CronJob",
    }  # fmt: skip
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE.lstrip("v"), strict=True)
    job = cronjob(rendered)
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert len(job["metadata"]["name"]) <= 52  # a CronJob's Jobs add 11 characters to its name


@pytest.mark.parametrize(
    "values",
    [{"certManager": {"enabled": True}}, {"certJobs": {"renewal": {"enabled": False}}}],
)
def test_not_rendered_with_cert_manager_or_when_off(values: dict[str, Any]) -> None:
    assert renewal_objects(render(values, kube_version=KUBE)) == []


def test_create_runs_before_patch_and_both_parse_as_the_real_cli_does(rendered: Rendered) -> None:
    spec = pod_spec(rendered)
    (create,) = spec["initContainers"]
    (patch,) = spec["containers"]
    created, patched = parse(create["args"]), parse(patch["args"])
    assert (created.command, created.certs_command) == ("certs", "create")
    assert (patched.command, patched.certs_command) == ("certs", "patch")
    (service,) = rendered.of_kind("Service")
    (mwc,) = rendered.of_kind("MutatingWebhookConfiguration")
    deployment = rendered.of_kind("Deployment")[0]
    mounted = {
        v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v
    }
    assert created.service == service["metadata"]["name"] and created.namespace == rendered.namespace
    assert created.secret_name in mounted and patched.secret_name == created.secret_name
    assert patched.webhook_name == mwc["metadata"]["name"]


def test_its_commands_are_the_install_hooks_commands(rendered: Rendered) -> None:
    hooks = {j["metadata"]["name"].rsplit("-", 1)[-1]: j for j in rendered.of_kind("Job")}
    spec = pod_spec(rendered)
    assert (
        spec["initContainers"][0]["args"]
        == hooks["create"]["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert (
        spec["containers"][0]["args"] == hooks["patch"]["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_its_rbac_covers_the_secret_and_the_webhook_configuration_only(rendered: Rendered) -> None:
    spec = pod_spec(rendered)
    args = parse(spec["containers"][0]["args"])
    objects = {o["kind"]: o for o in renewal_objects(rendered)}
    assert spec["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    for binding, role in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        assert objects[binding]["roleRef"]["name"] == objects[role]["metadata"]["name"]
        assert objects[binding]["subjects"][0]["name"] == spec["serviceAccountName"]
    named = [r for r in objects["Role"]["rules"] if r.get("resourceNames")]
    assert named == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [args.secret_name],
         "verbs": ["get", "update"]},
    ]  # fmt: skip
    (cluster_rule,) = objects["ClusterRole"]["rules"]
    assert cluster_rule["resourceNames"] == [args.webhook_name]
    assert cluster_rule["resources"] == ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]


def test_its_pods_run_restricted(rendered: Rendered) -> None:
    # No pod-level opt-out label: pods cannot opt out, and these ask for no GPU anyway.
    template = cronjob(rendered)["spec"]["jobTemplate"]["spec"]["template"]
    assert "kube-vgpu.io/webhook" not in template["metadata"]["labels"]
    spec = template["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    for container in spec["initContainers"] + spec["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("schedule", ["daily", "* * *", ""])
def test_a_schedule_that_is_not_cron_is_refused(schedule: str) -> None:
    with pytest.raises(Exception, match="schedule"):
        render({"certJobs": {"renewal": {"schedule": schedule}}}, kube_version=KUBE)


def create_commands(rendered: Rendered) -> list[list[str]]:
    """The `certs create` argument lists of the install hook Job and of the renewal CronJob."""
    pods = [job["spec"]["template"]["spec"] for job in rendered.of_kind("Job")]
    pods += [c["spec"]["jobTemplate"]["spec"]["template"]["spec"] for c in rendered.of_kind("CronJob")]
    containers = [c for pod in pods for c in [*pod.get("initContainers", []), *pod["containers"]]]
    return [c["args"] for c in containers if c["args"][:2] == ["certs", "create"]]


def test_the_longest_validity_the_chart_accepts_is_one_the_program_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The Jobs pass --days alone, so the CA keeps its default 3650 days; a longer --days used to
    # render and then fail every Job with "--ca-days must be at least --days".
    commands = create_commands(render({"webhook": {"tls": {"days": 3650}}}, kube_version=KUBE))
    assert len(commands) == 2
    for args in commands:
        # Flags are checked before the cluster is looked for: a missing kubeconfig means they passed.
        assert main([*args, "--kubeconfig", str(tmp_path / "none")]) == EXIT_UNREACHABLE
        assert "--days=3650" in args and "no such file" in capsys.readouterr().err
    with pytest.raises(helm_python.HelmValuesError, match="/webhook/tls/days"):
        render({"webhook": {"tls": {"days": 3651}}}, kube_version=KUBE)
