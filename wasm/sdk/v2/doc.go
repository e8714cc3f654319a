// Package sdk is the Go SDK for Fleetlearn update modules of ABI v2. It is
// package wasm/sdk (ABI v1) with the same API, plus the kernels v2 adds for
// transformer-style models: Embedding, LayerNorm, GELU, Softmax, BatchedGemm
// and their gradients. A module built with it declares fleetlearn_abi_version
// 2 and imports host functions only from fleetlearn_v2 (see docs/ABI.md). A
// module uses one of the two packages, never both: each exports the ABI's
// entry points.
//
// It is a separate package, not a build tag on wasm/sdk, so that v1 modules
// keep building to the same bytes (and the same sha256 a server registered
// them under) and a v2 module says which ABI it speaks in its imports:
//
//	import sdk "github.com/fleetlearn/fleetlearn/wasm/sdk/v2"
//
// Build a module with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o module.wasm .
//
// and register its entry points in init with sdk.Handle. A kernel misused
// (bad handle, mismatched shapes, token id out of range, budget exhausted)
// aborts the call on the host side with a descriptive error; SDK calls
// therefore return no errors.
//
// Everything but this file builds only for GOOS=wasip1. The files named
// *_gen.go are wasm/sdk's, rebound to fleetlearn_v2 by gensdk (go generate);
// what v2 adds is in imports_v2.go and transformer.go.
package sdk

//go:generate go run ../internal/gensdk/cmd 2
