//go:build tools

// Package tools pins the Kueue controller manager so that go mod tidy keeps
// its dependencies; internal/testtool builds it for package kubetest.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
