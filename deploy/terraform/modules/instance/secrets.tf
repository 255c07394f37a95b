# The instance's credentials that nobody has to hand in: generated once by the random provider
# and kept in the Terraform state, so every later apply (an upgrade of the chart or the images
# included) finds them unchanged and leaves their Secrets as they are. A credential variable left
# empty takes the generated value; one given wins. Only `terraform destroy` (or a `-replace` of
# the random resource) makes a new one.

resource "random_password" "admin_token" {
  length  = 48
  special = false
}

resource "random_bytes" "internal_token" {
  length = 32
}

# One outbox key: <key id>:<base64 of 32 bytes>, the shape EVENTOS_OUTBOX_KEYS takes.
resource "random_bytes" "outbox_key" {
  length = 32
}

resource "random_password" "postgresql" {
  count   = var.bundled_postgresql ? 1 : 0
  length  = 40
  special = false
}

locals {
  outbox_key_id  = "k1"
  admin_token    = var.admin_token != "" ? var.admin_token : random_password.admin_token.result
  internal_token = var.internal_token != "" ? var.internal_token : random_bytes.internal_token.hex
  outbox_keys    = var.outbox_keys != "" ? var.outbox_keys : "${local.outbox_key_id}:${random_bytes.outbox_key.base64}"
  # The bundled PostgreSQL's superuser and the URL the services use to reach it in the namespace.
  postgresql_host = "${local.fullname}-postgresql.${var.namespace}.svc"
  database_url = var.bundled_postgresql ? join("", [
    "postgresql://postgres:", random_password.postgresql[0].result, "@", local.postgresql_host, ":5432/eventos",
  ]) : var.database_url
}
