variable "name" {
  description = "Helm release name of the instance (also the prefix of its resources)."
  type        = string
}

variable "namespace" {
  description = "Kubernetes namespace created for the instance (one instance per namespace)."
  type        = string
}

variable "tier" {
  description = "Tier of the instance: S (Temporal dev server) or L (full Temporal server on PostgreSQL)."
  type        = string
  validation {
    condition     = contains(["S", "L"], var.tier)
    error_message = "The tier must be S or L."
  }
}

variable "instance_id" {
  description = "Opaque instance id sent with telemetry (lower-case letters, digits and '-'; never an owner's name)."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.instance_id))
    error_message = "The instance id must be lower-case letters, digits and '-', at most 63 characters."
  }
}

variable "database_url" {
  description = "PostgreSQL URL of the instance's database (user, password, host, port and database eventos); stored in a Secret. Required unless bundled_postgresql."
  type        = string
  sensitive   = true
  default     = ""
}

variable "bundled_postgresql" {
  description = "Run PostgreSQL in the release (the chart's postgresql.bundled, small installs): its password is generated once and the database URL built from it."
  type        = bool
  default     = false
}

variable "admin_token" {
  description = "Bearer token of the owner API (at least 16 characters); stored in a Secret. Empty: 48 characters generated once and kept (secrets.tf)."
  type        = string
  sensitive   = true
  default     = ""
  validation {
    condition     = var.admin_token == "" || length(var.admin_token) >= 16
    error_message = "The admin token must be at least 16 characters."
  }
}

variable "internal_token" {
  description = "The internal producers' token (secrets.internal: ingress checks it on the unary Append; relay, workers-workflow and egress send it); stored in a Secret. Empty: 32 random bytes in hex, generated once and kept."
  type        = string
  sensitive   = true
  default     = ""
}

variable "outbox_keys" {
  description = "Keys sealing outbox recipients at rest: comma-separated <key id>:<base64 of 32 bytes>, the first encrypts (e.g. k1:$(openssl rand -base64 32)); stored in a Secret. Empty: one key k1 generated once and kept."
  type        = string
  sensitive   = true
  default     = ""
  validation {
    condition     = var.outbox_keys == "" || can(regex("^[A-Za-z0-9_.-]{1,32}:[A-Za-z0-9+/]{43}=", var.outbox_keys))
    error_message = "The outbox keys must start with <key id>:<base64 of 32 bytes>."
  }
}

variable "grpc_tls_cert" {
  description = "PEM certificate (chain) of ingress's gRPC port; with grpc_tls_key it becomes the kubernetes.io/tls Secret of ingress.grpc.tls. Empty: plaintext gRPC, guarded only by the NetworkPolicy (docs/deploy.md section 7)."
  type        = string
  default     = ""
}

variable "grpc_tls_key" {
  description = "PEM private key of grpc_tls_cert; stored in that Secret."
  type        = string
  sensitive   = true
  default     = ""
}

variable "llm_endpoints" {
  description = "The operator's allowlist of LLM endpoints (the chart's llm.endpoints): endpoint name => base_url and the secret references a spec may use with it. Empty: only provider local."
  type = map(object({
    base_url    = string
    credentials = optional(list(string), [])
  }))
  default = {}
}

variable "employee_secrets" {
  description = "Secrets the employees reference by name (e.g. openai-main = key); mounted as files (EVENTOS_SECRETS_DIR)."
  type        = map(string)
  sensitive   = true
  default     = {}
}

variable "secret_purposes" {
  description = "What each employee secret is for (the chart's secrets.employees.purposes): secret name or prefix* => llm, http:<host>, poll:<host>, driver, channel or webhook."
  type        = map(string)
  default     = {}
}

variable "egress_to" {
  description = "Egress rules for private destinations the calling roles need (the chart's networkPolicy.egress.to): e.g. the collector's namespace, an external database."
  type        = any
  default     = []
}

variable "temporal_sql_host" {
  description = "Tier L: PostgreSQL host of the temporal and temporal_visibility databases."
  type        = string
  default     = ""
}

variable "temporal_sql_user" {
  description = "Tier L: PostgreSQL user of the Temporal databases."
  type        = string
  default     = "temporal"
}

variable "temporal_sql_password" {
  description = "Tier L: password of the Temporal databases' user; stored in a Secret."
  type        = string
  sensitive   = true
  default     = ""
}

variable "otlp_endpoint" {
  description = "OTLP endpoint of the central collector (e.g. the collector module's otlp_grpc_endpoint)."
  type        = string
  default     = ""
}

variable "image_repository" {
  description = "Prefix of the service images (<repository>/<service>:<tag>)."
  type        = string
  default     = "eventos"
}

variable "image_tag" {
  description = "Tag of the service images; empty means the chart's appVersion."
  type        = string
  default     = ""
}

variable "keda_enabled" {
  description = "Tier L: scale the LLM class Deployments with KEDA's Temporal scaler (KEDA must be installed) instead of HPAs."
  type        = bool
  default     = false
}

variable "ingress_host" {
  description = "Host name of an Ingress for the instance's HTTP (webhooks, owner API); empty means no Ingress."
  type        = string
  default     = ""
}

variable "ingress_class_name" {
  description = "Ingress class of that Ingress; empty means the cluster default."
  type        = string
  default     = ""
}

variable "chart_path" {
  description = "Path of the instance chart (deploy/helm/eventos)."
  type        = string
  default     = ""
}

variable "wait" {
  description = "Wait for every pod of the release to be Ready (helm --wait) before the apply succeeds; never with bundled_postgresql (its migration runs after install, and the services are unready until then)."
  type        = bool
  default     = true
}

variable "timeout_s" {
  description = "Seconds helm may take for the release's hooks (the migration Job) and, with wait, for its pods."
  type        = number
  default     = 900
}

variable "extra_values" {
  description = "More chart values (merged last), e.g. per-role sizes; never credentials."
  type        = any
  default     = {}
}
