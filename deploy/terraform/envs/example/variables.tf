variable "kubeconfig" {
  description = "Path of the kubeconfig of the fleet's cluster."
  type        = string
  default     = "~/.kube/config"
}

variable "kube_context" {
  description = "Context in that kubeconfig; null means its current context."
  type        = string
  default     = null
}

variable "instances" {
  description = "The fleet: release name => tier, opaque instance id and optional public host (no credentials here)."
  type = map(object({
    tier              = string
    instance_id       = string
    ingress_host      = optional(string, "")
    temporal_sql_host = optional(string, "")
    keda_enabled      = optional(bool, false)
  }))
}

variable "instance_secrets" {
  description = "Per instance (same keys as instances): database URL, admin token, outbox keys, Tier L Temporal database password and the employees' secrets. Pass it from a secret store (e.g. TF_VAR_instance_secrets), never from a committed file."
  type = map(object({
    database_url          = string
    admin_token           = string
    outbox_keys           = string
    temporal_sql_password = optional(string, "")
    employee_secrets      = optional(map(string), {})
  }))
  sensitive = true
}

variable "image_repository" {
  description = "Prefix of the service images (<repository>/<service>:<tag>)."
  type        = string
  default     = "eventos"
}

variable "image_tag" {
  description = "Tag of the service images (the fleet's pinned release)."
  type        = string
  default     = ""
}

variable "collector_exporters" {
  description = "Exporters of the central collector (collector config shape); credentials only as $${env:NAME}."
  type        = any
  default     = { debug = { verbosity = "basic" } }
}

variable "collector_exporter_env" {
  description = "Exporter credentials of the central collector (NAME => value)."
  type        = map(string)
  sensitive   = true
  default     = {}
}
