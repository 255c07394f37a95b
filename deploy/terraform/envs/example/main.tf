# An example fleet: one central collector and one instance per entry of var.instances, each in its
# own namespace at its own tier, sending telemetry to the collector.

module "collector" {
  source       = "../../modules/collector"
  namespace    = var.collector_namespace
  exporters    = var.collector_exporters
  pipelines    = { metrics = keys(var.collector_exporters), logs = keys(var.collector_exporters) }
  exporter_env = var.collector_exporter_env
  wait         = var.wait
  extra_values = var.collector_extra_values
}

module "instance" {
  source   = "../../modules/instance"
  for_each = var.instances

  name                  = each.key
  namespace             = "eventos-${each.key}"
  tier                  = each.value.tier
  instance_id           = each.value.instance_id
  bundled_postgresql    = each.value.bundled_postgresql
  database_url          = var.instance_secrets[each.key].database_url
  admin_token           = var.instance_secrets[each.key].admin_token
  internal_token        = var.instance_secrets[each.key].internal_token
  outbox_keys           = var.instance_secrets[each.key].outbox_keys
  temporal_sql_password = var.instance_secrets[each.key].temporal_sql_password
  employee_secrets      = var.instance_secrets[each.key].employee_secrets
  grpc_tls_cert         = each.value.grpc_tls_cert
  grpc_tls_key          = var.instance_secrets[each.key].grpc_tls_key
  llm_endpoints         = each.value.llm_endpoints
  temporal_sql_host     = each.value.temporal_sql_host
  keda_enabled          = each.value.keda_enabled
  ingress_host          = each.value.ingress_host
  otlp_endpoint         = module.collector.otlp_grpc_endpoint
  secret_purposes       = each.value.secret_purposes
  image_repository      = var.image_repository
  image_tag             = var.image_tag
  wait                  = var.wait
  timeout_s             = var.helm_timeout_s
  extra_values          = var.extra_values

  # The collector and egress_cidrs are private addresses the calling roles' egress policy must
  # let through.
  egress_to = concat(
    [{ to = [{ namespaceSelector = { matchLabels = { "kubernetes.io/metadata.name" = var.collector_namespace } } }] }],
    [for cidr in each.value.egress_cidrs : { to = [{ ipBlock = { cidr = cidr } }] }],
  )
}
