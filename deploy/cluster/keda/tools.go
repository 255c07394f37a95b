//go:build tools

// Package tools pins the KEDA commands `make cluster-tools` builds (the operator and its metrics
// apiserver): the blank imports keep them (and everything they need) in go.mod and go.sum; the
// tag keeps the file out of any build.
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
