# One Event OS instance: its namespace, its Secrets (from sensitive variables, or generated once:
# secrets.tf; the chart only references them by name) and the Helm release of deploy/helm/eventos
# at the chosen tier. It creates every Secret docs/deploy.md §2 lists, so nothing is made by hand.

locals {
  chart_path   = var.chart_path != "" ? var.chart_path : "${path.module}/../../../helm/eventos"
  tier_file    = "${local.chart_path}/values-tier-${lower(var.tier)}.yaml"
  namespace    = kubernetes_namespace_v1.this.metadata[0].name
  grpc_tls     = var.grpc_tls_cert != ""
  temporal_sql = var.tier == "L" && !var.bundled_postgresql
  instance_values = {
    instance = { id = var.instance_id }
    image = merge(
      { repository = var.image_repository },
      var.image_tag != "" ? { tag = var.image_tag } : {},
    )
    telemetry = { otlpEndpoint = var.otlp_endpoint }
    secrets = {
      database  = { existingSecret = kubernetes_secret_v1.database.metadata[0].name, urlKey = "url" }
      admin     = { existingSecret = kubernetes_secret_v1.admin.metadata[0].name, tokenKey = "token" }
      internal  = { existingSecret = kubernetes_secret_v1.internal.metadata[0].name, tokenKey = "token" }
      outbox    = { existingSecret = kubernetes_secret_v1.outbox.metadata[0].name, keysKey = "keys" }
      employees = { existingSecret = kubernetes_secret_v1.employees.metadata[0].name, purposes = var.secret_purposes }
    }
    networkPolicy = { egress = { to = var.egress_to } }
    llm           = { endpoints = var.llm_endpoints }
    autoscaling   = { keda = { enabled = var.keda_enabled } }
    ingress = {
      enabled   = var.ingress_host != ""
      host      = var.ingress_host
      className = var.ingress_class_name
      grpc      = { tls = { secretName = local.grpc_tls ? kubernetes_secret_v1.grpc_tls[0].metadata[0].name : "" } }
    }
  }
  # Optional parts as values documents of their own (helm merges them in order).
  postgresql_values = [for s in kubernetes_secret_v1.postgresql : yamlencode({
    postgresql = { bundled = { enabled = true }, existingSecret = s.metadata[0].name, passwordKey = "password" }
  })]
  temporal_sql_values = [for s in kubernetes_secret_v1.temporal_sql : yamlencode({
    temporal = { server = { sql = {
      host           = var.temporal_sql_host
      user           = var.temporal_sql_user
      existingSecret = s.metadata[0].name
      passwordKey    = "password"
    } } }
  })]
}

resource "kubernetes_namespace_v1" "this" {
  metadata {
    name = var.namespace
    labels = {
      "app.kubernetes.io/part-of" = "eventos"
      "eventos.dev/instance-id"   = var.instance_id
      "eventos.dev/tier"          = var.tier
    }
  }
}

resource "kubernetes_secret_v1" "database" {
  metadata {
    name      = "${var.name}-database"
    namespace = local.namespace
  }
  data = { url = local.database_url }
  lifecycle {
    precondition {
      condition     = var.bundled_postgresql || var.database_url != ""
      error_message = "database_url is required unless bundled_postgresql is true."
    }
  }
}

resource "kubernetes_secret_v1" "admin" {
  metadata {
    name      = "${var.name}-admin"
    namespace = local.namespace
  }
  data = { token = local.admin_token }
}

resource "kubernetes_secret_v1" "internal" {
  metadata {
    name      = "${var.name}-internal"
    namespace = local.namespace
  }
  data = { token = local.internal_token }
}

resource "kubernetes_secret_v1" "outbox" {
  metadata {
    name      = "${var.name}-outbox"
    namespace = local.namespace
  }
  data = { keys = local.outbox_keys }
}

resource "kubernetes_secret_v1" "employees" {
  metadata {
    name      = "${var.name}-employees"
    namespace = local.namespace
  }
  data = var.employee_secrets
}

resource "kubernetes_secret_v1" "grpc_tls" {
  count = local.grpc_tls ? 1 : 0
  metadata {
    name      = "${var.name}-grpc-tls"
    namespace = local.namespace
  }
  type = "kubernetes.io/tls"
  data = { "tls.crt" = var.grpc_tls_cert, "tls.key" = var.grpc_tls_key }
  lifecycle {
    precondition {
      condition     = var.grpc_tls_key != ""
      error_message = "grpc_tls_key is required with grpc_tls_cert."
    }
  }
}

resource "kubernetes_secret_v1" "postgresql" {
  count = var.bundled_postgresql ? 1 : 0
  metadata {
    name      = "${var.name}-postgresql"
    namespace = local.namespace
  }
  data = { password = random_password.postgresql[0].result }
}

resource "kubernetes_secret_v1" "temporal_sql" {
  count = local.temporal_sql ? 1 : 0
  metadata {
    name      = "${var.name}-temporal-sql"
    namespace = local.namespace
  }
  data = { password = var.temporal_sql_password }
}

resource "helm_release" "instance" {
  name      = var.name
  namespace = local.namespace
  chart     = local.chart_path
  values = concat(
    [file(local.tier_file), yamlencode(local.instance_values)],
    local.postgresql_values,
    local.temporal_sql_values,
    [yamlencode(var.extra_values)],
  )
  # helm waits for the migration Job (a hook) in any case; a failed one fails the release.
  # With the bundled PostgreSQL the Job runs post-install, after the services started, and they
  # stay unready until it ran; helm's wait would wait for them before it, until the timeout
  # (seen on the local cluster: "context deadline exceeded"). So that release is not waited for.
  wait    = var.wait && !var.bundled_postgresql
  timeout = var.timeout_s
}
