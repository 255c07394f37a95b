# An example fleet: one central collector and one instance per entry of var.instances, each in its
# own namespace at its own tier, sending telemetry to the collector.

module "collector" {
  source       = "../../modules/collector"
  namespace    = "eventos-telemetry"
  exporters    = var.collector_exporters
  pipelines    = { metrics = keys(var.collector_exporters), logs = keys(var.collector_exporters) }
  exporter_env = var.collector_exporter_env
}

module "instance" {
  source   = "../../modules/instance"
  for_each = var.instances

  name                  = each.key
  namespace             = "eventos-${each.key}"
  tier                  = each.value.tier
  instance_id           = each.value.instance_id
  database_url          = var.instance_secrets[each.key].database_url
  admin_token           = var.instance_secrets[each.key].admin_token
  outbox_keys           = var.instance_secrets[each.key].outbox_keys
  temporal_sql_password = var.instance_secrets[each.key].temporal_sql_password
  employee_secrets      = var.instance_secrets[each.key].employee_secrets
  temporal_sql_host     = each.value.temporal_sql_host
  keda_enabled          = each.value.keda_enabled
  ingress_host          = each.value.ingress_host
  otlp_endpoint         = module.collector.otlp_grpc_endpoint
  image_repository      = var.image_repository
  image_tag             = var.image_tag
}
