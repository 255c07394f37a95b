locals {
  fullname = strcontains(var.name, "eventos-collector") ? var.name : "${var.name}-eventos-collector"
  host     = "${local.fullname}.${kubernetes_namespace_v1.this.metadata[0].name}.svc"
}

output "namespace" {
  description = "Namespace of the collector."
  value       = kubernetes_namespace_v1.this.metadata[0].name
}

output "otlp_grpc_endpoint" {
  description = "OTLP/gRPC endpoint instances send to (the instance chart's telemetry.otlpEndpoint)."
  value       = "http://${local.host}:4317"
}

output "otlp_http_endpoint" {
  description = "OTLP/HTTP endpoint."
  value       = "http://${local.host}:4318"
}
