// Package proto holds the Fleetlearn API definitions: the NATS wire protocol
// between the aggregator and device agents, and the gRPC services of the
// control plane. Generated Go code lives next to the .proto files: the
// messages in package fleetlearnv1 (fleetlearn/v1), the gRPC services in
// package apiv1 (fleetlearn/api/v1), so that code using only the messages
// links no gRPC.
//
// Regenerate from the repository root with
//
//	go generate ./proto/...
//
// and lint, from this directory, with
//
//	go run github.com/bufbuild/buf/cmd/buf@v1.75.0 lint
//
// buf and the protoc plugins are run at pinned versions with `go run
// pkg@version`, which keeps them out of go.mod.
package proto

//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
