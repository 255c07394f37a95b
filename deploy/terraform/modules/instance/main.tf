# One Event OS instance: its namespace, its Secrets (from sensitive variables; the chart only
# references them by name) and the Helm release of deploy/helm/eventos at the chosen tier.

locals {
  chart_path              = var.chart_path != "" ? var.chart_path : "${path.module}/../../../helm/eventos"
  tier_file               = "${local.chart_path}/values-tier-${lower(var.tier)}.yaml"
  has_temporal_sql_secret = var.tier == "L"
  instance_values = {
    instance = { id = var.instance_id }
    image = merge(
      { repository = var.image_repository },
      var.image_tag != "" ? { tag = var.image_tag } : {},
    )
    telemetry = { otlpEndpoint = var.otlp_endpoint }
    secrets = {
      database  = { existingSecret = kubernetes_secret.database.metadata[0].name, urlKey = "url" }
      admin     = { existingSecret = kubernetes_secret.admin.metadata[0].name, tokenKey = "token" }
      outbox    = { existingSecret = kubernetes_secret.outbox.metadata[0].name, keysKey = "keys" }
      employees = { existingSecret = kubernetes_secret.employees.metadata[0].name }
    }
    temporal = local.has_temporal_sql_secret ? {
      server = {
        sql = {
          host           = var.temporal_sql_host
          user           = var.temporal_sql_user
          existingSecret = kubernetes_secret.temporal_sql[0].metadata[0].name
          passwordKey    = "password"
        }
      }
    } : {}
    autoscaling = { keda = { enabled = var.keda_enabled } }
    ingress = {
      enabled   = var.ingress_host != ""
      host      = var.ingress_host
      className = var.ingress_class_name
    }
  }
}

resource "kubernetes_namespace" "this" {
  metadata {
    name = var.namespace
    labels = {
      "app.kubernetes.io/part-of" = "eventos"
      "eventos.dev/instance-id"   = var.instance_id
      "eventos.dev/tier"          = var.tier
    }
  }
}

resource "kubernetes_secret" "database" {
  metadata {
    name      = "${var.name}-database"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  data = { url = var.database_url }
}

resource "kubernetes_secret" "admin" {
  metadata {
    name      = "${var.name}-admin"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  data = { token = var.admin_token }
}

resource "kubernetes_secret" "outbox" {
  metadata {
    name      = "${var.name}-outbox"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  data = { keys = var.outbox_keys }
}

resource "kubernetes_secret" "employees" {
  metadata {
    name      = "${var.name}-employees"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  data = var.employee_secrets
}

resource "kubernetes_secret" "temporal_sql" {
  count = local.has_temporal_sql_secret ? 1 : 0
  metadata {
    name      = "${var.name}-temporal-sql"
    namespace = kubernetes_namespace.this.metadata[0].name
  }
  data = { password = var.temporal_sql_password }
}

resource "helm_release" "instance" {
  name      = var.name
  namespace = kubernetes_namespace.this.metadata[0].name
  chart     = local.chart_path
  values = [
    file(local.tier_file),
    yamlencode(local.instance_values),
    yamlencode(var.extra_values),
  ]
  # The migration Job runs before install and upgrade; a failed one fails the release.
  wait    = true
  timeout = 900
}
