package wasm

import "errors"

// Sentinel errors. Every error a Module returns wraps exactly one of these, with
// the detail (import name, kernel, shape, address) in the message.
var (
	// ErrHashMismatch: the module bytes do not hash to the sha256 they were loaded under.
	ErrHashMismatch = errors.New("wasm: module hash mismatch")
	// ErrInvalidModule: the bytes are not a valid WebAssembly module (truncated, corrupt).
	ErrInvalidModule = errors.New("wasm: invalid module")
	// ErrForbiddenImport: the module imports something its declared ABI version does not grant.
	ErrForbiddenImport = errors.New("wasm: forbidden import")
	// ErrABI: the module does not implement the ABI (missing export, wrong signature).
	ErrABI = errors.New("wasm: ABI violation")
	// ErrABIVersion: the module speaks an ABI version this host does not.
	ErrABIVersion = errors.New("wasm: unsupported ABI version")
	// ErrDeadline: the call ran past its wall-clock limit and the module was closed.
	ErrDeadline = errors.New("wasm: deadline exceeded")
	// ErrMemoryLimit: the module tried to grow its memory past the call's page cap.
	ErrMemoryLimit = errors.New("wasm: memory limit exceeded")
	// ErrBudget: the module's kernel work or tensor memory exceeded the call's budget.
	ErrBudget = errors.New("wasm: kernel budget exceeded")
	// ErrKernel: a host kernel was called with bad handles or shapes.
	ErrKernel = errors.New("wasm: bad kernel call")
	// ErrMemoryAccess: a host call named a range outside the module's memory.
	ErrMemoryAccess = errors.New("wasm: out-of-bounds memory access")
	// ErrResult: the module's result is malformed (bad JSON, wrong lengths, non-finite weights).
	ErrResult = errors.New("wasm: invalid result")
	// ErrModuleFailed: the module reported failure or trapped.
	ErrModuleFailed = errors.New("wasm: module failed")
	// ErrInvalidCall: the host-side inputs to a call are invalid (model, data, hyper-parameters).
	ErrInvalidCall = errors.New("wasm: invalid call")
	// ErrLimits: a call's or a sandbox's Limits are outside what the sandbox can honour.
	ErrLimits = errors.New("wasm: invalid limits")
	// ErrClosed: the sandbox was closed.
	ErrClosed = errors.New("wasm: sandbox closed")
	// ErrEngine: a sandbox was asked for an engine this machine cannot run.
	ErrEngine = errors.New("wasm: unsupported engine")
)
