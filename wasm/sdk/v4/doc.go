// Package sdk is the Go SDK for Fleetlearn update modules of ABI v4. It is
// package wasm/sdk/v2's API (v1's, plus the transformer kernels) plus the
// kernels v4 adds for convolutional networks: Conv2D, MaxPool2D,
// AvgPool2D, GroupNorm, Dropout and their gradients, and the request's
// Arch. A module built with it declares fleetlearn_abi_version 4 and
// imports host functions only from fleetlearn_v4 (see docs/ABI.md).
//
//	import sdk "github.com/fleetlearn/fleetlearn/wasm/sdk/v4"
//
// Build a module with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o module.wasm .
//
// The files named *_gen.go are wasm/sdk's and wasm/sdk/v2's, rebound to
// fleetlearn_v4 by gensdk (go generate); what v4 adds is in imports_v4.go
// and conv.go.
package sdk

//go:generate go run ../internal/gensdk/cmd 4
