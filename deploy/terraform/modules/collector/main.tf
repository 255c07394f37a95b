# The central OpenTelemetry Collector of the fleet: its namespace, the Secret of exporter
# credentials, and the Helm release of deploy/helm/eventos-collector.

locals {
  chart_path = var.chart_path != "" ? var.chart_path : "${path.module}/../../../helm/eventos-collector"
}

resource "kubernetes_namespace_v1" "this" {
  metadata {
    name   = var.namespace
    labels = { "app.kubernetes.io/part-of" = "eventos" }
  }
}

resource "kubernetes_secret_v1" "exporter_env" {
  metadata {
    name      = "${var.name}-exporter-env"
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }
  data = var.exporter_env
}

resource "helm_release" "collector" {
  name      = var.name
  namespace = kubernetes_namespace_v1.this.metadata[0].name
  chart     = local.chart_path
  values = [
    yamlencode({
      replicas       = var.replicas
      exporters      = var.exporters
      pipelines      = var.pipelines
      exporterSecret = kubernetes_secret_v1.exporter_env.metadata[0].name
      service        = { type = var.service_type }
    }),
    yamlencode(var.extra_values),
  ]
  wait = var.wait
}
