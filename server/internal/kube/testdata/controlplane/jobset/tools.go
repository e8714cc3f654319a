//go:build tools

// Package tools pins the JobSet controller manager, the module's root
// package, so that go mod tidy keeps its dependencies; internal/testtool
// builds it for package kubetest.
package tools

import _ "sigs.k8s.io/jobset"
