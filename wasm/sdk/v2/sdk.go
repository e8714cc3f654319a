//go:build wasip1

package sdk

import (
	"encoding/json"
	"errors"
	"runtime"
	"unsafe"
)

// ABIVersion is the ABI this SDK implements.
const ABIVersion = 2

// Request describes one call: the task's hyper-parameters (JSON, verbatim), the
// seed for example order and randomness, the model's parameters (held by the host,
// reachable through Param) and the local dataset's size.
type Request struct {
	ABI    int             `json:"abi"`
	Kind   string          `json:"kind"` // "train" or "evaluate"
	Hyper  json.RawMessage `json:"hyper"`
	Seed   uint64          `json:"seed"`
	Params []ParamInfo     `json:"params"`
	Data   DataInfo        `json:"data"`
}

// ParamInfo names one model parameter and its shape.
type ParamInfo struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

// DataInfo sizes the local dataset.
type DataInfo struct {
	Examples int `json:"examples"`
	Dim      int `json:"dim"`
	Classes  int `json:"classes"`
}

// Result is what an entry point reports. Trained weights are not part of it:
// they are whatever the parameter tensors hold when train returns.
type Result struct {
	NumExamples int                `json:"num_examples"`
	Metrics     map[string]float64 `json:"metrics"`
}

// Handler implements an entry point.
type Handler func(req *Request) (*Result, error)

var trainFn, evalFn Handler

// Handle registers the module's entry points; call it from init.
func Handle(train, evaluate Handler) { trainFn, evalFn = train, evaluate }

//go:wasmexport fleetlearn_abi_version
func abiVersion() int32 { return ABIVersion }

//go:wasmexport train
func train() int32 { return dispatch(trainFn) }

//go:wasmexport evaluate
func evaluate() int32 { return dispatch(evalFn) }

func dispatch(h Handler) int32 {
	if h == nil {
		return fail(errors.New("entry point not implemented"))
	}
	in := make([]byte, hostInputLen())
	hostInputRead(ptr(in), uint32(len(in)))
	var req Request
	if err := json.Unmarshal(in, &req); err != nil {
		return fail(err)
	}
	res, err := h(&req)
	if err != nil {
		return fail(err)
	}
	out, err := json.Marshal(res)
	if err != nil {
		return fail(err)
	}
	hostOutputWrite(ptr(out), uint32(len(out)))
	runtime.KeepAlive(out)
	return 0
}

func fail(err error) int32 {
	msg := []byte(err.Error())
	hostFail(ptr(msg), uint32(len(msg)))
	runtime.KeepAlive(msg)
	return 1
}

func ptr[T any](s []T) uint32 {
	if len(s) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&s[0])))
}

// Log sends a debug line to the host's log (bounded per call).
func Log(msg string) {
	b := []byte(msg)
	hostLog(ptr(b), uint32(len(b)))
	runtime.KeepAlive(b)
}
