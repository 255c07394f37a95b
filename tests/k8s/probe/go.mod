module eventos.local/tests/k8s/probe

go 1.24
