locals {
  fullname = strcontains(var.name, "eventos") ? var.name : "${var.name}-eventos"
  svc      = "${kubernetes_namespace_v1.this.metadata[0].name}.svc"
}

output "namespace" {
  description = "Namespace of the instance."
  value       = kubernetes_namespace_v1.this.metadata[0].name
}

output "http_endpoint" {
  description = "In-cluster URL of the instance's HTTP (webhooks /hooks, owner API /v1)."
  value       = "http://${local.fullname}-ingress.${local.svc}:8080"
}

output "grpc_endpoint" {
  description = "In-cluster address of the instance's gRPC EventIngress (drivers)."
  value       = "${local.fullname}-ingress.${local.svc}:9090"
}

output "public_url" {
  description = "Public URL of the instance's HTTP when an Ingress host is set, else null."
  value       = var.ingress_host != "" ? "https://${var.ingress_host}" : null
}

output "temporal_address" {
  description = "Temporal frontend of the instance (reachable only from the instance's pods)."
  value       = "${local.fullname}-temporal.${local.svc}:7233"
}

output "release" {
  description = "Name of the Helm release."
  value       = helm_release.instance.name
}

output "secret_names" {
  description = "Names of the Secrets the module created in the namespace, by the chart value they fill (database, admin, internal, outbox, employees, grpc_tls, postgresql, temporal_sql)."
  value = merge(
    {
      database  = kubernetes_secret_v1.database.metadata[0].name
      admin     = kubernetes_secret_v1.admin.metadata[0].name
      internal  = kubernetes_secret_v1.internal.metadata[0].name
      outbox    = kubernetes_secret_v1.outbox.metadata[0].name
      employees = kubernetes_secret_v1.employees.metadata[0].name
    },
    { for s in kubernetes_secret_v1.grpc_tls : "grpc_tls" => s.metadata[0].name },
    { for s in kubernetes_secret_v1.postgresql : "postgresql" => s.metadata[0].name },
    { for s in kubernetes_secret_v1.temporal_sql : "temporal_sql" => s.metadata[0].name },
  )
}
