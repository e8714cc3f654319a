// Package deploy holds no code for the binaries: its files are the
// deployments (container images, Kubernetes manifests, systemd units, NATS
// configurations) and its tests check them against the real things — the
// Kubernetes types and kubelet probes, systemd-analyze, nats-server and the
// binaries' own flag sets.
package deploy
