output "instance_endpoints" {
  description = "Per instance: namespace, HTTP and gRPC endpoints, public URL and Temporal address."
  value = {
    for name, inst in module.instance : name => {
      namespace        = inst.namespace
      http_endpoint    = inst.http_endpoint
      grpc_endpoint    = inst.grpc_endpoint
      public_url       = inst.public_url
      temporal_address = inst.temporal_address
    }
  }
}

output "collector_otlp_grpc_endpoint" {
  description = "OTLP/gRPC endpoint of the central collector."
  value       = module.collector.otlp_grpc_endpoint
}
