// Package kubetest runs a real Kubernetes control plane for tests: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, the JobSet and
// Kueue controllers with their CRDs and admission webhooks, and KWOK, which
// fakes nodes and the lifecycle of the pods bound to them, so that pods are
// scheduled, reach Running and can be made to fail without a container
// runtime.
//
// Every program is built ahead of time from the modules pinned under
// server/internal/kube/testdata/controlplane by `go run
// ./internal/testtool/build` (package testtool); Start finds them there, and
// skips the test without them outside CI. Start runs them as child
// processes on free loopback ports, with their configuration, certificates
// and logs in a temporary directory, and stops them when the test ends. The
// API server trusts one bearer token, of a system:masters user, which every
// component and the test's clients use.
//
// It is Linux-only: the kernel kills the children if the test binary dies
// (Pdeathsig), e.g. on a go test -timeout, which skips t.Cleanup and would
// otherwise leave them holding ports. Elsewhere Start skips.
//
// Kueue v0.17 reads its metrics endpoint's certificate from the fixed
// directory /etc/kueue/metrics/certs when it does not manage certificates
// itself (and it cannot here: its own certificates name an in-cluster
// Service, which a control plane without kube-proxy cannot reach). Start
// therefore writes a self-signed pair there when none is present; a test
// that cannot write there skips outside CI.
package kubetest
