// Package sdk is the Go SDK for Fleetlearn update modules. A module is a Go main
// package built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o module.wasm .
//
// that registers its entry points in init:
//
//	func init() { sdk.Handle(train, evaluate) }
//	func main() {}
//
// The SDK exports what ABI v1 requires (see docs/ABI.md) and wraps the host's
// tensor kernels: tensors live in the host and are named by handles, so the heavy
// math runs natively while the module keeps the control flow. A kernel misused
// (bad handle, mismatched shapes, budget exhausted) aborts the call on the host
// side with a descriptive error; SDK calls therefore return no errors.
//
// Modules that need ABI v2's kernels (embedding, layer norm, GELU, softmax,
// batched gemm) use package wasm/sdk/v2 instead, which has the same API.
//
// Everything but this file builds only for GOOS=wasip1.
package sdk
