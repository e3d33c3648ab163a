"""The webhook's metrics (`webhook.metrics`): `/metrics` renders whatever names the label values hold."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.quota.metrics import QuotaMetrics
from tests.support.webhook_quota import make_gate


def test_metrics_render_whatever_names_the_labels_hold() -> None:
    metrics = WebhookMetrics()
    quota_metrics = QuotaMetrics(make_gate(), metrics.registry)
    odd = ["a\ud800b", 'quo"te', "new\nline", "back\\slash", "\udfff", "ünï"]
    for name in odd:
        metrics.denials.labels(name).inc()
        quota_metrics.denied(name, "vgpu-number")
    text = metrics.exposition().decode("utf-8")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    denied = {s.labels["namespace"] for s in families["kube_vgpu_quota_denied"].samples}
    # Text survives as written; lone surrogates are shown as their escape, not dropped.
    assert {'quo"te', "new\nline", "back\\slash", "ünï", "a\\ud800b", "\\udfff"} <= denied
    reasons = {s.labels["reason"] for s in families["kube_vgpu_webhook_denials"].samples}
    assert "a\\ud800b" in reasons
