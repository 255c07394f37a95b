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
  description = "The fleet: release name => tier, opaque instance id, optional public host, bundled PostgreSQL, LLM endpoint allowlist, the purposes of the employees' secrets, the private addresses its roles may reach besides the collector (egress_cidrs: an external database) and gRPC TLS certificate (no credentials here)."
  type = map(object({
    tier               = string
    instance_id        = string
    ingress_host       = optional(string, "")
    temporal_sql_host  = optional(string, "")
    keda_enabled       = optional(bool, false)
    bundled_postgresql = optional(bool, false)
    grpc_tls_cert      = optional(string, "")
    secret_purposes    = optional(map(string), {})
    egress_cidrs       = optional(list(string), [])
    llm_endpoints = optional(map(object({
      base_url    = string
      credentials = optional(list(string), [])
    })), {})
  }))
}

variable "instance_secrets" {
  description = "Per instance (an entry for each key of instances, {} at least): database URL (unless bundled_postgresql), admin token, internal token and outbox keys (each generated once when left out), Tier L Temporal database password, gRPC TLS key and the employees' secrets. Pass it from a secret store (e.g. TF_VAR_instance_secrets), never from a committed file."
  type = map(object({
    database_url          = optional(string, "")
    admin_token           = optional(string, "")
    internal_token        = optional(string, "")
    outbox_keys           = optional(string, "")
    temporal_sql_password = optional(string, "")
    grpc_tls_key          = optional(string, "")
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

variable "collector_namespace" {
  description = "Namespace created for the central collector."
  type        = string
  default     = "eventos-telemetry"
}

variable "collector_extra_values" {
  description = "More values of the collector chart (e.g. a locally built image); never credentials."
  type        = any
  default     = {}
}

variable "extra_values" {
  description = "More values of every instance's chart (e.g. locally built images, sizes); never credentials."
  type        = any
  default     = {}
}

variable "wait" {
  description = "Wait for every release's pods to be Ready before the apply succeeds."
  type        = bool
  default     = true
}

variable "helm_timeout_s" {
  description = "Seconds helm may take per instance release (its hooks and, with wait, its pods)."
  type        = number
  default     = 900
}
