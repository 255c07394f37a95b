variable "name" {
  description = "Helm release name of the collector."
  type        = string
  default     = "eventos-collector"
}

variable "namespace" {
  description = "Kubernetes namespace created for the collector."
  type        = string
}

variable "replicas" {
  description = "Replicas of the collector."
  type        = number
  default     = 2
}

variable "exporters" {
  description = "Exporters of the collector, in the collector's own config shape (exporter id => settings); credentials only as $${env:NAME}."
  type        = any
  default     = { debug = { verbosity = "basic" } }
}

variable "pipelines" {
  description = "Exporter ids used by the metrics and logs pipelines."
  type = object({
    metrics = list(string)
    logs    = list(string)
  })
  default = { metrics = ["debug"], logs = ["debug"] }
}

variable "exporter_env" {
  description = "Environment of the collector for exporter credentials (NAME => value); stored in a Secret."
  type        = map(string)
  sensitive   = true
  default     = {}
}

variable "service_type" {
  description = "Type of the collector's Service (LoadBalancer when instances run in other clusters)."
  type        = string
  default     = "ClusterIP"
}

variable "chart_path" {
  description = "Path of the collector chart (deploy/helm/eventos-collector)."
  type        = string
  default     = ""
}

variable "wait" {
  description = "Wait for the collector's pods to be Ready (helm --wait) before the apply succeeds."
  type        = bool
  default     = true
}

variable "extra_values" {
  description = "More chart values (merged last), e.g. the image; never credentials."
  type        = any
  default     = {}
}
